//! AVX2 + FMA + F16C kernels of the exact family's two fast forms (see `crate::exact`):
//!
//! - [`stream_tile`]: small M. Weight rows are read in their stored format and dequantized
//!   in registers, 8 elements at a time, straight into the dot products; nothing is written
//!   back, so each weight byte is read once per `MR` activation rows.
//! - [`pack_panel`] + [`packed_tile`]: large M. A block of weight rows is dequantized once
//!   into a panel interleaved by `NR` rows (`[step][NR][8]`), which an `MR × NR` register
//!   tile then streams for every activation row of the block, carrying its lane accumulators
//!   across K blocks in memory.
//!
//! Both compute every output element in the canonical order (`generic::dot_f32` with FMA,
//! exactly as `avx2::tile_f32` does): one 8-lane accumulator per element fed the K chunks
//! `0, 1, 2, …` in order, the lane tree of `generic::reduce_lanes`, then the `K % 8` tail in
//! order. So both are bitwise equal to `avx2::tile_f32` on the dequantized rows, whatever the
//! tile, block or split.
//!
//! Invariants shared by every function: the caller has verified AVX2, FMA and F16C
//! (`Isa::Avx2Fma`); pointers are valid for the lengths documented; loads are unaligned.

use std::arch::x86_64::*;

use tessera_core::DType;

/// Weight formats as const-generic codes (an enum cannot be a const parameter).
pub const F32: u8 = 0;
pub const F16: u8 = 1;
pub const BF16: u8 = 2;
pub const Q8_0: u8 = 3;
pub const Q4_0: u8 = 4;
pub const Q4_1: u8 = 5;

/// The code of a format this module's kernels read as stored, `None` for the others (the
/// ggml types of `tessera_core::ggml_quants`, which callers dequantize first).
pub const fn code(d: DType) -> Option<u8> {
    Some(match d {
        DType::F32 => F32,
        DType::F16 => F16,
        DType::BF16 => BF16,
        DType::Q8_0 => Q8_0,
        DType::Q4_0 => Q4_0,
        DType::Q4_1 => Q4_1,
        _ => return None,
    })
}

/// Bytes of one group of 32 elements (a quantization block, or 32 float elements).
const fn group_bytes(dt: u8) -> usize {
    match dt {
        F32 => 128,
        F16 | BF16 => 64,
        Q8_0 => 34,
        Q4_0 => 18,
        _ => 20,
    }
}

/// The f16 at `p`, converted (exactly) and broadcast.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_splat(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16(p.cast::<i16>().read_unaligned()))
}

/// Elements `8j .. 8j + 8` (j = 0..4) of 32-element group `b` of a stored row, dequantized
/// bit-identically to `tessera_core::tensor::dequantize_row`:
/// - Q8_0 `d · q`, Q4_0 `(q − 8) · d`: the same single products (the integer part is exact).
/// - Q4_1 `q · d + m` as one FMA: `q · d` is exact in f32 (a 4-bit integer times an 11-bit
///   f16 significand), so rounding once equals the reference's two roundings.
/// - f16/bf16/f32: exact widenings.
///
/// # Safety
/// AVX2+FMA+F16C; `row` valid for group `b` (`group_bytes` each).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_group<const DT: u8>(row: *const u8, b: usize) -> [__m256; 4] {
    let p = row.add(b * group_bytes(DT));
    match DT {
        F32 => {
            let f = p as *const f32;
            [
                _mm256_loadu_ps(f),
                _mm256_loadu_ps(f.add(8)),
                _mm256_loadu_ps(f.add(16)),
                _mm256_loadu_ps(f.add(24)),
            ]
        }
        F16 => std::array::from_fn(|j| {
            _mm256_cvtph_ps(_mm_loadu_si128(p.add(16 * j) as *const __m128i))
        }),
        BF16 => std::array::from_fn(|j| {
            let h = _mm_loadu_si128(p.add(16 * j) as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
        }),
        Q8_0 => {
            let d = f16_splat(p);
            std::array::from_fn(|j| {
                let q = _mm_loadl_epi64(p.add(2 + 8 * j) as *const __m128i);
                _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)))
            })
        }
        Q4_0 | Q4_1 => {
            // Bytes 0..8 and 8..16 widened to 32 bits: low nibbles are elements 0..16,
            // high nibbles elements 16..32.
            let qs = p.add(if DT == Q4_0 { 2 } else { 4 });
            let b0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(qs as *const __m128i));
            let b1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(qs.add(8) as *const __m128i));
            let lo = _mm256_set1_epi32(0x0f);
            let q = [
                _mm256_and_si256(b0, lo),
                _mm256_and_si256(b1, lo),
                _mm256_srli_epi32(b0, 4),
                _mm256_srli_epi32(b1, 4),
            ];
            if DT == Q4_0 {
                let d = f16_splat(p);
                let eight = _mm256_set1_epi32(8);
                q.map(|q| _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q, eight)), d))
            } else {
                // d and m are adjacent f16s: convert both, then spread each over the lanes.
                let dm = _mm256_cvtph_ps(_mm_set1_epi32(p.cast::<i32>().read_unaligned()));
                let (d, m) = (_mm256_moveldup_ps(dm), _mm256_movehdup_ps(dm));
                q.map(|q| _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), d, m))
            }
        }
        _ => unreachable!("unknown dtype code"),
    }
}

/// Row `c` (0..8) of one record of the 8-row interleaved repack (`crate::packed`), i.e. 32
/// elements of a block-quantized row: the same values as [`decode_group`] on the stored
/// block (the record keeps each row's quants and scales; for 4-bit formats the row's 16
/// bytes, one dword per record slice, are the stored block's bytes in order).
///
/// # Safety
/// AVX2+FMA+F16C; `rec` valid for one record of `DT` (`avx512_exact::record_geometry`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn decode_record<const DT: u8>(rec: *const u8, c: usize) -> [__m256; 4] {
    let dw = |v: usize| rec.add(32 * v + 4 * c).cast::<i32>().read_unaligned();
    match DT {
        Q8_0 => {
            let d = f16_splat(rec.add(256 + 2 * c));
            let q = _mm256_setr_epi32(dw(0), dw(1), dw(2), dw(3), dw(4), dw(5), dw(6), dw(7));
            let halves = [_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q)];
            std::array::from_fn(|j| {
                let h = halves[j / 2];
                let b = if j % 2 == 0 {
                    h
                } else {
                    _mm_unpackhi_epi64(h, h)
                };
                _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)))
            })
        }
        Q4_0 | Q4_1 => {
            let qs = _mm_setr_epi32(dw(0), dw(1), dw(2), dw(3));
            let b0 = _mm256_cvtepu8_epi32(qs);
            let b1 = _mm256_cvtepu8_epi32(_mm_unpackhi_epi64(qs, qs));
            let lo = _mm256_set1_epi32(0x0f);
            let q = [
                _mm256_and_si256(b0, lo),
                _mm256_and_si256(b1, lo),
                _mm256_srli_epi32(b0, 4),
                _mm256_srli_epi32(b1, 4),
            ];
            let d = f16_splat(rec.add(128 + 2 * c));
            if DT == Q4_0 {
                let eight = _mm256_set1_epi32(8);
                q.map(|q| _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q, eight)), d))
            } else {
                let m = f16_splat(rec.add(144 + 2 * c));
                q.map(|q| _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), d, m))
            }
        }
        _ => unreachable!("only block formats are repacked"),
    }
}

/// Float formats only: elements `8c .. 8c + 8` of a stored row.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_chunk<const DT: u8>(row: *const u8, c: usize) -> __m256 {
    match DT {
        F32 => _mm256_loadu_ps((row as *const f32).add(8 * c)),
        F16 => _mm256_cvtph_ps(_mm_loadu_si128(row.add(16 * c) as *const __m128i)),
        BF16 => {
            let h = _mm_loadu_si128(row.add(16 * c) as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
        }
        _ => unreachable!("block formats have whole groups"),
    }
}

/// Float formats only: element `t` of a stored row (the reference conversion).
#[inline]
unsafe fn decode_elem<const DT: u8>(row: *const u8, t: usize) -> f32 {
    match DT {
        F32 => (row as *const f32).add(t).read_unaligned(),
        F16 => tessera_core::blocks::f16_bits_to_f32([*row.add(2 * t), *row.add(2 * t + 1)]),
        BF16 => f32::from_bits((row.add(2 * t).cast::<u16>().read_unaligned() as u32) << 16),
        _ => unreachable!("block formats have no tail"),
    }
}

/// Four canonical lane trees at once: `[tree(a), tree(b), tree(c), tree(d)]`, each sum
/// exactly `avx2::hsum`'s (lane `i` + lane `i + 4`, then pairs `(0, 2)`, `(1, 3)`, then the
/// last two; IEEE addition is commutative, so operand order inside a sum does not matter).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn reduce4(a: __m256, b: __m256, c: __m256, d: __m256) -> __m128 {
    let hab = _mm256_add_ps(
        _mm256_permute2f128_ps(a, b, 0x20),
        _mm256_permute2f128_ps(a, b, 0x31),
    ); // [h(a) | h(b)]
    let hcd = _mm256_add_ps(
        _mm256_permute2f128_ps(c, d, 0x20),
        _mm256_permute2f128_ps(c, d, 0x31),
    ); // [h(c) | h(d)]
    let q = _mm256_add_ps(
        _mm256_shuffle_ps(hab, hcd, 0b01_00_01_00),
        _mm256_shuffle_ps(hab, hcd, 0b11_10_11_10),
    ); // [qa0 qa1 qc0 qc1 | qb0 qb1 qd0 qd1]
    let s = _mm256_add_ps(
        _mm256_shuffle_ps(q, q, 0b10_00_10_00),
        _mm256_shuffle_ps(q, q, 0b11_01_11_01),
    ); // [sa sc sa sc | sb sd sb sd]
    _mm_unpacklo_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1))
}

/// The canonical lane tree of one accumulator (as `avx2::hsum`).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn reduce1(v: __m256) -> f32 {
    let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let q = _mm_add_ps(h, _mm_movehl_ps(h, h));
    _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 0b01)))
}

/// Lane trees of a whole register tile, four at a time.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn reduce_tile<const MR: usize, const NR: usize>(
    acc: &[[__m256; NR]; MR],
) -> [[f32; NR]; MR] {
    let mut out = [[0f32; NR]; MR];
    let total = MR * NR;
    let v = |t: usize| acc[t / NR][t % NR];
    let mut t = 0;
    while t + 4 <= total {
        let mut s = [0f32; 4];
        _mm_storeu_ps(s.as_mut_ptr(), reduce4(v(t), v(t + 1), v(t + 2), v(t + 3)));
        for (i, si) in s.into_iter().enumerate() {
            out[(t + i) / NR][(t + i) % NR] = si;
        }
        t += 4;
    }
    while t < total {
        out[t / NR][t % NR] = reduce1(v(t));
        t += 1;
    }
    out
}

/// An `MR × NR` tile of canonical dot products of activation rows `x[m]` (f32, `k` each)
/// with stored weight rows `w[n]` (format `DT`, `k` elements each), the weights dequantized
/// in registers. Equal, bitwise, to `avx2::tile_f32` on the dequantized rows.
///
/// # Safety
/// AVX2+FMA+F16C; every `x[m]` valid for `k` f32 reads, every `w[n]` for one stored row of
/// `k` elements of `DT` (for block formats `k` is a multiple of 32).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn stream_tile<const DT: u8, const MR: usize, const NR: usize>(
    x: [*const f32; MR],
    w: [*const u8; NR],
    k: usize,
) -> [[f32; NR]; MR] {
    let mut acc = [[_mm256_setzero_ps(); NR]; MR];
    let groups = k / 32;
    // Rows of one tensor are contiguous, so `w[n] + j · NR · row` is row `n` of the tile
    // `j` ahead: fetch the first tile at least 16 KiB ahead (a hint that never faults;
    // wrapping arithmetic, no deref), every 64-byte line of the group. (An f32 group is two
    // lines; hinting only its first leaves a cold f32 GEMV at 0.76-0.86 of a plain read of
    // its bytes, 0.90-1.02 with both: Zen 4, 2 units, M = 1 on the 7B shapes. One tile
    // ahead is 9 KiB at K = 576 on a 1x4 tile: 16 KiB runs 1 × 576 × 49,152 f32 from DRAM
    // 3-10% faster.)
    let tile = NR * (k / 32) * group_bytes(DT);
    let ahead = tile * 16384usize.div_ceil(tile.max(1));
    for b in 0..groups {
        for n in 0..NR {
            let pf = w[n].wrapping_add(ahead + b * group_bytes(DT));
            for line in (0..group_bytes(DT)).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(pf.wrapping_add(line) as *const i8);
            }
            let v = decode_group::<DT>(w[n], b);
            for (j, wv) in v.into_iter().enumerate() {
                for m in 0..MR {
                    let xv = _mm256_loadu_ps(x[m].add(32 * b + 8 * j));
                    acc[m][n] = _mm256_fmadd_ps(xv, wv, acc[m][n]);
                }
            }
        }
    }
    let n8 = k / 8 * 8;
    for c in groups * 4..n8 / 8 {
        for n in 0..NR {
            let wv = decode_chunk::<DT>(w[n], c);
            for m in 0..MR {
                acc[m][n] = _mm256_fmadd_ps(_mm256_loadu_ps(x[m].add(8 * c)), wv, acc[m][n]);
            }
        }
    }
    let mut out = reduce_tile(&acc);
    if n8 < k {
        for n in 0..NR {
            for t in n8..k {
                let wt = decode_elem::<DT>(w[n], t);
                for m in 0..MR {
                    out[m][n] = x[m].add(t).read_unaligned().mul_add(wt, out[m][n]);
                }
            }
        }
    }
    out
}

/// Dequantizes elements `k0 .. k1` of `NR` stored rows into a panel `[step][NR][8]` (step
/// = chunk of 8 from `k0`) followed by the tail `[NR][(k1 − k0) % 8]`. Rows past `rows`
/// are zero. Values are bit-identical to `dequantize_row`.
///
/// # Safety
/// AVX2+FMA+F16C; `w[n]` valid stored rows of `DT` for `n < rows`; `k0` a multiple of 32;
/// `k1 − k0` a multiple of 32 for block formats; `panel` holds `NR · (k1 − k0)` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn pack_panel<const DT: u8, const NR: usize>(
    w: [*const u8; NR],
    rows: usize,
    k0: usize,
    k1: usize,
    panel: *mut f32,
) {
    let len = k1 - k0;
    let steps = len / 8;
    let groups = len / 32;
    let g0 = k0 / 32;
    for n in 0..NR {
        if n >= rows {
            for s in 0..steps {
                _mm256_storeu_ps(panel.add((s * NR + n) * 8), _mm256_setzero_ps());
            }
            for t in 0..len % 8 {
                *panel.add(steps * 8 * NR + n * (len % 8) + t) = 0.0;
            }
            continue;
        }
        for b in 0..groups {
            let v = decode_group::<DT>(w[n], g0 + b);
            for (j, wv) in v.into_iter().enumerate() {
                _mm256_storeu_ps(panel.add(((4 * b + j) * NR + n) * 8), wv);
            }
        }
        for s in groups * 4..steps {
            let wv = decode_chunk::<DT>(w[n], k0 / 8 + s);
            _mm256_storeu_ps(panel.add((s * NR + n) * 8), wv);
        }
        for t in 0..len % 8 {
            *panel.add(steps * 8 * NR + n * (len % 8) + t) =
                decode_elem::<DT>(w[n], k0 + steps * 8 + t);
        }
    }
}

/// [`pack_panel`] for a repacked weight (block formats, so `k0` and `k1` are multiples of
/// 32): row `n` of the panel is row `cs[n]` of the group whose records start at `recs[n]`
/// (`rb` bytes each, one per block of 32 elements).
///
/// # Safety
/// AVX2+FMA+F16C; `recs[n]` valid for `k1 / 32` records of `DT` for `n < rows`; `panel`
/// holds `NR · (k1 − k0)` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn pack_panel_records<const DT: u8, const NR: usize>(
    recs: [*const u8; NR],
    cs: [usize; NR],
    rb: usize,
    rows: usize,
    k0: usize,
    k1: usize,
    panel: *mut f32,
) {
    let steps = (k1 - k0) / 8;
    for n in 0..NR {
        if n >= rows {
            for s in 0..steps {
                _mm256_storeu_ps(panel.add((s * NR + n) * 8), _mm256_setzero_ps());
            }
            continue;
        }
        for b in 0..steps / 4 {
            let v = decode_record::<DT>(recs[n].add((k0 / 32 + b) * rb), cs[n]);
            for (j, wv) in v.into_iter().enumerate() {
                _mm256_storeu_ps(panel.add(((4 * b + j) * NR + n) * 8), wv);
            }
        }
    }
}

/// How many steps ahead [`packed_tile`] prefetches its panel.
const PF_STEPS: usize = 8;

/// Runs `steps` chunks of an `MR × NR` register tile over a packed panel: lane accumulators
/// start at zero (`first`) or at their values stored in `acc[(m · NR + n) · 8 ..]`, and take
/// `x[m][8s..8s+8] · panel[s][n]` for `s = 0..steps` in order with FMA. Unless `last`, they
/// are stored back to `acc` (and zeros returned); on the last K block they are reduced by the
/// lane tree in registers, the tail `x[m][8·steps + t] · tail[n][t]` (`t < tail_len`, the
/// panel's tail region) added in order with FMA, and the finished values returned.
///
/// # Safety
/// AVX2+FMA; `x[m]` valid for `8 · steps + tail_len` reads; `panel` for
/// `NR · (8 · steps + tail_len)`; `acc` for `MR · NR · 8` reads (unless `first`) and writes
/// (unless `last`).
#[inline]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn packed_tile<const MR: usize, const NR: usize>(
    x: [*const f32; MR],
    panel: *const f32,
    steps: usize,
    tail_len: usize,
    acc: *mut f32,
    first: bool,
    last: bool,
) -> [[f32; NR]; MR] {
    let mut a = [[_mm256_setzero_ps(); NR]; MR];
    if !first {
        for m in 0..MR {
            for n in 0..NR {
                a[m][n] = _mm256_loadu_ps(acc.add((m * NR + n) * 8));
            }
        }
    }
    let mut bp = panel;
    let mut xp = x;
    for _ in 0..steps {
        // The panel streams from L2: fetch a few steps ahead (a hint; never faults).
        _mm_prefetch::<_MM_HINT_T0>(bp.add(8 * NR * PF_STEPS) as *const i8);
        if NR > 2 {
            _mm_prefetch::<_MM_HINT_T0>(bp.add(8 * NR * PF_STEPS + 16) as *const i8);
        }
        let xv: [__m256; MR] = std::array::from_fn(|m| _mm256_loadu_ps(xp[m]));
        for n in 0..NR {
            let wv = _mm256_loadu_ps(bp.add(8 * n));
            for m in 0..MR {
                a[m][n] = _mm256_fmadd_ps(xv[m], wv, a[m][n]);
            }
        }
        bp = bp.add(8 * NR);
        for p in xp.iter_mut() {
            *p = p.add(8);
        }
    }
    if !last {
        for m in 0..MR {
            for n in 0..NR {
                _mm256_storeu_ps(acc.add((m * NR + n) * 8), a[m][n]);
            }
        }
        return [[0f32; NR]; MR];
    }
    let mut out = reduce_tile(&a);
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
