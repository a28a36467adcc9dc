//! AVX2 integer-dot kernels over 8-row interleaved weights ([`crate::packed`]) and 8-bit
//! quantized activations ([`crate::quant_acts`]).
//!
//! Per block and row group: the 8 rows' quants against 4-element broadcasts of the
//! activation quants (`vpmaddubsw`, unsigned weights × signed activations), summed to one
//! i32 per row, converted to f32 and accumulated as `acc = fma(isum, d_w·d_x, acc)` (Q4_1 adds
//! `fma(m_w, s_x, acc)`). Integer sums are exact; the float accumulation runs over blocks in
//! order, so each output depends only on its own activation row and K.
//!
//! Invariants: AVX2+FMA+F16C present (checked by the caller through `Isa`); `rec` points at a
//! group's first record with `blocks` records of `record_bytes`; each `x[m]` points at a
//! row's `blocks · 32` quants; `d`, `s`, `qsum` hold `blocks` entries per row.
//! Overflow: Q4 lanes sum 8 `vpmaddubsw` results of at most 2·15·127 = 3810 in i16
//! (30480 < 32767); Q8_0 widens to i32 after every `vpmaddubsw` (2·127·127 = 32258).

use std::arch::x86_64::*;

use tessera_core::DType;

/// Row pointers and per-block scales of up to four activation rows.
pub struct ActRows<'a, const MR: usize> {
    pub qs: [*const i8; MR],
    pub d: [&'a [f32]; MR],
    pub s: [&'a [f32]; MR],
    pub qsum: [&'a [i32]; MR],
}

/// Computes 8 outputs (one group) for each of `MR` activation rows.
///
/// # Safety
/// See the module invariants.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile<const MR: usize>(
    dtype: DType,
    rec: *const u8,
    blocks: usize,
    record_bytes: usize,
    x: &ActRows<MR>,
    out: &mut [[f32; 8]; MR],
) {
    match dtype {
        DType::Q4_0 => tile_q4::<MR, false>(rec, blocks, record_bytes, x, out),
        DType::Q4_1 => tile_q4::<MR, true>(rec, blocks, record_bytes, x, out),
        DType::Q8_0 => tile_q8::<MR>(rec, blocks, record_bytes, x, out),
        _ => unreachable!("packed weights are Q4_0, Q4_1 or Q8_0"),
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bcast4(p: *const i8) -> __m256i {
    _mm256_set1_epi32(std::ptr::read_unaligned(p as *const i32))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_q4<const MR: usize, const MIN: bool>(
    rec: *const u8,
    blocks: usize,
    record_bytes: usize,
    x: &ActRows<MR>,
    out: &mut [[f32; 8]; MR],
) {
    let mask = _mm256_set1_epi8(0x0f);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); MR];
    for b in 0..blocks {
        let r = rec.add(b * record_bytes);
        let mut sum16 = [_mm256_setzero_si256(); MR];
        for v in 0..4 {
            let raw = _mm256_loadu_si256(r.add(32 * v) as *const __m256i);
            let lo = _mm256_and_si256(raw, mask);
            let hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
            for m in 0..MR {
                let xb = x.qs[m].add(b * 32);
                sum16[m] =
                    _mm256_add_epi16(sum16[m], _mm256_maddubs_epi16(lo, bcast4(xb.add(4 * v))));
                sum16[m] = _mm256_add_epi16(
                    sum16[m],
                    _mm256_maddubs_epi16(hi, bcast4(xb.add(4 * (v + 4)))),
                );
            }
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(r.add(128) as *const __m128i));
        for m in 0..MR {
            let mut isum = _mm256_madd_epi16(sum16[m], ones);
            if !MIN {
                isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(8 * x.qsum[m][b]));
            }
            let scale = _mm256_mul_ps(dw, _mm256_set1_ps(x.d[m][b]));
            acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc[m]);
            if MIN {
                let mw = _mm256_cvtph_ps(_mm_loadu_si128(r.add(144) as *const __m128i));
                acc[m] = _mm256_fmadd_ps(mw, _mm256_set1_ps(x.s[m][b]), acc[m]);
            }
        }
    }
    for m in 0..MR {
        _mm256_storeu_ps(out[m].as_mut_ptr(), acc[m]);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_q8<const MR: usize>(
    rec: *const u8,
    blocks: usize,
    record_bytes: usize,
    x: &ActRows<MR>,
    out: &mut [[f32; 8]; MR],
) {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); MR];
    for b in 0..blocks {
        let r = rec.add(b * record_bytes);
        let mut isum = [_mm256_setzero_si256(); MR];
        for v in 0..8 {
            let w = _mm256_loadu_si256(r.add(32 * v) as *const __m256i);
            let aw = _mm256_sign_epi8(w, w);
            for m in 0..MR {
                let xv = _mm256_sign_epi8(bcast4(x.qs[m].add(b * 32 + 4 * v)), w);
                isum[m] = _mm256_add_epi32(
                    isum[m],
                    _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xv), ones),
                );
            }
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(r.add(256) as *const __m128i));
        for m in 0..MR {
            let scale = _mm256_mul_ps(dw, _mm256_set1_ps(x.d[m][b]));
            acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[m]), scale, acc[m]);
        }
    }
    for m in 0..MR {
        _mm256_storeu_ps(out[m].as_mut_ptr(), acc[m]);
    }
}
