//! Flash-style causal attention of one query tile against paged K/V rows, with an online
//! softmax (running max, running sum, rescaled accumulator), so that each block of key and
//! value rows, loaded once, serves every query row of the tile.
//!
//! This module owns the tile description ([`Tile`]), its execution ([`attend`]), the f64
//! reference ([`attend_reference`]) and the per-thread scratch ([`AttnScratch`]). Which rows
//! form a tile, and where the K/V rows live (block tables), is the caller's business: it
//! passes each key position's element offset.
//!
//! Numerics (batch invariance, bitwise on a given ISA): the keys `0..n` of a query row
//! with limit `n` fall into fixed segments of [`SEGMENT`] keys from position 0, each cut
//! into blocks of [`KEY_BLOCK`] keys walked in increasing order, the last cut at `n`. Within
//! a segment, from `m = -∞, l = 0, acc = 0`: in a block with `c` valid keys the scores are
//! the crate's canonical dot products times `scale`; `m' = max(m, max(scores))`;
//! `p = exp(score - m')` (the vector `exp` on AVX2, its scalar twin on the portable path);
//! `α = exp(m - m')` (0 for the first block); `l = l·α + Σp`, the sum in 8 lanes (lane
//! `j % 8`, keys in order) reduced by the canonical lane tree; `acc = acc·α`, then
//! `acc += p_j·v_j` for `j` in key order (FMA on AVX2, multiply-then-add on the portable
//! path). The segments' `(m, l, acc)` are then folded left in segment order
//! ([`merge_partial`], plain f32 arithmetic on every ISA) and the output is
//! `acc · (1/l)` ([`finish_partial`]). Segments let one long row's keys be split over
//! several compute units ([`attend_segment`]) with exactly the arithmetic of one call.
//!
//! None of it depends on the other rows of the tile (their limits only decide which blocks
//! the tile walks, and a row skips the blocks past its own limit), on the tile's size, on
//! whether segments ran in one call or apart, or on the storage dtype's layout: f16 rows
//! are converted exactly to f32 before use, so f16 K/V gives the f32 arithmetic of the
//! rounded values. A query therefore gets the same bits alone in a decode step as inside
//! any prefill tile.
//!
//! Cost per tile of `R` rows against `N` keys: about `2·R·N·head_dim` multiply-adds, and
//! one read of the `N` key and value rows (the point of tiling: not one read per row).

use std::ops::Range;

use half::f16;

use crate::math::exp_scalar;
use crate::Isa;

mod block;
pub use block::convert_rows;
use block::{block_scores, prefetch_rows, pv_update, runs, softmax_step};

/// Keys per block of the online softmax. Fixed: a row's arithmetic depends on it.
pub const KEY_BLOCK: usize = 32;
const _: () = assert!(
    KEY_BLOCK / 4 * 4 == KEY_BLOCK,
    "score tiles are 4 keys wide"
);
/// Keys per segment (a whole number of blocks). Fixed: a row's arithmetic depends on it.
pub const SEGMENT: usize = 256;
const _: () = assert!(
    SEGMENT / KEY_BLOCK * KEY_BLOCK == SEGMENT,
    "segments are whole blocks"
);

/// Floats per row of a partial result: running max `m`, running sum `l`, then the
/// `head_dim` unnormalized output values `acc`.
pub fn partial_len(head_dim: usize) -> usize {
    head_dim + 2
}

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
/// `head_dim` values each in `q` (row-major), row `r` attending keys
/// `starts[r]..limits[r]`.
#[derive(Debug, Clone, Copy)]
pub struct Tile<'a> {
    pub head_dim: usize,
    /// Multiplies each score (`1/√head_dim` for standard attention).
    pub scale: f32,
    /// Scores become `c · tanh(score / c)` after the scale (Gemma 2's soft-cap).
    pub softcap: Option<f32>,
    pub q: &'a [f32],
    /// Keys each row attends (at least 1 each).
    pub limits: &'a [usize],
    /// The first key each row attends (a sliding window); empty: key 0 for every row.
    /// Keys below a row's start are masked exactly as if absent (their probability is 0).
    pub starts: &'a [usize],
    pub k: KvRows<'a>,
    pub v: KvRows<'a>,
    /// Element offset of key position `first_key + i`'s row (this head's `head_dim` values)
    /// in `k` and `v` at `offs[i]`, for every key the call walks: from [`Tile::first_walked`]
    /// (0 without a window) to the largest limit for [`attend`], segment `seg`'s keys from
    /// there for [`attend_segment`] (then `first_key` may be that first key, so a caller
    /// lists only those).
    pub offs: &'a [usize],
    pub first_key: usize,
}

/// Buffers of [`attend`], reused from call to call (one per thread).
#[derive(Debug, Default)]
pub struct AttnScratch {
    /// One segment's partial result and the running total (rows × [`partial_len`]).
    part: Vec<f32>,
    total: Vec<f32>,
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
    /// `keys`: the key positions the call walks (only their offsets are checked, so a
    /// segment's check costs its own keys, not the whole context).
    fn check(&self, keys: Range<usize>) {
        let (rows, hd) = (self.limits.len(), self.head_dim);
        assert!(hd > 0, "attention: head_dim must be positive");
        assert_eq!(
            self.q.len(),
            rows * hd,
            "attention: q is not rows × head_dim"
        );
        assert!(
            self.limits.iter().all(|&n| n > 0),
            "attention: a row attends no key"
        );
        assert!(
            self.starts.is_empty()
                || (self.starts.len() == rows
                    && self.starts.iter().zip(self.limits).all(|(s, n)| s < n)),
            "attention: a row's window starts at or past its limit"
        );
        if keys.is_empty() {
            return;
        }
        assert!(
            keys.start >= self.first_key && keys.end - self.first_key <= self.offs.len(),
            "attention: fewer offsets than keys"
        );
        let (kl, vl) = (self.k.len(), self.v.len());
        assert!(
            self.offs_of(keys)
                .iter()
                .all(|&o| o + hd <= kl && o + hd <= vl),
            "attention: a key row lies outside K or V"
        );
    }

    /// The offsets of key positions `keys` (within the listed ones).
    fn offs_of(&self, keys: Range<usize>) -> &[usize] {
        &self.offs[keys.start - self.first_key..keys.end - self.first_key]
    }

    /// The largest limit: keys `0..max_keys()` are attended by some row.
    fn max_keys(&self) -> usize {
        self.limits.iter().copied().max().unwrap_or(0)
    }

    /// The first key any row attends, rounded down to its key block: the first key a call
    /// walks (its offsets must be listed from there).
    pub fn first_walked(&self) -> usize {
        self.starts.iter().copied().min().unwrap_or(0) / KEY_BLOCK * KEY_BLOCK
    }

    /// Row `r`'s first key.
    fn start(&self, r: usize) -> usize {
        self.starts.get(r).copied().unwrap_or(0)
    }

    /// Keys of segment `seg` the call walks: below the largest limit, from
    /// [`Tile::first_walked`].
    fn segment_keys(&self, seg: usize) -> Range<usize> {
        let k = segment_keys(seg, self.max_keys());
        k.start.max(self.first_walked()).min(k.end)..k.end
    }
}

/// The keys of segment `seg` of a row set whose largest limit is `n`: the positions
/// `seg · SEGMENT .. (seg + 1) · SEGMENT` below `n` (empty past the last segment).
pub fn segment_keys(seg: usize, n: usize) -> Range<usize> {
    (seg * SEGMENT).min(n)..((seg + 1) * SEGMENT).min(n)
}

/// `out[r] = softmax(scale · q[r] · K[0..limits[r]]ᵀ) · V[0..limits[r]]` for every row of
/// `tile`, on the active ISA (see the module's numerics).
pub fn attend(tile: &Tile, out: &mut [f32], scratch: &mut AttnScratch) {
    attend_on(Isa::active(), tile, out, scratch)
}

/// Panics unless this CPU runs `isa` (the SIMD paths' safety rests on it).
fn assert_supported(isa: Isa) {
    assert!(
        isa == Isa::Generic || isa == Isa::detect(),
        "attention: this CPU does not support {}",
        isa.name()
    );
}

/// [`attend`] on a given ISA (tests compare the two paths); panics if the CPU lacks it.
pub fn attend_on(isa: Isa, tile: &Tile, out: &mut [f32], scratch: &mut AttnScratch) {
    assert_supported(isa);
    tile.check(tile.first_walked()..tile.max_keys());
    let (rows, hd) = (tile.limits.len(), tile.head_dim);
    assert_eq!(
        out.len(),
        rows * hd,
        "attention: out is not rows × head_dim"
    );
    let pl = partial_len(hd);
    let max_n = tile.limits.iter().copied().max().unwrap_or(0);
    let mut total = std::mem::take(&mut scratch.total);
    let mut part = std::mem::take(&mut scratch.part);
    empty_partial(&mut total, rows * pl, hd);
    part.resize(rows * pl, 0.0);
    for seg in tile.first_walked() / SEGMENT..max_n.div_ceil(SEGMENT) {
        run_segment(isa, tile, seg, &mut part, scratch);
        merge_partial(hd, &mut total, &part);
    }
    finish_partial(hd, &total, out);
    scratch.total = total;
    scratch.part = part;
}

/// `part` (rows × [`partial_len`]) set to every row's partial result over segment `seg`
/// alone (keys `seg·SEGMENT..(seg + 1)·SEGMENT` below its limit; a row with none there gets
/// `m = -∞, l = 0, acc = 0`), on the active ISA. Folding the segments `0, 1, …` in order
/// with [`merge_partial`] into an empty total and finishing it gives [`attend`]'s bits.
pub fn attend_segment(tile: &Tile, seg: usize, part: &mut [f32], scratch: &mut AttnScratch) {
    let isa = Isa::active();
    assert_supported(isa);
    let pl = partial_len(tile.head_dim);
    tile.check(tile.segment_keys(seg));
    assert_eq!(
        part.len(),
        tile.limits.len() * pl,
        "attention: partial is not rows × partial_len"
    );
    run_segment(isa, tile, seg, part, scratch);
}

/// An empty total of `len` floats (`m = -∞`, `l = 0`, `acc = 0` per row).
pub fn empty_partial(total: &mut Vec<f32>, len: usize, head_dim: usize) {
    let pl = partial_len(head_dim);
    total.clear();
    total.resize(len, 0.0);
    for r in total.chunks_exact_mut(pl) {
        r[0] = f32::NEG_INFINITY;
    }
}

/// Folds one segment's partial result into the running total, row by row:
/// `m' = max(m, mₛ)`, `a = exp(m - m')`, `b = exp(mₛ - m')`, `l = l·a + lₛ·b`,
/// `acc = acc·a + accₛ·b` (a row with no key in the segment is skipped; into an empty row
/// the segment is copied). Plain f32 arithmetic, the same on every ISA.
pub fn merge_partial(head_dim: usize, total: &mut [f32], part: &[f32]) {
    let pl = partial_len(head_dim);
    assert_eq!(
        total.len(),
        part.len(),
        "attention: partials differ in size"
    );
    for (t, p) in total.chunks_exact_mut(pl).zip(part.chunks_exact(pl)) {
        if p[0] == f32::NEG_INFINITY {
            continue;
        }
        if t[0] == f32::NEG_INFINITY {
            t.copy_from_slice(p);
            continue;
        }
        let m = t[0].max(p[0]);
        let (a, b) = (exp_scalar(t[0] - m), exp_scalar(p[0] - m));
        t[0] = m;
        t[1] = t[1] * a + p[1] * b;
        for (x, &y) in t[2..].iter_mut().zip(&p[2..]) {
            *x = *x * a + y * b;
        }
    }
}

/// `out[r] = acc[r] · (1/l[r])` for every row of a total (rows × head_dim outputs).
pub fn finish_partial(head_dim: usize, total: &[f32], out: &mut [f32]) {
    let pl = partial_len(head_dim);
    assert_eq!(
        total.len() / pl * head_dim,
        out.len(),
        "attention: out does not match the total"
    );
    for (t, o) in total.chunks_exact(pl).zip(out.chunks_exact_mut(head_dim)) {
        let inv = 1.0 / t[1];
        for (o, &a) in o.iter_mut().zip(&t[2..]) {
            *o = a * inv;
        }
    }
}

/// Every row's online softmax over the blocks of segment `seg` from a fresh state, into
/// `part` (rows × [`partial_len`]).
fn run_segment(isa: Isa, tile: &Tile, seg: usize, part: &mut [f32], scratch: &mut AttnScratch) {
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
        ..
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
    let keys = tile.segment_keys(seg);
    let end = keys.end;
    for b0 in keys.step_by(KEY_BLOCK) {
        let bn = KEY_BLOCK.min(end - b0);
        // The next block's K and V rows, into L2 while this one runs: a long context's
        // rows come from DRAM (hints only; no effect on any value).
        let next = (b0 + KEY_BLOCK).min(end)..(b0 + 2 * KEY_BLOCK).min(end);
        prefetch_rows(tile.k, tile.offs_of(next.clone()), hd);
        prefetch_rows(tile.v, tile.offs_of(next), hd);
        for (r, (c, &n)) in valid.iter_mut().zip(tile.limits).enumerate() {
            *c = n.saturating_sub(b0).min(bn);
            // A row whose window starts past this block has nothing in it.
            if tile.start(r) >= b0 + bn {
                *c = 0;
            }
        }
        // This block's K and V rows: in place for f32, converted into the scratch for f16.
        let (kbuf, vbuf, offs): (&[f32], &[f32], &[usize]) = match (tile.k, tile.v) {
            (KvRows::F32(k), KvRows::F32(v)) => (k, v, tile.offs_of(b0..b0 + bn)),
            _ => {
                convert_rows(isa, tile.k, tile.offs_of(b0..b0 + bn), hd, kblk);
                convert_rows(isa, tile.v, tile.offs_of(b0..b0 + bn), hd, vblk);
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
            let row = &mut scores[r * KEY_BLOCK..r * KEY_BLOCK + c];
            if let Some(cap) = tile.softcap {
                row.iter_mut().for_each(|s| *s = (*s / cap).tanh() * cap);
            }
            // Keys below the window: out of the max, then probability 0 (the key at the
            // start is in this block, so the max is finite).
            let masked = tile.start(r).saturating_sub(b0).min(c);
            row[..masked].fill(f32::NEG_INFINITY);
            let (m_new, sum) = softmax_step(isa, row, m[r]);
            row[..masked].fill(0.0);
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
    let pl = partial_len(hd);
    for (r, p) in part.chunks_exact_mut(pl).enumerate() {
        p[0] = m[r];
        p[1] = l[r];
        p[2..].copy_from_slice(&acc[r * hd..(r + 1) * hd]);
    }
}

/// The straightforward definition in f64: all scores, a full softmax, the weighted sum.
pub fn attend_reference(tile: &Tile) -> Vec<f64> {
    assert_eq!(
        tile.first_key, 0,
        "attention reference: offsets must start at key 0"
    );
    let hd = tile.head_dim;
    let val = |b: KvRows, i: usize| match b {
        KvRows::F32(x) => x[i] as f64,
        KvRows::F16(x) => x[i].to_f64(),
    };
    let mut out = Vec::with_capacity(tile.limits.len() * hd);
    for (r, &n) in tile.limits.iter().enumerate() {
        let q = &tile.q[r * hd..(r + 1) * hd];
        let keys = tile.start(r)..n;
        let s: Vec<f64> = keys
            .clone()
            .map(|p| {
                let dot: f64 = (0..hd)
                    .map(|d| q[d] as f64 * val(tile.k, tile.offs[p] + d))
                    .sum();
                let s = dot * tile.scale as f64;
                match tile.softcap {
                    Some(c) => (s / c as f64).tanh() * c as f64,
                    None => s,
                }
            })
            .collect();
        let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum();
        for d in 0..hd {
            let num: f64 = keys
                .clone()
                .zip(&e)
                .map(|(p, e)| e * val(tile.v, tile.offs[p] + d))
                .sum();
            out.push(num / z);
        }
    }
    out
}

#[cfg(test)]
mod tests;
