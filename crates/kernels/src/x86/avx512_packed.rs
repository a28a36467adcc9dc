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
use super::avx2_packed::NextTilePrefetch;

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

/// The packed kernel's AVX-512 macro tile: an `MR`-row activation tile (MR ≤ 8) against
/// `groups` consecutive 4-row groups of a panel (`[group][step][4][8]`, then each group's
/// tail `[4][tail_len]`), over one K block. Each group runs exactly
/// [`packed_tile::<MR, 4>`]'s chunks in order, so every element's lanes are the same numbers;
/// what changes is the finish: on the last K block the lane trees of four rows run together
/// on 512-bit registers (the canonical pairing: `h_l = lane_l + lane_{l+4}`,
/// `q_0 = h_0 + h_2`, `q_1 = h_1 + h_3`, `s = q_0 + q_1`), the tail is added in order, then the
/// bias, and each row's four values are stored straight into the output (masked at the
/// block's last columns). No per-group call, copy or write-back of the results.
///
/// Lane slots: group `g`'s are `slots + g · slot_stride` (`MR · 4 · 8` floats used), read
/// unless `first`, written unless `last`.
///
/// Activations: chunk `c` of the block for tile row `m` is at `x[m] + c · x_step`, and its
/// `K % 8` tail at `x_tail[m]`: rows in place (`x_step` 8) or a packed tile
/// (`[step][MR][8]`, `x_step` `8 · MR`), which is one contiguous stream whatever K is (rows
/// a multiple of 4 KiB apart would all map to the same L1 sets). `x_next` are the ranges the
/// next tile will read: fetched into L2 a share per group, so it does not start on L3
/// latency.
///
/// # Safety
/// AVX2+FMA+AVX-512F/DQ/VL; `x[m]` valid for reads of `steps` chunks as above, `x_tail[m]`
/// for `tail_len`; `panel` for
/// `groups · 4 · (8 · steps + tail_len)`; the slots as above; when `last`, `out[m]` valid for
/// `cols` writes (`cols ≤ 4 · groups`, `cols > 4 · (groups − 1)`) and `bias` null or valid
/// for `cols` reads.
#[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,fma")]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
pub unsafe fn packed_groups<const MR: usize>(
    x: [*const f32; MR],
    x_step: usize,
    x_tail: [*const f32; MR],
    x_next: &[&[f32]],
    panel: *const f32,
    groups: usize,
    steps: usize,
    tail_len: usize,
    slots: *mut f32,
    slot_stride: usize,
    first: bool,
    last: bool,
    out: [*mut f32; MR],
    cols: usize,
    bias: *const f32,
) {
    debug_assert!(MR >= 1 && MR <= 8 && cols <= 4 * groups && cols + 4 > 4 * groups);
    let group_len = 4 * (8 * steps + tail_len);
    let mut next = NextTilePrefetch::new(x_next, groups);
    for g in 0..groups {
        next.group(g);
        let slot = slots.wrapping_add(g * slot_stride);
        let mut a = [[_mm512_setzero_ps(); 2]; MR];
        if !first {
            for m in 0..MR {
                for p in 0..2 {
                    a[m][p] = _mm512_loadu_ps(slot.add((m * 4 + 2 * p) * 8));
                }
            }
        }
        let mut bp = panel.add(g * group_len);
        let mut xp = x;
        for _ in 0..steps {
            // The panel streams from L2 (and runs on into the next group): fetch ahead.
            _mm_prefetch::<_MM_HINT_T0>(bp.wrapping_add(32 * PF_STEPS).cast());
            _mm_prefetch::<_MM_HINT_T0>(bp.wrapping_add(32 * PF_STEPS + 16).cast());
            let w0 = _mm512_loadu_ps(bp);
            let w1 = _mm512_loadu_ps(bp.add(16));
            for m in 0..MR {
                let xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(xp[m]));
                a[m][0] = _mm512_fmadd_ps(xv, w0, a[m][0]);
                a[m][1] = _mm512_fmadd_ps(xv, w1, a[m][1]);
            }
            bp = bp.add(32);
            for q in xp.iter_mut() {
                *q = q.add(x_step);
            }
        }
        if !last {
            for m in 0..MR {
                for p in 0..2 {
                    _mm512_storeu_ps(slot.add((m * 4 + 2 * p) * 8), a[m][p]);
                }
            }
            continue;
        }
        let col0 = 4 * g;
        let live = (cols - col0).min(4);
        let mut m0 = 0;
        while m0 < MR {
            let rows = (MR - m0).min(4);
            // Four rows' values, row-major (`[r][n]`); rows past `rows` are padding.
            let quad = |r: usize| {
                if m0 + r < MR {
                    a[m0 + r]
                } else {
                    [_mm512_setzero_ps(); 2]
                }
            };
            let mut s = reduce_rows4(quad(0), quad(1), quad(2), quad(3));
            if tail_len > 0 {
                // The `K % 8` tail, element by element in order (rare: K a multiple of 8
                // has none).
                let mut v = [0f32; 16];
                _mm512_storeu_ps(v.as_mut_ptr(), s);
                for r in 0..rows {
                    for n in 0..4 {
                        // `bp` is at the group's tail `[4][tail_len]`.
                        let mut e = v[4 * r + n];
                        for t in 0..tail_len {
                            let wt = *bp.add(n * tail_len + t);
                            e = x_tail[m0 + r].add(t).read().mul_add(wt, e);
                        }
                        v[4 * r + n] = e;
                    }
                }
                s = _mm512_loadu_ps(v.as_ptr());
            }
            let mask: __mmask8 = (1u8 << live) - 1;
            if !bias.is_null() {
                let b = _mm_maskz_loadu_ps(mask, bias.add(col0));
                s = _mm512_add_ps(s, _mm512_broadcast_f32x4(b));
            }
            for r in 0..rows {
                let v = match r {
                    0 => _mm512_castps512_ps128(s),
                    1 => _mm512_extractf32x4_ps::<1>(s),
                    2 => _mm512_extractf32x4_ps::<2>(s),
                    _ => _mm512_extractf32x4_ps::<3>(s),
                };
                _mm_mask_storeu_ps(out[m0 + r].add(col0), mask, v);
            }
            m0 += 4;
        }
    }
}

/// The canonical lane trees of four rows' four elements: row `r`'s accumulators hold
/// elements (r, 0) | (r, 1) and (r, 2) | (r, 3), 8 lanes each. Returns the 16 sums row-major.
#[inline]
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
unsafe fn reduce_rows4(
    r0: [__m512; 2],
    r1: [__m512; 2],
    r2: [__m512; 2],
    r3: [__m512; 2],
) -> __m512 {
    // h: 128-bit chunk j of row r's result is h(r, j) = lanes 0..4 + lanes 4..8.
    let h = |a: [__m512; 2]| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(a[0], a[1]),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(a[0], a[1]),
        )
    };
    let (h0, h1, h2, h3) = (h(r0), h(r1), h(r2), h(r3));
    // q: chunk j = [q0(r, j), q1(r, j), q0(r + 1, j), q1(r + 1, j)], q0 = h0 + h2, q1 = h1 + h3.
    let q = |a: __m512, b: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_ps::<0b01_00_01_00>(a, b),
            _mm512_shuffle_ps::<0b11_10_11_10>(a, b),
        )
    };
    let (q01, q23) = (q(h0, h1), q(h2, h3));
    // s = q0 + q1: chunk j = [s(0, j), s(1, j), s(2, j), s(3, j)].
    let s = _mm512_add_ps(
        _mm512_shuffle_ps::<0b10_00_10_00>(q01, q23),
        _mm512_shuffle_ps::<0b11_01_11_01>(q01, q23),
    );
    // Transpose the 4 × 4: element 4r + j ← 4j + r.
    let idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_permutexvar_ps(idx, s)
}
