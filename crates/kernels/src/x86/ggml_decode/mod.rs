//! Dequantization of the ggml block types of `tessera_core::ggml_quants` (Q5_0, Q5_1, the
//! K-quants, IQ4_NL, IQ4_XS) to their exact reference f32 values, in SIMD registers.
//!
//! Bitwise as the reference (`tessera_core::ggml_quants::dequantize_row`) for every input:
//! each weight comes from the reference's own float operations, in its operand order, on
//! the same values. Those are one or two per weight, and every product in them is exact in
//! f32 (a half-float scale, 11 significant bits, times small integers: at most 23 bits), so
//! only the last add or subtract rounds and an FMA (`fmsub(dl, q, ml)` for the reference's
//! `dl * q - ml`, `fmadd(q, d, m)` for `q * d + m`) rounds exactly as the reference's two
//! operations, signed zeros included (a zero result of `x*y - z` has the sign IEEE gives
//! `x*y + (-z)` either way). Products that the reference takes in two steps (`(d * sc) * q`) are taken in
//! two steps here too: a zero factor's sign (`-0.0` against `+0.0`) and an infinite scale's
//! `inf * 0 = NaN` depend on it. The integer work (unpacking bit fields, the IQ4 level
//! table) is exact in any form, so it runs on 32 bytes at a time where the format allows.
//!
//! Layout: [`unpack`] turns a 256-weight block into its quant bytes in output order and its
//! per-sub-block float scales ([`Unpacked`], AVX2 integer operations, shared by both
//! ISAs); [`avx2`] and [`avx512`] widen those to floats and finish the weights (8 or 16 a
//! vector), and decode the formats that need no unpacking pass (Q4_K, Q8_K, the 32-weight
//! blocks) straight from the block bytes.
//!
//! AVX-512 (F, BW, VL) runs when the exact family's AVX-512 kernels do
//! ([`crate::isa::avx512_ggml_decode`]); the results are the same bits either way.

use tessera_core::ggml_quants::GgmlQuant;
use tessera_core::DType;

pub(crate) mod avx2;
pub(crate) mod avx512;
mod unpack;

#[cfg(test)]
mod tests;

/// Dequantizes a stored row of a ggml type (`dtype.ggml_quant()` is `Some`) into `out`,
/// bitwise as `tessera_core::ggml_quants::dequantize_row`.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `row` holds `out.len()` elements of `dtype` (whole
/// blocks).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dequantize(dtype: DType, row: &[u8], out: &mut [f32]) {
    let Some(q) = dtype.ggml_quant() else {
        return tessera_core::tensor::dequantize_row(dtype, row, out);
    };
    if crate::isa::avx512_ggml_decode() {
        // SAFETY: `avx512_ggml_decode` implies AVX-512 F/BW/DQ/VL besides AVX2, FMA and F16C.
        unsafe { avx512::dequantize(q, row, out) }
    } else {
        avx2::dequantize(q, row, out)
    }
}

/// A 256-weight block unpacked by [`unpack`]: quant `q[i]` (a signed byte) for weight `i`,
/// and the float scale `dl[s]` (and offset `ml[s]`) of sub-block `s` (16 or 32 weights).
#[repr(C, align(64))]
pub(super) struct Unpacked {
    pub q: [u8; 256],
    pub dl: [f32; 16],
    pub ml: [f32; 16],
}

impl Unpacked {
    pub fn new() -> Unpacked {
        Unpacked {
            q: [0; 256],
            dl: [0.0; 16],
            ml: [0.0; 16],
        }
    }
}

/// `v` behind an optimization barrier: what was stored to it stays in memory and what is
/// read from it is loaded, as broadcasts (`vbroadcastss`) and widening loads (`vpmovsxbd`
/// from memory) that need no shuffle-port operation. Without it the compiler forwards the
/// stores to the loads and rebuilds the values by shuffles and extracts, which compete with
/// the widening for that port (Q4_K at 16 weights a vector ran 1.4x slower so).
#[inline(always)]
pub(super) fn in_memory<T>(v: &T) -> &T {
    std::hint::black_box(v)
}

/// `s[i..i + N]` as an array (the bounds fold away where `i` and `s`'s length are known).
#[inline(always)]
pub(super) fn at<const N: usize, T>(s: &[T], i: usize) -> &[T; N] {
    s[i..i + N].try_into().expect("N elements")
}

/// `s[i..i + N]` as a mutable array.
#[inline(always)]
pub(super) fn at_mut<const N: usize, T>(s: &mut [T], i: usize) -> &mut [T; N] {
    (&mut s[i..i + N]).try_into().expect("N elements")
}

/// Bytes per block of `q`, as a constant.
pub(super) const fn bb(q: GgmlQuant) -> usize {
    q.block_bytes()
}

/// Splits `row` into blocks of `BB` bytes and `out` into blocks of `BL` weights.
///
/// # Panics
/// If `row` is not a whole number of blocks or `out` does not hold exactly their weights
/// (the callers' contract; checked once per call, so the block loops need no checks).
#[inline(always)]
pub(super) fn blocks<'a, 'b, const BB: usize, const BL: usize>(
    row: &'a [u8],
    out: &'b mut [f32],
) -> std::iter::Zip<std::slice::Iter<'a, [u8; BB]>, std::slice::IterMut<'b, [f32; BL]>> {
    let n = out.len();
    let (b, rest) = row.as_chunks::<BB>();
    let (y, yrest) = out.as_chunks_mut::<BL>();
    assert!(
        rest.is_empty() && yrest.is_empty() && b.len() == y.len(),
        "a ggml row of {} bytes does not hold the {n} weights asked for",
        row.len(),
    );
    b.iter().zip(y.iter_mut())
}
