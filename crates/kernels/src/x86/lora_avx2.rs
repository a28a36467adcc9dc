//! AVX2 + FMA + F16C kernels of the LoRA shrink and expand (see [`crate::lora`]); their
//! portable twins are `generic::dot_f32_as` and `lora::expand_row_generic`.
//!
//! Invariants: the caller has verified AVX2, FMA and F16C (`Isa::Avx2Fma`); pointers are
//! valid for the lengths passed; loads and stores are unaligned, so no alignment is
//! required. Factors are f32 or halves (`W: Elem`): [`load8`] converts 8 halves to f32 in
//! registers, exactly, so every function below does the same arithmetic on a half factor as
//! on the f32 copy of its values, bit for bit.
//!
//! Shrink ([`shrink_tile`]): each element exactly `avx2::tile_f32`'s (the crate's canonical
//! dot product). Expand: every output element gets the same arithmetic whichever block it
//! falls in (16 wide, 8 wide or the scalar tail): an FMA chain from +0 over r = 0..rank in
//! order, then one FMA into `out`. `f32::mul_add` is a single rounding, bitwise equal to the
//! vector FMA, so where a caller splits the columns changes no bit.

use std::arch::x86_64::*;

use crate::lora::{Ahead, Elem, ElemKind};

/// 8 consecutive values at `p` as f32: a plain load for f32; `vcvtph2ps` for f16; for bf16
/// the 16 bits widened to 32 and shifted into the high half (bf16 is f32's top half).
///
/// # Safety
/// AVX2+F16C available; `p` valid for 8 reads of `W`. `W::KIND` names `W`'s layout (the
/// `Elem` contract), so the casts read the right bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8<W: Elem>(p: *const W) -> __m256 {
    match W::KIND {
        ElemKind::F32 => _mm256_loadu_ps(p.cast()),
        ElemKind::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
        ElemKind::BF16 => {
            let h = _mm_loadu_si128(p.cast());
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
    }
}

/// `avx2::tile_f32` with the weight rows `w` in `W` (converted by [`load8`]; the tail
/// element by `Into<f32>`, exact too): `MR × NR` canonical dot products over `k`. Reports
/// the bytes of `w` it reads to `ahead`.
///
/// # Safety
/// AVX2+FMA+F16C available; every `x[m]` valid for `k` f32 reads, every `w[n]` for `k`
/// reads of `W`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn shrink_tile<const MR: usize, const NR: usize, W: Elem>(
    x: [*const f32; MR],
    w: [*const W; NR],
    k: usize,
    ahead: &mut Ahead,
) -> [[f32; NR]; MR] {
    let n8 = k / 8 * 8;
    let mut acc = [[_mm256_setzero_ps(); NR]; MR];
    let mut i = 0;
    while i < n8 {
        ahead.consume(8 * NR * std::mem::size_of::<W>());
        let mut xv = [_mm256_setzero_ps(); MR];
        for m in 0..MR {
            xv[m] = _mm256_loadu_ps(x[m].add(i));
        }
        for n in 0..NR {
            let wv = load8(w[n].add(i));
            for m in 0..MR {
                acc[m][n] = _mm256_fmadd_ps(xv[m], wv, acc[m][n]);
            }
        }
        i += 8;
    }
    let mut out = [[0f32; NR]; MR];
    for m in 0..MR {
        for n in 0..NR {
            let mut s = crate::x86::avx2::hsum(acc[m][n]);
            for t in n8..k {
                let wt: f32 = w[n].add(t).read_unaligned().into();
                s = x[m].add(t).read_unaligned().mul_add(wt, s);
            }
            out[m][n] = s;
        }
    }
    out
}

/// [`expand_tile`] for the first `mr` (1 to 4) of `out` and `t`; the rest are not touched.
///
/// # Safety
/// As [`expand_tile`] for those `mr` rows (`mr` is checked).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn expand_rows<W: Elem>(
    out: [*mut f32; 4],
    t: [*const f32; 4],
    mr: usize,
    b: *const W,
    ldb: usize,
    rank: usize,
    len: usize,
    scale: f32,
    ahead: &mut Ahead,
) {
    assert!((1..=4).contains(&mr), "expand_rows: {mr} rows");
    let (o, p, s) = (out, t, scale);
    match mr {
        1 => expand_tile([o[0]], [p[0]], b, ldb, rank, len, s, ahead),
        2 => expand_tile([o[0], o[1]], [p[0], p[1]], b, ldb, rank, len, s, ahead),
        3 => expand_tile(
            [o[0], o[1], o[2]],
            [p[0], p[1], p[2]],
            b,
            ldb,
            rank,
            len,
            s,
            ahead,
        ),
        _ => expand_tile(o, p, b, ldb, rank, len, s, ahead),
    }
}

/// `out[m][j] = fma(scale, acc, out[m][j])` with `acc = fma(t[m][r], b[r·ldb + j], acc)`
/// over r = 0..rank from +0, for `j < len` and the `MR` rows (sharing every load of `b`,
/// halves converted as they are loaded). Reports the bytes of `b` it reads to `ahead`.
///
/// # Safety
/// AVX2+FMA+F16C available; each `t[m]` valid for `rank` reads; for every `r < rank`,
/// `b.add(r * ldb)` valid for `len` reads; each `out[m]` valid for `len` reads and writes,
/// and the `MR` output rows overlap neither each other nor `t` or `b`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn expand_tile<const MR: usize, W: Elem>(
    out: [*mut f32; MR],
    t: [*const f32; MR],
    b: *const W,
    ldb: usize,
    rank: usize,
    len: usize,
    scale: f32,
    ahead: &mut Ahead,
) {
    let mut j = 0;
    while j + 16 <= len {
        expand_block::<MR, 2, W>(out, t, b, ldb, rank, j, scale, ahead);
        j += 16;
    }
    if j + 8 <= len {
        expand_block::<MR, 1, W>(out, t, b, ldb, rank, j, scale, ahead);
        j += 8;
    }
    while j < len {
        for m in 0..MR {
            let mut acc = 0f32;
            for r in 0..rank {
                let bv: f32 = (*b.add(r * ldb + j)).into();
                acc = (*t[m].add(r)).mul_add(bv, acc);
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
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn expand_block<const MR: usize, const NV: usize, W: Elem>(
    out: [*mut f32; MR],
    t: [*const f32; MR],
    b: *const W,
    ldb: usize,
    rank: usize,
    j: usize,
    scale: f32,
    ahead: &mut Ahead,
) {
    let mut acc = [[_mm256_setzero_ps(); NV]; MR];
    for r in 0..rank {
        ahead.consume(8 * NV * std::mem::size_of::<W>());
        let br = b.add(r * ldb + j);
        let mut bv = [_mm256_setzero_ps(); NV];
        for (h, v) in bv.iter_mut().enumerate() {
            *v = load8(br.add(8 * h));
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
                // SAFETY: AVX2+FMA+F16C active; out rows are `len` apart in a 4·len buffer, t rows
                // `rank` apart in 4·rank, b holds rank rows of len.
                unsafe {
                    let none = &mut crate::lora::Ahead::none();
                    super::expand_rows(o, tp, mr, b.as_ptr(), len, rank, len, 0.75, none)
                };
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
