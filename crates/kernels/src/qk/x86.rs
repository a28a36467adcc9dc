//! The x86 kernels' common loop: weight rows in chunks of 4, and per block
//! - each row's integer dot against every activation row of the tile ([`super::x86_k`],
//!   [`super::x86_small`], [`super::x86_k512`]: lanes of 32-bit partial sums, exact), the
//!   weight block decoded once for all activation rows;
//! - the 4 rows' lanes summed horizontally to one `isum` (and `msum`) per row ([`hsum4`]);
//! - the float step of [`super::combine`] on 4 elements at once (lane `r` is row `r`'s
//!   element: the same operations, in the same order, as the portable kernel's).
//!
//! One driver per kernel set (`driver!`: AVX2; AVX-512 without and with VNNI), each with its
//! `#[target_feature]`s; the dot functions have none of their own and are inlined into it.
//! Invariants for every `unsafe fn` here and in the dot modules: the CPU has the driver's
//! features; `w` points at a whole weight block; [`ActRows`] points at `MR` activation rows
//! of the tile with every block of a row readable at `b < blocks`.

use std::arch::x86_64::*;

use super::{block_len, fmt, layout, Kernel, MinKind, QkActs};

/// The activation rows of a tile: row starts of each array of [`QkActs`].
pub(super) struct ActRows<const MR: usize> {
    pub q: [*const i8; MR],
    pub d: [*const f32; MR],
    pub s: [*const f32; MR],
    pub qsum: [*const i32; MR],
    pub bs: [*const i16; MR],
    pub bs32: [*const i16; MR],
}

impl<const MR: usize> ActRows<MR> {
    fn new(x: &QkActs, i0: usize) -> Self {
        let nb = x.blocks();
        // Arrays a format does not use are empty: their pointers are never read.
        ActRows {
            q: std::array::from_fn(|a| x.qs.as_ptr().wrapping_add((i0 + a) * x.k)),
            d: std::array::from_fn(|a| x.d.as_ptr().wrapping_add((i0 + a) * nb)),
            s: std::array::from_fn(|a| x.s.as_ptr().wrapping_add((i0 + a) * nb)),
            qsum: std::array::from_fn(|a| x.qsum.as_ptr().wrapping_add((i0 + a) * nb)),
            bs: std::array::from_fn(|a| x.bsums.as_ptr().wrapping_add((i0 + a) * nb * 16)),
            bs32: std::array::from_fn(|a| x.bsums32.as_ptr().wrapping_add((i0 + a) * nb * 8)),
        }
    }
}

/// One weight block's integer dots with `MR` activation rows: lanes summing to `isum` and
/// to `msum` (zero for formats without minimums).
pub(super) struct Sums<const MR: usize> {
    pub i: [__m256i; MR],
    pub m: [__m256i; MR],
}

/// Runs the tile on `kernel` (not [`Kernel::Portable`]).
///
/// # Safety
/// The CPU has `kernel`'s features; `rows`, `acts`, `i0`, `mr` and `out` as checked by
/// [`super::tile_with`].
pub(super) unsafe fn tile(
    kernel: Kernel,
    f: u8,
    acts: &QkActs,
    i0: usize,
    mr: usize,
    rows: &[&[u8]],
    out: &mut [f32],
) {
    macro_rules! by_fmt {
        ($drive:ident, $mr:literal) => {
            match f {
                fmt::Q5_0 => $drive::<$mr, { fmt::Q5_0 }>(acts, i0, rows, out),
                fmt::Q5_1 => $drive::<$mr, { fmt::Q5_1 }>(acts, i0, rows, out),
                fmt::IQ4_NL => $drive::<$mr, { fmt::IQ4_NL }>(acts, i0, rows, out),
                fmt::Q2_K => $drive::<$mr, { fmt::Q2_K }>(acts, i0, rows, out),
                fmt::Q3_K => $drive::<$mr, { fmt::Q3_K }>(acts, i0, rows, out),
                fmt::Q4_K => $drive::<$mr, { fmt::Q4_K }>(acts, i0, rows, out),
                fmt::Q5_K => $drive::<$mr, { fmt::Q5_K }>(acts, i0, rows, out),
                fmt::Q6_K => $drive::<$mr, { fmt::Q6_K }>(acts, i0, rows, out),
                _ => $drive::<$mr, { fmt::IQ4_XS }>(acts, i0, rows, out),
            }
        };
    }
    macro_rules! by_mr {
        ($drive:ident) => {
            match mr {
                1 => by_fmt!($drive, 1),
                2 => by_fmt!($drive, 2),
                3 => by_fmt!($drive, 3),
                _ => by_fmt!($drive, 4),
            }
        };
    }
    match kernel {
        Kernel::Avx2 => by_mr!(drive_avx2),
        Kernel::Avx512 => by_mr!(drive_avx512),
        Kernel::Avx512Vnni => by_mr!(drive_vnni),
        Kernel::Portable => unreachable!("the portable kernel is not an x86 one"),
    }
}

/// `[Σ v[0], Σ v[1], Σ v[2], Σ v[3]]` of the 8 lanes of each vector (exact: the sums fit).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn hsum4(v: &[__m256i; 4]) -> __m128i {
    let h01 = _mm256_hadd_epi32(v[0], v[1]);
    let h23 = _mm256_hadd_epi32(v[2], v[3]);
    let h = _mm256_hadd_epi32(h01, h23);
    _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h))
}

/// The f16 at byte `off` of each block `w[r]`, widened.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn f16x4(w: &[*const u8; 4], off: usize) -> __m128 {
    let h = |r: usize| std::ptr::read_unaligned(w[r].add(off) as *const i16);
    _mm_cvtph_ps(_mm_setr_epi16(h(0), h(1), h(2), h(3), 0, 0, 0, 0))
}

/// The f16 pairs at byte `off` of each block `w[r]` (a scale and the minimum after it),
/// widened: `(scales, minimums)`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn f16x4_pairs(w: &[*const u8; 4], off: usize) -> (__m128, __m128) {
    let h = |r: usize| std::ptr::read_unaligned(w[r].add(off) as *const i32);
    let both = _mm256_cvtph_ps(_mm_setr_epi32(h(0), h(1), h(2), h(3)));
    let split = _mm256_permutevar8x32_ps(both, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
    (
        _mm256_castps256_ps128(split),
        _mm256_extractf128_ps::<1>(split),
    )
}

/// How far ahead in each weight row the driver prefetches, in bytes: at M = 1 the weights
/// stream from DRAM, where the hardware prefetchers alone left the kernels latency-bound.
const PREFETCH: usize = 4608;

/// Generates the loop for one kernel set: `$dot::<MR, F>(w, acts, b)` gives a block's
/// [`Sums`].
macro_rules! driver {
    ($name:ident, $features:literal, $dot:ident) => {
        #[target_feature(enable = $features)]
        unsafe fn $name<const MR: usize, const F: u8>(
            acts: &QkActs,
            i0: usize,
            rows: &[&[u8]],
            out: &mut [f32],
        ) {
            let (bb, d_off, m_off, min) = layout(F);
            let (nb, nr) = (acts.k / block_len(F), rows.len());
            let x = ActRows::<MR>::new(acts, i0);
            for c0 in (0..nr).step_by(4) {
                let cnt = (nr - c0).min(4);
                let w: [*const u8; 4] = std::array::from_fn(|r| rows[c0 + r.min(cnt - 1)].as_ptr());
                let mut acc = [_mm_setzero_ps(); MR];
                for b in 0..nb {
                    // Weights stream from memory at M = 1: fetch each row PREFETCH bytes
                    // ahead (only hints: past a row's end they touch nothing).
                    for wr in &w {
                        let p = wr.wrapping_add(b * bb + PREFETCH) as *const i8;
                        for l in 0..bb.div_ceil(64) {
                            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64 * l));
                        }
                    }
                    // Rows past `cnt` repeat the last one (computed, never stored: no
                    // branches, and the sums stay in registers).
                    let s = [
                        $dot::<MR, F>(w[0].add(b * bb), &x, b),
                        $dot::<MR, F>(w[1].add(b * bb), &x, b),
                        $dot::<MR, F>(w[2].add(b * bb), &x, b),
                        $dot::<MR, F>(w[3].add(b * bb), &x, b),
                    ];
                    let wb: [*const u8; 4] = std::array::from_fn(|r| w[r].add(b * bb));
                    let (dw, mw) = if min == MinKind::None {
                        (f16x4(&wb, d_off), _mm_setzero_ps())
                    } else {
                        debug_assert_eq!(m_off, d_off + 2);
                        f16x4_pairs(&wb, d_off)
                    };
                    for a in 0..MR {
                        let d = *x.d[a].add(b);
                        let da = _mm_set1_ps(d);
                        let mut isum = hsum4(&[s[0].i[a], s[1].i[a], s[2].i[a], s[3].i[a]]);
                        if F == fmt::Q5_0 {
                            // Levels were fed as q + 16: less 16 · Σa.
                            isum = _mm_sub_epi32(isum, _mm_set1_epi32(16 * *x.qsum[a].add(b)));
                        }
                        let isum = _mm_cvtepi32_ps(isum);
                        acc[a] = _mm_fmadd_ps(isum, _mm_mul_ps(dw, da), acc[a]);
                        match min {
                            MinKind::None => {}
                            MinKind::Int => {
                                let m = [s[0].m[a], s[1].m[a], s[2].m[a], s[3].m[a]];
                                let msum = _mm_cvtepi32_ps(hsum4(&m));
                                // −(mw · da), exactly.
                                let neg = _mm_mul_ps(mw, _mm_set1_ps(-d));
                                acc[a] = _mm_fmadd_ps(msum, neg, acc[a]);
                            }
                            MinKind::Float => {
                                acc[a] = _mm_fmadd_ps(mw, _mm_set1_ps(*x.s[a].add(b)), acc[a]);
                            }
                        }
                    }
                }
                for (a, v) in acc.iter().enumerate() {
                    let mut lanes = [0f32; 4];
                    _mm_storeu_ps(lanes.as_mut_ptr(), *v);
                    out[a * nr + c0..a * nr + c0 + cnt].copy_from_slice(&lanes[..cnt]);
                }
            }
        }
    };
}

driver!(drive_avx2, "avx2,fma,f16c", dot_avx2);
driver!(
    drive_avx512,
    "avx512f,avx512bw,avx512vl,avx2,fma,f16c",
    dot_avx512
);
driver!(
    drive_vnni,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
    dot_vnni
);

/// The AVX2 dot of format `F`.
#[inline(always)]
unsafe fn dot_avx2<const MR: usize, const F: u8>(
    w: *const u8,
    x: &ActRows<MR>,
    b: usize,
) -> Sums<MR> {
    use super::{x86_k as k, x86_small as s};
    match F {
        fmt::Q5_0 => s::q5::<MR, true, false, false>(w, x, b),
        fmt::Q5_1 => s::q5::<MR, false, false, false>(w, x, b),
        fmt::IQ4_NL => s::iq4nl::<MR, false>(w, x, b),
        fmt::Q2_K => k::q2k::<MR, false>(w, x, b),
        fmt::Q3_K => k::q3k::<MR, false>(w, x, b),
        fmt::Q4_K => k::q4k::<MR, false, false>(w, x, b),
        fmt::Q5_K => k::q4k::<MR, true, false>(w, x, b),
        fmt::Q6_K => k::q6k::<MR, false>(w, x, b),
        _ => k::iq4xs::<MR, false>(w, x, b),
    }
}

/// The AVX-512 dot of format `F` (AVX2's where it has none), without VNNI.
#[inline(always)]
unsafe fn dot_avx512<const MR: usize, const F: u8>(
    w: *const u8,
    x: &ActRows<MR>,
    b: usize,
) -> Sums<MR> {
    dot512::<MR, F, false>(w, x, b)
}

/// The AVX-512 dot of format `F` with VNNI.
#[inline(always)]
unsafe fn dot_vnni<const MR: usize, const F: u8>(
    w: *const u8,
    x: &ActRows<MR>,
    b: usize,
) -> Sums<MR> {
    dot512::<MR, F, true>(w, x, b)
}

#[inline(always)]
unsafe fn dot512<const MR: usize, const F: u8, const VNNI: bool>(
    w: *const u8,
    x: &ActRows<MR>,
    b: usize,
) -> Sums<MR> {
    use super::{x86_k as k, x86_k512 as z, x86_small as s};
    match F {
        fmt::Q5_0 => s::q5::<MR, true, VNNI, true>(w, x, b),
        fmt::Q5_1 => s::q5::<MR, false, VNNI, true>(w, x, b),
        fmt::IQ4_NL => s::iq4nl::<MR, VNNI>(w, x, b),
        fmt::Q2_K => k::q2k::<MR, VNNI>(w, x, b),
        fmt::Q3_K => k::q3k::<MR, VNNI>(w, x, b),
        fmt::Q4_K => z::q4k::<MR, false, VNNI>(w, x, b),
        fmt::Q5_K => z::q4k::<MR, true, VNNI>(w, x, b),
        fmt::Q6_K => z::q6k::<MR, VNNI>(w, x, b),
        _ => k::iq4xs::<MR, VNNI>(w, x, b),
    }
}
