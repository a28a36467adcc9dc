//! AVX2 integer dots of one 32-weight block (Q5_0, Q5_1, IQ4_NL) with 8-bit activation
//! blocks, as llama.cpp's `ggml_vec_dot_q5_0_q8_0` and friends: the 32 levels in one vector
//! (low nibbles of the 16 bytes first, then high), Q5's fifth bits spread from the 32-bit
//! `qh` by a byte shuffle and compare (AVX-512: a byte mask). Q5 levels go in unsigned
//! (`0..32`), Q5_0's offset of 16 through the activations' quant sum; IQ4_NL's table values as
//! `|v|` against the quants with `v`'s sign.
//!
//! `#[inline(always)]` into the drivers of `super::x86` (no `#[target_feature]` of their
//! own). Invariants: as `super::x86`'s, and the CPU has AVX2.

use std::arch::x86_64::*;

use super::x86::{ActRows, Sums};
use tessera_core::ggml_quants::KVALUES_IQ4NL;

/// The 16 bytes at `p` as 32 nibbles: low nibbles in bytes 0..16, high in 16..32.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> __m256i {
    let v = _mm_loadu_si128(p as *const __m128i);
    let m4 = _mm256_set1_epi8(15);
    _mm256_and_si256(_mm256_setr_m128i(v, _mm_srli_epi16::<4>(v)), m4)
}

/// Byte `i` is 0xff where bit `i` of the 32 bits at `p` is set, else 0.
#[inline(always)]
unsafe fn bits_to_bytes(p: *const u8) -> __m256i {
    let x = _mm256_set1_epi32(std::ptr::read_unaligned(p as *const i32));
    let spread = _mm256_setr_epi64x(
        0,
        0x0101_0101_0101_0101,
        0x0202_0202_0202_0202,
        0x0303_0303_0303_0303,
    );
    let bytes = _mm256_shuffle_epi8(x, spread);
    // Every bit but bit i % 8 set: all ones exactly where bit i is.
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(bytes, others), _mm256_set1_epi8(-1))
}

/// Sums of 4 products of unsigned `u` and signed `v` bytes in each i32 lane: `vpmaddubsw`
/// then `vpmaddwd` by ones (the i16 pair sums here at most `2 · 127 · 127`, no saturation),
/// or one VNNI `vpdpbusd`.
#[inline(always)]
unsafe fn dot4<const VNNI: bool>(u: __m256i, v: __m256i) -> __m256i {
    if VNNI {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, v)
    } else {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, v), _mm256_set1_epi16(1))
    }
}

/// Activation quants of row `a`, block `b`.
#[inline(always)]
unsafe fn quants<const MR: usize>(x: &ActRows<MR>, a: usize, b: usize) -> __m256i {
    _mm256_loadu_si256(x.q[a].add(32 * b) as *const __m256i)
}

/// Q5_0 (`OFFSET`) and Q5_1, levels `0..32`: Q5_0's offset of 16 (`16 · Σa`) is left to
/// `super::x86`'s driver, once per 4 rows. With `AVX512`, the fifth bits add 16 through a
/// byte mask loaded straight from `qh`.
#[inline(always)]
pub(super) unsafe fn q5<
    const MR: usize,
    const OFFSET: bool,
    const VNNI: bool,
    const AVX512: bool,
>(
    w: *const u8,
    x: &ActRows<MR>,
    b: usize,
) -> Sums<MR> {
    let qh = w.add(if OFFSET { 2 } else { 4 });
    let lv = if AVX512 {
        let set = std::ptr::read_unaligned(qh as *const u32);
        let lo = nibbles(qh.add(4));
        _mm256_mask_add_epi8(lo, set, lo, _mm256_set1_epi8(16))
    } else {
        let high = _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(16));
        _mm256_or_si256(nibbles(qh.add(4)), high)
    };
    let mut s = Sums {
        i: [_mm256_setzero_si256(); MR],
        m: [_mm256_setzero_si256(); MR],
    };
    for a in 0..MR {
        s.i[a] = dot4::<VNNI>(lv, quants(x, a, b));
    }
    s
}

/// IQ4_NL.
#[inline(always)]
pub(super) unsafe fn iq4nl<const MR: usize, const VNNI: bool>(
    w: *const u8,
    x: &ActRows<MR>,
    b: usize,
) -> Sums<MR> {
    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const _));
    let v = _mm256_shuffle_epi8(table, nibbles(w.add(2)));
    let av = _mm256_sign_epi8(v, v);
    let mut s = Sums {
        i: [_mm256_setzero_si256(); MR],
        m: [_mm256_setzero_si256(); MR],
    };
    for a in 0..MR {
        let q = _mm256_sign_epi8(quants(x, a, b), v);
        s.i[a] = dot4::<VNNI>(av, q);
    }
    s
}
