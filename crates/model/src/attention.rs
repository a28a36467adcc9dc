//! Causal grouped-query attention over paged KV storage, tiled flash-style.
//!
//! Each new token attends to its own sequence's positions `0..=pos`, read through the
//! sequence's block table. Work items are (query tile, KV head) pairs: a tile is up to
//! [`TILE_TOKENS`] consecutive rows of one sequence, and its query rows are those tokens ×
//! the query heads sharing the KV head, so each K/V row the kernel loads serves all of them
//! ([`tessera_kernels::attn`]). Items are spread over the compute units by a static
//! longest-first assignment weighted by keys attended (later tiles attend more).
//!
//! Batch invariance: the kernel's arithmetic for a query row depends only on its own
//! position, query and K/V (fixed key blocks from position 0, the last cut at the row's own
//! limit), never on the tile it lands in, so how rows are tiled or assigned — a prefill
//! chunk of hundreds of rows or a lone decode token — changes no bit of any result.

use std::cell::RefCell;
use std::ops::Range;

use tessera_kernels::attn::{attend, AttnScratch, Tile};
use tessera_runtime::{DisjointMut, ThreadPool};

use crate::kv::KvStorage;
use crate::prepared::PreparedBatch;

/// Most tokens of one sequence in a query tile.
pub const TILE_TOKENS: usize = 16;

/// One unit's buffers: the tile's gathered query rows, its output rows, per-row key
/// limits, key offsets, and the kernel's scratch.
#[derive(Default)]
struct Local {
    q: Vec<f32>,
    out: Vec<f32>,
    limits: Vec<usize>,
    offs: Vec<usize>,
    attn: AttnScratch,
}

thread_local! {
    static LOCAL: RefCell<Local> = RefCell::new(Local::default());
}

pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

/// A work item: rows `rows` (of the step, one sequence's) against KV head `kvh`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Item {
    rows: Range<usize>,
    kvh: usize,
    /// Keys attended, summed over the rows.
    cost: usize,
}

/// Tokens per tile: [`TILE_TOKENS`], fewer when the rows would give the units too few
/// items to share (no effect on any result).
fn tile_tokens(rows: usize, kv_heads: usize, units: usize) -> usize {
    (rows * kv_heads / (4 * units.max(1))).clamp(1, TILE_TOKENS)
}

/// The work items of `rows`, grouped per unit (longest first onto the least loaded unit).
fn assign(
    batch: &PreparedBatch,
    rows: Range<usize>,
    kv_heads: usize,
    units: usize,
) -> Vec<Vec<Item>> {
    let tile = tile_tokens(rows.len(), kv_heads, units);
    let mut items = Vec::new();
    let mut r = rows.start;
    while r < rows.end {
        // A tile: up to `tile` consecutive rows of one sequence.
        let seq = batch.row_seq[r];
        let mut end = r + 1;
        while end < rows.end && end - r < tile && batch.row_seq[end] == seq {
            end += 1;
        }
        let cost: usize = batch.positions[r..end].iter().map(|&p| p + 1).sum();
        for kvh in 0..kv_heads {
            items.push(Item {
                rows: r..end,
                kvh,
                cost,
            });
        }
        r = end;
    }
    items.sort_by_key(|it| std::cmp::Reverse(it.cost));
    let mut per_unit: Vec<Vec<Item>> = vec![Vec::new(); units.max(1)];
    let mut load = vec![0usize; units.max(1)];
    for it in items {
        let u = (0..load.len()).min_by_key(|&u| load[u]).expect("a unit");
        load[u] += it.cost;
        per_unit[u].push(it);
    }
    per_unit
}

/// `out[t, h·d..] = softmax(q_t,h · K_{0..=pos}ᵀ / √d) · V_{0..=pos}` for every row `t` of
/// `rows` (a sub-batch of the prepared step; `t` counted from `rows.start`). `q`: the rows'
/// query rows `q_stride` apart, each starting with `n_heads · head_dim` rotated values; the
/// K/V of every position attended to already stored (earlier steps, earlier sub-batches, and
/// these rows).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    pool: &ThreadPool,
    batch: &PreparedBatch,
    rows: Range<usize>,
    kv: &KvStorage,
    layer: usize,
    shape: &AttnShape,
    q: &[f32],
    q_stride: usize,
    out: &mut [f32],
) {
    let (nh, nkv, hd) = (shape.n_heads, shape.n_kv_heads, shape.head_dim);
    let group = nh / nkv;
    let q_dim = nh * hd;
    let scale = 1.0 / (hd as f32).sqrt();
    let base = rows.start;
    let (kbuf, vbuf) = kv.layer(layer);
    let work = assign(batch, rows, nkv, pool.units());
    let out_ptr = DisjointMut::new(out);
    pool.run(|unit| {
        LOCAL.with(|local| {
            let l = &mut *local.borrow_mut();
            for it in &work[unit] {
                let table = batch.table(batch.row_seq[it.rows.start] as usize);
                // Query rows: the tile's tokens × the group's heads, token-major.
                l.q.clear();
                l.limits.clear();
                for row in it.rows.clone() {
                    let t = row - base;
                    let h0 = t * q_stride + it.kvh * group * hd;
                    l.q.extend_from_slice(&q[h0..h0 + group * hd]);
                    let n = batch.positions[row] + 1;
                    l.limits.extend(std::iter::repeat_n(n, group));
                }
                let n = l.limits.iter().copied().max().unwrap_or(0);
                l.offs.clear();
                l.offs
                    .extend((0..n).map(|p| kv.offset(table, p) + it.kvh * hd));
                l.out.resize(l.q.len(), 0.0);
                let tile = Tile {
                    head_dim: hd,
                    scale,
                    q: &l.q,
                    limits: &l.limits,
                    k: kbuf,
                    v: vbuf,
                    offs: &l.offs,
                };
                attend(&tile, &mut l.out, &mut l.attn);
                for (i, row) in it.rows.clone().enumerate() {
                    let t = row - base;
                    // SAFETY: the (row, head group) output slice is written by this work
                    // item alone (items are distinct (rows, KV head) pairs) and lies inside
                    // `out` (rows × q_dim).
                    let o = unsafe { out_ptr.slice(t * q_dim + it.kvh * group * hd, group * hd) };
                    o.copy_from_slice(&l.out[i * group * hd..(i + 1) * group * hd]);
                }
            }
        });
    });
}

#[cfg(test)]
mod tests;
