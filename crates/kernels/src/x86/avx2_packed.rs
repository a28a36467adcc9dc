//! The exact packed kernel's AVX2 macro tile: one `MR`-row activation tile (MR ≤ 4) against
//! every 4-row group of a panel over one K block, in one call (the AVX2 counterpart of
//! `avx512_packed::packed_groups`). Each group runs exactly
//! [`avx2_exact::packed_tile::<MR, 4>`](super::avx2_exact::packed_tile)'s chunks in order, so
//! every element's lanes are the same numbers; the finish is done in place: on the last K
//! block each row's four lane trees run together (`reduce4`, the canonical pairing), the
//! `K % 8` tail is added in order, then the bias, and the four values are stored straight
//! into the output row (masked at the block's last columns). No per-group call, copy or
//! write-back of the results, which cost a third of a large-M product on a Zen3 as separate
//! per-group tiles.
//!
//! Invariants: the caller has verified AVX2 and FMA (`Isa::Avx2Fma`); pointers are valid for
//! the lengths documented; loads and stores are unaligned.

use std::arch::x86_64::*;

use super::avx2_exact::reduce4;

/// How many steps (128 bytes each) ahead the panel is prefetched.
const PF_STEPS: usize = 8;

/// The macro tile: activation rows `x[m]` (chunk `c` of the block at `x[m] + c · x_step`,
/// its `K % 8` tail at `x_tail[m]`; rows in place, `x_step` 8, or a packed tile
/// `[step][MR][8]`, `x_step` `8 · MR`) against `groups` consecutive groups of the panel
/// (`[group][step][4][8]`, then each group's tail `[4][tail_len]`).
///
/// Lane slots: group `g`'s are `slots + g · slot_stride` (`MR · 4 · 8` floats used, `[m][n][8]`),
/// read unless `first`, written unless `last`. `x_next` are the ranges the next tile will
/// read: fetched into L2 a share per group.
///
/// # Safety
/// AVX2+FMA; `x[m]` valid for reads of `steps` chunks as above, `x_tail[m]` for `tail_len`;
/// `panel` for `groups · 4 · (8 · steps + tail_len)`; the slots as above; when `last`,
/// `out[m]` valid for `cols` writes (`4 · (groups − 1) < cols ≤ 4 · groups`) and `bias` null
/// or valid for `cols` reads.
#[target_feature(enable = "avx2,fma")]
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
    debug_assert!((1..=4).contains(&MR) && cols <= 4 * groups && cols + 4 > 4 * groups);
    let group_len = 4 * (8 * steps + tail_len);
    let mut next = NextTilePrefetch::new(x_next, groups);
    for g in 0..groups {
        next.group(g);
        let slot = slots.wrapping_add(g * slot_stride);
        let mut a = [[_mm256_setzero_ps(); 4]; MR];
        if !first {
            for m in 0..MR {
                for n in 0..4 {
                    a[m][n] = _mm256_loadu_ps(slot.add((m * 4 + n) * 8));
                }
            }
        }
        let mut bp = panel.add(g * group_len);
        let mut xp = x;
        for _ in 0..steps {
            // The panel streams from L2 (and runs on into the next group): fetch ahead.
            _mm_prefetch::<_MM_HINT_T0>(bp.wrapping_add(32 * PF_STEPS).cast());
            _mm_prefetch::<_MM_HINT_T0>(bp.wrapping_add(32 * PF_STEPS + 16).cast());
            let xv: [__m256; MR] = std::array::from_fn(|m| _mm256_loadu_ps(xp[m]));
            for n in 0..4 {
                let w = _mm256_loadu_ps(bp.add(8 * n));
                for m in 0..MR {
                    a[m][n] = _mm256_fmadd_ps(xv[m], w, a[m][n]);
                }
            }
            bp = bp.add(32);
            for q in xp.iter_mut() {
                *q = q.add(x_step);
            }
        }
        if !last {
            for m in 0..MR {
                for n in 0..4 {
                    _mm256_storeu_ps(slot.add((m * 4 + n) * 8), a[m][n]);
                }
            }
            continue;
        }
        let col0 = 4 * g;
        let live = (cols - col0).min(4);
        // Lanes `0..live` all ones: the columns this group owns.
        let mask = _mm_cmpgt_epi32(_mm_set1_epi32(live as i32), _mm_setr_epi32(0, 1, 2, 3));
        let b = if bias.is_null() {
            None
        } else if live == 4 {
            Some(_mm_loadu_ps(bias.add(col0)))
        } else {
            Some(_mm_maskload_ps(bias.add(col0), mask))
        };
        for m in 0..MR {
            let mut s = reduce4(a[m][0], a[m][1], a[m][2], a[m][3]);
            if tail_len > 0 {
                // The `K % 8` tail, element by element in order (rare: K a multiple of 8
                // has none); `bp` is at the group's tail `[4][tail_len]`.
                let mut v = [0f32; 4];
                _mm_storeu_ps(v.as_mut_ptr(), s);
                for (n, e) in v.iter_mut().enumerate() {
                    for t in 0..tail_len {
                        let wt = *bp.add(n * tail_len + t);
                        *e = x_tail[m].add(t).read().mul_add(wt, *e);
                    }
                }
                s = _mm_loadu_ps(v.as_ptr());
            }
            if let Some(b) = b {
                s = _mm_add_ps(s, b);
            }
            if live == 4 {
                _mm_storeu_ps(out[m].add(col0), s);
            } else {
                _mm_maskstore_ps(out[m].add(col0), mask, s);
            }
        }
    }
}

/// The next activation tile's lines, fetched into L2 a share per group while the macro tile
/// runs over a panel's groups, so the next tile does not start on L3 latency. A cursor over
/// the ranges (prefetches never fault).
pub(crate) struct NextTilePrefetch<'a> {
    ranges: &'a [&'a [f32]],
    /// 64-byte lines in all the ranges.
    lines: usize,
    groups: usize,
    range: usize,
    offset: usize,
}

impl<'a> NextTilePrefetch<'a> {
    pub(crate) fn new(ranges: &'a [&'a [f32]], groups: usize) -> Self {
        let lines = ranges.iter().map(|r| r.len().div_ceil(16)).sum();
        NextTilePrefetch {
            ranges,
            lines,
            groups: groups.max(1),
            range: 0,
            offset: 0,
        }
    }

    /// Fetches group `g`'s share of the lines.
    #[inline]
    pub(crate) fn group(&mut self, g: usize) {
        for _ in self.lines * g / self.groups..self.lines * (g + 1) / self.groups {
            while self.range < self.ranges.len() && self.offset >= self.ranges[self.range].len() {
                (self.range, self.offset) = (self.range + 1, 0);
            }
            if let Some(r) = self.ranges.get(self.range) {
                // SAFETY: a prefetch is a hint and never faults; the address is computed
                // with wrapping arithmetic and not dereferenced.
                unsafe { _mm_prefetch::<_MM_HINT_T1>(r.as_ptr().wrapping_add(self.offset).cast()) };
                self.offset += 16;
            }
        }
    }
}
