//! Dequantization of the ggml block types of `tessera_core::ggml_quants` (Q5_0, Q5_1, the
//! K-quants, IQ4_NL, IQ4_XS) to their exact reference f32 values, in SIMD registers.

use tessera_core::DType;

/// Dequantizes a stored row of a ggml type (`dtype.ggml_quant()` is `Some`) into `out`,
/// bitwise as `tessera_core::ggml_quants::dequantize_row`.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `row` holds `out.len()` elements of `dtype` (whole
/// blocks).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dequantize(dtype: DType, row: &[u8], out: &mut [f32]) {
    tessera_core::tensor::dequantize_row(dtype, row, out)
}
