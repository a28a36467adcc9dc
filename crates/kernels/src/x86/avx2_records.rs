//! AVX2 form of the exact family's stream kernel (small M) over the 8-row interleaved repack
//! of block-quantized weights (`crate::packed`, built at load for the exact path wherever
//! AVX2 runs, see `crate::wants_repack`). The AVX-512 form is `avx512_exact::stream16`.
//!
//! One call computes the 8 rows of one record group (vector lane `c` = row `c`) against `MR`
//! activation rows. Output element `(m, c)`'s 8 canonical lanes live in 8 accumulators, one
//! per lane `l`, at position `c`: chunk `ch` of block `b` adds
//! `x[m][32b + 8ch + l] · w[c][32b + 8ch + l]` to accumulator `l` with one FMA (`x`
//! broadcast), chunks in order; at the end the canonical lane tree is 7 vector additions
//! (`h_l = acc_l + acc_{l+4}`, `q_0 = h_0 + h_2`, `q_1 = h_1 + h_3`, `s = q_0 + q_1`). So
//! every element is computed exactly as `avx2::tile_f32` computes it on the dequantized row:
//! same products, same order, FMA.
//!
//! Dequantization is the reference's own arithmetic (bit-identical to
//! `tessera_core::tensor::dequantize_row`, as `avx2_exact::decode_group`): each record slice
//! holds one dword per row, so a quant is one shift and one mask away from its lane (no byte
//! shuffles), then converted: Q4_1 `q·d + m` as one FMA (`q·d` is exact), Q4_0 `(q − 8)·d`,
//! Q8_0 `d·q`. Per 8 weights that is shift, mask, convert, scale and the dot FMA: five
//! vector operations on Zen 3's four FP pipes, and no per-block scale checks.
//!
//! Registers: `MR × 8` accumulators do not fit 16 vector registers beside the temporaries for
//! `MR > 1`, so the 8 lanes are computed in `8 / L` passes of `L` lanes over the call's
//! records (`L · MR ≤ 8`); every pass after the first re-reads records the first just brought
//! into L1/L2. The lanes' sums are independent until the tree, so passes change no bits.
//!
//! Invariants: the caller has verified AVX2, FMA and F16C (`Isa::Avx2Fma`); pointers are
//! valid for the lengths documented; loads are unaligned.

use std::arch::x86_64::*;

pub use super::avx2_exact::{Q4_0, Q4_1, Q8_0};
use super::avx512_exact::record_geometry;

/// How far ahead of the record stream [`stream8`] prefetches into L2 (a decode step streams
/// the whole model from DRAM; see `avx512_exact::FAR_PREFETCH`).
const FAR_PREFETCH: usize = 12 << 10;

/// The 8 rows' f16 values at byte `off` of a record, converted (exactly).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn halves8(rec: *const u8, off: usize) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(rec.add(off).cast()))
}

/// The 32 bytes of record slice `v`: 4 bytes per row.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn slice(rec: *const u8, v: usize) -> __m256i {
    _mm256_loadu_si256(rec.add(32 * v).cast())
}

/// `(z >> P) & 0xf` in every dword: the nibble at bit `P` (0, 4, …, 28) as an integer.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn nibble(z: __m256i, p: u32) -> __m256i {
    let lo = _mm256_set1_epi32(0x0f);
    match p {
        0 => _mm256_and_si256(z, lo),
        4 => _mm256_and_si256(_mm256_srli_epi32::<4>(z), lo),
        8 => _mm256_and_si256(_mm256_srli_epi32::<8>(z), lo),
        12 => _mm256_and_si256(_mm256_srli_epi32::<12>(z), lo),
        16 => _mm256_and_si256(_mm256_srli_epi32::<16>(z), lo),
        20 => _mm256_and_si256(_mm256_srli_epi32::<20>(z), lo),
        24 => _mm256_and_si256(_mm256_srli_epi32::<24>(z), lo),
        28 => _mm256_srli_epi32::<28>(z),
        _ => unreachable!("nibble at {p}"),
    }
}

/// The signed byte `j` (0..4) of every dword, sign-extended.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn signed_byte(z: __m256i, j: usize) -> __m256i {
    match j {
        0 => _mm256_srai_epi32::<24>(_mm256_slli_epi32::<24>(z)),
        1 => _mm256_srai_epi32::<24>(_mm256_slli_epi32::<16>(z)),
        2 => _mm256_srai_epi32::<24>(_mm256_slli_epi32::<8>(z)),
        _ => _mm256_srai_epi32::<24>(z),
    }
}

/// The 8 rows' weights at element `8ch + l` of the block whose record is `rec`, with the
/// block's scales `d` (and minimums `m`, Q4_1) already converted.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn weights<const DT: u8>(
    rec: *const u8,
    d: __m256,
    m: __m256,
    ch: usize,
    l: usize,
) -> __m256 {
    let (half, j) = (l / 4, l % 4);
    if DT == Q8_0 {
        // Slice v holds, per row, elements 4v + j: element 8ch + 4half + j is in v = 2ch + half.
        let q = signed_byte(slice(rec, 2 * ch + half), j);
        return _mm256_mul_ps(d, _mm256_cvtepi32_ps(q));
    }
    // Slice v holds, per row, the stored block's bytes 4v .. 4v + 4: elements 4v + j (low
    // nibbles) and 16 + 4v + j (high nibbles). Element 8ch + 4half + j is the low (ch < 2)
    // or high nibble of byte j of slice 2·(ch % 2) + half.
    let p = 8 * j as u32 + if ch < 2 { 0 } else { 4 };
    let q = nibble(slice(rec, 2 * (ch % 2) + half), p);
    if DT == Q4_1 {
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), d, m)
    } else {
        let q = _mm256_sub_epi32(q, _mm256_set1_epi32(8));
        _mm256_mul_ps(_mm256_cvtepi32_ps(q), d)
    }
}

/// One pass: lanes `l0 .. l0 + L` of every activation row over all `blocks` records.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pass<const DT: u8, const MR: usize, const L: usize, const XE: bool>(
    x: &[*const f32; MR],
    r: *const u8,
    blocks: usize,
    l0: usize,
    prefetch: bool,
) -> [[__m256; L]; MR] {
    let (rb, d_off, m_off) = record_geometry(DT);
    let mut acc = [[_mm256_setzero_ps(); L]; MR];
    for b in 0..blocks {
        let rec = r.add(b * rb);
        if prefetch {
            // The group's records are one stream: four records ahead into L1 and
            // `FAR_PREFETCH` bytes ahead into L2 (hints: never fault, wrapping arithmetic
            // without a dereference; past the group's end they reach the next group's).
            for line in (0..rb).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(rec.wrapping_add(4 * rb + line).cast());
                _mm_prefetch::<_MM_HINT_T1>(rec.wrapping_add(FAR_PREFETCH + line).cast());
            }
        }
        let d = halves8(rec, d_off);
        let m = if DT == Q4_1 {
            halves8(rec, m_off)
        } else {
            _mm256_setzero_ps()
        };
        for ch in 0..4 {
            for i in 0..L {
                let l = l0 + i;
                let w = weights::<DT>(rec, d, m, ch, l);
                let e = 32 * b + 8 * ch + l;
                for (a, xa) in acc.iter_mut().zip(x) {
                    let xv = if XE {
                        _mm256_loadu_ps(xa.add(8 * e))
                    } else {
                        _mm256_broadcast_ss(&*xa.add(e))
                    };
                    a[i] = _mm256_fmadd_ps(xv, w, a[i]);
                }
            }
        }
    }
    acc
}

/// Canonical dot products of `MR` activation rows `x[m]` (f32, `32 · blocks` each) with the
/// 8 rows of the record group starting at `r` (`blocks` consecutive records), computed `L`
/// lanes per pass (`L` divides 8, `L · MR ≤ 8`). Returns `[m][row]`. With `XE` the rows
/// come expanded ([`expand`]: each value 8 times), so the kernel loads a vector per FMA
/// instead of broadcasting one (Zen 3: a broadcast per FMA costs a vector pipe slot; 8-15%).
///
/// # Safety
/// AVX2+FMA+F16C; `x[m]` valid for `32 · blocks` reads (`256 · blocks` with `XE`); `r` for
/// `blocks` records of format `DT` (`record_geometry`).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn stream8<const DT: u8, const MR: usize, const L: usize, const XE: bool>(
    x: [*const f32; MR],
    r: *const u8,
    blocks: usize,
) -> [[f32; 8]; MR] {
    const { assert!(L > 0 && 8 % L == 0 && L * MR <= 8) };
    let mut lanes = [[_mm256_setzero_ps(); 8]; MR];
    for p in 0..8 / L {
        let acc = pass::<DT, MR, L, XE>(&x, r, blocks, p * L, p == 0);
        for (dst, a) in lanes.iter_mut().zip(acc) {
            dst[p * L..p * L + L].copy_from_slice(&a);
        }
    }
    let mut out = [[0f32; 8]; MR];
    for (o, a) in out.iter_mut().zip(&lanes) {
        let h: [__m256; 4] = std::array::from_fn(|l| _mm256_add_ps(a[l], a[l + 4]));
        let s = _mm256_add_ps(_mm256_add_ps(h[0], h[2]), _mm256_add_ps(h[1], h[3]));
        _mm256_storeu_ps(o.as_mut_ptr(), s);
    }
    out
}

/// Writes each of `x`'s values 8 times into `dst` (`dst.len() == 8 · x.len()`): the
/// activation form [`stream8`] takes with `XE`.
pub fn expand(x: &[f32], dst: &mut [f32]) {
    assert_eq!(dst.len(), 8 * x.len());
    for (d, &v) in dst.chunks_exact_mut(8).zip(x) {
        d.fill(v);
    }
}
