//! AVX2 + FMA + F16C kernels of the tiled attention ([`crate::attn`]): a 3 × 4 tile of
//! scores, one row's softmax step over a key block, the rescale-and-add update of the output accumulators by the
//! block, and f16 → f32 row conversion.
//!
//! Invariants: the caller has verified AVX2, FMA and F16C (`Isa::Avx2Fma`); pointers are
//! valid for the lengths named in each function's safety section; loads and stores are
//! unaligned. Every column gets the same per-element arithmetic whichever path (32-wide,
//! 8-wide or scalar tail) covers it, so a row's result never depends on `head_dim`'s split.

use std::arch::x86_64::*;

use half::f16;

use crate::math::avx2::exp8;

/// One row's online-softmax step over the `c` scores of a key block: `m' = max(m, s)`,
/// `s[j] = exp(s[j] - m')` in place (the vector `exp` for every element), and `Σ s[j]`
/// in 8 lanes (lane `j % 8` from zero, keys in order) reduced by the canonical lane tree.
/// Returns `(m', Σ)`. The sum's order is the portable twin's, so for equal exponentials
/// the two ISAs give equal sums.
///
/// # Safety
/// AVX2+FMA available; `s` valid for `c` reads and writes, `1 <= c`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn softmax_step(s: *mut f32, c: usize, m: f32) -> (f32, f32) {
    let n8 = c / 8 * 8;
    let tail = c - n8;
    // Lanes below `tail` are the block's last, partial vector.
    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(tail as i32), lanes);
    // The max is exact, so its order is free.
    let mut vm = _mm256_set1_ps(m);
    let mut i = 0;
    while i < n8 {
        vm = _mm256_max_ps(vm, _mm256_loadu_ps(s.add(i)));
        i += 8;
    }
    if tail > 0 {
        let t = _mm256_maskload_ps(s.add(n8), mask);
        vm = _mm256_max_ps(vm, _mm256_blendv_ps(vm, t, _mm256_castsi256_ps(mask)));
    }
    let h = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
    let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    let m_new = _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
    let vmn = _mm256_set1_ps(m_new);
    let mut acc = _mm256_setzero_ps();
    i = 0;
    while i < n8 {
        let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s.add(i)), vmn));
        _mm256_storeu_ps(s.add(i), e);
        acc = _mm256_add_ps(acc, e);
        i += 8;
    }
    if tail > 0 {
        let t = _mm256_maskload_ps(s.add(n8), mask);
        let e = _mm256_and_ps(exp8(_mm256_sub_ps(t, vmn)), _mm256_castsi256_ps(mask));
        _mm256_maskstore_ps(s.add(n8), mask, e);
        acc = _mm256_add_ps(acc, e);
    }
    // The canonical lane tree (`generic::reduce_lanes`).
    let h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    let q = _mm_add_ps(h, _mm_movehl_ps(h, h));
    let sum = _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 0b01)));
    (m_new, sum)
}

/// `out[a][b] = scale · dot(q[a], k[b])` for 3 query rows × 4 key rows of `hd` values, each
/// dot with exactly the canonical arithmetic of `avx2::dot_f32` (8 lanes, the lane tree,
/// then the tail in order); the four dots of a row are reduced together by the same tree.
///
/// # Safety
/// AVX2+FMA available; each `q[a]` and `k[b]` valid for `hd` reads; each `out[a]` valid
/// for 4 writes (rows may repeat: a repeated row writes the same values again).
#[target_feature(enable = "avx2,fma")]
pub unsafe fn scores_3x4(
    q: [*const f32; 3],
    k: [*const f32; 4],
    hd: usize,
    scale: f32,
    out: [*mut f32; 3],
) {
    let n8 = hd / 8 * 8;
    let mut acc = [[_mm256_setzero_ps(); 4]; 3];
    let mut i = 0;
    while i < n8 {
        let qv = [
            _mm256_loadu_ps(q[0].add(i)),
            _mm256_loadu_ps(q[1].add(i)),
            _mm256_loadu_ps(q[2].add(i)),
        ];
        for b in 0..4 {
            let kv = _mm256_loadu_ps(k[b].add(i));
            for a in 0..3 {
                acc[a][b] = _mm256_fmadd_ps(qv[a], kv, acc[a][b]);
            }
        }
        i += 8;
    }
    let sc = _mm_set1_ps(scale);
    for a in 0..3 {
        let mut s = reduce4(acc[a]);
        if n8 < hd {
            let mut t = [0f32; 4];
            _mm_storeu_ps(t.as_mut_ptr(), s);
            for (b, tb) in t.iter_mut().enumerate() {
                for e in n8..hd {
                    *tb = (*q[a].add(e)).mul_add(*k[b].add(e), *tb);
                }
            }
            s = _mm_loadu_ps(t.as_ptr());
        }
        _mm_storeu_ps(out[a], _mm_mul_ps(s, sc));
    }
}

/// `[hsum(v[0]), hsum(v[1]), hsum(v[2]), hsum(v[3])]`, each by the canonical lane tree
/// (`generic::reduce_lanes`: `h[i] = v[i] + v[i + 4]`, `q = [h0 + h2, h1 + h3]`,
/// `q0 + q1`), the four reductions sharing each shuffle and add.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn reduce4(v: [__m256; 4]) -> __m128 {
    // [h(v0) | h(v1)] and [h(v2) | h(v3)].
    let p = _mm256_add_ps(
        _mm256_permute2f128_ps(v[0], v[1], 0x20),
        _mm256_permute2f128_ps(v[0], v[1], 0x31),
    );
    let r = _mm256_add_ps(
        _mm256_permute2f128_ps(v[2], v[3], 0x20),
        _mm256_permute2f128_ps(v[2], v[3], 0x31),
    );
    // Per 128-bit half: [q0(x), q1(x), q0(y), q1(y)] for (x, y) = (v0, v2) | (v1, v3).
    let q = _mm256_add_ps(_mm256_shuffle_ps(p, r, 0x44), _mm256_shuffle_ps(p, r, 0xEE));
    // [s(v0), s(v2), ..] | [s(v1), s(v3), ..].
    let s = _mm256_add_ps(_mm256_shuffle_ps(q, q, 0x88), _mm256_shuffle_ps(q, q, 0xDD));
    _mm_unpacklo_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1))
}

/// For each of the `G` rows: `acc[d] = acc[d]·alpha`, then `acc[d] = fma(p[j], v_j[d],
/// acc[d])` for the keys `j` in order, where `v_j = v[offs[j]..offs[j] + hd]`.
///
/// # Safety
/// AVX2+FMA available; each `acc[g]` valid for `hd` reads and writes, disjoint from the
/// others and from `v`; each `p[g]` valid for `offs.len()` reads; every
/// `offs[j] + hd <= v.len()`.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::needless_range_loop)] // register tiles read clearer indexed
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
            // G broadcasts, then one value vector at a time: 4·G accumulators + G + 1
            // registers (16 for G = 3, no spill).
            let w: [__m256; G] = std::array::from_fn(|g| _mm256_set1_ps(*p[g].add(j)));
            for c in 0..4 {
                let r = _mm256_loadu_ps(row.add(8 * c));
                for g in 0..G {
                    a[g][c] = _mm256_fmadd_ps(w[g], r, a[g][c]);
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

/// The `hd`-value rows of `src` at `offs`, converted to f32 (exact) one after another into
/// `dst`, eight values at a time with `vcvtph2ps`.
///
/// # Safety
/// AVX2+F16C available; every `offs[j] + hd <= src.len()`; `dst.len() == offs.len() · hd`.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn f16_rows_to_f32(src: &[f16], offs: &[usize], hd: usize, dst: &mut [f32]) {
    let n8 = hd / 8 * 8;
    let (s, d) = (src.as_ptr() as *const u16, dst.as_mut_ptr());
    for (j, &off) in offs.iter().enumerate() {
        let (s, d) = (s.add(off), d.add(j * hd));
        let mut i = 0;
        while i < n8 {
            let h = _mm_loadu_si128(s.add(i) as *const __m128i);
            _mm256_storeu_ps(d.add(i), _mm256_cvtph_ps(h));
            i += 8;
        }
        for e in n8..hd {
            *d.add(e) = f16::from_bits(*s.add(e)).to_f32();
        }
    }
}
