//! AVX2 integer dots of one super-block (Q2_K … Q6_K, IQ4_XS) with Q8_K activation rows, as
//! llama.cpp's `ggml_vec_dot_*_q8_K` (AVX2): unsigned levels × signed quants by
//! `vpmaddubsw` (pairs to i16), times the sub-block scale by `vpmaddwd` (to i32). Offsets of
//! the levels (Q6_K's 32, Q3_K's 4) and the minimums are applied through the activations'
//! block sums (`Σ sc_g · bsum_g`, one `vpmaddwd`), so every level fed to `vpmaddubsw` is in
//! `0..64` (no i16 saturation: `2 · 63 · 127 < 2^15`). IQ4_XS's signed table values go in
//! as `|v|` against the quants with `v`'s sign (`|v|, |q| ≤ 127`).
//!
//! These functions carry no `#[target_feature]`: they are `#[inline(always)]` into the
//! drivers of `super::x86`, whose features they take (AVX2, FMA, F16C; AVX-512 VL and VNNI
//! when `VNNI`, for `vpdpwssd` on 256-bit vectors). Invariants: as `super::x86`'s (whole
//! super-block at `w`, activation block `b` readable), and the CPU has those features.

use std::arch::x86_64::*;

use super::x86::{ActRows, Sums};
use tessera_core::ggml_quants::KVALUES_IQ4NL;

#[inline(always)]
unsafe fn load(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[inline(always)]
unsafe fn load_q<const MR: usize>(x: &ActRows<MR>, a: usize, b: usize, off: usize) -> __m256i {
    _mm256_loadu_si256(x.q[a].add(256 * b + off) as *const __m256i)
}

/// The activations' 16 sums of 16 of block `b`, row `a`, as i16 lanes.
#[inline(always)]
unsafe fn bsums<const MR: usize>(x: &ActRows<MR>, a: usize, b: usize) -> __m256i {
    _mm256_loadu_si256(x.bs[a].add(16 * b) as *const __m256i)
}

/// A `vpshufb` index that repeats i16 lane `lo` of the low 128-bit half and lane `hi` of the
/// high one.
#[inline(always)]
unsafe fn lane16(lo: i32, hi: i32) -> __m256i {
    let idx = |k: i32| 0x0100 + 0x0202 * k;
    _mm256_setr_m128i(
        _mm_set1_epi16(idx(lo) as i16),
        _mm_set1_epi16(idx(hi) as i16),
    )
}

/// `acc + madd(scale, maddubs(levels, quants))`; with VNNI, `vpdpwssd` does the last two.
#[inline(always)]
unsafe fn mac<const VNNI: bool>(
    acc: __m256i,
    scale: __m256i,
    levels: __m256i,
    quants: __m256i,
) -> __m256i {
    let p16 = _mm256_maddubs_epi16(levels, quants);
    if VNNI {
        _mm256_dpwssd_epi32(acc, p16, scale)
    } else {
        _mm256_add_epi32(acc, _mm256_madd_epi16(scale, p16))
    }
}

/// Q4_K's and Q5_K's 8 scales and 8 minimums (6 bits each, packed in the 12 bytes at
/// `w + 4`) as bytes. Scales and minimums 0..4 are the low 6 bits of bytes 0..4 and 4..8;
/// 4..8 take their low 4 bits from the nibbles of bytes 8..12 and their top 2 from the tops
/// of bytes 0..8.
#[inline(always)]
pub(super) unsafe fn q4k_scales(w: *const u8) -> __m128i {
    let x = std::ptr::read_unaligned(w.add(4) as *const u64);
    let s2 = std::ptr::read_unaligned(w.add(12) as *const u32) as u64;
    // [scales 0..4, minimums 0..4] and [scales 4..8, minimums 4..8].
    let lo = x & 0x3f3f_3f3f_3f3f_3f3f;
    let nib = (s2 | ((s2 >> 4) << 32)) & 0x0f0f_0f0f_0f0f_0f0f;
    let hi = nib | (((x >> 6) & 0x0303_0303_0303_0303) << 4);
    _mm_unpacklo_epi32(_mm_cvtsi64_si128(lo as i64), _mm_cvtsi64_si128(hi as i64))
}

/// Q4_K (`Q5 = false`) and Q5_K: 8 sub-blocks of 32 with 6-bit scales and minimums.
#[inline(always)]
pub(super) unsafe fn q4k<const MR: usize, const Q5: bool, const VNNI: bool>(
    w: *const u8,
    x: &ActRows<MR>,
    b: usize,
) -> Sums<MR> {
    let sm = _mm256_cvtepu8_epi16(q4k_scales(w));
    let mins = _mm256_extracti128_si256::<1>(sm);
    let sc = _mm256_permute2x128_si256::<0x00>(sm, sm);
    let mut s = Sums {
        i: [_mm256_setzero_si256(); MR],
        m: [_mm256_setzero_si256(); MR],
    };
    for a in 0..MR {
        let bs = _mm_loadu_si128(x.bs32[a].add(8 * b) as *const __m128i);
        s.m[a] = _mm256_zextsi128_si256(_mm_madd_epi16(mins, bs));
    }
    let m4 = _mm256_set1_epi8(15);
    let qs = w.add(if Q5 { 48 } else { 16 });
    let mut hb = if Q5 {
        load(w.add(16))
    } else {
        _mm256_setzero_si256()
    };
    for j in 0..4 {
        let sl = _mm256_shuffle_epi8(sc, lane16(2 * j as i32, 2 * j as i32));
        let sh = _mm256_shuffle_epi8(sc, lane16(2 * j as i32 + 1, 2 * j as i32 + 1));
        let bits = load(qs.add(32 * j));
        let mut lo = _mm256_and_si256(bits, m4);
        let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
        if Q5 {
            // Bits 2j and 2j + 1 of qh are the fifth bits (bits 0, 1 here after 2j shifts
            // of 16-bit lanes: what crosses in from the byte above lands in bits 6, 7).
            let one = _mm256_set1_epi8(1);
            lo = _mm256_or_si256(lo, _mm256_slli_epi16::<4>(_mm256_and_si256(hb, one)));
            let two = _mm256_set1_epi8(2);
            hi = _mm256_or_si256(hi, _mm256_slli_epi16::<3>(_mm256_and_si256(hb, two)));
            hb = _mm256_srli_epi16::<2>(hb);
        }
        // Activations in the nibble order (`QkActs::stored`).
        let (p, e) = (j / 2, j % 2);
        for a in 0..MR {
            s.i[a] = mac::<VNNI>(s.i[a], sl, lo, load_q(x, a, b, 128 * p + 32 * e));
            s.i[a] = mac::<VNNI>(s.i[a], sh, hi, load_q(x, a, b, 128 * p + 64 + 32 * e));
        }
    }
    s
}

/// The 16 scales of a super-block with 16 sub-blocks of 16 as i16 lanes, and their two
/// halves each broadcast to both 128-bit lanes.
#[inline(always)]
unsafe fn scales16(sc8: __m128i, signed: bool) -> (__m256i, [__m256i; 2]) {
    let sc = if signed {
        _mm256_cvtepi8_epi16(sc8)
    } else {
        _mm256_cvtepu8_epi16(sc8)
    };
    let halves = [
        _mm256_permute2x128_si256::<0x00>(sc, sc),
        _mm256_permute2x128_si256::<0x11>(sc, sc),
    ];
    (sc, halves)
}

/// Q6_K: 6-bit levels (less 32) in 16 sub-blocks of 16 with signed 8-bit scales.
#[inline(always)]
pub(super) unsafe fn q6k<const MR: usize, const VNNI: bool>(
    w: *const u8,
    x: &ActRows<MR>,
    b: usize,
) -> Sums<MR> {
    let (sc, halves) = scales16(_mm_loadu_si128(w.add(192) as *const __m128i), true);
    let mut s = Sums {
        i: [_mm256_setzero_si256(); MR],
        m: [_mm256_setzero_si256(); MR],
    };
    let m4 = _mm256_set1_epi8(15);
    let m2 = _mm256_set1_epi8(3);
    for (n, half) in halves.iter().enumerate() {
        let ql1 = load(w.add(64 * n));
        let ql2 = load(w.add(64 * n + 32));
        let qh = load(w.add(128 + 32 * n));
        // Element 128n + 32k + l: level k of byte l; sub-blocks 8n + 2k (l < 16) and + 1.
        let lv = [
            _mm256_or_si256(
                _mm256_and_si256(ql1, m4),
                _mm256_slli_epi16::<4>(_mm256_and_si256(qh, m2)),
            ),
            _mm256_or_si256(
                _mm256_and_si256(ql2, m4),
                _mm256_slli_epi16::<2>(_mm256_and_si256(qh, _mm256_slli_epi16::<2>(m2))),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                _mm256_and_si256(qh, _mm256_slli_epi16::<4>(m2)),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql2), m4),
                _mm256_srli_epi16::<2>(_mm256_and_si256(qh, _mm256_slli_epi16::<6>(m2))),
            ),
        ];
        for (k, lv) in lv.iter().enumerate() {
            let scale = _mm256_shuffle_epi8(*half, lane16(2 * k as i32, 2 * k as i32 + 1));
            for a in 0..MR {
                s.i[a] = mac::<VNNI>(s.i[a], scale, *lv, load_q(x, a, b, 128 * n + 32 * k));
            }
        }
    }
    // Levels were fed as q + 32: less 32 · Σ sc_g · bsum_g.
    for a in 0..MR {
        let corr = _mm256_madd_epi16(sc, bsums(x, a, b));
        s.i[a] = _mm256_sub_epi32(s.i[a], _mm256_slli_epi32::<5>(corr));
    }
    s
}

/// Q2_K: 2-bit levels in 16 sub-blocks of 16 with 4-bit scales and minimums.
#[inline(always)]
pub(super) unsafe fn q2k<const MR: usize, const VNNI: bool>(
    w: *const u8,
    x: &ActRows<MR>,
    b: usize,
) -> Sums<MR> {
    let raw = _mm_loadu_si128(w as *const __m128i);
    let m4 = _mm_set1_epi8(15);
    let (_, halves) = scales16(_mm_and_si128(raw, m4), false);
    let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(raw), m4));
    let mut s = Sums {
        i: [_mm256_setzero_si256(); MR],
        m: [_mm256_setzero_si256(); MR],
    };
    for a in 0..MR {
        s.m[a] = _mm256_madd_epi16(mins, bsums(x, a, b));
    }
    let m2 = _mm256_set1_epi8(3);
    for (n, half) in halves.iter().enumerate() {
        // Element 128n + 32k + l: bits 2k.. of byte l (each shift of 16-bit lanes moves
        // bits of the byte above only into the top of the byte below).
        let mut bits = load(w.add(16 + 32 * n));
        for k in 0..4 {
            let scale = _mm256_shuffle_epi8(*half, lane16(2 * k, 2 * k + 1));
            let lv = _mm256_and_si256(bits, m2);
            for a in 0..MR {
                s.i[a] = mac::<VNNI>(
                    s.i[a],
                    scale,
                    lv,
                    load_q(x, a, b, 128 * n + 32 * k as usize),
                );
            }
            bits = _mm256_srli_epi16::<2>(bits);
        }
    }
    s
}

/// Q3_K: 2-bit levels and a high bit (level − 4 where it is clear) in 16 sub-blocks of 16
/// with 6-bit scales less 32.
#[inline(always)]
pub(super) unsafe fn q3k<const MR: usize, const VNNI: bool>(
    w: *const u8,
    x: &ActRows<MR>,
    b: usize,
) -> Sums<MR> {
    let word = |i: usize| std::ptr::read_unaligned(w.add(96 + 4 * i) as *const u32);
    let (a0, a1, t) = (word(0), word(1), word(2));
    let (k1, k2) = (0x0303_0303u32, 0x0f0f_0f0fu32);
    let sc8 = _mm_setr_epi32(
        ((a0 & k2) | ((t & k1) << 4)) as i32,
        ((a1 & k2) | (((t >> 2) & k1) << 4)) as i32,
        (((a0 >> 4) & k2) | (((t >> 4) & k1) << 4)) as i32,
        (((a1 >> 4) & k2) | (((t >> 6) & k1) << 4)) as i32,
    );
    let (sc, halves) = scales16(_mm_sub_epi8(sc8, _mm_set1_epi8(32)), true);
    let mut s = Sums {
        i: [_mm256_setzero_si256(); MR],
        m: [_mm256_setzero_si256(); MR],
    };
    let m2 = _mm256_set1_epi8(3);
    let one = _mm256_set1_epi8(1);
    let mut hm = load(w);
    for (n, half) in halves.iter().enumerate() {
        let mut bits = load(w.add(32 + 32 * n));
        for k in 0..4 {
            // Level + 4: the two low bits, plus 4 where bit 4n + k of hmask is set.
            let hi = _mm256_slli_epi16::<2>(_mm256_and_si256(hm, one));
            let lv = _mm256_or_si256(_mm256_and_si256(bits, m2), hi);
            let scale = _mm256_shuffle_epi8(*half, lane16(2 * k, 2 * k + 1));
            for a in 0..MR {
                s.i[a] = mac::<VNNI>(
                    s.i[a],
                    scale,
                    lv,
                    load_q(x, a, b, 128 * n + 32 * k as usize),
                );
            }
            bits = _mm256_srli_epi16::<2>(bits);
            hm = _mm256_srli_epi16::<1>(hm);
        }
    }
    // Levels were fed as q + 4: less 4 · Σ sc_g · bsum_g.
    for a in 0..MR {
        let corr = _mm256_madd_epi16(sc, bsums(x, a, b));
        s.i[a] = _mm256_sub_epi32(s.i[a], _mm256_slli_epi32::<2>(corr));
    }
    s
}

/// IQ4_XS: non-linear 4-bit levels in 8 sub-blocks of 32 with 6-bit scales less 32.
#[inline(always)]
pub(super) unsafe fn iq4xs<const MR: usize, const VNNI: bool>(
    w: *const u8,
    x: &ActRows<MR>,
    b: usize,
) -> Sums<MR> {
    let sh = std::ptr::read_unaligned(w.add(2) as *const u16) as i32;
    let sl = std::ptr::read_unaligned(w.add(4) as *const u32) as i32;
    let ls = |ib: i32| (((sl >> (4 * ib)) & 15) | (((sh >> (2 * ib)) & 3) << 4)) - 32;
    let sc8 = _mm_setr_epi16(
        ls(0) as i16,
        ls(1) as i16,
        ls(2) as i16,
        ls(3) as i16,
        ls(4) as i16,
        ls(5) as i16,
        ls(6) as i16,
        ls(7) as i16,
    );
    let sc = _mm256_broadcastsi128_si256(sc8);
    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const _));
    let m4 = _mm256_set1_epi8(15);
    let mut s = Sums {
        i: [_mm256_setzero_si256(); MR],
        m: [_mm256_setzero_si256(); MR],
    };
    for p in 0..4 {
        // Sub-blocks 2p and 2p + 1: 16 bytes each, low nibbles then high nibbles.
        let bits = load(w.add(8 + 32 * p));
        let lo = _mm256_shuffle_epi8(table, _mm256_and_si256(bits, m4));
        let hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4));
        let v = [
            _mm256_permute2x128_si256::<0x20>(lo, hi),
            _mm256_permute2x128_si256::<0x31>(lo, hi),
        ];
        for (h, v) in v.iter().enumerate() {
            let ib = 2 * p as i32 + h as i32;
            let scale = _mm256_shuffle_epi8(sc, lane16(ib, ib));
            let av = _mm256_sign_epi8(*v, *v);
            for a in 0..MR {
                let q = _mm256_sign_epi8(load_q(x, a, b, 64 * p + 32 * h), *v);
                s.i[a] = mac::<VNNI>(s.i[a], scale, av, q);
            }
        }
    }
    s
}
