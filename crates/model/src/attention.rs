//! Causal grouped-query attention over paged KV storage.
//!
//! Each new token attends to its own sequence's positions `0..=pos`, read through the
//! sequence's block table. Work items are (token, KV head) pairs, split statically over the
//! compute units. For a given query the scores, softmax and weighted sum of V run over
//! positions in increasing order whatever else is in the batch, so results are
//! batch-invariant.

use std::cell::RefCell;

use tessera_runtime::{DisjointMut, ThreadPool};

use std::ops::Range;

use crate::kv::KvStorage;
use crate::prepared::PreparedBatch;

thread_local! {
    static SCORES: RefCell<(Vec<f32>, Vec<usize>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
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
    let items = rows.len() * nkv;
    let (kbuf, vbuf) = kv.layer(layer);
    let out_ptr = DisjointMut::new(out);
    let units = pool.units();
    pool.run(|unit| {
        SCORES.with(|scores| {
            let (scores, offs) = &mut *scores.borrow_mut();
            // Items interleaved over units: later tokens attend to more positions, so
            // contiguous ranges would leave the last unit with most of a prefill's work.
            for item in (unit..items).step_by(units) {
                let (t, kvh) = (item / nkv, item % nkv);
                let row = base + t;
                let table = batch.table(batch.row_seq[row] as usize);
                let n = batch.positions[row] + 1;
                scores.resize(group * n, 0.0);
                let qh = |h: usize| &q[t * q_stride + h * hd..t * q_stride + (h + 1) * hd];
                // Element offsets of this head's K/V rows for positions 0..n (block tables
                // make them non-contiguous across blocks).
                offs.clear();
                offs.extend((0..n).map(|p| kv.offset(table, p) + kvh * hd));
                // Scores of the group's query heads against 4 positions at a time.
                for h0 in (0..group).step_by(3) {
                    let nh = (group - h0).min(3);
                    let hs: [&[f32]; 3] =
                        std::array::from_fn(|a| qh(kvh * group + h0 + a.min(nh - 1)));
                    for p0 in (0..n).step_by(4) {
                        let np = (n - p0).min(4);
                        let ks: [&[f32]; 4] = std::array::from_fn(|b| {
                            let off = offs[p0 + b.min(np - 1)];
                            &kbuf[off..off + hd]
                        });
                        tessera_kernels::dot_tile(&hs[..nh], &ks[..np], &mut |a, b, v| {
                            scores[(h0 + a) * n + p0 + b] = v * scale;
                        });
                    }
                }
                for g in 0..group {
                    tessera_kernels::ops::softmax(&mut scores[g * n..(g + 1) * n]);
                }
                let vrows = &vbuf[..];
                for g0 in (0..group).step_by(3) {
                    let ng = (group - g0).min(3);
                    // SAFETY: the (t, head) output slices are owned by this work item alone,
                    // distinct per head, and inside `out`.
                    let mut outs: Vec<&mut [f32]> = (g0..g0 + ng)
                        .map(|g| unsafe { out_ptr.slice(t * q_dim + (kvh * group + g) * hd, hd) })
                        .collect();
                    let ws: Vec<&[f32]> =
                        (g0..g0 + ng).map(|g| &scores[g * n..(g + 1) * n]).collect();
                    tessera_kernels::weighted_rows(&mut outs, &ws, vrows, offs);
                }
            }
        });
    });
}
