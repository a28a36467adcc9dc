//! The integer pass of the 256-weight formats that the float pass cannot read directly:
//! each block's quants, unpacked to one signed byte per weight in output order, and its
//! per-sub-block float scales, into an [`Unpacked`] (AVX2 byte operations, 32 weights
//! each; shared by the AVX2 and AVX-512 float passes). Also the small load/store and
//! half-float helpers of both.

use std::arch::x86_64::*;

use tessera_core::ggml_quants::{GgmlQuant, KVALUES_IQ4NL};

use super::{at, at_mut, bb, Unpacked};

/// The 32 bytes of `b`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn load32(b: &[u8; 32]) -> __m256i {
    // SAFETY: reads exactly the 32 bytes of `b` (unaligned load).
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

/// The 16 bytes of `b`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn load16(b: &[u8; 16]) -> __m128i {
    // SAFETY: reads exactly the 16 bytes of `b` (unaligned load).
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

/// The 8 bytes of `b` in the low half of a vector.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn load8(b: &[u8; 8]) -> __m128i {
    // SAFETY: reads exactly the 8 bytes of `b` (unaligned load).
    unsafe { _mm_loadl_epi64(b.as_ptr().cast()) }
}

/// Writes `v` to the 32 bytes of `d`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn store32(d: &mut [u8; 32], v: __m256i) {
    // SAFETY: writes exactly the 32 bytes of `d` (unaligned store).
    unsafe { _mm256_storeu_si256(d.as_mut_ptr().cast(), v) }
}

/// Writes `v` to the 16 bytes of `d`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn store16(d: &mut [u8; 16], v: __m128i) {
    // SAFETY: writes exactly the 16 bytes of `d` (unaligned store).
    unsafe { _mm_storeu_si128(d.as_mut_ptr().cast(), v) }
}

/// Writes `v` to the 8 floats of `y`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn store8f(y: &mut [f32; 8], v: __m256) {
    // SAFETY: writes exactly the 32 bytes of `y` (unaligned store).
    unsafe { _mm256_storeu_ps(y.as_mut_ptr(), v) }
}

/// The 8 signed bytes of `b` as 8 floats (exact).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn i8x8_f32(b: &[u8; 8]) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(load8(b)))
}

/// The half floats at `b[0..2]` and `b[2..4]`, each in every lane (exact, as
/// `half::f16::to_f32`; a signalling NaN comes out quiet, as there): a broadcast load, one
/// conversion and two in-lane shuffles.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn halves_x8(b: &[u8; 4]) -> (__m256, __m256) {
    let dm = _mm256_cvtph_ps(_mm_set1_epi32(i32::from_le_bytes(*b)));
    (_mm256_moveldup_ps(dm), _mm256_movehdup_ps(dm))
}

/// The half float at `b[0..2]` in every lane.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn half_x8(b: &[u8; 2]) -> __m256 {
    let h = u16::from_le_bytes(*b) as i32;
    _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(h)))
}

/// ggml's `get_scale_min_k4` for all 8 sub-blocks of a Q4_K/Q5_K block at once (the
/// word-wise form of ggml's SIMD dot products): bytes 0..8 the 6-bit scales, 8..16 the mins.
#[inline(always)]
pub(super) fn scale_min_k4(s: &[u8; 12]) -> [u8; 16] {
    const KMASK1: u32 = 0x3f3f_3f3f;
    const KMASK2: u32 = 0x0f0f_0f0f;
    const KMASK3: u32 = 0x0303_0303;
    let w = |i: usize| u32::from_le_bytes(*at::<4, u8>(s, 4 * i));
    let (u0, u1, u2) = (w(0), w(1), w(2));
    // Sub-block j < 4: scale s[j] & 63, min s[j + 4] & 63. j >= 4: the low nibble (scale)
    // or high nibble (min) of s[j + 4], with the top two bits of s[j - 4] (scale) or s[j]
    // (min) above.
    let words = [
        u0 & KMASK1,
        (u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4),
        u1 & KMASK1,
        ((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4),
    ];
    let mut out = [0u8; 16];
    for (o, w) in out.chunks_exact_mut(4).zip(words) {
        o.copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// Q4_K/Q5_K (`b`: `d`, `dmin` at 0..4, scales at 4..16): `d * sc_j` and `dmin * m_j` for
/// the 8 sub-blocks of 32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn k4_scales(b: &[u8]) -> (__m256, __m256) {
    let sm = scale_min_k4(at(b, 4));
    let (d, dmin) = halves_x8(at(b, 0));
    let v = load16(&sm);
    let sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
    let m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128::<8>(v)));
    (_mm256_mul_ps(d, sc), _mm256_mul_ps(dmin, m))
}

/// `dl[s] = d * x_s` for 16 sub-blocks, `x` the 16 signed bytes `v` (exact products).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scales16(dl: &mut [f32; 16], d: __m256, v: __m128i) {
    let lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
    let hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(v)));
    store8f(at_mut(dl, 0), _mm256_mul_ps(d, lo));
    store8f(at_mut(dl, 8), _mm256_mul_ps(d, hi));
}

/// Q2_K: `q` the 2-bit quants (0..3), `dl = d * (sc & 15)`, `ml = dmin * (sc >> 4)` per 16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q2_k(b: &[u8; bb(GgmlQuant::Q2_K)], u: &mut Unpacked) {
    let m3 = _mm256_set1_epi8(3);
    for n in 0..2 {
        // Shift j of byte l is weight 128n + 32j + l (`(q >> 2j) & 3`; the 16-bit shifts'
        // spill from the next byte is masked off).
        let q = load32(at(b, 16 + 32 * n));
        let w = at_mut::<128, _>(&mut u.q, 128 * n);
        store32(at_mut(w, 0), _mm256_and_si256(q, m3));
        store32(
            at_mut(w, 32),
            _mm256_and_si256(_mm256_srli_epi16::<2>(q), m3),
        );
        store32(
            at_mut(w, 64),
            _mm256_and_si256(_mm256_srli_epi16::<4>(q), m3),
        );
        store32(
            at_mut(w, 96),
            _mm256_and_si256(_mm256_srli_epi16::<6>(q), m3),
        );
    }
    let (d, dmin) = halves_x8(at(b, 80));
    let sc = load16(at(b, 0));
    let m4 = _mm_set1_epi8(0x0f);
    scales16(&mut u.dl, d, _mm_and_si128(sc, m4));
    scales16(&mut u.ml, dmin, _mm_and_si128(_mm_srli_epi16::<4>(sc), m4));
}

/// Q3_K: `q = low - (hmask bit ? 0 : 4)` (-4..3), `dl = d * (sc - 32)` per 16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q3_k(b: &[u8; bb(GgmlQuant::Q3_K)], u: &mut Unpacked) {
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let s = at::<12, _>(b, 96);
    let w = |i: usize| u32::from_le_bytes(*at::<4, u8>(s, 4 * i));
    let (a0, a1, tmp) = (w(0), w(1), w(2));
    let aux = [
        (a0 & KMASK2) | ((tmp & KMASK1) << 4),
        (a1 & KMASK2) | (((tmp >> 2) & KMASK1) << 4),
        ((a0 >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4),
        ((a1 >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4),
    ];
    let mut sc = [0u8; 16];
    for (o, w) in sc.chunks_exact_mut(4).zip(aux) {
        o.copy_from_slice(&w.to_le_bytes());
    }
    // The 6-bit scales minus 32, as signed bytes (exact).
    let sc = _mm_sub_epi8(load16(&sc), _mm_set1_epi8(32));
    scales16(&mut u.dl, half_x8(at(b, 108)), sc);

    let hm = load32(at(b, 0));
    let (m3, fc, zero) = (
        _mm256_set1_epi8(3),
        _mm256_set1_epi8(-4),
        _mm256_setzero_si256(),
    );
    for n in 0..2 {
        let mut q = load32(at(b, 32 + 32 * n));
        for j in 0..4 {
            // Weight 128n + 32j + l: `(q[l] >> 2j) & 3`, minus 4 where bit 4n + j of
            // hmask[l] is clear (`low | 0xfc` is `low - 4` for low < 4).
            let bit = _mm256_set1_epi8(1 << (4 * n + j));
            let clear = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), zero);
            let low = _mm256_and_si256(q, m3);
            let v = _mm256_or_si256(low, _mm256_and_si256(clear, fc));
            store32(at_mut(&mut u.q, 128 * n + 32 * j), v);
            // The next field down (the 16-bit shift's spill lands above bit 1, masked).
            q = _mm256_srli_epi16::<2>(q);
        }
    }
}

/// Q5_K: `q` the 5-bit quants (0..31); the scales are [`k4_scales`]'.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q5_k(b: &[u8; bb(GgmlQuant::Q5_K)], u: &mut Unpacked) {
    let (dl, ml) = k4_scales(b);
    store8f(at_mut(&mut u.dl, 0), dl);
    store8f(at_mut(&mut u.ml, 0), ml);
    let (m4, b4) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x10));
    // Bits 2g and 2g + 1 of qh[l] are the fifth bits of weights 64g + l and 64g + 32 + l;
    // `h` is qh shifted right by 2g (16-bit lanes: what spills in from the next byte lands
    // at bits 6 and 7, never used before the next shift).
    let mut h = load32(at(b, 16));
    for g in 0..4 {
        let q = load32(at(b, 48 + 32 * g));
        let lo = _mm256_or_si256(
            _mm256_and_si256(q, m4),
            _mm256_and_si256(_mm256_slli_epi16::<4>(h), b4),
        );
        let hi = _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4),
            _mm256_and_si256(_mm256_slli_epi16::<3>(h), b4),
        );
        store32(at_mut(&mut u.q, 64 * g), lo);
        store32(at_mut(&mut u.q, 64 * g + 32), hi);
        h = _mm256_srli_epi16::<2>(h);
    }
}

/// Q6_K: `q` the 6-bit quants minus 32 (-32..31), `dl = d * sc` per 16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q6_k(b: &[u8; bb(GgmlQuant::Q6_K)], u: &mut Unpacked) {
    let (m4, m30, off) = (
        _mm256_set1_epi8(0x0f),
        _mm256_set1_epi8(0x30),
        _mm256_set1_epi8(32),
    );
    for n in 0..2 {
        // Weights 128n + l, + 32, + 64, + 96 (l < 32): the low nibbles of ql[l], ql[l + 32],
        // then their high nibbles, over bits 0-1, 2-3, 4-5, 6-7 of qh[l] (at bits 4-5).
        let a = load32(at(b, 64 * n));
        let c = load32(at(b, 64 * n + 32));
        let h = load32(at(b, 128 + 32 * n));
        let nib = |x: __m256i, hb: __m256i| {
            _mm256_sub_epi8(
                _mm256_or_si256(_mm256_and_si256(x, m4), _mm256_and_si256(hb, m30)),
                off,
            )
        };
        let w = at_mut::<128, _>(&mut u.q, 128 * n);
        store32(at_mut(w, 0), nib(a, _mm256_slli_epi16::<4>(h)));
        store32(at_mut(w, 32), nib(c, _mm256_slli_epi16::<2>(h)));
        store32(at_mut(w, 64), nib(_mm256_srli_epi16::<4>(a), h));
        store32(
            at_mut(w, 96),
            nib(_mm256_srli_epi16::<4>(c), _mm256_srli_epi16::<2>(h)),
        );
    }
    scales16(&mut u.dl, half_x8(at(b, 208)), load16(at(b, 192)));
}

/// `kvalues_iq4nl` in both 128-bit lanes, for `vpshufb`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn iq4_table() -> __m256i {
    const KV: [u8; 16] = {
        let mut t = [0u8; 16];
        let mut i = 0;
        while i < 16 {
            t[i] = KVALUES_IQ4NL[i] as u8;
            i += 1;
        }
        t
    };
    _mm256_broadcastsi128_si256(load16(&KV))
}

/// IQ4_XS: `q` the levels `kvalues_iq4nl[nibble]`, `dl = d * (ls - 32)` per 32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn iq4_xs(b: &[u8; bb(GgmlQuant::IQ4_XS)], u: &mut Unpacked) {
    let kv = iq4_table();
    let m4 = _mm256_set1_epi8(0x0f);
    for p in 0..4 {
        // Bytes 16i + j (i < 2) of this quarter: weights 64p + 32i + j (low nibble) and
        // 64p + 32i + 16 + j (high nibble).
        let q = load32(at(b, 8 + 32 * p));
        let lo = _mm256_shuffle_epi8(kv, _mm256_and_si256(q, m4));
        let hi = _mm256_shuffle_epi8(kv, _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4));
        let w = at_mut::<64, _>(&mut u.q, 64 * p);
        store16(at_mut(w, 0), _mm256_castsi256_si128(lo));
        store16(at_mut(w, 16), _mm256_castsi256_si128(hi));
        store16(at_mut(w, 32), _mm256_extracti128_si256::<1>(lo));
        store16(at_mut(w, 48), _mm256_extracti128_si256::<1>(hi));
    }
    store8f(at_mut(&mut u.dl, 0), iq4_xs_scales(b));
}

/// IQ4_XS's `dl_ib = d * (ls_ib - 32)` for its 8 sub-blocks of 32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn iq4_xs_scales(b: &[u8; bb(GgmlQuant::IQ4_XS)]) -> __m256 {
    // ls_ib = nibble ib of scales_l (bits 4ib..) | bits 2ib..2ib+2 of scales_h at bits 4-5.
    let sl = _mm256_set1_epi32(i32::from_le_bytes(*at(b, 4)));
    let sh = _mm256_set1_epi32(u16::from_le_bytes(*at(b, 2)) as i32);
    let low = _mm256_and_si256(
        _mm256_srlv_epi32(sl, _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
        _mm256_set1_epi32(0x0f),
    );
    let high = _mm256_and_si256(
        _mm256_srlv_epi32(sh, _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
        _mm256_set1_epi32(3),
    );
    let ls = _mm256_or_si256(low, _mm256_slli_epi32::<4>(high));
    let ls = _mm256_cvtepi32_ps(_mm256_sub_epi32(ls, _mm256_set1_epi32(32)));
    _mm256_mul_ps(half_x8(at(b, 0)), ls)
}
