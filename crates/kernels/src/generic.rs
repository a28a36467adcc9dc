//! Portable kernels. Always complete; the SIMD kernels must match their summation order.

use tessera_core::tensor::dequantize_row;
use tessera_core::DType;

/// Lanes of the canonical dot product.
pub const LANES: usize = 8;

/// The canonical f32 dot product: 8 lane accumulators over the first `K - K % 8` elements,
/// a fixed lane tree, then the tail added in order.
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    dot_f32_as(a, b)
}

/// [`dot_f32`] with `b` in another element type (f16, bf16) converted to f32 as it is read:
/// on exactly converted values, bitwise [`dot_f32`] of the converted row.
#[inline]
pub fn dot_f32_as<W: Copy + Into<f32>>(a: &[f32], b: &[W]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let n = a.len() / LANES * LANES;
    let mut acc = [0f32; LANES];
    for (ca, cb) in a[..n].chunks_exact(LANES).zip(b[..n].chunks_exact(LANES)) {
        for l in 0..LANES {
            acc[l] += ca[l] * cb[l].into();
        }
    }
    let mut s = reduce_lanes(&acc);
    for i in n..a.len() {
        s += a[i] * b[i].into();
    }
    s
}

/// The fixed lane tree shared by every dot-product kernel: the upper four lanes are added to
/// the lower four (as a 256-bit to 128-bit fold does), then pairs, then the last two.
#[inline]
pub fn reduce_lanes(acc: &[f32; LANES]) -> f32 {
    let h = [
        acc[0] + acc[4],
        acc[1] + acc[5],
        acc[2] + acc[6],
        acc[3] + acc[7],
    ];
    let q = [h[0] + h[2], h[1] + h[3]];
    q[0] + q[1]
}

/// Dequantizes a stored row to f32 (reference definition).
pub fn dequantize(dtype: DType, row: &[u8], out: &mut [f32]) {
    dequantize_row(dtype, row, out)
}

/// Portable twin of `x86::avx2_q8::tile`: 8 outputs of group `g` for activation row `r`.
pub fn packed_group_row(
    pw: &crate::packed::PackedWeight,
    g: usize,
    xq: &crate::quant_acts::QuantizedActs,
    r: usize,
    out: &mut [f32; 8],
) {
    use tessera_core::blocks::{f16_bits_to_f32, QK};
    let (_, d_off, m_off) = crate::packed::record_layout(pw.dtype).expect("packed dtype");
    let mut acc = [0f32; 8];
    for b in 0..pw.blocks {
        let rec = pw.record(g, b);
        let xb = xq.block(r, b);
        let i = r * xq.blocks_per_row + b;
        for (c, a) in acc.iter_mut().enumerate() {
            let mut isum: i32 = (0..QK).map(|e| pw.quant(g, b, c, e) * xb[e] as i32).sum();
            if pw.dtype == DType::Q4_0 {
                isum -= 8 * xq.qsum[i];
            }
            let dw = f16_bits_to_f32([rec[d_off + 2 * c], rec[d_off + 2 * c + 1]]);
            *a += isum as f32 * (dw * xq.d[i]);
            if pw.dtype == DType::Q4_1 {
                let mw = f16_bits_to_f32([rec[m_off + 2 * c], rec[m_off + 2 * c + 1]]);
                *a += mw * xq.s[i];
            }
        }
    }
    *out = acc;
}
