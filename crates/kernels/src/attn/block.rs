//! One key block's steps of the tiled attention: the rows' scores against the block's
//! keys, each row's online-softmax step, the accumulators' rescale-and-add update, and the
//! conversion of stored rows to f32. Each dispatches to AVX2 or its portable twin.

use super::{KvRows, Tile, KEY_BLOCK};
use crate::generic::{dot_f32, reduce_lanes, LANES};
use crate::math::exp_scalar;
use crate::Isa;

/// One row's online-softmax step over its block scores `s`: returns `m' = max(m, s)` and
/// `Σ exp(s - m')`, leaving the exponentials in `s`. The sum runs in 8 lanes (lane `j % 8`,
/// keys in order from zero) reduced by the canonical lane tree, on both ISAs.
pub(super) fn softmax_step(isa: Isa, s: &mut [f32], m: f32) -> (f32, f32) {
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
pub(super) fn runs(valid: &[usize]) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
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
pub(super) fn block_scores(
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
pub(super) fn pv_update(
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
/// into `dst`; F16C on AVX2 (panics if the CPU lacks `isa`).
pub fn convert_rows(isa: Isa, src: KvRows, offs: &[usize], hd: usize, dst: &mut Vec<f32>) {
    super::assert_supported(isa);
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

/// Prefetch hints (into L2) for the rows at `offs` (`hd` values each) of `src`. Hints only:
/// they never fault and change no value (on other architectures, nothing).
pub(super) fn prefetch_rows(src: KvRows, offs: &[usize], hd: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        let (base, elem) = match src {
            KvRows::F32(b) => (b.as_ptr().cast::<u8>(), 4),
            KvRows::F16(b) => (b.as_ptr().cast::<u8>(), 2),
        };
        let bytes = hd * elem;
        for &o in offs {
            let row = base.wrapping_add(o * elem);
            let mut line = 0;
            while line < bytes {
                // SAFETY: a prefetch is a hint: it never faults, whatever the address (the
                // pointer is formed with wrapping arithmetic and never dereferenced).
                unsafe { _mm_prefetch::<_MM_HINT_T1>(row.wrapping_add(line).cast()) };
                line += 64;
            }
            // SAFETY: as above (the row's last byte, for rows not 64-byte aligned).
            unsafe { _mm_prefetch::<_MM_HINT_T1>(row.wrapping_add(bytes - 1).cast()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (src, offs, hd);
}
