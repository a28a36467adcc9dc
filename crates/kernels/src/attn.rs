//! Flash-style causal attention of one query tile against paged K/V rows, with an online
//! softmax (running max, running sum, rescaled accumulator), so that each block of key and
//! value rows, loaded once, serves every query row of the tile.
//!
//! This module owns the tile description ([`Tile`]), its execution ([`attend`]), the f64
//! reference ([`attend_reference`]) and the per-thread scratch ([`AttnScratch`]). Which rows
//! form a tile, and where the K/V rows live (block tables), is the caller's business: it
//! passes each key position's element offset.
//!
//! Numerics (batch invariance, bitwise on a given ISA): a query row with limit `n` (it
//! attends keys `0..n`) walks the key blocks `[0, B), [B, 2B), …` in increasing order
//! ([`KEY_BLOCK`] = B), the last one cut at `n`. In a block with `c` valid keys its scores
//! are the crate's canonical dot products times `scale`; `m' = max(m, max(scores))`;
//! `p = exp(score - m')` (the vector `exp` on AVX2, its scalar twin on the portable path);
//! `α = exp(m - m')` (0 for the first block); `l = l·α + Σp`, the sum in 8 lanes (lane
//! `j % 8`, keys in order) reduced by the canonical lane tree;
//! `acc = acc·α`, then `acc += p_j·v_j` for `j` in key order (FMA on AVX2, multiply-then-add
//! on the portable path). The output is `acc · (1/l)`. None of it depends on the other rows
//! of the tile (their limits only decide which blocks the tile walks, and a row skips the
//! blocks past its own limit), on the tile's size, or on the storage dtype's layout: f16
//! rows are converted exactly to f32 before use, so f16 K/V gives the f32 arithmetic of the
//! rounded values. A query therefore gets the same bits alone in a decode step as inside any
//! prefill tile.
//!
//! Cost per tile of `R` rows against `N` keys: about `2·R·N·head_dim` multiply-adds, and
//! one read of the `N` key and value rows (the point of tiling: not one read per row).

use half::f16;

use crate::generic::{dot_f32, reduce_lanes, LANES};
use crate::math::exp_scalar;
use crate::Isa;

/// Keys per block of the online softmax. Fixed: a row's arithmetic depends on it.
pub const KEY_BLOCK: usize = 32;
const _: () = assert!(KEY_BLOCK % 4 == 0, "score tiles are 4 keys wide");

/// One layer's K or V buffer as stored.
#[derive(Debug, Clone, Copy)]
pub enum KvRows<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
}

impl KvRows<'_> {
    pub fn len(&self) -> usize {
        match self {
            KvRows::F32(b) => b.len(),
            KvRows::F16(b) => b.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A tile of query rows of one sequence sharing one KV head: `rows = limits.len()` rows of
/// `head_dim` values each in `q` (row-major), row `r` attending keys `0..limits[r]`.
#[derive(Debug, Clone, Copy)]
pub struct Tile<'a> {
    pub head_dim: usize,
    /// Multiplies each score (`1/√head_dim` for standard attention).
    pub scale: f32,
    pub q: &'a [f32],
    /// Keys each row attends (at least 1 each).
    pub limits: &'a [usize],
    pub k: KvRows<'a>,
    pub v: KvRows<'a>,
    /// Element offset of key position `p`'s row (this head's `head_dim` values) in `k` and
    /// `v`, for every `p` below the largest limit.
    pub offs: &'a [usize],
}

/// Buffers of [`attend`], reused from call to call (one per thread).
#[derive(Debug, Default)]
pub struct AttnScratch {
    scores: Vec<f32>,
    acc: Vec<f32>,
    m: Vec<f32>,
    l: Vec<f32>,
    alpha: Vec<f32>,
    valid: Vec<usize>,
    /// f16 blocks converted to f32, and their row offsets.
    kblk: Vec<f32>,
    vblk: Vec<f32>,
    blk_offs: Vec<usize>,
}

impl Tile<'_> {
    /// Panics with a message naming the broken invariant (the caller validates its input).
    fn check(&self, out: &[f32]) {
        let (rows, hd) = (self.limits.len(), self.head_dim);
        assert!(hd > 0, "attention: head_dim must be positive");
        assert_eq!(
            self.q.len(),
            rows * hd,
            "attention: q is not rows × head_dim"
        );
        assert_eq!(
            out.len(),
            rows * hd,
            "attention: out is not rows × head_dim"
        );
        assert!(
            self.limits.iter().all(|&n| n > 0),
            "attention: a row attends no key"
        );
        let n = self.limits.iter().copied().max().unwrap_or(0);
        assert!(self.offs.len() >= n, "attention: fewer offsets than keys");
        let (kl, vl) = (self.k.len(), self.v.len());
        assert!(
            self.offs[..n].iter().all(|&o| o + hd <= kl && o + hd <= vl),
            "attention: a key row lies outside K or V"
        );
    }
}

/// `out[r] = softmax(scale · q[r] · K[0..limits[r]]ᵀ) · V[0..limits[r]]` for every row of
/// `tile`, on the active ISA (see the module's numerics).
pub fn attend(tile: &Tile, out: &mut [f32], scratch: &mut AttnScratch) {
    attend_on(Isa::active(), tile, out, scratch)
}

/// [`attend`] on a given ISA (tests compare the two paths); `isa` must be supported.
pub fn attend_on(isa: Isa, tile: &Tile, out: &mut [f32], scratch: &mut AttnScratch) {
    tile.check(out);
    let (rows, hd) = (tile.limits.len(), tile.head_dim);
    let AttnScratch {
        scores,
        acc,
        m,
        l,
        alpha,
        valid,
        kblk,
        vblk,
        blk_offs,
    } = scratch;
    scores.resize(rows * KEY_BLOCK, 0.0);
    acc.clear();
    acc.resize(rows * hd, 0.0);
    m.clear();
    m.resize(rows, f32::NEG_INFINITY);
    l.clear();
    l.resize(rows, 0.0);
    alpha.resize(rows, 0.0);
    valid.resize(rows, 0);
    let max_n = tile.limits.iter().copied().max().unwrap_or(0);
    for b0 in (0..max_n).step_by(KEY_BLOCK) {
        let bn = KEY_BLOCK.min(max_n - b0);
        for (c, &n) in valid.iter_mut().zip(tile.limits) {
            *c = n.saturating_sub(b0).min(bn);
        }
        // This block's K and V rows: in place for f32, converted into the scratch for f16.
        let (kbuf, vbuf, offs): (&[f32], &[f32], &[usize]) = match (tile.k, tile.v) {
            (KvRows::F32(k), KvRows::F32(v)) => (k, v, &tile.offs[b0..b0 + bn]),
            _ => {
                convert_rows(isa, tile.k, &tile.offs[b0..b0 + bn], hd, kblk);
                convert_rows(isa, tile.v, &tile.offs[b0..b0 + bn], hd, vblk);
                blk_offs.clear();
                blk_offs.extend((0..bn).map(|j| j * hd));
                (kblk, vblk, blk_offs)
            }
        };
        for run in runs(valid) {
            block_scores(isa, tile, run, kbuf, offs, scores);
        }
        for r in 0..rows {
            let c = valid[r];
            if c == 0 {
                continue;
            }
            let (m_new, sum) =
                softmax_step(isa, &mut scores[r * KEY_BLOCK..r * KEY_BLOCK + c], m[r]);
            alpha[r] = if m[r] == f32::NEG_INFINITY {
                0.0
            } else {
                exp_scalar(m[r] - m_new)
            };
            l[r] = l[r] * alpha[r] + sum;
            m[r] = m_new;
        }
        for run in runs(valid) {
            pv_update(isa, run, hd, acc, scores, alpha, vbuf, offs);
        }
    }
    for r in 0..rows {
        let inv = 1.0 / l[r];
        for (o, &a) in out[r * hd..(r + 1) * hd]
            .iter_mut()
            .zip(&acc[r * hd..(r + 1) * hd])
        {
            *o = a * inv;
        }
    }
}

/// One row's online-softmax step over its block scores `s`: returns `m' = max(m, s)` and
/// `Σ exp(s - m')`, leaving the exponentials in `s`. The sum runs in 8 lanes (lane `j % 8`,
/// keys in order from zero) reduced by the canonical lane tree, on both ISAs.
fn softmax_step(isa: Isa, s: &mut [f32], m: f32) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2Fma {
        // SAFETY: AVX2+FMA checked by the caller's ISA; `s` is a live slice of its length
        // (at least 1: only rows with valid keys get here).
        return unsafe { crate::x86::avx2_attn::softmax_step(s.as_mut_ptr(), s.len(), m) };
    }
    let _ = isa;
    let m_new = s.iter().copied().fold(m, f32::max);
    let mut lanes = [0f32; LANES];
    for (j, x) in s.iter_mut().enumerate() {
        *x = exp_scalar(*x - m_new);
        lanes[j % LANES] += *x;
    }
    (m_new, reduce_lanes(&lanes))
}

/// Runs of at most 3 consecutive rows with the same positive count of valid keys in the
/// block: `(first row, rows, keys)`.
fn runs(valid: &[usize]) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
    let mut r = 0;
    std::iter::from_fn(move || {
        while r < valid.len() && valid[r] == 0 {
            r += 1;
        }
        if r == valid.len() {
            return None;
        }
        let (r0, c) = (r, valid[r]);
        while r < valid.len() && r - r0 < 3 && valid[r] == c {
            r += 1;
        }
        Some((r0, r - r0, c))
    })
}

/// The block's scores of rows `r0..r0 + nr` against its first `c` keys into
/// `scores[row · KEY_BLOCK + j]`, each the canonical dot times `tile.scale`.
fn block_scores(
    isa: Isa,
    tile: &Tile,
    (r0, nr, c): (usize, usize, usize),
    kbuf: &[f32],
    offs: &[usize],
    scores: &mut [f32],
) {
    let hd = tile.head_dim;
    let qrow = |r: usize| &tile.q[r * hd..(r + 1) * hd];
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2Fma {
        // Rows past the run's end repeat its last one (writing the same values again);
        // keys past `c` repeat its last one into score slots below KEY_BLOCK that the
        // softmax never reads (j0 + 4 <= KEY_BLOCK: j0 is a multiple of 4 below c).
        let a_row = |a: usize| r0 + a.min(nr - 1);
        let xs: [*const f32; 3] = std::array::from_fn(|a| qrow(a_row(a)).as_ptr());
        let sp = scores.as_mut_ptr();
        assert!(scores.len() >= (r0 + nr) * KEY_BLOCK);
        for j0 in (0..c).step_by(4) {
            let nk = (c - j0).min(4);
            let ws: [*const f32; 4] =
                std::array::from_fn(|b| kbuf[offs[j0 + b.min(nk - 1)]..].as_ptr());
            // SAFETY (of the `add`): inside `scores`, asserted above.
            let outs: [*mut f32; 3] =
                std::array::from_fn(|a| unsafe { sp.add(a_row(a) * KEY_BLOCK + j0) });
            // SAFETY: AVX2+FMA checked by the caller's ISA; every q row holds `hd` values
            // and every key row starts at an offset with `hd` values after it (checked by
            // `Tile::check`, or built so for converted blocks); each output has 4 slots
            // inside its row of `scores` (see above).
            unsafe { crate::x86::avx2_attn::scores_3x4(xs, ws, hd, tile.scale, outs) };
        }
        return;
    }
    let _ = isa;
    for r in r0..r0 + nr {
        for j in 0..c {
            let k = &kbuf[offs[j]..offs[j] + hd];
            scores[r * KEY_BLOCK + j] = dot_f32(qrow(r), k) * tile.scale;
        }
    }
}

/// `acc[r] = acc[r]·α[r] + Σ_j p[r][j]·v_j` for the rows of one run, keys in order.
#[allow(clippy::too_many_arguments)]
fn pv_update(
    isa: Isa,
    (r0, nr, c): (usize, usize, usize),
    hd: usize,
    acc: &mut [f32],
    scores: &[f32],
    alpha: &[f32],
    vbuf: &[f32],
    offs: &[usize],
) {
    let offs = &offs[..c];
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2Fma {
        let acc = acc[r0 * hd..].as_mut_ptr();
        let p = |a: usize| scores[(r0 + a) * KEY_BLOCK..].as_ptr();
        let al = |a: usize| alpha[r0 + a];
        // SAFETY: AVX2+FMA checked by the caller's ISA; rows r0..r0+nr of `acc` (hd each)
        // and of `scores` (c ≤ KEY_BLOCK each) lie inside those buffers; every
        // `offs[j] + hd <= vbuf.len()` (`Tile::check`, or built so for converted blocks).
        unsafe {
            use crate::x86::avx2_attn::pv_update as pv;
            match nr {
                1 => pv::<1>([acc], [al(0)], [p(0)], vbuf, offs, hd),
                2 => pv::<2>(
                    [acc, acc.add(hd)],
                    [al(0), al(1)],
                    [p(0), p(1)],
                    vbuf,
                    offs,
                    hd,
                ),
                _ => pv::<3>(
                    [acc, acc.add(hd), acc.add(2 * hd)],
                    [al(0), al(1), al(2)],
                    [p(0), p(1), p(2)],
                    vbuf,
                    offs,
                    hd,
                ),
            }
        }
        return;
    }
    let _ = isa;
    for r in r0..r0 + nr {
        let (alpha, acc) = (alpha[r], &mut acc[r * hd..(r + 1) * hd]);
        acc.iter_mut().for_each(|a| *a *= alpha);
        for (j, &off) in offs.iter().enumerate() {
            let p = scores[r * KEY_BLOCK + j];
            for (a, &v) in acc.iter_mut().zip(&vbuf[off..off + hd]) {
                *a += p * v;
            }
        }
    }
}

/// The rows at `offs` (`hd` values each) converted to f32 (exactly), one after another,
/// into `dst`; F16C on AVX2.
pub fn convert_rows(isa: Isa, src: KvRows, offs: &[usize], hd: usize, dst: &mut Vec<f32>) {
    assert!(
        offs.iter().all(|&o| o + hd <= src.len()),
        "convert_rows: a row lies outside the buffer"
    );
    dst.resize(offs.len() * hd, 0.0);
    match src {
        KvRows::F32(b) => {
            for (j, &off) in offs.iter().enumerate() {
                dst[j * hd..(j + 1) * hd].copy_from_slice(&b[off..off + hd]);
            }
        }
        #[cfg(target_arch = "x86_64")]
        KvRows::F16(b) if isa == Isa::Avx2Fma => {
            // SAFETY: AVX2+F16C checked by the caller's ISA; rows inside `b` (asserted
            // above); `dst` holds exactly offs.len() · hd values.
            unsafe { crate::x86::avx2_attn::f16_rows_to_f32(b, offs, hd, dst) }
        }
        KvRows::F16(b) => {
            let _ = isa;
            for (j, &off) in offs.iter().enumerate() {
                for (d, s) in dst[j * hd..(j + 1) * hd].iter_mut().zip(&b[off..off + hd]) {
                    *d = s.to_f32();
                }
            }
        }
    }
}

/// The straightforward definition in f64: all scores, a full softmax, the weighted sum.
pub fn attend_reference(tile: &Tile) -> Vec<f64> {
    let hd = tile.head_dim;
    let val = |b: KvRows, i: usize| match b {
        KvRows::F32(x) => x[i] as f64,
        KvRows::F16(x) => x[i].to_f64(),
    };
    let mut out = Vec::with_capacity(tile.limits.len() * hd);
    for (r, &n) in tile.limits.iter().enumerate() {
        let q = &tile.q[r * hd..(r + 1) * hd];
        let s: Vec<f64> = (0..n)
            .map(|p| {
                let dot: f64 = (0..hd)
                    .map(|d| q[d] as f64 * val(tile.k, tile.offs[p] + d))
                    .sum();
                dot * tile.scale as f64
            })
            .collect();
        let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum();
        for d in 0..hd {
            let num: f64 = (0..n).map(|p| e[p] * val(tile.v, tile.offs[p] + d)).sum();
            out.push(num / z);
        }
    }
    out
}

#[cfg(test)]
mod tests;
