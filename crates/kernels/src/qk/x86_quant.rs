//! AVX2 Q8_K quantization of one 256-element block, bitwise as ggml's
//! `quantize_row_q8_K_ref` (`tessera_core::ggml_quants::quantize_row_q8_k_into`) for finite
//! inputs: the same `max` (the first element of the largest magnitude), the same
//! `iscale = −127 / max` and products `iscale · x`, rounded to nearest-even by `vcvtps2dq`
//! (ggml's `nearest_int` rounds the same way below 2^22; here `|iscale · x| ≤ 127`), and
//! `d = 1 / iscale`.

use std::arch::x86_64::*;

/// Quantizes `x` (256 values) into `qs`, their 16 sums of 16 into `bsums`; returns `d`.
///
/// # Safety
/// The CPU has AVX2; `x`, `qs`, `bsums` hold 256, 256 and 16 elements.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q8k_block(x: &[f32], qs: &mut [i8], bsums: &mut [i16]) -> f32 {
    debug_assert!(x.len() == 256 && qs.len() == 256 && bsums.len() == 16);
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let p = x.as_ptr();
    let mut amax = _mm256_setzero_ps();
    for i in 0..32 {
        // `max(|x|, amax)` keeps `amax` where `|x|` is NaN, as the reference's `>` skips it.
        amax = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(p.add(8 * i)), abs), amax);
    }
    let m4 = _mm_max_ps(
        _mm256_castps256_ps128(amax),
        _mm256_extractf128_ps::<1>(amax),
    );
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let m1 = _mm_max_ss(m2, _mm_movehdup_ps(m2));
    let amax = _mm_cvtss_f32(m1);
    if amax == 0.0 {
        qs.fill(0);
        bsums.fill(0);
        return 0.0;
    }
    // The first element of that magnitude, with its sign.
    let target = _mm256_set1_ps(amax);
    let mut max = 0.0;
    for i in 0..32 {
        let v = _mm256_and_ps(_mm256_loadu_ps(p.add(8 * i)), abs);
        let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(v, target));
        if hit != 0 {
            max = x[8 * i + hit.trailing_zeros() as usize];
            break;
        }
    }
    let iscale = -127.0f32 / max;
    let scale = _mm256_set1_ps(iscale);
    let q = qs.as_mut_ptr();
    let ones = _mm256_set1_epi16(1);
    let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for g in 0..8 {
        // 32 values: four vectors of 8 to i32, packed (saturating, as `min(127)` and the i8
        // store) to i16 and i8 with 128-bit lane interleaving undone by one permute.
        let v = |k: usize| {
            _mm256_cvtps_epi32(_mm256_mul_ps(scale, _mm256_loadu_ps(p.add(32 * g + 8 * k))))
        };
        let w01 = _mm256_packs_epi32(v(0), v(1));
        let w23 = _mm256_packs_epi32(v(2), v(3));
        let bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23), perm);
        _mm256_storeu_si256(q.add(32 * g) as *mut __m256i, bytes);
        // Sums of each 16: widen to i16 pairs, then add.
        let s = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(bytes)), ones);
        let t = _mm256_madd_epi16(
            _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(bytes)),
            ones,
        );
        let both = _mm256_hadd_epi32(s, t);
        let both = _mm256_hadd_epi32(both, both);
        // Lanes: [s01 s23 | t01 t23]... each 128-bit half has its vector's two partial sums.
        let lo = _mm256_castsi256_si128(both);
        let hi = _mm256_extracti128_si256::<1>(both);
        let sums = _mm_add_epi32(lo, hi);
        bsums[2 * g] = _mm_extract_epi32::<0>(sums) as i16;
        bsums[2 * g + 1] = _mm_extract_epi32::<1>(sums) as i16;
    }
    1.0 / iscale
}
