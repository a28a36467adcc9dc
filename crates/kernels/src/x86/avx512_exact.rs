//! AVX-512 (F, BW, DQ, VL) form of the exact family's stream kernel (small M), over the
//! 8-row interleaved repack of block-quantized weights (`crate::packed`, built at load when
//! this kernel runs, see `crate::wants_repack`).
//!
//! One call computes 16 weight rows (two 8-row groups: lanes 0..8 of every 512-bit register
//! are group 0's rows, lanes 8..16 group 1's) against `MR` activation rows. Output element
//! `(m, row)`'s 8 canonical lanes live in 8 accumulators, one per lane `l`, at position
//! `row`: chunk `c` of block `b` adds `x[m][32b + 8c + l] · w[row][32b + 8c + l]` to
//! accumulator `l` with one FMA (`x` broadcast), chunks in order; at the end the canonical
//! lane tree is 7 vector additions (`h_l = acc_l + acc_{l+4}`, `q_0 = h_0 + h_2`,
//! `q_1 = h_1 + h_3`, `s = q_0 + q_1`). So every element is computed exactly as
//! `avx2::tile_f32` computes it on the dequantized row: same products, same order, FMA.
//!
//! The weights come from `avx512_decode` (a block of two groups' records decoded into
//! vectors of 16 rows, bitwise `tessera_core::tensor::dequantize_row`): the dot products
//! here ([`stream16`]) or an outer-product strip ([`decode_strip16`]) take them.
//!
//! Invariants shared by every function: the caller has verified AVX2, FMA, F16C, AVX-512
//! F/BW/DQ/VL (`crate::isa::avx512_exact`); pointers are valid for the lengths
//! documented; loads are unaligned.

use std::arch::x86_64::*;

pub use super::avx2_exact::{Q4_0, Q4_1, Q8_0};
use super::avx512_decode::{block16, Consts, Sink};

/// How far ahead of each record stream [`stream16`] prefetches into L2. Weights streamed
/// from DRAM (a decode step reads the whole model, 3x this VM's L3) wait on memory latency
/// with only the near (4-record) hint: Zen 4, SmolLM2-135M exact decode, 1 unit 67-75
/// tok/s with the near hint alone, 83-89 with a 4 KiB far hint, 104-111 with 8-16 KiB, 105
/// with 32 KiB; 2 units 115-125 with the near hint alone, 145-185 with 12-16 KiB. Past a
/// group's end the hint goes to the next call's group: in the call's other group, already
/// being read, it would leave the first 12 KiB of every second group unfetched, and a cold
/// 4096 × 11,008 Q4_1 GEMV runs 3-4% faster this way (Emerald Rapids Xeon, 2 units, where
/// 4-32 KiB distances run level).
const FAR_PREFETCH: usize = 12 << 10;
/// Bytes of one record (8 rows × 32 elements) and the offsets of its d and m (`crate::packed`).
pub const fn record_geometry(dt: u8) -> (usize, usize, usize) {
    match dt {
        Q4_0 => (144, 128, 0),
        Q4_1 => (160, 128, 144),
        _ => (272, 256, 0),
    }
}

/// Adds `x[m][e] · w` to accumulator `l` of every activation row.
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn feed<const MR: usize>(
    acc: &mut [[__m512; 8]; MR],
    x: &[*const f32; MR],
    e: usize,
    l: usize,
    w: __m512,
) {
    for m in 0..MR {
        acc[m][l] = _mm512_fmadd_ps(_mm512_set1_ps(*x[m].add(e)), w, acc[m][l]);
    }
}

/// The stream kernel's dot products: `x[m][e] · w` into accumulator `l` ([`feed`]).
struct Dots<'a, const MR: usize> {
    acc: &'a mut [[__m512; 8]; MR],
    x: &'a [*const f32; MR],
}

impl<const MR: usize> Sink for Dots<'_, MR> {
    #[inline(always)]
    unsafe fn put(&mut self, e: usize, l: usize, w: __m512) {
        feed(self.acc, self.x, e, l, w)
    }
}

/// A strip of the outer-product tile (`exact::outer`, `[lane][step][32]`): `w` is stored as
/// 16 of the 32 values of step `e / 8` of lane `l` (`dst` points at the first of them in
/// lane 0, step 0).
struct StripRows {
    dst: *mut f32,
    steps: usize,
}

impl Sink for StripRows {
    #[inline(always)]
    unsafe fn put(&mut self, e: usize, l: usize, w: __m512) {
        _mm512_storeu_ps(self.dst.add((l * self.steps + e / 8) * 32), w)
    }
}

/// Canonical dot products of `MR` activation rows `x[m]` (f32, `32 · blocks` each) with the
/// 16 rows of two 8-row groups whose records start at `r0` and `r1` (`blocks` consecutive
/// records each; `r1 == r0` is allowed, its results then repeat group 0's). `fast` is the
/// weight's record bitmap (`PackedWeight::fast`) and `f0`, `f1` the bit indices of the two
/// groups' first records: a block runs the magic-exponent path when both its records' bits
/// are set. Returns `[m][row]`, rows of group 0 then group 1.
///
/// # Safety
/// The CPU features above; `x[m]` valid for `32 · blocks` reads; `r0`, `r1` for `blocks`
/// records of format `DT` (`record_geometry`); `fast` for bits `f0 .. f0 + blocks` and
/// `f1 .. f1 + blocks`, each set only where `crate::packed::magic_ok` holds for every row of
/// that record whose result the caller keeps.
///
/// `low_field`: decode Q4_1 and Q8_0 records flagged fast by the low field
/// (`avx512_decode`; `crate::variants` decides per CPU); else by the general path. The
/// results are the same bits either way.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
pub unsafe fn stream16<const DT: u8, const MR: usize>(
    x: [*const f32; MR],
    r0: *const u8,
    r1: *const u8,
    blocks: usize,
    fast: *const u8,
    f0: usize,
    f1: usize,
    low_field: bool,
) -> [[f32; 16]; MR] {
    let (rb, _, _) = record_geometry(DT);
    let k = Consts::new::<DT>(low_field);
    let mut acc = [[_mm512_setzero_ps(); 8]; MR];
    // The far hint's target, `FAR_PREFETCH` bytes ahead of each stream, and past a
    // group's end the next call's group of the same stream (this call's other group lies
    // between: the calls of a range take groups `g, g + 1`, then `g + 2, g + 3`, ...).
    // `extra` is the groups skipped so far; `ahead` the target's offset in its group.
    let len = blocks * rb;
    let pair = len > 0 && r1 == r0.wrapping_add(len);
    let (mut extra, mut ahead) = if pair {
        (FAR_PREFETCH / len * len, FAR_PREFETCH % len)
    } else {
        (0, 0)
    };
    for b in 0..blocks {
        let (p0, p1) = (r0.add(b * rb), r1.add(b * rb));
        let far = FAR_PREFETCH + extra;
        let near = 4 * rb + if pair && b + 4 >= blocks { len } else { 0 };
        if pair {
            ahead += rb;
            while ahead >= len {
                ahead -= len;
                extra += len;
            }
        }
        // Each group's records are one stream; fetch four records ahead into L1 and `far`
        // bytes ahead into L2 (hints: never fault, wrapping arithmetic without a
        // dereference), both past a group's end into the next call's group of that stream.
        for line in (0..rb).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>(p0.wrapping_add(near + line).cast());
            _mm_prefetch::<_MM_HINT_T0>(p1.wrapping_add(near + line).cast());
            _mm_prefetch::<_MM_HINT_T1>(p0.wrapping_add(far + line).cast());
            _mm_prefetch::<_MM_HINT_T1>(p1.wrapping_add(far + line).cast());
        }
        let mut out = Dots {
            acc: &mut acc,
            x: &x,
        };
        block16::<DT, MR>(&k, &mut out, (p0, p1), b, (fast, f0, f1));
    }
    let mut out = [[0f32; 16]; MR];
    for m in 0..MR {
        let a = &acc[m];
        let h: [__m512; 4] = std::array::from_fn(|l| _mm512_add_ps(a[l], a[l + 4]));
        let s = _mm512_add_ps(_mm512_add_ps(h[0], h[2]), _mm512_add_ps(h[1], h[3]));
        _mm512_storeu_ps(out[m].as_mut_ptr(), s);
    }
    out
}

/// Decodes the 16 rows of two 8-row groups (records at `r0`, `r1`, as [`stream16`]) into 16
/// columns of an outer-product strip `[lane][step][32]` (`steps = 4 · blocks`; `dst` points at
/// the first column in lane 0, step 0): the weights [`stream16`] multiplies, bitwise the
/// reference's, by the same decode (one row per vector lane is one strip row half).
///
/// # Safety
/// As [`stream16`] for `r0`, `r1`, `blocks`, `fast`, `f0`, `f1`, `low_field`; `dst` valid for writes of 16
/// values at every `(l · steps + c) · 32`, `l < 8`, `c < steps`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
pub unsafe fn decode_strip16<const DT: u8>(
    r0: *const u8,
    r1: *const u8,
    blocks: usize,
    fast: *const u8,
    f0: usize,
    f1: usize,
    dst: *mut f32,
    low_field: bool,
) {
    let (rb, _, _) = record_geometry(DT);
    let k = Consts::new::<DT>(low_field);
    let mut out = StripRows {
        dst,
        steps: 4 * blocks,
    };
    for b in 0..blocks {
        let recs = (r0.add(b * rb), r1.add(b * rb));
        block16::<DT, 1>(&k, &mut out, recs, b, (fast, f0, f1));
    }
}
