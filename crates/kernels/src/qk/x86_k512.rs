//! AVX-512 integer dots of one super-block with Q8_K activation rows, 64 levels a vector:
//! Q4_K/Q5_K take the low (or high) nibbles of 64 weight bytes, sub-blocks `g` and `g + 2`,
//! one per 256-bit half, against 64 contiguous activation quants (their nibble order,
//! `QkActs::stored`); Q6_K takes four 16-weight sub-blocks, one per 128-bit lane. The
//! sub-block scales are placed per lane by one `vpermw`. Without VNNI: `vpmaddubsw`, then
//! `vpmaddwd` by the scales; with VNNI, two level vectors at a time: `vpdpbusd` sums of 4,
//! packed to i16 and scaled by one `vpdpwssd` ([`dot_pair`]: 3 multiplies for 2 vectors, not
//! 4). Level offsets and minimums go through the block sums as in [`super::x86_k`]; the lanes
//! are folded to 256 bits for `super::x86`'s horizontal sums.
//!
//! These functions carry no `#[target_feature]`: they are `#[inline(always)]` into the
//! AVX-512 drivers of `super::x86`, whose features (with or without VNNI) they take.
//! Invariants: as `super::x86`'s, and the CPU has AVX-512 F/BW/VL (and VNNI when `VNNI`).

use std::arch::x86_64::*;

use super::x86::{ActRows, Sums};

/// `acc + vpmaddwd(p16, scale)`.
#[inline(always)]
unsafe fn mac<const VNNI: bool>(acc: __m512i, p16: __m512i, scale: __m512i) -> __m512i {
    if VNNI {
        _mm512_dpwssd_epi32(acc, p16, scale)
    } else {
        _mm512_add_epi32(acc, _mm512_madd_epi16(p16, scale))
    }
}

/// The 64 activation quants of row `a`, block `b` at `off`.
#[inline(always)]
unsafe fn quants<const MR: usize>(x: &ActRows<MR>, a: usize, b: usize, off: usize) -> __m512i {
    _mm512_loadu_si512(x.q[a].add(256 * b + off) as *const _)
}

/// The two 256-bit halves summed.
#[inline(always)]
unsafe fn fold(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v))
}

/// `vpermw` indices: i16 lane `i` takes lane `idx(i / 8)`.
#[inline(always)]
unsafe fn lanes8(idx: [i16; 4]) -> __m512i {
    let q = |i: usize| _mm_set1_epi16(idx[i]);
    let lo = _mm256_setr_m128i(q(0), q(1));
    let hi = _mm256_setr_m128i(q(2), q(3));
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// `vpermw` indices: i16 lane `i` takes lane `idx[i / 4]`.
#[inline(always)]
unsafe fn quads(idx: [i16; 8]) -> __m512i {
    let v: [i16; 32] = std::array::from_fn(|i| idx[i / 4]);
    _mm512_loadu_si512(v.as_ptr() as *const _)
}

/// With VNNI, `acc + Σ scale · (u0 · v0 ‖ u1 · v1)`: `vpdpbusd` sums of 4 products (each
/// fits an i16: levels below 64, quants at most 127 in magnitude), packed to i16 (per
/// 128-bit lane: 4 sums of `u0`, 4 of `u1`) and scaled and added by one `vpdpwssd`; `scale`
/// holds, per 128-bit lane, `u0`'s sub-block scale 4 times, then `u1`'s.
#[inline(always)]
unsafe fn dot_pair(
    acc: __m512i,
    u0: __m512i,
    v0: __m512i,
    u1: __m512i,
    v1: __m512i,
    scale: __m512i,
) -> __m512i {
    let zero = _mm512_setzero_si512();
    let s0 = _mm512_dpbusd_epi32(zero, u0, v0);
    let s1 = _mm512_dpbusd_epi32(zero, u1, v1);
    _mm512_dpwssd_epi32(acc, _mm512_packs_epi32(s0, s1), scale)
}

/// `vpermw` indices: i16 lanes 0..16 take lane `lo`, 16..32 lane `hi`.
#[inline(always)]
unsafe fn halves16(lo: i16, hi: i16) -> __m512i {
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_set1_epi16(lo)),
        _mm256_set1_epi16(hi),
    )
}

/// Q4_K (`Q5 = false`) and Q5_K, on activations in the nibble order (`QkActs::stored`):
/// the low nibbles of `qs[64p..64p + 64]` (sub-blocks 4p, 4p + 2) meet the 64 quants at
/// `128p`, the high nibbles (4p + 1, 4p + 3) those at `128p + 64`.
#[inline(always)]
pub(super) unsafe fn q4k<const MR: usize, const Q5: bool, const VNNI: bool>(
    w: *const u8,
    x: &ActRows<MR>,
    b: usize,
) -> Sums<MR> {
    let sm = super::x86_k::q4k_scales(w);
    let mins = _mm_cvtepu8_epi16(_mm_srli_si128::<8>(sm));
    let sc = _mm512_castsi128_si512(_mm_cvtepu8_epi16(sm));
    let mut s = Sums {
        i: [_mm256_setzero_si256(); MR],
        m: [_mm256_setzero_si256(); MR],
    };
    for a in 0..MR {
        let bs = _mm_loadu_si128(x.bs32[a].add(8 * b) as *const __m128i);
        s.m[a] = _mm256_zextsi128_si256(_mm_madd_epi16(mins, bs));
    }
    let m4 = _mm512_set1_epi8(15);
    let qs = w.add(if Q5 { 48 } else { 16 });
    let hb = if Q5 {
        _mm512_broadcast_i64x4(_mm256_loadu_si256(w.add(16) as *const __m256i))
    } else {
        _mm512_setzero_si512()
    };
    let mut acc = [_mm512_setzero_si512(); MR];
    for p in 0..2 {
        let bits = _mm512_loadu_si512(qs.add(64 * p) as *const _);
        let lv = [
            _mm512_and_si512(bits, m4),
            _mm512_and_si512(_mm512_srli_epi16::<4>(bits), m4),
        ];
        let mut lv = lv;
        if Q5 {
            for (h, lv) in lv.iter_mut().enumerate() {
                // The fifth bits of sub-blocks g, g + 2: bits g, g + 2 of qh[l].
                let g = 4 * p + h;
                let bit = |k: usize| _mm256_set1_epi8((1u8 << k) as i8);
                let sel = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(bit(g)), bit(g + 2));
                let set = _mm512_test_epi8_mask(hb, sel);
                *lv = _mm512_mask_add_epi8(*lv, set, *lv, _mm512_set1_epi8(16));
            }
        }
        // Low nibbles: sub-blocks 4p (low 256 bits), 4p + 2; high: 4p + 1, 4p + 3.
        let g = 4 * p as i16;
        if VNNI {
            let scale = _mm512_permutexvar_epi16(
                quads([g, g + 1, g, g + 1, g + 2, g + 3, g + 2, g + 3]),
                sc,
            );
            for (a, acc) in acc.iter_mut().enumerate() {
                let (q0, q1) = (quants(x, a, b, 128 * p), quants(x, a, b, 128 * p + 64));
                *acc = dot_pair(*acc, lv[0], q0, lv[1], q1, scale);
            }
        } else {
            for (h, lv) in lv.iter().enumerate() {
                let g = g + h as i16;
                let scale = _mm512_permutexvar_epi16(halves16(g, g + 2), sc);
                for (a, acc) in acc.iter_mut().enumerate() {
                    let p16 = _mm512_maddubs_epi16(*lv, quants(x, a, b, 128 * p + 64 * h));
                    *acc = mac::<VNNI>(*acc, p16, scale);
                }
            }
        }
    }
    for (i, acc) in s.i.iter_mut().zip(acc) {
        *i = fold(acc);
    }
    s
}

/// Q6_K.
#[inline(always)]
pub(super) unsafe fn q6k<const MR: usize, const VNNI: bool>(
    w: *const u8,
    x: &ActRows<MR>,
    b: usize,
) -> Sums<MR> {
    let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(w.add(192) as *const __m128i));
    let sc = _mm512_castsi256_si512(sc16);
    let m4 = _mm512_set1_epi8(15);
    let half = |lo: i8, hi: i8| {
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_set1_epi8(lo)),
            _mm256_set1_epi8(hi),
        )
    };
    let half16 = |lo: i16, hi: i16| {
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_set1_epi16(lo)),
            _mm256_set1_epi16(hi),
        )
    };
    let mut acc = [_mm512_setzero_si512(); MR];
    for n in 0..2 {
        // ql[64n..64n + 64]: low nibbles are elements 128n + 0..64, high ones + 64..128;
        // their top bits are bits 0-1, 2-3 (low) and 4-5, 6-7 (high) of qh[32n + l].
        let ql = _mm512_loadu_si512(w.add(64 * n) as *const _);
        let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(w.add(128 + 32 * n) as *const __m256i));
        let top_lo = _mm512_sllv_epi16(_mm512_and_si512(qh, half(0x03, 0x0c)), half16(4, 2));
        let top_hi =
            _mm512_srlv_epi16(_mm512_and_si512(qh, half(0x30, 0xc0u8 as i8)), half16(0, 2));
        // (a & b) | c
        let lv = [
            _mm512_ternarylogic_epi32::<0xea>(ql, m4, top_lo),
            _mm512_ternarylogic_epi32::<0xea>(_mm512_srli_epi16::<4>(ql), m4, top_hi),
        ];
        // Low levels: sub-blocks 8n + k in 128-bit lane k; high levels: 8n + 4 + k.
        let g = 8 * n as i16;
        if VNNI {
            let scale = _mm512_permutexvar_epi16(
                quads([g, g + 4, g + 1, g + 5, g + 2, g + 6, g + 3, g + 7]),
                sc,
            );
            for (a, acc) in acc.iter_mut().enumerate() {
                let (q0, q1) = (quants(x, a, b, 128 * n), quants(x, a, b, 128 * n + 64));
                *acc = dot_pair(*acc, lv[0], q0, lv[1], q1, scale);
            }
        } else {
            for (h, lv) in lv.iter().enumerate() {
                let g = g + 4 * h as i16;
                let scale = _mm512_permutexvar_epi16(lanes8([g, g + 1, g + 2, g + 3]), sc);
                for (a, acc) in acc.iter_mut().enumerate() {
                    let p16 = _mm512_maddubs_epi16(*lv, quants(x, a, b, 128 * n + 64 * h));
                    *acc = mac::<VNNI>(*acc, p16, scale);
                }
            }
        }
    }
    let mut s = Sums {
        i: [_mm256_setzero_si256(); MR],
        m: [_mm256_setzero_si256(); MR],
    };
    for (a, acc) in acc.iter().enumerate() {
        // Levels were fed as q + 32: less 32 · Σ sc_g · bsum_g.
        let bs = _mm256_loadu_si256(x.bs[a].add(16 * b) as *const __m256i);
        let corr = _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc16, bs));
        s.i[a] = _mm256_sub_epi32(fold(*acc), corr);
    }
    s
}
