//! Causal grouped-query attention over paged KV storage, tiled flash-style.
//!
//! Each new token attends to its own sequence's positions `0..=pos`, read through the
//! sequence's block table. Work items ([`plan`]) are (query tile, KV head) pairs: a tile is
//! up to [`TILE_TOKENS`] consecutive rows of one sequence, and its query rows are those
//! tokens × the query heads sharing the KV head, so each K/V row the kernel loads serves all
//! of them ([`tessera_kernels::attn`]). A tile too big for the units to share (a long
//! decode) runs as one item per key segment, whose partial results a second pass merges.
//! Items are spread over the compute units by a static longest-first assignment weighted by
//! keys attended (later tiles attend more).
//!
//! Batch invariance: the kernel's arithmetic for a query row depends only on its own
//! position, query and K/V (fixed key segments and blocks from position 0, the last cut at
//! the row's own limit, segments folded in order), never on the tile it lands in or on
//! whether its segments ran apart, so how rows are tiled, split or assigned — a prefill
//! chunk of hundreds of rows or a lone decode token — changes no bit of any result.

use std::cell::RefCell;
use std::ops::Range;

use tessera_kernels::attn::{
    attend, attend_segment, empty_partial, finish_partial, merge_partial, partial_len,
    segment_keys, AttnScratch, Tile, KEY_BLOCK,
};
use tessera_runtime::{split_range, DisjointMut, ThreadPool};

use crate::kv::KvStorage;
use crate::prepared::PreparedBatch;

mod plan;
pub use plan::TILE_TOKENS;
use plan::{assign, Item};

/// An item's query rows (its tokens × the group's heads, token-major), their key limits
/// and window starts, and the offsets of the keys it walks (from key `first_key`).
#[derive(Default)]
struct Gathered {
    q: Vec<f32>,
    limits: Vec<usize>,
    starts: Vec<usize>,
    offs: Vec<usize>,
    first_key: usize,
}

/// One unit's buffers: the gathered tile, its output rows, a merged total, and the
/// kernel's scratch.
#[derive(Default)]
struct Local {
    g: Gathered,
    out: Vec<f32>,
    total: Vec<f32>,
    attn: AttnScratch,
}

thread_local! {
    static LOCAL: RefCell<Local> = RefCell::new(Local::default());
}

pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Multiplies the scores (1/√head_dim, or the family's query scale).
    pub scale: f32,
    /// Gemma 2's score soft-cap.
    pub softcap: Option<f32>,
    /// A local layer's window: position `p` attends keys `p - w + 1 ..= p`.
    pub window: Option<usize>,
}

/// `out[t, h·d..] = softmax(scale · q_t,h · K_{s..=pos}ᵀ) · V_{s..=pos}` for every row `t` of
/// `rows` (a sub-batch of the prepared step; `t` counted from `rows.start`), with `s = 0`,
/// or `pos + 1 - w` in a window of `w` keys. `q`: the rows'
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
    let base = rows.start;
    let (scale, window) = (shape.scale, shape.window);
    let (kbuf, vbuf) = kv.layer(layer);
    let work = assign(batch, rows, nkv, group, hd, window, pool.units());
    let mut partials = vec![0f32; work.partial_floats];
    let part_ptr = DisjointMut::new(&mut partials);
    let out_ptr = DisjointMut::new(out);
    let pl = partial_len(hd);
    // The output rows of (tile rows, KV head): every token's group of heads.
    let put = |rows: Range<usize>, kvh: usize, tile_out: &[f32]| {
        for (i, row) in rows.enumerate() {
            let t = row - base;
            // SAFETY: the (row, head group) output slice is written by one work item or
            // split alone (they are distinct (rows, KV head) pairs) and lies inside `out`
            // (rows × q_dim).
            let o = unsafe { out_ptr.slice(t * q_dim + kvh * group * hd, group * hd) };
            o.copy_from_slice(&tile_out[i * group * hd..(i + 1) * group * hd]);
        }
    };
    pool.run(|unit| {
        LOCAL.with(|local| {
            let l = &mut *local.borrow_mut();
            for it in &work.per_unit[unit] {
                let seg = it.part.map(|(_, s)| s);
                gather(
                    &mut l.g, batch, it, seg, kv, layer, q, q_stride, base, group, hd, window,
                );
                let tile = Tile {
                    head_dim: hd,
                    scale,
                    softcap: shape.softcap,
                    q: &l.g.q,
                    limits: &l.g.limits,
                    starts: &l.g.starts,
                    k: kbuf,
                    v: vbuf,
                    offs: &l.g.offs,
                    first_key: l.g.first_key,
                };
                match it.part {
                    None => {
                        l.out.resize(l.g.q.len(), 0.0);
                        attend(&tile, &mut l.out, &mut l.attn);
                        put(it.rows.clone(), it.kvh, &l.out);
                    }
                    Some((split, s)) => {
                        let sp = &work.splits[split];
                        let n = sp.rows.len() * group * pl;
                        // SAFETY: segment `s` of split `split` owns these partials alone
                        // (`assign` lays the splits' segments out one after another).
                        let part = unsafe { part_ptr.slice(sp.offset + (s - sp.first) * n, n) };
                        attend_segment(&tile, s, part, &mut l.attn);
                    }
                }
            }
        });
    });
    if work.splits.is_empty() {
        return;
    }
    let units = pool.units();
    pool.run(|unit| {
        LOCAL.with(|local| {
            let l = &mut *local.borrow_mut();
            for sp in &work.splits[split_range(work.splits.len(), units, unit)] {
                let n = sp.rows.len() * group * pl;
                empty_partial(&mut l.total, n, hd);
                for s in 0..sp.segments {
                    merge_partial(hd, &mut l.total, &partials[sp.offset + s * n..][..n]);
                }
                l.out.resize(sp.rows.len() * group * hd, 0.0);
                finish_partial(hd, &l.total, &mut l.out);
                put(sp.rows.clone(), sp.kvh, &l.out);
            }
        });
    });
}

/// Fills `g` with item `it`'s query rows, their key limits and window starts, and the
/// offsets of the keys it walks (segment `seg`'s only, when given: the kernel reads no
/// other; from the first key block a window reaches, otherwise).
#[allow(clippy::too_many_arguments)]
fn gather(
    g: &mut Gathered,
    batch: &PreparedBatch,
    it: &Item,
    seg: Option<usize>,
    kv: &KvStorage,
    layer: usize,
    q: &[f32],
    q_stride: usize,
    base: usize,
    group: usize,
    hd: usize,
    window: Option<usize>,
) {
    let table = batch.table_for(
        batch.row_seq[it.rows.start] as usize,
        kv.in_window_group(layer),
    );
    g.q.clear();
    g.limits.clear();
    g.starts.clear();
    for row in it.rows.clone() {
        let h0 = (row - base) * q_stride + it.kvh * group * hd;
        g.q.extend_from_slice(&q[h0..h0 + group * hd]);
        let n = batch.positions[row] + 1;
        g.limits.extend(std::iter::repeat_n(n, group));
        if let Some(w) = window {
            g.starts
                .extend(std::iter::repeat_n(n.saturating_sub(w), group));
        }
    }
    let n = g.limits.iter().copied().max().unwrap_or(0);
    let first = g.starts.iter().copied().min().unwrap_or(0) / KEY_BLOCK * KEY_BLOCK;
    let keys = match seg {
        None => first..n,
        Some(s) => {
            let k = segment_keys(s, n);
            k.start.max(first).min(k.end)..k.end
        }
    };
    g.first_key = keys.start;
    g.offs.clear();
    g.offs
        .extend(keys.map(|p| kv.offset(table, p) + it.kvh * hd));
}

#[cfg(test)]
mod tests;
