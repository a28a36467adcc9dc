//! The exact packed kernel's outer-product form on AVX2 (`crate::exact::outer`): the
//! canonical order's eight lanes are eight independent sums, lane `l` of element `(i, j)`
//! being `x[i, l] · w[j, l] + x[i, 8 + l] · w[j, 8 + l] + …` fused in chunk order from zero.
//! One lane of an `MR × 16` block of elements is therefore an outer-product GEMM of depth
//! `K / 8`: [`lane_tile`] broadcasts each activation value and multiplies it into 16 weight
//! values (two vectors along N), exactly the fused chain a dot-product tile runs per lane.
//! [`finish_rows`] then adds each element's eight lane sums with the canonical tree, the
//! `K % 8` tail in order and the bias, 8 elements at a time. Same numbers as every other
//! exact kernel; what changes is the data each FMA needs: 2 bytes of activations per FMA
//! streamed from L2 instead of 11 bytes of panel.
//!
//! Invariants: the caller has verified AVX2 and FMA (`Isa::Avx2Fma`); pointers are valid for
//! the lengths documented; loads and stores are unaligned.

use std::arch::x86_64::*;

/// One lane of an `MR × 16` block over `steps` chunks: `a` is the tile's activations for
/// this lane, `[step][MR]`; `b` the strip's weights for this lane, `[step][16]`. The lane
/// sums `[MR][16]` at `acc` start from zero when `first`, else continue from what is there
/// (a K block after the previous one), and are stored back.
///
/// # Safety
/// AVX2+FMA; `a` valid for `steps · MR` reads, `b` for `steps · 16`, `acc` for `MR · 16`
/// reads and writes.
#[inline]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::needless_range_loop)]
pub unsafe fn lane_tile<const MR: usize>(
    a: *const f32,
    b: *const f32,
    steps: usize,
    acc: *mut f32,
    first: bool,
) {
    debug_assert!((1..=6).contains(&MR));
    let mut c = [[_mm256_setzero_ps(); 2]; MR];
    if !first {
        for r in 0..MR {
            c[r][0] = _mm256_loadu_ps(acc.add(16 * r));
            c[r][1] = _mm256_loadu_ps(acc.add(16 * r + 8));
        }
    }
    let (mut ap, mut bp) = (a, b);
    for _ in 0..steps {
        let b0 = _mm256_loadu_ps(bp);
        let b1 = _mm256_loadu_ps(bp.add(8));
        for r in 0..MR {
            let x = _mm256_broadcast_ss(&*ap.add(r));
            c[r][0] = _mm256_fmadd_ps(x, b0, c[r][0]);
            c[r][1] = _mm256_fmadd_ps(x, b1, c[r][1]);
        }
        ap = ap.add(MR);
        bp = bp.add(16);
    }
    for r in 0..MR {
        _mm256_storeu_ps(acc.add(16 * r), c[r][0]);
        _mm256_storeu_ps(acc.add(16 * r + 8), c[r][1]);
    }
}

/// [`lane_tile`] over `tiles` consecutive tiles of one lane: tile `t` reads `a + t · a_stride`
/// and keeps its sums at `acc + t · acc_stride` (one call per strip, K block and lane, so
/// the strip's lane block stays in L1 while the tiles stream past it).
///
/// # Safety
/// As [`lane_tile`] for every tile.
#[target_feature(enable = "avx2,fma")]
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

/// Finishes `rows` rows of a `width`-column strip (16, or 32 for the AVX-512 tile): for row
/// `r`, lane `l`'s sums are at `lanes + (l · rows + r) · width` (`[lane][row][width]`); each
/// element gets the canonical tree over its eight lanes, then its `tail` products fused in
/// order (`x_tail[r][t]` times `w_tail[t · width + col]`), then the bias, and its first
/// `cols` values are stored at `out[r] + out_off` (masked past `cols`).
///
/// # Safety
/// AVX2+FMA; `width` a multiple of 8; `lanes` valid for `8 · rows · width` reads;
/// `x_tail[r]` (r < rows) for `tail` reads; `w_tail` for `tail · width`; `bias` null or
/// valid for `cols` reads; `out[r] + out_off` for `cols` writes; `1 ≤ cols ≤ width`.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn finish_rows(
    lanes: *const f32,
    rows: usize,
    x_tail: &[*const f32],
    w_tail: *const f32,
    tail: usize,
    bias: *const f32,
    out: &[*mut f32],
    out_off: usize,
    cols: usize,
    width: usize,
) {
    debug_assert!((1..=width).contains(&cols) && rows <= x_tail.len() && rows <= out.len());
    for half in 0..width / 8 {
        let col0 = 8 * half;
        if col0 >= cols {
            break;
        }
        let live = (cols - col0).min(8);
        // Lanes `0..live` all ones: the columns this half owns.
        let mask = _mm256_cmpgt_epi32(
            _mm256_set1_epi32(live as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        );
        let bv = if bias.is_null() {
            None
        } else {
            Some(_mm256_maskload_ps(bias.add(col0), mask))
        };
        for r in 0..rows {
            let l = |i: usize| _mm256_loadu_ps(lanes.add((i * rows + r) * width + col0));
            // The canonical tree (`generic::reduce_lanes`): lane i + lane i + 4, then
            // (0, 2) and (1, 3), then the two.
            let h0 = _mm256_add_ps(l(0), l(4));
            let h1 = _mm256_add_ps(l(1), l(5));
            let h2 = _mm256_add_ps(l(2), l(6));
            let h3 = _mm256_add_ps(l(3), l(7));
            let mut s = _mm256_add_ps(_mm256_add_ps(h0, h2), _mm256_add_ps(h1, h3));
            for t in 0..tail {
                let x = _mm256_broadcast_ss(&*x_tail[r].add(t));
                s = _mm256_fmadd_ps(x, _mm256_loadu_ps(w_tail.add(width * t + col0)), s);
            }
            if let Some(b) = bv {
                s = _mm256_add_ps(s, b);
            }
            if live == 8 {
                _mm256_storeu_ps(out[r].add(out_off + col0), s);
            } else {
                _mm256_maskstore_ps(out[r].add(out_off + col0), mask, s);
            }
        }
    }
}

/// The standard 8 × 8 transpose: `r[i]`'s element `l` becomes element `i` of the result's
/// vector `l`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ]
}

/// Transposes `steps` chunks of 16 weight rows into a strip's lane-major layout: chunk `c`
/// of row `j` is the 8 values at `src[j] + c · stride` (`stride` 8 for rows as stored, 32
/// for the `[step][4][8]` panels of 4-row groups); lane `l` of it goes to
/// `dst + (l · steps + c) · width + j` (a strip `width` rows wide holds these 16 at `dst`).
///
/// # Safety
/// AVX2; each `src[j]` valid for `(steps − 1) · stride + 8` reads, `dst` for
/// `8 · steps · width` writes (`width ≥ 16`).
#[target_feature(enable = "avx2,fma")]
pub unsafe fn transpose_strip(
    src: [*const f32; 16],
    stride: usize,
    steps: usize,
    dst: *mut f32,
    width: usize,
) {
    for c in 0..steps {
        for half in 0..2 {
            let rows: [__m256; 8] =
                std::array::from_fn(|j| _mm256_loadu_ps(src[8 * half + j].add(c * stride)));
            let lanes = transpose8(rows);
            for (l, v) in lanes.iter().enumerate() {
                _mm256_storeu_ps(dst.add((l * steps + c) * width + 8 * half), *v);
            }
        }
    }
}

/// Transposes `steps` chunks of `mi ≤ 8` activation rows (`rows[r]`, chunk `c` at
/// `rows[r] + 8 · c`) into the lane-major tile layout: lane `l` of chunk `c` of row `r` goes
/// to `dst[l] + c · stride + r` (`stride ≥ mi`: the tile's height, when these rows are part
/// of it).
///
/// A chunk is stored with 8 plain values while they stay inside the `room` values from
/// `dst[l]`, the values past row `mi` landing where a later chunk, or a later call for the
/// tile's lower rows, writes its own; so a tile of more than 8 rows is transposed from its
/// last rows to its first.
///
/// # Safety
/// AVX2; `1 ≤ mi ≤ 8`, `mi ≤ stride`; `rows[r]` (r < mi) valid for `8 · steps` reads; each
/// `dst[l]` for `room ≥ (steps − 1) · stride + mi` writes.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn transpose_tile(
    rows: [*const f32; 8],
    mi: usize,
    steps: usize,
    stride: usize,
    dst: [*mut f32; 8],
    room: usize,
) {
    let mask = _mm256_cmpgt_epi32(
        _mm256_set1_epi32(mi as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    );
    for c in 0..steps {
        let r: [__m256; 8] = std::array::from_fn(|i| {
            if i < mi {
                _mm256_loadu_ps(rows[i].add(8 * c))
            } else {
                _mm256_setzero_ps()
            }
        });
        let lanes = transpose8(r);
        if c * stride + 8 <= room {
            // Values past `mi` land inside the tile, where later chunks or calls write
            // theirs (a masked store is slow on Zen3).
            for (l, v) in lanes.iter().enumerate() {
                _mm256_storeu_ps(dst[l].add(c * stride), *v);
            }
        } else {
            for (l, v) in lanes.iter().enumerate() {
                _mm256_maskstore_ps(dst[l].add(c * stride), mask, *v);
            }
        }
    }
}
