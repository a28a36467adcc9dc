//! The exact packed kernel's outer-product lane tile at AVX-512 width (`crate::exact::outer`
//! with 32-row strips): the AVX2 form (`avx2_outer::lane_tile`) with two 16-wide weight
//! vectors per step instead of two 8-wide ones, and up to 14 broadcast activation rows
//! (28 accumulators of the 32 registers). Lane `l` of element `(i, j)` is the same fused
//! chain as in every other exact kernel: `x[i, l] · w[j, l]`, then `x[i, 8 + l] · w[j, 8 + l]`,
//! …, from zero, one FMA per product in chunk order; the lanes are then added by the AVX2
//! `finish_rows`, so results are bitwise those of the AVX2 tile.
//!
//! Invariants: the caller has verified AVX2, FMA and AVX-512 F/DQ
//! (`crate::isa::avx512_exact`); pointers are valid for the lengths documented; loads and
//! stores are unaligned.

use std::arch::x86_64::*;

/// Weight rows of one strip (two 512-bit vectors along N).
pub const WIDTH: usize = 32;

/// One lane of an `MR × 32` block over `steps` chunks: `a` is the tile's activations for
/// this lane, `[step][MR]`; `b` the strip's weights for this lane, `[step][32]`. The lane
/// sums `[MR][32]` at `acc` start from zero when `first`, else continue from what is there
/// (a K block after the previous one), and are stored back.
///
/// # Safety
/// AVX2+FMA+AVX-512F; `a` valid for `steps · MR` reads, `b` for `steps · 32`, `acc` for
/// `MR · 32` reads and writes.
#[inline]
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
#[allow(clippy::needless_range_loop)]
pub unsafe fn lane_tile<const MR: usize>(
    a: *const f32,
    b: *const f32,
    steps: usize,
    acc: *mut f32,
    first: bool,
) {
    debug_assert!((1..=14).contains(&MR));
    let mut c = [[_mm512_setzero_ps(); 2]; MR];
    if !first {
        for r in 0..MR {
            c[r][0] = _mm512_loadu_ps(acc.add(WIDTH * r));
            c[r][1] = _mm512_loadu_ps(acc.add(WIDTH * r + 16));
        }
    }
    let (mut ap, mut bp) = (a, b);
    for _ in 0..steps {
        let b0 = _mm512_loadu_ps(bp);
        let b1 = _mm512_loadu_ps(bp.add(16));
        for r in 0..MR {
            let x = _mm512_set1_ps(*ap.add(r));
            c[r][0] = _mm512_fmadd_ps(x, b0, c[r][0]);
            c[r][1] = _mm512_fmadd_ps(x, b1, c[r][1]);
        }
        ap = ap.add(MR);
        bp = bp.add(WIDTH);
    }
    for r in 0..MR {
        _mm512_storeu_ps(acc.add(WIDTH * r), c[r][0]);
        _mm512_storeu_ps(acc.add(WIDTH * r + 16), c[r][1]);
    }
}

/// [`lane_tile`] over `tiles` consecutive tiles of one lane: tile `t` reads `a + t · a_stride`
/// and keeps its sums at `acc + t · acc_stride` (one call per strip, K block and lane, so
/// the strip's lane block stays in L1 while the tiles stream past it).
///
/// # Safety
/// As [`lane_tile`] for every tile.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn lane_tiles<const MR: usize>(
    a: *const f32,
    a_stride: usize,
    b: *const f32,
    steps: usize,
    tiles: usize,
    acc: *mut f32,
    acc_stride: usize,
    first: bool,
) {
    for t in 0..tiles {
        lane_tile::<MR>(
            a.add(t * a_stride),
            b,
            steps,
            acc.add(t * acc_stride),
            first,
        );
    }
}
