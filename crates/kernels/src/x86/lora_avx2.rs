//! AVX2 + FMA kernel of the LoRA expand (see [`crate::lora`]); its portable twin is
//! `lora::expand_row_generic`.
//!
//! Invariants: the caller has verified AVX2 and FMA (`Isa::Avx2Fma`); pointers are valid for
//! the lengths passed; loads and stores are unaligned, so no alignment is required. Every
//! output element gets the same arithmetic whichever block it falls in (16 wide, 8 wide or
//! the scalar tail): an FMA chain from +0 over r = 0..rank in order, then one FMA into
//! `out`. `f32::mul_add` is a single rounding, bitwise equal to the vector FMA, so where a
//! caller splits the columns changes no bit.

use std::arch::x86_64::*;

/// [`expand_tile`] for the first `mr` (1 to 4) of `out` and `t`; the rest are not touched.
///
/// # Safety
/// As [`expand_tile`] for those `mr` rows (`mr` is checked).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn expand_rows(
    out: [*mut f32; 4],
    t: [*const f32; 4],
    mr: usize,
    b: *const f32,
    ldb: usize,
    rank: usize,
    len: usize,
    scale: f32,
) {
    assert!((1..=4).contains(&mr), "expand_rows: {mr} rows");
    let (o, p) = (out, t);
    match mr {
        1 => expand_tile([o[0]], [p[0]], b, ldb, rank, len, scale),
        2 => expand_tile([o[0], o[1]], [p[0], p[1]], b, ldb, rank, len, scale),
        3 => expand_tile(
            [o[0], o[1], o[2]],
            [p[0], p[1], p[2]],
            b,
            ldb,
            rank,
            len,
            scale,
        ),
        _ => expand_tile(o, p, b, ldb, rank, len, scale),
    }
}

/// `out[m][j] = fma(scale, acc, out[m][j])` with `acc = fma(t[m][r], b[r·ldb + j], acc)`
/// over r = 0..rank from +0, for `j < len` and the `MR` rows (sharing every load of `b`).
///
/// # Safety
/// AVX2+FMA available; each `t[m]` valid for `rank` reads; for every `r < rank`,
/// `b.add(r * ldb)` valid for `len` reads; each `out[m]` valid for `len` reads and writes,
/// and the `MR` output rows overlap neither each other nor `t` or `b`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn expand_tile<const MR: usize>(
    out: [*mut f32; MR],
    t: [*const f32; MR],
    b: *const f32,
    ldb: usize,
    rank: usize,
    len: usize,
    scale: f32,
) {
    let mut j = 0;
    while j + 16 <= len {
        expand_block::<MR, 2>(out, t, b, ldb, rank, j, scale);
        j += 16;
    }
    if j + 8 <= len {
        expand_block::<MR, 1>(out, t, b, ldb, rank, j, scale);
        j += 8;
    }
    while j < len {
        for m in 0..MR {
            let mut acc = 0f32;
            for r in 0..rank {
                acc = (*t[m].add(r)).mul_add(*b.add(r * ldb + j), acc);
            }
            let o = out[m].add(j);
            *o = scale.mul_add(acc, *o);
        }
        j += 1;
    }
}

/// Columns `j..j + 8·NV` of [`expand_tile`], the accumulators in registers.
///
/// # Safety
/// As [`expand_tile`], with `j + 8·NV <= len`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn expand_block<const MR: usize, const NV: usize>(
    out: [*mut f32; MR],
    t: [*const f32; MR],
    b: *const f32,
    ldb: usize,
    rank: usize,
    j: usize,
    scale: f32,
) {
    let mut acc = [[_mm256_setzero_ps(); NV]; MR];
    for r in 0..rank {
        let br = b.add(r * ldb + j);
        let mut bv = [_mm256_setzero_ps(); NV];
        for (h, v) in bv.iter_mut().enumerate() {
            *v = _mm256_loadu_ps(br.add(8 * h));
        }
        for m in 0..MR {
            let tv = _mm256_broadcast_ss(&*t[m].add(r));
            for h in 0..NV {
                acc[m][h] = _mm256_fmadd_ps(tv, bv[h], acc[m][h]);
            }
        }
    }
    let sv = _mm256_set1_ps(scale);
    for (m, acc_m) in acc.iter().enumerate() {
        for (h, &a) in acc_m.iter().enumerate() {
            let o = out[m].add(j + 8 * h);
            _mm256_storeu_ps(o, _mm256_fmadd_ps(sv, a, _mm256_loadu_ps(o)));
        }
    }
}

#[cfg(test)]
mod tests {
    /// Each of 1 to 4 rows agrees with the portable twin to rounding (FMA vs multiply-add).
    #[test]
    fn expand_agrees_with_portable_twin() {
        if crate::Isa::active() != crate::Isa::Avx2Fma {
            return;
        }
        let val = |i: usize| ((i * 7919 % 2001) as f32 / 1000.0) - 1.0;
        for (rank, len) in [(1, 1), (3, 7), (17, 40), (5, 67)] {
            let t: Vec<f32> = (0..4 * rank).map(|i| val(i + 3)).collect();
            let b: Vec<f32> = (0..rank * len).map(val).collect();
            for mr in 1..=4 {
                let mut simd = vec![0.5f32; 4 * len];
                let o: [*mut f32; 4] = std::array::from_fn(|m| simd[m * len..].as_mut_ptr());
                let tp: [*const f32; 4] = std::array::from_fn(|m| t[m * rank..].as_ptr());
                // SAFETY: AVX2+FMA active; out rows are `len` apart in a 4·len buffer, t rows
                // `rank` apart in 4·rank, b holds rank rows of len.
                unsafe { super::expand_rows(o, tp, mr, b.as_ptr(), len, rank, len, 0.75) };
                for m in 0..4 {
                    let mut want = vec![0.5f32; len];
                    if m < mr {
                        crate::lora::expand_row_generic(
                            &mut want,
                            &t[m * rank..][..rank],
                            &b,
                            len,
                            0.75,
                        );
                    }
                    for (s, w) in simd[m * len..][..len].iter().zip(&want) {
                        assert!((s - w).abs() <= 1e-5 * (1.0 + rank as f32), "{s} vs {w}");
                    }
                }
            }
        }
    }
}
