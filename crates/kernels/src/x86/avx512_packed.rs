//! AVX-512 form of the exact packed kernel's register tile (`avx2_exact::packed_tile`), for
//! an even `NR`: in the panel (`[step][NR][8]`) weight rows `2p` and `2p + 1` of a step are
//! 16 consecutive floats, so one 512-bit register holds both rows' 8 canonical lanes, and
//! one FMA with the activation chunk broadcast to both halves advances two elements. Each
//! element's lanes take exactly the chunks, in the order, of the AVX2 tile; the lane trees
//! and the `K % 8` tail are the AVX2 tile's own (on the 256-bit halves), so results are bitwise
//! equal. Twice the lanes per instruction lets the tile grow to 8 × 4 (16 accumulators),
//! which halves the loads per FMA.
//!
//! Invariants: the caller has verified AVX2, FMA and AVX-512 F/DQ (`crate::isa::avx512_exact`);
//! pointers are valid for the lengths documented; loads are unaligned.

use std::arch::x86_64::*;

use super::avx2_exact::{reduce1, reduce4};

/// How many steps ahead the panel is prefetched.
const PF_STEPS: usize = 8;

/// [`avx2_exact::packed_tile`](super::avx2_exact::packed_tile) for even `NR` (2 or 4) and
/// `MR` up to 8, same contract: lane slots `acc[(m · NR + n) · 8 ..]`, start at zero
/// (`first`) or at the stored lanes; `steps` chunks in order with FMA; unless `last` the
/// lanes are stored back (zeros returned), else reduced, the tail added in order, returned.
///
/// # Safety
/// AVX2+FMA+AVX-512F/DQ; `x[m]` valid for `8 · steps + tail_len` reads; `panel` for
/// `NR · (8 · steps + tail_len)`; `acc` for `MR · NR · 8` reads (unless `first`) and writes
/// (unless `last`).
#[inline]
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
pub unsafe fn packed_tile<const MR: usize, const NR: usize>(
    x: [*const f32; MR],
    panel: *const f32,
    steps: usize,
    tail_len: usize,
    acc: *mut f32,
    first: bool,
    last: bool,
) -> [[f32; NR]; MR] {
    assert!(NR == 2 || NR == 4);
    let np = NR / 2;
    let mut a = [[_mm512_setzero_ps(); 2]; MR];
    if !first {
        for m in 0..MR {
            for p in 0..np {
                a[m][p] = _mm512_loadu_ps(acc.add((m * NR + 2 * p) * 8));
            }
        }
    }
    let mut bp = panel;
    let mut xp = x;
    for _ in 0..steps {
        // The panel streams from L2: fetch a few steps ahead (a hint; never faults).
        _mm_prefetch::<_MM_HINT_T0>(bp.wrapping_add(8 * NR * PF_STEPS).cast());
        if NR > 2 {
            _mm_prefetch::<_MM_HINT_T0>(bp.wrapping_add(8 * NR * PF_STEPS + 16).cast());
        }
        let w: [__m512; 2] = std::array::from_fn(|p| {
            if p < np {
                _mm512_loadu_ps(bp.add(16 * p))
            } else {
                _mm512_setzero_ps()
            }
        });
        for m in 0..MR {
            let xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(xp[m]));
            for p in 0..np {
                a[m][p] = _mm512_fmadd_ps(xv, w[p], a[m][p]);
            }
        }
        bp = bp.add(8 * NR);
        for q in xp.iter_mut() {
            *q = q.add(8);
        }
    }
    if !last {
        for m in 0..MR {
            for p in 0..np {
                _mm512_storeu_ps(acc.add((m * NR + 2 * p) * 8), a[m][p]);
            }
        }
        return [[0f32; NR]; MR];
    }
    // Element (m, n)'s lanes: half n % 2 of a[m][n / 2].
    let lanes = |t: usize| {
        let (m, n) = (t / NR, t % NR);
        let v = a[m][n / 2];
        if n % 2 == 0 {
            _mm512_castps512_ps256(v)
        } else {
            _mm512_extractf32x8_ps::<1>(v)
        }
    };
    let mut out = [[0f32; NR]; MR];
    let total = MR * NR;
    let mut t = 0;
    while t + 4 <= total {
        let mut s = [0f32; 4];
        _mm_storeu_ps(
            s.as_mut_ptr(),
            reduce4(lanes(t), lanes(t + 1), lanes(t + 2), lanes(t + 3)),
        );
        for (i, si) in s.into_iter().enumerate() {
            out[(t + i) / NR][(t + i) % NR] = si;
        }
        t += 4;
    }
    while t < total {
        out[t / NR][t % NR] = reduce1(lanes(t));
        t += 1;
    }
    for t in 0..tail_len {
        for n in 0..NR {
            let wt = *bp.add(n * tail_len + t);
            for m in 0..MR {
                out[m][n] = xp[m].add(t).read_unaligned().mul_add(wt, out[m][n]);
            }
        }
    }
    out
}
