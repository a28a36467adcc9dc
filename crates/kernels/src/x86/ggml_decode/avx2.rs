//! The AVX2 float pass: 8 weights a vector, each a byte widened to a float (exact) and
//! finished by the reference's own float operation.

use std::arch::x86_64::*;

use tessera_core::ggml_quants::GgmlQuant;

use super::unpack::{
    self, half_x8, halves_x8, i8x8_f32, iq4_table, load16, load8, store32, store8f,
};
use super::{at, at_mut, bb, blocks, in_memory, Unpacked};

/// Dequantizes `row` (whole blocks of `q`) into `out`, bitwise as the reference.
///
/// # Panics
/// If `row` is not a whole number of blocks or `out` does not hold exactly their weights.
#[target_feature(enable = "avx2,fma,f16c")]
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
        GgmlQuant::IQ4_NL => each!(IQ4_NL, 32, |b, y| iq4_nl(b, y)),
        GgmlQuant::IQ4_XS => unpacked!(IQ4_XS, unpack::iq4_xs, 32, false),
        GgmlQuant::Q3_K => unpacked!(Q3_K, unpack::q3_k, 16, false),
        GgmlQuant::Q2_K => unpacked!(Q2_K, unpack::q2_k, 16, true),
    }
}

/// The float pass of an [`Unpacked`] block with sub-blocks of `S` weights:
/// `y = dl * q - ml` (`FMS`, one rounding as the reference's exact product then subtract)
/// or `y = dl * q`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn emit<const S: usize, const FMS: bool>(u: &Unpacked, y: &mut [f32; 256]) {
    let u = in_memory(u);
    for s in 0..256 / S {
        let d = _mm256_set1_ps(u.dl[s]);
        let m = _mm256_set1_ps(u.ml[s]);
        for i in 0..S / 8 {
            let k = S * s + 8 * i;
            let q = i8x8_f32(at(&u.q, k));
            let w = if FMS {
                _mm256_fmsub_ps(d, q, m)
            } else {
                _mm256_mul_ps(d, q)
            };
            store8f(at_mut(y, k), w);
        }
    }
}

/// Q4_K, straight from the block: each 8 quant bytes widened once, the low nibbles (weights
/// 64g + l) and high nibbles (64g + 32 + l) both taken from the dwords.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q4_k(b: &[u8; bb(GgmlQuant::Q4_K)], y: &mut [f32; 256]) {
    // `d * sc_j` at j, `dmin * m_j` at 8 + j.
    let mut s = [0f32; 16];
    let (dl, ml) = unpack::k4_scales(b);
    store8f(at_mut(&mut s, 0), dl);
    store8f(at_mut(&mut s, 8), ml);
    let s = in_memory(&s);
    let m4 = _mm256_set1_epi32(0x0f);
    for g in 0..4 {
        let (d1, m1) = (_mm256_set1_ps(s[2 * g]), _mm256_set1_ps(s[8 + 2 * g]));
        let (d2, m2) = (_mm256_set1_ps(s[2 * g + 1]), _mm256_set1_ps(s[9 + 2 * g]));
        for i in 0..4 {
            let v = _mm256_cvtepu8_epi32(load8(at(b, 16 + 32 * g + 8 * i)));
            let lo = _mm256_cvtepi32_ps(_mm256_and_si256(v, m4));
            let hi = _mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(v));
            store8f(at_mut(y, 64 * g + 8 * i), _mm256_fmsub_ps(d1, lo, m1));
            store8f(at_mut(y, 64 * g + 32 + 8 * i), _mm256_fmsub_ps(d2, hi, m2));
        }
    }
}

/// Q8_K: `y = d * q`, `d` an f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q8_k(b: &[u8; bb(GgmlQuant::Q8_K)], y: &mut [f32; 256]) {
    let d = _mm256_set1_ps(f32::from_le_bytes(*at(b, 0)));
    for i in 0..32 {
        store8f(
            at_mut(y, 8 * i),
            _mm256_mul_ps(d, i8x8_f32(at(b, 4 + 8 * i))),
        );
    }
}

/// A 32-bit mask as 32 bytes, byte `i` `0xff` where bit `i` is set (ggml's
/// `bytes_from_bits_32`).
#[inline]
#[target_feature(enable = "avx2")]
fn bytes_from_bits(x: u32) -> __m256i {
    let spread = _mm256_setr_epi64x(
        0,
        0x0101_0101_0101_0101,
        0x0202_0202_0202_0202,
        0x0303_0303_0303_0303,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x as i32), spread);
    // Every bit but bit (i % 8) of byte i set: all ones exactly where that bit is.
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(bytes, others), _mm256_set1_epi64x(-1))
}

/// Q5_0 (`y = (q - 16) * d`) or Q5_1 (`ONE`, `y = q * d + m`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q5<const ONE: bool, const BB: usize>(b: &[u8; BB], y: &mut [f32; 32]) {
    let o = if ONE { 4 } else { 2 };
    let qs = load16(at(b, o + 4));
    let m4 = _mm_set1_epi8(0x0f);
    // Bytes 0..16 the low nibbles (weights 0..16), 16..32 the high ones.
    let nib = _mm256_set_m128i(
        _mm_and_si128(_mm_srli_epi16::<4>(qs), m4),
        _mm_and_si128(qs, m4),
    );
    let high = bytes_from_bits(u32::from_le_bytes(*at(b, o)));
    let mut buf = [0u8; 32];
    let (d, m);
    if ONE {
        // q | (bit ? 16 : 0).
        store32(
            &mut buf,
            _mm256_or_si256(nib, _mm256_and_si256(high, _mm256_set1_epi8(0x10))),
        );
        (d, m) = halves_x8(at(b, 0));
    } else {
        // q - 16: the nibble where the bit is set, else `nibble | 0xf0` (nibble - 16).
        store32(
            &mut buf,
            _mm256_or_si256(nib, _mm256_andnot_si256(high, _mm256_set1_epi8(-16))),
        );
        d = half_x8(at(b, 0));
        m = d;
    }
    for i in 0..4 {
        let q = i8x8_f32(at(&buf, 8 * i));
        let w = if ONE {
            _mm256_fmadd_ps(q, d, m)
        } else {
            _mm256_mul_ps(q, d)
        };
        store8f(at_mut(y, 8 * i), w);
    }
}

/// IQ4_NL: `y = d * kvalues_iq4nl[q]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn iq4_nl(b: &[u8; bb(GgmlQuant::IQ4_NL)], y: &mut [f32; 32]) {
    let kv = _mm256_castsi256_si128(iq4_table());
    let q = load16(at(b, 2));
    let m4 = _mm_set1_epi8(0x0f);
    let lo = _mm_shuffle_epi8(kv, _mm_and_si128(q, m4));
    let hi = _mm_shuffle_epi8(kv, _mm_and_si128(_mm_srli_epi16::<4>(q), m4));
    let mut buf = [0u8; 32];
    store32(&mut buf, _mm256_set_m128i(hi, lo));
    let d = half_x8(at(b, 0));
    for i in 0..4 {
        store8f(
            at_mut(y, 8 * i),
            _mm256_mul_ps(d, i8x8_f32(at(&buf, 8 * i))),
        );
    }
}
