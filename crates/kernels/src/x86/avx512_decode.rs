//! AVX-512 decode of block-quantized records (`crate::packed`: 8 rows interleaved per
//! record) for the exact family: one block of two 8-row groups at a time, as vectors of 16
//! rows' weights (lanes 0..8 group 0's rows, 8..16 group 1's) handed to a [`Sink`] (the
//! stream kernel's dot products or an outer-product strip, `avx512_exact`).
//!
//! Dequantization (bit-identical to `tessera_core::tensor::dequantize_row`). Per block, when
//! the 16 rows' scales allow it (the common case, decided at repack, see below), integer
//! operations place each quant in a float's mantissa and one FMA finishes the weight:
//! - Q4_1 (low field, [`subnormal_q4_1`]): a shift and an AND put the nibble at bits
//!   20..24 with nothing above: a float below `2^-125` whose value is its bit pattern times
//!   `2^-149` (subnormal, or normal with exponent field 1), so `F = q · 2^-129`, and
//!   `F · D + m` with `D = d · 2^129` is `q · d + m` with one rounding, the reference's (it
//!   rounds `q · d`, exact, then `+ m` once). Needs `d` finite, non-zero and `|d| < 1/2`
//!   (`D` is then `d`'s bits with 129 added to the exponent field) and subnormal inputs
//!   kept (MXCSR's DAZ clear, checked once per call).
//! - Q8_0 (low field, [`subnormal_q8_0`]): the quant flipped to `b = q + 128` (an XOR of
//!   the sign bit), shifted to bits 16..24 and masked, is `F = b · 2^-133` by the same rule;
//!   `F · D + C` with `D = d · 2^133` and `C = −128 · d` (both made by integer adds to `d`'s
//!   exponent field, exact) is `q · d` exactly, the reference's product, rounded once (a
//!   no-op: `q · d` is a float). Needs `0 < d < 2^-5`, finite (`D` finite; `d > 0` so that
//!   `q = 0` gives the reference's `+0`), and subnormal inputs kept.
//! - Q4_0 (magic exponent): a shift and a ternary-logic op build `F = 2^e + q` directly
//!   (the quant bits under a fixed exponent, `Consts::float_in`), and `F · d + C` with
//!   `C = −(2^e + 8)·d`, exact, is the reference's product rounded once. A byte's two
//!   nibbles (at bits `8j` and `8j + 4` of a row's dword) are placed by one shift at bits 15
//!   and 19, the mantissa fields of `F = 256 + q` (`e = 8`) and `F = 16 + q` (`e = 4`), each
//!   with its own `C`: half a shift per weight vector instead of one (+7-10% for Q4_1
//!   decoded this way at M = 1, one unit of an Emerald Rapids Xeon). These need
//!   `d > 0` and finite (then an exact zero comes out `+0`, as the reference's `q·d` with
//!   `q = 0` and `d > 0`).
//!
//! The low-field decodes exist for cores where subnormal operands cost the FMA nothing
//! (Zen 4): there the magic exponent's ternary-logic op competes with the FMAs for their
//! pipes where a shift and an AND do not. Intel's cores take a microcode assist for every
//! subnormal operand (about 90x an FMA's time), so whether they run is measured per CPU
//! class (`crate::variants`, the caller's `low_field`); elsewhere the general path runs.
//!
//! Whether a record's rows meet these conditions is decided once, when the weight is
//! repacked (`crate::packed::magic_ok`, a bit per record in `PackedWeight::fast`; a
//! per-block check in the kernel cost ~10% of its rate on the Emerald Rapids Xeon). A
//! record where a real row does not takes another path:
//! - Q4_0: the same `F`, then the reference's own product `(F − (2^e + 8)) · d`: the
//!   subtraction gives `q − 8` exactly (`+0` for `q = 8`), so every `d` is handled, at one
//!   more operation per vector (ggml's Q4_0 scale is negative in about half of all blocks);
//! - Q4_1 and Q8_0, the general path: quants widened to 32-bit integers, converted, then
//!   the reference's own operations (`q·d + m` as one FMA, `d·q`), as
//!   `avx2_exact::decode_group`.
//!
//! Invariants shared by every function: the caller has verified AVX2, FMA, F16C, AVX-512
//! F/BW/DQ/VL (`crate::isa::avx512_exact`); pointers are valid for the lengths
//! documented; loads are unaligned.

use std::arch::x86_64::*;

use super::avx512_exact::{record_geometry, Q4_0, Q4_1, Q8_0};

/// Hides a constant from LLVM's shuffle combining, which could otherwise rewrite a byte
/// shuffle with a constant control into other instructions (the general path's controls).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn opaque(mut v: __m512i) -> __m512i {
    // SAFETY: an empty asm block that only claims to change `v`; no memory, no stack.
    std::arch::asm!("/* {0} */", inout(zmm_reg) v, options(pure, nomem, nostack));
    v
}

/// `vpshufb` control putting byte `j` of each 4-byte row slot at byte `pos` of that row's
/// dword and zeros (index bit 7) in its other bytes.
const fn spread(j: usize, pos: usize) -> [u8; 64] {
    let mut v = [0x80u8; 64];
    let mut i = 0;
    while i < 64 {
        if i % 4 == pos {
            v[i] = (i / 4 % 4 * 4 + j) as u8;
        }
        i += 1;
    }
    v
}

/// The shuffle controls, `[pos][j]`, for `pos` 0..4 (built at compile time; the general
/// path uses `pos` 0 and 3).
static SPREAD: [[[u8; 64]; 4]; 4] = {
    let mut t = [[[0u8; 64]; 4]; 4];
    let mut pos = 0;
    while pos < 4 {
        let mut j = 0;
        while j < 4 {
            t[pos][j] = spread(j, pos);
            j += 1;
        }
        pos += 1;
    }
    t
};

/// One of the `SPREAD` controls in a register.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn spread_reg(j: usize, pos: usize) -> __m512i {
    opaque(_mm512_loadu_si512(SPREAD[pos][j].as_ptr().cast()))
}

/// The 16 rows' f16 values at byte `off` of both records, converted (exactly).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn halves16(r0: *const u8, r1: *const u8, off: usize) -> __m512 {
    let lo = _mm_loadu_si128(r0.add(off).cast());
    let hi = _mm_loadu_si128(r1.add(off).cast());
    _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi))
}

/// Bytes `32v .. 32v + 32` of both records: 4 bytes per row, rows 0..8 of group 0 then of
/// group 1 (each 128-bit lane holds 4 rows).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
unsafe fn quads16(r0: *const u8, r1: *const u8, v: usize) -> __m512i {
    let lo = _mm256_loadu_si256(r0.add(32 * v).cast());
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(lo),
        _mm256_loadu_si256(r1.add(32 * v).cast()),
    )
}

/// Constants of the fast and general paths, built once per call.
pub(super) struct Consts {
    /// The float exponent (and leading mantissa bit) of Q4_0's magic `F` for high nibbles:
    /// `2^4`.
    magic: __m512i,
    /// Where the quant sits in that `F`'s mantissa: bits 19..23.
    field: __m512i,
    /// The 4-bit low nibbles' `F`: exponent `2^8`, the quant at bits 15..19, so that one
    /// shift places a byte's two nibbles in both fields (see [`block_q4`]).
    magic_lo: __m512i,
    field_lo: __m512i,
    /// `spread(j, 0)` (4-bit) or `spread(j, 3)` (Q8_0): the general path's byte shuffles.
    slow: [__m512i; 4],
    /// Whether the low-field decodes run ([`subnormal_q4_1`], [`subnormal_q8_0`]): the caller
    /// asked for them (`crate::variants`: they feed subnormal floats to the FMAs, free on
    /// some cores and a microcode assist per instruction on others) and this thread keeps
    /// subnormal inputs (MXCSR's DAZ bit clear, read once per call).
    low_field: bool,
}

impl Consts {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn new<const DT: u8>(low_field: bool) -> Consts {
        let slow_pos = if DT == Q8_0 { 3 } else { 0 };
        Consts {
            magic: _mm512_set1_epi32(0x4180_0000),
            field: _mm512_set1_epi32(0x0078_0000),
            magic_lo: _mm512_set1_epi32(0x4380_0000),
            field_lo: _mm512_set1_epi32(0x0007_8000),
            slow: std::array::from_fn(|j| spread_reg(j, slow_pos)),
            low_field: low_field && subnormal_inputs_kept(),
        }
    }

    /// Every dword of `v` shifted so that its bits at `p ..` sit at bit `to`: one
    /// single-cycle integer operation (none when `p == to`).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn shifted(v: __m512i, p: u32, to: u32) -> __m512i {
        match to as i32 - p as i32 {
            0 => v,
            3 => _mm512_slli_epi32::<3>(v),
            4 => _mm512_slli_epi32::<4>(v),
            7 => _mm512_slli_epi32::<7>(v),
            8 => _mm512_slli_epi32::<8>(v),
            11 => _mm512_slli_epi32::<11>(v),
            12 => _mm512_slli_epi32::<12>(v),
            15 => _mm512_slli_epi32::<15>(v),
            16 => _mm512_slli_epi32::<16>(v),
            19 => _mm512_slli_epi32::<19>(v),
            20 => _mm512_slli_epi32::<20>(v),
            -1 => _mm512_srli_epi32::<1>(v),
            -4 => _mm512_srli_epi32::<4>(v),
            -5 => _mm512_srli_epi32::<5>(v),
            -8 => _mm512_srli_epi32::<8>(v),
            -9 => _mm512_srli_epi32::<9>(v),
            -16 => _mm512_srli_epi32::<16>(v),
            r => unreachable!("shift {r}"),
        }
    }

    /// `F` from a shifted dword: its `field` bits kept, the rest cleared, the exponent
    /// `magic` set. One single-cycle ternary-logic operation. (On Zen 4 a masked byte
    /// shuffle, or a rotate, per vector in place of the shift runs this loop at 55% of the
    /// speed: both compete with the FMAs for a pipe.)
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn float_in(r: __m512i, magic: __m512i, field: __m512i) -> __m512 {
        // (r & field) | magic: truth table over (r, magic, field) = 0xEC.
        _mm512_castsi512_ps(_mm512_ternarylogic_epi32::<0xEC>(r, magic, field))
    }

    /// `F` from the quant at bits `p ..` of every dword of `v` (Q8_0, and 4-bit high-nibble
    /// fields), shifted to bit `to`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn float_at(&self, v: __m512i, p: u32, to: u32) -> __m512 {
        Self::float_in(Self::shifted(v, p, to), self.magic, self.field)
    }
}

/// Where a block's 16-row weight vectors go: `w` holds element `e` (lane `l = e % 8`) of the
/// 16 rows.
pub(super) trait Sink {
    /// # Safety
    /// The CPU features of this module; what the implementation's pointers need.
    unsafe fn put(&mut self, e: usize, l: usize, w: __m512);
}

/// The magic-exponent path's `C` for a block's 16 rows with `F = 2^e + q` (`e` 4 or 8,
/// Q4_0): `−(2^e + 8)·d`, exact for a record flagged fast (`crate::packed::magic_ok`).
#[inline]
#[target_feature(enable = "avx512f,avx512dq,avx512vl,fma")]
unsafe fn magic_c(d: __m512, e: i32) -> __m512 {
    _mm512_mul_ps(_mm512_set1_ps(-(2f32.powi(e) + 8.0)), d)
}

/// `d` times `2^e` for the fast records' scales: `e` added to the exponent field of each
/// lane's bits, one integer operation where a multiply would take an FMA-pipe slot. Exact
/// and finite while `d` is a normal float (as every converted f16 is) and its biased
/// exponent plus `e` stays below 255, which `crate::packed::magic_ok` checks per record
/// (padding rows' zero `d` gives `2^(e - 127)`, finite; their lanes are never stored).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn times_pow2<const E: i32>(d: __m512) -> __m512 {
    _mm512_castsi512_ps(_mm512_add_epi32(
        _mm512_castps_si512(d),
        _mm512_set1_epi32(E << 23),
    ))
}

/// Whether this thread's floating-point unit takes subnormal inputs as they are: MXCSR's
/// DAZ ("denormals are zero") bit clear, as Rust and C leave it. A host that sets it (some
/// fast-math builds do) makes Q4_1's fast decode read every weight as `m`, so the general
/// path runs instead.
fn subnormal_inputs_kept() -> bool {
    let mut csr = 0u32;
    // SAFETY: `stmxcsr` stores the 4-byte MXCSR register at the address given, a local.
    unsafe {
        std::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack, preserves_flags));
    }
    csr & (1 << 6) == 0
}

/// Q4_1's fast decode of one block (a record flagged fast: `d` finite, non-zero and
/// `|d| < 1/2` in every real row, `crate::packed::magic_ok`; and [`Consts::low_field`]),
/// each weight vector to `out`. Each nibble is shifted to bits 20..24 and masked: a float
/// whose value is its bits times `2^-149` (exponent field 0 or 1), `F = q · 2^-129`, and
/// one FMA `F · D + m` with `D = d · 2^129` (an integer add to `d`'s exponent field, exact
/// and finite for such `d`) finishes it: `F · D` is `q · d` exactly, so the FMA's one
/// rounding is the reference's `q · d + m` for every `m` and either sign of `d`. Per vector
/// a shift (none for byte 2's high nibble, already at bit 20) and an AND, integer
/// operations that issue beside the FMAs, where the magic exponent's ternary-logic op
/// competes with them (Zen 4, register-only loops of the M = 1 mix, 4 weight vectors per
/// iteration: 9.4 cycles with `ternlog` and half a shift per vector, 8.0 with a shift and
/// an AND, the two FMAs' bound; subnormal inputs cost the FMA nothing there). Field at bit
/// 20 rather than 19: one shift in 8 saved and `|d|` up to 1/2, +3-5% at M = 1.
#[inline]
#[target_feature(enable = "avx512f,avx512dq,avx512vl,fma")]
unsafe fn subnormal_q4_1<const MR: usize>(
    out: &mut impl Sink,
    z: &[__m512i; 4],
    d: __m512,
    m: __m512,
    e0: usize,
) {
    // D = d · 2^129 by the exponent field, where two multiplies by 2^65 and 2^64 took
    // FMA-pipe slots (one unit, M = 1 / 2-4: +2-3% / +7-8%). The fast records' d (finite,
    // non-zero, |d| < 1/2) has a biased exponent of 103..=125, so 232..=254 after the add.
    let ds = times_pow2::<129>(d);
    let field = _mm512_set1_epi32(0x00f0_0000);
    // Element 8ch + 4half + j: the low (ch < 2) or high nibble of byte j of slice
    // 2·(ch % 2) + half; the high nibble of byte 2 is in place already.
    let mut one = |ch: usize, half: usize, j: usize| {
        let p = 8 * j as u32 + if ch < 2 { 0 } else { 4 };
        let bits = Consts::shifted(z[2 * (ch % 2) + half], p, 20);
        let f = _mm512_castsi512_ps(_mm512_and_si512(bits, field));
        let w = _mm512_fmadd_ps(f, ds, m);
        out.put(e0 + 8 * ch + 4 * half + j, 4 * half + j, w);
    };
    if MR == 1 {
        // One accumulator's four chunks in a row (as `magic_q4`).
        for half in 0..2 {
            for j in 0..4 {
                for ch in 0..4 {
                    one(ch, half, j);
                }
            }
        }
    } else {
        for ch in 0..4 {
            for half in 0..2 {
                for j in 0..4 {
                    one(ch, half, j);
                }
            }
        }
    }
}

/// The magic-exponent decode of one Q4_0 block (see the module's documentation), each weight
/// vector to `out`. `FUSED`: `w = F·d + C` (a record flagged fast); else the
/// reference's own product `w = (F − (2^e + 8)) · d`, the subtraction exact (`q − 8` as a
/// float, `+0` for `q = 8`), which holds for every `d` (negative, zero, not finite) at one
/// more operation per vector.
#[inline]
#[target_feature(enable = "avx512f,avx512dq,avx512vl,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn magic_q4<const DT: u8, const MR: usize, const FUSED: bool>(
    k: &Consts,
    out: &mut impl Sink,
    z: &[__m512i; 4],
    d: __m512,
    e0: usize,
) {
    // Per exponent e = 8 (index 0) and 4 (index 1): C, or −(2^e + 8).
    let c = if FUSED {
        [magic_c(d, 8), magic_c(d, 4)]
    } else {
        [_mm512_set1_ps(-264.0), _mm512_set1_ps(-24.0)]
    };
    let weight = |f: __m512, i: usize| {
        if FUSED {
            _mm512_fmadd_ps(f, d, c[i])
        } else {
            _mm512_mul_ps(_mm512_add_ps(f, c[i]), d)
        }
    };
    if MR == 1 {
        // Byte j of a row's dword holds the low nibble (element 8ch + 4half + j, ch < 2)
        // at bit 8j and the high one (ch ≥ 2) at 8j + 4: one shift places them at bits 15
        // and 19, the fields of `F = 256 + q` and `F = 16 + q`, each with its own `C`.
        // Accumulator 4half + j takes chunks 0, 1, 2, 3 in that order, one accumulator's
        // four chunks in a row. (Alternating the two halves' chains runs 1-3% faster on
        // the Emerald Rapids Xeon but 0.65-0.7x on the Zen 4, at M = 1 on the SmolLM2
        // shapes.)
        for half in 0..2 {
            for j in 0..4 {
                let p = 8 * j as u32;
                // Slices half (chunks 0, 2) and 2 + half (chunks 1, 3).
                let s = [
                    Consts::shifted(z[half], p, 15),
                    Consts::shifted(z[2 + half], p, 15),
                ];
                for ch in 0..4 {
                    let f = if ch < 2 {
                        Consts::float_in(s[ch % 2], k.magic_lo, k.field_lo)
                    } else {
                        Consts::float_in(s[ch % 2], k.magic, k.field)
                    };
                    let w = weight(f, ch / 2);
                    out.put(e0 + 8 * ch + 4 * half + j, 4 * half + j, w);
                }
            }
        }
    } else {
        // Two activation rows: 16 accumulators leave too few registers for the pairs'
        // second `C` and field constants (spilled, they ran 16% slower than this on the
        // Emerald Rapids Xeon), so every nibble is shifted to bit 19 (`F = 16 + q`).
        for ch in 0..4 {
            for half in 0..2 {
                let zv = z[2 * (ch % 2) + half];
                for j in 0..4 {
                    // Element 8ch + 4half + j is the low (ch < 2) or high nibble of byte j.
                    let p = 8 * j as u32 + if ch < 2 { 0 } else { 4 };
                    let w = weight(k.float_at(zv, p, 19), 1);
                    out.put(e0 + 8 * ch + 4 * half + j, 4 * half + j, w);
                }
            }
        }
    }
}

/// One 4-bit block (Q4_0/Q4_1) of 16 rows, each weight vector to `out` (the dot products'
/// accumulators or a strip). `MR` (activation rows) sets the register budget.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn block_q4<const DT: u8, const MR: usize>(
    k: &Consts,
    out: &mut impl Sink,
    r0: *const u8,
    r1: *const u8,
    e0: usize,
    fast: bool,
) {
    let (_, d_off, m_off) = record_geometry(DT);
    let d = halves16(r0, r1, d_off);
    let m = if DT == Q4_1 {
        halves16(r0, r1, m_off)
    } else {
        _mm512_setzero_ps()
    };
    let z: [__m512i; 4] = std::array::from_fn(|v| quads16(r0, r1, v));
    // Record slice v holds, per row, elements 4v + j (low nibbles) and 16 + 4v + j (high):
    // chunk ch's lanes 0..4 come from slice 2·(ch % 2), lanes 4..8 from the next one.
    if fast && DT == Q4_1 {
        subnormal_q4_1::<MR>(out, &z, d, m, e0);
    } else if fast {
        magic_q4::<DT, MR, true>(k, out, &z, d, e0);
    } else if DT == Q4_0 {
        // Q4_0's scale is negative in about half of its blocks (ggml stores `max / −8`),
        // so most records hold a row with one: 16-18% faster than the general path at
        // M = 1, 4% at M = 2 (Emerald Rapids Xeon, paired runs).
        magic_q4::<DT, MR, false>(k, out, &z, d, e0);
    } else {
        let nib = _mm512_set1_epi8(0x0f);
        for ch in 0..4 {
            for half in 0..2 {
                let zv = z[2 * (ch % 2) + half];
                let s = if ch < 2 {
                    _mm512_and_si512(zv, nib)
                } else {
                    _mm512_and_si512(_mm512_srli_epi16::<4>(zv), nib)
                };
                for (j, shj) in k.slow.iter().enumerate() {
                    let q = _mm512_shuffle_epi8(s, *shj);
                    let w = if DT == Q4_1 {
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), d, m)
                    } else {
                        let q = _mm512_sub_epi32(q, _mm512_set1_epi32(8));
                        _mm512_mul_ps(_mm512_cvtepi32_ps(q), d)
                    };
                    out.put(e0 + 8 * ch + 4 * half + j, 4 * half + j, w);
                }
            }
        }
    }
}

/// Q8_0's fast decode of one block (a record flagged fast: `0 < d < 2^-5` in every real
/// row, `crate::packed::magic_ok`; and [`Consts::low_field`]), each weight vector to
/// `out`. A quant's byte, its sign bit flipped (`b = q + 128`, 0..=255), shifted to bits
/// 16..24 and masked is a float whose value is its bits times `2^-149` (exponent field 0,
/// or 1 for `b ≥ 128`): `F = b · 2^-133`. With `D = d · 2^133` and `C = −128 · d` (the
/// exponent field moved by 133 and by 7, the sign flipped: exact, `D` finite below
/// `d = 2^-5`), `F · D + C` is `b·d − 128·d = q·d` exactly, a float (8 bits times 11), so the
/// FMA's rounding keeps it: the reference's `d · q`, `+0` for `q = 0` as `d > 0` gives.
/// Per vector a shift (none for byte 2, in place already) and an AND beside the two FMAs,
/// where the magic exponent's ternary-logic op takes a third FMA-pipe slot (Zen 4, one
/// unit, M = 1 on the SmolLM2 shapes: 47-49 GFLOP/s against 40-42 with it; two units from
/// DRAM on the 7B shapes +10-25%).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
unsafe fn subnormal_q8_0(out: &mut impl Sink, r0: *const u8, r1: *const u8, d: __m512, e0: usize) {
    let ds = times_pow2::<133>(d);
    let c = _mm512_castsi512_ps(_mm512_xor_si512(
        _mm512_castps_si512(times_pow2::<7>(d)),
        _mm512_set1_epi32(i32::MIN),
    ));
    let flip = _mm512_set1_epi8(-128);
    let field = _mm512_set1_epi32(0x00ff_0000);
    for v in 0..8 {
        let s = _mm512_xor_si512(quads16(r0, r1, v), flip);
        for j in 0..4 {
            let bits = Consts::shifted(s, 8 * j as u32, 16);
            let f = _mm512_castsi512_ps(_mm512_and_si512(bits, field));
            let w = _mm512_fmadd_ps(f, ds, c);
            out.put(e0 + 4 * v + j, 4 * (v % 2) + j, w);
        }
    }
}

/// One Q8_0 block of 16 rows, each weight vector to `out`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn block_q8<const MR: usize>(
    k: &Consts,
    out: &mut impl Sink,
    r0: *const u8,
    r1: *const u8,
    e0: usize,
    fast: bool,
) {
    let (_, d_off, _) = record_geometry(Q8_0);
    let d = halves16(r0, r1, d_off);
    // Record slice v holds, per row, elements 4v + j: chunk v / 2, lanes 4·(v % 2) + j.
    if fast {
        subnormal_q8_0(out, r0, r1, d, e0);
    } else {
        for v in 0..8 {
            let s = quads16(r0, r1, v);
            for (j, shj) in k.slow.iter().enumerate() {
                // The byte at the top of its dword, shifted down with its sign.
                let q = _mm512_shuffle_epi8(s, *shj);
                let q = _mm512_srai_epi32::<24>(q);
                let w = _mm512_mul_ps(d, _mm512_cvtepi32_ps(q));
                out.put(e0 + 4 * v + j, 4 * (v % 2) + j, w);
            }
        }
    }
}

/// Block `b` of two groups (its records at `p0`, `p1`) to `out`: by the magic exponent when
/// both records' bits are set in `fast` (bits `f0 + b` and `f1 + b`), else the general path.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn block16<const DT: u8, const MR: usize>(
    k: &Consts,
    out: &mut impl Sink,
    (p0, p1): (*const u8, *const u8),
    b: usize,
    (fast, f0, f1): (*const u8, usize, usize),
) {
    let bit = |i: usize| *fast.add(i / 8) >> (i % 8) & 1 == 1;
    let magic = bit(f0 + b) && bit(f1 + b) && (DT == Q4_0 || k.low_field);
    match DT {
        Q8_0 => block_q8::<MR>(k, out, p0, p1, 32 * b, magic),
        _ => block_q4::<DT, MR>(k, out, p0, p1, 32 * b, magic),
    }
}
