//! AVX2 + FMA + F16C kernels of the tiled attention ([`crate::attn`]): the rescale-and-add
//! update of the output accumulators by one key block, and f16 → f32 row conversion.
//!
//! Invariants: the caller has verified AVX2, FMA and F16C (`Isa::Avx2Fma`); pointers are
//! valid for the lengths named in each function's safety section; loads and stores are
//! unaligned. Every column gets the same per-element arithmetic whichever path (32-wide,
//! 8-wide or scalar tail) covers it, so a row's result never depends on `head_dim`'s split.

use std::arch::x86_64::*;

use half::f16;

/// For each of the `G` rows: `acc[d] = acc[d]·alpha`, then `acc[d] = fma(p[j], v_j[d],
/// acc[d])` for the keys `j` in order, where `v_j = v[offs[j]..offs[j] + hd]`.
///
/// # Safety
/// AVX2+FMA available; each `acc[g]` valid for `hd` reads and writes, disjoint from the
/// others and from `v`; each `p[g]` valid for `offs.len()` reads; every
/// `offs[j] + hd <= v.len()`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn pv_update<const G: usize>(
    acc: [*mut f32; G],
    alpha: [f32; G],
    p: [*const f32; G],
    v: &[f32],
    offs: &[usize],
    hd: usize,
) {
    let vp = v.as_ptr();
    let al: [__m256; G] = std::array::from_fn(|g| _mm256_set1_ps(alpha[g]));
    let full = hd / 32 * 32;
    let mut c0 = 0;
    while c0 < full {
        let mut a = [[_mm256_setzero_ps(); 4]; G];
        for g in 0..G {
            for (c, ag) in a[g].iter_mut().enumerate() {
                *ag = _mm256_mul_ps(_mm256_loadu_ps(acc[g].add(c0 + 8 * c)), al[g]);
            }
        }
        for (j, &off) in offs.iter().enumerate() {
            let row = vp.add(off + c0);
            let r = [
                _mm256_loadu_ps(row),
                _mm256_loadu_ps(row.add(8)),
                _mm256_loadu_ps(row.add(16)),
                _mm256_loadu_ps(row.add(24)),
            ];
            for g in 0..G {
                let w = _mm256_set1_ps(*p[g].add(j));
                for c in 0..4 {
                    a[g][c] = _mm256_fmadd_ps(w, r[c], a[g][c]);
                }
            }
        }
        for g in 0..G {
            for (c, ag) in a[g].iter().enumerate() {
                _mm256_storeu_ps(acc[g].add(c0 + 8 * c), *ag);
            }
        }
        c0 += 32;
    }
    while c0 + 8 <= hd {
        let mut a: [__m256; G] =
            std::array::from_fn(|g| _mm256_mul_ps(_mm256_loadu_ps(acc[g].add(c0)), al[g]));
        for (j, &off) in offs.iter().enumerate() {
            let r = _mm256_loadu_ps(vp.add(off + c0));
            for g in 0..G {
                a[g] = _mm256_fmadd_ps(_mm256_set1_ps(*p[g].add(j)), r, a[g]);
            }
        }
        for g in 0..G {
            _mm256_storeu_ps(acc[g].add(c0), a[g]);
        }
        c0 += 8;
    }
    for c in c0..hd {
        for g in 0..G {
            let mut a = *acc[g].add(c) * alpha[g];
            for (j, &off) in offs.iter().enumerate() {
                a = (*p[g].add(j)).mul_add(*vp.add(off + c), a);
            }
            *acc[g].add(c) = a;
        }
    }
}

/// `dst[i] = src[i]` as f32 (exact), eight at a time with `vcvtph2ps`.
///
/// # Safety
/// AVX2+F16C available; `src.len() == dst.len()`.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
    let n8 = src.len() / 8 * 8;
    let (s, d) = (src.as_ptr() as *const u16, dst.as_mut_ptr());
    let mut i = 0;
    while i < n8 {
        let h = _mm_loadu_si128(s.add(i) as *const __m128i);
        _mm256_storeu_ps(d.add(i), _mm256_cvtph_ps(h));
        i += 8;
    }
    for j in n8..src.len() {
        dst[j] = src[j].to_f32();
    }
}
