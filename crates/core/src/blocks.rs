//! Block-quantized storage formats, byte-compatible with ggml's.
//!
//! Every block covers [`QK`] = 32 consecutive weights of one row. The structs are `#[repr(C)]`
//! with byte-array fields only, so their alignment is 1 and any byte slice of the right length
//! can be viewed as a slice of blocks (see [`as_blocks`]). Scales are IEEE half floats stored
//! little-endian.
//!
//! The dequantization functions here are the reference definitions; kernels must agree with
//! them exactly (the dequantized value of a weight is well defined, only sums may reorder).

use half::f16;

/// Weights per quantization block.
pub const QK: usize = 32;

/// Q8_0: `w = d * q`, q in i8.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_0 {
    pub d: [u8; 2],
    pub qs: [i8; QK],
}

/// Q4_0: `w = d * (q - 8)`, q in 0..16; low nibbles hold weights 0..16, high nibbles 16..32.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4_0 {
    pub d: [u8; 2],
    pub qs: [u8; QK / 2],
}

/// Q4_1: `w = d * q + m`, q in 0..16; nibble order as Q4_0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qs: [u8; QK / 2],
}

const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);
const _: () = assert!(std::mem::align_of::<BlockQ4_1>() == 1);

#[inline(always)]
pub fn f16_bits_to_f32(b: [u8; 2]) -> f32 {
    f16::from_bits(u16::from_le_bytes(b)).to_f32()
}

#[inline(always)]
pub fn f32_to_f16_bits(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_bits().to_le_bytes()
}

/// Marker for the block structs: alignment 1, no padding, every bit pattern valid.
///
/// # Safety
/// Implementors must be `#[repr(C)]`, contain only `u8`/`i8` arrays, and have alignment 1.
pub unsafe trait Block: Copy + 'static {}
unsafe impl Block for BlockQ8_0 {}
unsafe impl Block for BlockQ4_0 {}
unsafe impl Block for BlockQ4_1 {}

/// Views bytes as blocks. Returns `None` if the length is not a whole number of blocks.
pub fn as_blocks<B: Block>(bytes: &[u8]) -> Option<&[B]> {
    let sz = std::mem::size_of::<B>();
    if !bytes.len().is_multiple_of(sz) {
        return None;
    }
    // SAFETY: B has alignment 1 and no invalid bit patterns (the `Block` contract), and the
    // length is a whole number of blocks, so the cast covers exactly `bytes`.
    Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const B, bytes.len() / sz) })
}

/// Views a block slice as its bytes.
pub fn blocks_as_bytes<B: Block>(blocks: &[B]) -> &[u8] {
    // SAFETY: blocks are plain bytes without padding (the `Block` contract).
    unsafe {
        std::slice::from_raw_parts(blocks.as_ptr() as *const u8, std::mem::size_of_val(blocks))
    }
}

impl BlockQ8_0 {
    pub fn dequantize(&self, out: &mut [f32]) {
        let d = f16_bits_to_f32(self.d);
        for (o, &q) in out[..QK].iter_mut().zip(self.qs.iter()) {
            *o = d * q as f32;
        }
    }

    /// Reference quantizer (round to nearest, as ggml's `quantize_row_q8_0_ref`).
    pub fn quantize(x: &[f32]) -> Self {
        let amax = x[..QK].iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0i8; QK];
        for (q, &v) in qs.iter_mut().zip(x) {
            *q = (v * id).round() as i8;
        }
        BlockQ8_0 {
            d: f32_to_f16_bits(d),
            qs,
        }
    }
}

impl BlockQ4_0 {
    pub fn dequantize(&self, out: &mut [f32]) {
        let d = f16_bits_to_f32(self.d);
        for j in 0..QK / 2 {
            let b = self.qs[j];
            out[j] = ((b & 0x0f) as i32 - 8) as f32 * d;
            out[j + QK / 2] = ((b >> 4) as i32 - 8) as f32 * d;
        }
    }

    /// Reference quantizer (as ggml's `quantize_row_q4_0_ref`).
    pub fn quantize(x: &[f32]) -> Self {
        let mut amax = 0f32;
        let mut max = 0f32;
        for &v in &x[..QK] {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; QK / 2];
        for j in 0..QK / 2 {
            let q0 = ((x[j] * id + 8.5) as i32).min(15) as u8;
            let q1 = ((x[j + QK / 2] * id + 8.5) as i32).min(15) as u8;
            qs[j] = q0 | (q1 << 4);
        }
        BlockQ4_0 {
            d: f32_to_f16_bits(d),
            qs,
        }
    }
}

impl BlockQ4_1 {
    pub fn dequantize(&self, out: &mut [f32]) {
        let d = f16_bits_to_f32(self.d);
        let m = f16_bits_to_f32(self.m);
        for j in 0..QK / 2 {
            let b = self.qs[j];
            out[j] = (b & 0x0f) as f32 * d + m;
            out[j + QK / 2] = (b >> 4) as f32 * d + m;
        }
    }

    /// Reference quantizer (as ggml's `quantize_row_q4_1_ref`).
    pub fn quantize(x: &[f32]) -> Self {
        let min = x[..QK].iter().cloned().fold(f32::INFINITY, f32::min);
        let max = x[..QK].iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; QK / 2];
        for j in 0..QK / 2 {
            let q0 = (((x[j] - min) * id + 0.5) as i32).min(15) as u8;
            let q1 = (((x[j + QK / 2] - min) * id + 0.5) as i32).min(15) as u8;
            qs[j] = q0 | (q1 << 4);
        }
        BlockQ4_1 {
            d: f32_to_f16_bits(d),
            m: f32_to_f16_bits(min),
            qs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn roundtrip_err<B: Block>(x: &[f32], q: fn(&[f32]) -> B, dq: fn(&B, &mut [f32])) -> f32 {
        let b = q(x);
        let mut y = [0f32; QK];
        dq(&b, &mut y);
        x.iter()
            .zip(&y)
            .map(|(a, b)| (a - b).abs())
            .fold(0., f32::max)
    }

    proptest! {
        #[test]
        fn quantizers_round_trip_within_half_a_step(x in proptest::collection::vec(-4f32..4f32, QK)) {
            let range = x.iter().cloned().fold(0f32, |a, v| a.max(v.abs()));
            // Half a quantization step, plus the f16 rounding of the scale (2^-11 relative,
            // times the largest quant). Q4_0 clamps +amax to 7/8 of it: up to a whole step.
            let f16_slack = range * 2f32.powi(-10);
            prop_assert!(roundtrip_err(&x, BlockQ8_0::quantize, BlockQ8_0::dequantize) <= range / 127.0 * 0.5 + f16_slack);
            prop_assert!(roundtrip_err(&x, BlockQ4_1::quantize, BlockQ4_1::dequantize) <= 2.0 * range / 15.0 * 0.5 + f16_slack);
            prop_assert!(roundtrip_err(&x, BlockQ4_0::quantize, BlockQ4_0::dequantize) <= range / 8.0 + f16_slack);
        }
    }

    #[test]
    fn block_views_check_length() {
        let bytes = vec![0u8; 40];
        assert_eq!(as_blocks::<BlockQ4_1>(&bytes).unwrap().len(), 2);
        assert!(as_blocks::<BlockQ4_1>(&bytes[..39]).is_none());
    }
}
