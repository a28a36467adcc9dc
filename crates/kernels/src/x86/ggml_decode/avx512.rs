//! The AVX-512 (F, BW, VL) float pass: 16 weights a vector. Besides the wider vectors, the
//! 32-weight formats take their fifth bits as a mask register (one masked OR per vector),
//! and 4-bit quants become floats by one permute of a 16-float table (the IQ4 levels, or
//! Q4_K's 0..=15) instead of a conversion: that runs on the shuffle port, which leaves the
//! conversion-and-FMA port to the FMAs.

use std::arch::x86_64::*;

use tessera_core::ggml_quants::{GgmlQuant, KVALUES_IQ4NL};

use super::unpack::{self, load16, scale_min_k4};
use super::{at, at_mut, bb, blocks, in_memory, Unpacked};

/// Dequantizes `row` (whole blocks of `q`) into `out`, bitwise as the reference.
///
/// # Panics
/// If `row` is not a whole number of blocks or `out` does not hold exactly their weights.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) fn dequantize(q: GgmlQuant, row: &[u8], out: &mut [f32]) {
    macro_rules! each {
        ($Q:ident, $BL:literal, |$b:ident, $y:ident| $body:expr) => {
            for ($b, $y) in blocks::<{ bb(GgmlQuant::$Q) }, $BL>(row, out) {
                $body
            }
        };
    }
    // The integer pass into an `Unpacked`, then the float pass over sub-blocks of S.
    macro_rules! unpacked {
        ($Q:ident, $unpack:path, $S:literal, $FMS:literal) => {{
            let mut u = Unpacked::new();
            each!($Q, 256, |b, y| {
                $unpack(b, &mut u);
                emit::<$S, $FMS>(&u, y)
            })
        }};
    }
    match q {
        GgmlQuant::Q4_K => each!(Q4_K, 256, |b, y| q4_k(b, y)),
        GgmlQuant::Q6_K => unpacked!(Q6_K, unpack::q6_k, 16, false),
        GgmlQuant::Q5_0 => each!(Q5_0, 32, |b, y| q5::<false, _>(b, y)),
        GgmlQuant::Q5_1 => each!(Q5_1, 32, |b, y| q5::<true, _>(b, y)),
        GgmlQuant::Q8_K => each!(Q8_K, 256, |b, y| q8_k(b, y)),
        GgmlQuant::Q5_K => unpacked!(Q5_K, unpack::q5_k, 32, true),
        GgmlQuant::IQ4_NL => {
            let kv = iq4_levels();
            each!(IQ4_NL, 32, |b, y| iq4_nl(b, y, kv))
        }
        GgmlQuant::IQ4_XS => {
            let kv = iq4_levels();
            each!(IQ4_XS, 256, |b, y| iq4_xs(b, y, kv))
        }
        GgmlQuant::Q3_K => unpacked!(Q3_K, unpack::q3_k, 16, false),
        GgmlQuant::Q2_K => unpacked!(Q2_K, unpack::q2_k, 16, true),
    }
}

/// Writes `v` to the 16 floats of `y`.
#[inline]
#[target_feature(enable = "avx512f")]
fn store16f(y: &mut [f32; 16], v: __m512) {
    // SAFETY: writes exactly the 64 bytes of `y` (unaligned store).
    unsafe { _mm512_storeu_ps(y.as_mut_ptr(), v) }
}

/// The 16 unsigned bytes of `b` as dwords.
#[inline]
#[target_feature(enable = "avx512f,avx2")]
fn u8x16(b: &[u8; 16]) -> __m512i {
    _mm512_cvtepu8_epi32(load16(b))
}

/// The 16 signed bytes of `b` as floats (exact).
#[inline]
#[target_feature(enable = "avx512f,avx2")]
fn i8x16_f32(b: &[u8; 16]) -> __m512 {
    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16(b)))
}

/// The half float at `b[0..2]` in every lane (exact): a broadcast load and one conversion.
#[inline]
#[target_feature(enable = "avx512f,avx2,f16c")]
fn half_x16(b: &[u8; 2]) -> __m512 {
    _mm512_cvtph_ps(_mm256_set1_epi16(i16::from_le_bytes(*b)))
}

/// The half floats at `b[0..2]` and `b[2..4]`, each in every lane (exact).
#[inline]
#[target_feature(enable = "avx512f,avx2,f16c")]
fn halves_x16(b: &[u8; 4]) -> (__m512, __m512) {
    let dm = _mm512_cvtph_ps(_mm256_set1_epi32(i32::from_le_bytes(*b)));
    (_mm512_moveldup_ps(dm), _mm512_movehdup_ps(dm))
}

/// The float pass of an [`Unpacked`] block with sub-blocks of `S` weights (as the AVX2
/// one): `y = dl * q - ml` (`FMS`) or `y = dl * q`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn emit<const S: usize, const FMS: bool>(u: &Unpacked, y: &mut [f32; 256]) {
    let u = in_memory(u);
    for s in 0..256 / S {
        let d = _mm512_set1_ps(u.dl[s]);
        let m = _mm512_set1_ps(u.ml[s]);
        for i in 0..S / 16 {
            let k = S * s + 16 * i;
            let q = i8x16_f32(at(&u.q, k));
            let w = if FMS {
                _mm512_fmsub_ps(d, q, m)
            } else {
                _mm512_mul_ps(d, q)
            };
            store16f(at_mut(y, k), w);
        }
    }
}

/// Q4_K straight from the block: `y = (d * sc) * q - (dmin * m)`, each 16 quant bytes
/// widened once for their low nibbles (weights 64g + l) and high ones (64g + 32 + l).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn q4_k(b: &[u8; bb(GgmlQuant::Q4_K)], y: &mut [f32; 256]) {
    // Lanes 0..8 `d * sc_j`, 8..16 `dmin * m_j`.
    let sm = scale_min_k4(at(b, 4));
    let (d, dmin) = halves_x16(at(b, 0));
    let dd = _mm512_mask_blend_ps(0xff00, d, dmin);
    let mut s = [0f32; 16];
    store16f(&mut s, _mm512_mul_ps(dd, _mm512_cvtepi32_ps(u8x16(&sm))));
    let s = in_memory(&s);
    // The nibbles as floats by a permute of 0.0..=15.0 (it reads the low 4 bits of each
    // index, so the low nibble needs no mask): a shuffle-port operation in place of a
    // mask and a conversion on the FMA ports.
    let f = nibble_floats();
    for g in 0..4 {
        let (d1, m1) = (_mm512_set1_ps(s[2 * g]), _mm512_set1_ps(s[8 + 2 * g]));
        let (d2, m2) = (_mm512_set1_ps(s[2 * g + 1]), _mm512_set1_ps(s[9 + 2 * g]));
        for i in 0..2 {
            let v = u8x16(at(b, 16 + 32 * g + 16 * i));
            let lo = _mm512_permutexvar_ps(v, f);
            let hi = _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(v), f);
            store16f(at_mut(y, 64 * g + 16 * i), _mm512_fmsub_ps(d1, lo, m1));
            store16f(at_mut(y, 64 * g + 32 + 16 * i), _mm512_fmsub_ps(d2, hi, m2));
        }
    }
}

/// Q8_K: `y = d * q`, `d` an f32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn q8_k(b: &[u8; bb(GgmlQuant::Q8_K)], y: &mut [f32; 256]) {
    let d = _mm512_set1_ps(f32::from_le_bytes(*at(b, 0)));
    for i in 0..16 {
        store16f(
            at_mut(y, 16 * i),
            _mm512_mul_ps(d, i8x16_f32(at(b, 4 + 16 * i))),
        );
    }
}

/// Q5_0 (`y = (q - 16) * d`) or Q5_1 (`ONE`, `y = q * d + m`): the fifth bits of weights
/// 0..16 and 16..32 are the two halves of `qh`, taken as lane masks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn q5<const ONE: bool, const BB: usize>(b: &[u8; BB], y: &mut [f32; 32]) {
    let o = if ONE { 4 } else { 2 };
    let qh = u32::from_le_bytes(*at(b, o));
    let v = u8x16(at(b, o + 4));
    let nib = [
        _mm512_and_si512(v, _mm512_set1_epi32(0x0f)),
        _mm512_srli_epi32::<4>(v),
    ];
    let (d, m) = if ONE {
        halves_x16(at(b, 0))
    } else {
        (half_x16(at(b, 0)), _mm512_setzero_ps())
    };
    for (i, n) in nib.into_iter().enumerate() {
        let bits = (qh >> (16 * i)) as u16;
        let w = if ONE {
            // q = nibble | 16 where the bit is set.
            let q = _mm512_mask_or_epi32(n, bits, n, _mm512_set1_epi32(16));
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), d, m)
        } else {
            // q - 16 = nibble where the bit is set, else `nibble | !15` (nibble - 16).
            let q = _mm512_mask_or_epi32(n, !bits, n, _mm512_set1_epi32(-16));
            _mm512_mul_ps(_mm512_cvtepi32_ps(q), d)
        };
        store16f(at_mut(y, 16 * i), w);
    }
}

/// 16 floats in a register.
#[inline]
#[target_feature(enable = "avx512f")]
fn floats16(v: &[f32; 16]) -> __m512 {
    // SAFETY: reads exactly the 64 bytes of `v`.
    unsafe { _mm512_loadu_ps(v.as_ptr()) }
}

/// `kvalues_iq4nl` as 16 floats (exact), for `vpermps`.
#[inline]
#[target_feature(enable = "avx512f")]
fn iq4_levels() -> __m512 {
    const KV: [f32; 16] = {
        let mut t = [0f32; 16];
        let mut i = 0;
        while i < 16 {
            t[i] = KVALUES_IQ4NL[i] as f32;
            i += 1;
        }
        t
    };
    floats16(&KV)
}

/// `0.0, 1.0, ..., 15.0`, for `vpermps`.
#[inline]
#[target_feature(enable = "avx512f")]
fn nibble_floats() -> __m512 {
    const N: [f32; 16] = {
        let mut t = [0f32; 16];
        let mut i = 0;
        while i < 16 {
            t[i] = i as f32;
            i += 1;
        }
        t
    };
    floats16(&N)
}

/// 16 nibbles (as dwords) to their levels, times `d`: `d * kvalues_iq4nl[q]`.
#[inline]
#[target_feature(enable = "avx512f")]
fn levels(d: __m512, nib: __m512i, kv: __m512) -> __m512 {
    _mm512_mul_ps(d, _mm512_permutexvar_ps(nib, kv))
}

/// IQ4_NL: `y = d * kvalues_iq4nl[q]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn iq4_nl(b: &[u8; bb(GgmlQuant::IQ4_NL)], y: &mut [f32; 32], kv: __m512) {
    let d = half_x16(at(b, 0));
    let v = u8x16(at(b, 2));
    // vpermps reads the low 4 bits of each index: the low nibble needs no mask.
    store16f(at_mut(y, 0), levels(d, v, kv));
    store16f(at_mut(y, 16), levels(d, _mm512_srli_epi32::<4>(v), kv));
}

/// IQ4_XS: `y = (d * (ls - 32)) * kvalues_iq4nl[q]` per 32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn iq4_xs(b: &[u8; bb(GgmlQuant::IQ4_XS)], y: &mut [f32; 256], kv: __m512) {
    let mut dl = [0f32; 8];
    unpack::store8f(&mut dl, unpack::iq4_xs_scales(b));
    for (ib, &dl) in in_memory(&dl).iter().enumerate() {
        let d = _mm512_set1_ps(dl);
        let v = u8x16(at(b, 8 + 16 * ib));
        store16f(at_mut(y, 32 * ib), levels(d, v, kv));
        store16f(
            at_mut(y, 32 * ib + 16),
            levels(d, _mm512_srli_epi32::<4>(v), kv),
        );
    }
}
