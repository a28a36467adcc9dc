//! AVX2 + FMA + F16C kernels.
//!
//! Invariants shared by every function: the caller has verified AVX2, FMA and F16C (see
//! `Isa::Avx2Fma`); pointers are valid for the lengths passed; loads are unaligned (`loadu`),
//! so no alignment is required. Summation order equals `generic::dot_f32`: 8 lanes, the lane
//! tree of `generic::reduce_lanes`, then the tail in order (with FMA where generic multiplies
//! then adds, so results agree to rounding, not bitwise, across ISAs).

use std::arch::x86_64::*;

use tessera_core::blocks::{as_blocks, BlockQ4_0, BlockQ4_1, BlockQ8_0, QK};
use tessera_core::DType;

/// Horizontal sum in the canonical lane tree: (lo + hi) → pairs → last two.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn hsum(v: __m256) -> f32 {
    let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let q = _mm_add_ps(h, _mm_movehl_ps(h, h));
    let s = _mm_add_ss(q, _mm_shuffle_ps(q, q, 0b01));
    _mm_cvtss_f32(s)
}

/// `Σ a[i]·b[i]` over `k` elements.
///
/// # Safety
/// AVX2+FMA available; `a` and `b` valid for `k` f32 reads.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_f32(a: *const f32, b: *const f32, k: usize) -> f32 {
    let n = k / 8 * 8;
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i < n {
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(i)), _mm256_loadu_ps(b.add(i)), acc);
        i += 8;
    }
    let mut s = hsum(acc);
    while i < k {
        s = a
            .add(i)
            .read_unaligned()
            .mul_add(b.add(i).read_unaligned(), s);
        i += 1;
    }
    s
}

/// Four dot products of one activation row `x` with weight rows `w[0..4]`, sharing each
/// load of `x`. Per row the arithmetic is exactly [`dot_f32`]'s.
///
/// # Safety
/// AVX2+FMA available; `x` and each `w[r]` valid for `k` f32 reads.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot4_f32(x: *const f32, w: [*const f32; 4], k: usize) -> [f32; 4] {
    let n = k / 8 * 8;
    let (mut a0, mut a1, mut a2, mut a3) = (
        _mm256_setzero_ps(),
        _mm256_setzero_ps(),
        _mm256_setzero_ps(),
        _mm256_setzero_ps(),
    );
    let mut i = 0;
    while i < n {
        let xv = _mm256_loadu_ps(x.add(i));
        a0 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w[0].add(i)), a0);
        a1 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w[1].add(i)), a1);
        a2 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w[2].add(i)), a2);
        a3 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w[3].add(i)), a3);
        i += 8;
    }
    let mut s = [hsum(a0), hsum(a1), hsum(a2), hsum(a3)];
    while i < k {
        for (r, sr) in s.iter_mut().enumerate() {
            *sr = x
                .add(i)
                .read_unaligned()
                .mul_add(w[r].add(i).read_unaligned(), *sr);
        }
        i += 1;
    }
    s
}

/// Expands 16 packed nibble bytes to 32 f32 values in `lo nibbles, hi nibbles` order,
/// returned as four vectors of 8.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn nibbles_to_f32(qs: *const u8) -> [__m256; 4] {
    let bytes = _mm_loadu_si128(qs as *const __m128i);
    let mask = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(bytes, mask);
    let hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
    [
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)),
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))),
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)),
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))),
    ]
}

/// Dequantizes one stored row of `out.len()` elements, bit-identical to the reference
/// (`tessera_core::tensor::dequantize_row`): products and sums are separate roundings.
///
/// # Safety
/// AVX2+FMA+F16C available; `row` holds exactly `out.len()` elements of `dtype`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dequantize(dtype: DType, row: &[u8], out: &mut [f32]) {
    let o = out.as_mut_ptr();
    match dtype {
        DType::F32 => std::ptr::copy_nonoverlapping(row.as_ptr(), o as *mut u8, out.len() * 4),
        DType::F16 => {
            let n = out.len() / 8 * 8;
            let p = row.as_ptr();
            let mut i = 0;
            while i < n {
                let h = _mm_loadu_si128(p.add(2 * i) as *const __m128i);
                _mm256_storeu_ps(o.add(i), _mm256_cvtph_ps(h));
                i += 8;
            }
            crate::generic::dequantize(dtype, &row[2 * n..], &mut out[n..]);
        }
        DType::BF16 => {
            let n = out.len() / 8 * 8;
            let p = row.as_ptr();
            let mut i = 0;
            while i < n {
                let h = _mm_loadu_si128(p.add(2 * i) as *const __m128i);
                let w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
                _mm256_storeu_ps(o.add(i), _mm256_castsi256_ps(w));
                i += 8;
            }
            crate::generic::dequantize(dtype, &row[2 * n..], &mut out[n..]);
        }
        DType::Q8_0 => {
            for (b, blk) in as_blocks::<BlockQ8_0>(row).unwrap().iter().enumerate() {
                let d = _mm256_set1_ps(tessera_core::blocks::f16_bits_to_f32(blk.d));
                let q = blk.qs.as_ptr() as *const __m128i;
                let q0 = _mm_loadu_si128(q);
                let q1 = _mm_loadu_si128(q.add(1));
                let parts = [q0, _mm_srli_si128(q0, 8), q1, _mm_srli_si128(q1, 8)];
                for (j, part) in parts.into_iter().enumerate() {
                    let f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part));
                    _mm256_storeu_ps(o.add(b * QK + 8 * j), _mm256_mul_ps(d, f));
                }
            }
        }
        DType::Q4_0 => {
            let eight = _mm256_set1_ps(8.0);
            for (b, blk) in as_blocks::<BlockQ4_0>(row).unwrap().iter().enumerate() {
                let d = _mm256_set1_ps(tessera_core::blocks::f16_bits_to_f32(blk.d));
                for (j, q) in nibbles_to_f32(blk.qs.as_ptr()).into_iter().enumerate() {
                    // (q - 8) is exact in f32, so this equals the reference `(q - 8) as f32 * d`.
                    _mm256_storeu_ps(
                        o.add(b * QK + 8 * j),
                        _mm256_mul_ps(_mm256_sub_ps(q, eight), d),
                    );
                }
            }
        }
        DType::Q4_1 => {
            for (b, blk) in as_blocks::<BlockQ4_1>(row).unwrap().iter().enumerate() {
                let d = _mm256_set1_ps(tessera_core::blocks::f16_bits_to_f32(blk.d));
                let m = _mm256_set1_ps(tessera_core::blocks::f16_bits_to_f32(blk.m));
                for (j, q) in nibbles_to_f32(blk.qs.as_ptr()).into_iter().enumerate() {
                    _mm256_storeu_ps(o.add(b * QK + 8 * j), _mm256_add_ps(_mm256_mul_ps(q, d), m));
                }
            }
        }
        _ => crate::x86::ggml_decode::dequantize(dtype, row, out),
    }
}

/// An `MR × NR` tile of canonical dot products: `out[m][n] = dot(x[m], w[n])` over `k`,
/// each element with exactly [`dot_f32`]'s arithmetic (so the tile shape never changes a
/// result). Each `x[m]` load is shared by `NR` rows and each `w[n]` load by `MR` rows.
///
/// # Safety
/// AVX2+FMA available; every `x[m]` and `w[n]` valid for `k` f32 reads.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn tile_f32<const MR: usize, const NR: usize>(
    x: [*const f32; MR],
    w: [*const f32; NR],
    k: usize,
) -> [[f32; NR]; MR] {
    let n8 = k / 8 * 8;
    let mut acc = [[_mm256_setzero_ps(); NR]; MR];
    let mut i = 0;
    while i < n8 {
        let mut xv = [_mm256_setzero_ps(); MR];
        for m in 0..MR {
            xv[m] = _mm256_loadu_ps(x[m].add(i));
        }
        for n in 0..NR {
            let wv = _mm256_loadu_ps(w[n].add(i));
            for m in 0..MR {
                acc[m][n] = _mm256_fmadd_ps(xv[m], wv, acc[m][n]);
            }
        }
        i += 8;
    }
    let mut out = [[0f32; NR]; MR];
    for m in 0..MR {
        for n in 0..NR {
            let mut s = hsum(acc[m][n]);
            for t in n8..k {
                s = x[m]
                    .add(t)
                    .read_unaligned()
                    .mul_add(w[n].add(t).read_unaligned(), s);
            }
            out[m][n] = s;
        }
    }
    out
}

/// [`tile_f32`]'s K loop over `len` elements (a multiple of 8) with the accumulators kept by
/// the caller: running it over consecutive K ranges, then [`hsum`] of each accumulator, is
/// [`tile_f32`] over the whole K (no tail), bit for bit.
///
/// # Safety
/// AVX2+FMA available; every `x[m]` and `w[n]` valid for `len` f32 reads.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn tile_f32_acc<const MR: usize, const NR: usize>(
    x: [*const f32; MR],
    w: [*const f32; NR],
    len: usize,
    acc: &mut [[__m256; NR]; MR],
) {
    debug_assert!(len.is_multiple_of(8));
    let mut i = 0;
    while i < len {
        let mut xv = [_mm256_setzero_ps(); MR];
        for m in 0..MR {
            xv[m] = _mm256_loadu_ps(x[m].add(i));
        }
        for n in 0..NR {
            let wv = _mm256_loadu_ps(w[n].add(i));
            for m in 0..MR {
                acc[m][n] = _mm256_fmadd_ps(xv[m], wv, acc[m][n]);
            }
        }
        i += 8;
    }
}

/// `y += a · x` (fused multiply-add per element).
///
/// # Safety
/// AVX2+FMA available; `y.len() == x.len()`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    let n8 = y.len() / 8 * 8;
    let av = _mm256_set1_ps(a);
    let (yp, xp) = (y.as_mut_ptr(), x.as_ptr());
    for i in (0..n8).step_by(8) {
        _mm256_storeu_ps(
            yp.add(i),
            _mm256_fmadd_ps(av, _mm256_loadu_ps(xp.add(i)), _mm256_loadu_ps(yp.add(i))),
        );
    }
    for i in n8..y.len() {
        y[i] = a.mul_add(x[i], y[i]);
    }
}

/// Quantizes 32-element blocks to 8 bits: per block `d = amax / 127`, `q = round(x / d)`
/// (half away from zero, as `f32::round`), `Σq`, `s = d · Σq`. Same results as the portable
/// `quant_acts` loop.
///
/// # Safety
/// AVX2+FMA available; `x.len() == 32 · d.len()`, `qs.len() == x.len()`, and `s`, `qsum`
/// as long as `d`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn quantize_q8_blocks(
    x: &[f32],
    d: &mut [f32],
    s: &mut [f32],
    qsum: &mut [i32],
    qs: &mut [i8],
) {
    let sign_mask = _mm256_set1_ps(-0.0);
    let half = _mm256_set1_ps(0.5);
    for b in 0..d.len() {
        let p = x.as_ptr().add(b * 32);
        let v = [
            _mm256_loadu_ps(p),
            _mm256_loadu_ps(p.add(8)),
            _mm256_loadu_ps(p.add(16)),
            _mm256_loadu_ps(p.add(24)),
        ];
        let mut m = _mm256_andnot_ps(sign_mask, v[0]);
        for vi in &v[1..] {
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign_mask, *vi));
        }
        let h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        let h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
        let amax = _mm_cvtss_f32(h);
        let db = amax / 127.0;
        let id = if db > 0.0 { 1.0 / db } else { 0.0 };
        let idv = _mm256_set1_ps(id);
        let mut q32 = [_mm256_setzero_si256(); 4];
        for j in 0..4 {
            let y = _mm256_mul_ps(v[j], idv);
            // round half away from zero: sign(y) · floor(|y| + 0.5)
            let a = _mm256_floor_ps(_mm256_add_ps(_mm256_andnot_ps(sign_mask, y), half));
            let r = _mm256_or_ps(a, _mm256_and_ps(y, sign_mask));
            q32[j] = _mm256_cvtps_epi32(r);
        }
        // Pack 32 i32 → 32 i8 in order.
        let w01 = _mm256_packs_epi32(q32[0], q32[1]);
        let w23 = _mm256_packs_epi32(q32[2], q32[3]);
        let bytes = _mm256_packs_epi16(w01, w23);
        let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(qs.as_mut_ptr().add(b * 32) as *mut __m256i, bytes);
        let sum_v = _mm256_add_epi32(
            _mm256_add_epi32(q32[0], q32[1]),
            _mm256_add_epi32(q32[2], q32[3]),
        );
        let sh = _mm_add_epi32(
            _mm256_castsi256_si128(sum_v),
            _mm256_extracti128_si256(sum_v, 1),
        );
        let sh = _mm_add_epi32(sh, _mm_shuffle_epi32(sh, 0b01_00_11_10));
        let sh = _mm_add_epi32(sh, _mm_shuffle_epi32(sh, 0b10_11_00_01));
        let sum = _mm_cvtsi128_si32(sh);
        d[b] = db;
        qsum[b] = sum;
        s[b] = db * sum as f32;
    }
}

/// `outs[g][d] = Σ_p weights[g][p] · v[offs[p] + d]` for up to 3 outputs sharing the rows,
/// each element accumulated over positions in order with FMA (exactly what repeated
/// [`axpy`] computes), 32 columns at a time in registers.
///
/// # Safety
/// AVX2+FMA available; every `offs[p] + hd <= v.len()`; each `outs[g]` holds `hd` values and
/// each `weights[g]` `offs.len()`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn weighted_rows<const G: usize>(
    outs: [*mut f32; G],
    weights: [&[f32]; G],
    v: &[f32],
    offs: &[usize],
    hd: usize,
) {
    let vp = v.as_ptr();
    let full = hd / 32 * 32;
    let mut c0 = 0;
    while c0 < full {
        let mut acc = [[_mm256_setzero_ps(); 4]; G];
        for (p, &off) in offs.iter().enumerate() {
            let row = vp.add(off + c0);
            let r = [
                _mm256_loadu_ps(row),
                _mm256_loadu_ps(row.add(8)),
                _mm256_loadu_ps(row.add(16)),
                _mm256_loadu_ps(row.add(24)),
            ];
            for g in 0..G {
                let w = _mm256_set1_ps(*weights[g].get_unchecked(p));
                for j in 0..4 {
                    acc[g][j] = _mm256_fmadd_ps(w, r[j], acc[g][j]);
                }
            }
        }
        for g in 0..G {
            for j in 0..4 {
                _mm256_storeu_ps(outs[g].add(c0 + 8 * j), acc[g][j]);
            }
        }
        c0 += 32;
    }
    for c in full..hd {
        for g in 0..G {
            let mut a = 0f32;
            for (p, &off) in offs.iter().enumerate() {
                a = weights[g][p].mul_add(*vp.add(off + c), a);
            }
            *outs[g].add(c) = a;
        }
    }
}
