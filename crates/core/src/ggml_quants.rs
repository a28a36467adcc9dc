//! Reference dequantization of the ggml block types that [`DType`](crate::DType) does not
//! (yet) name: Q5_0, Q5_1, the K-quants (Q2_K … Q6_K, Q8_K) and the non-linear IQ4_NL and
//! IQ4_XS.
//!
//! Every function here is a transcription of ggml's scalar reference in `ggml-quants.c`
//! (`dequantize_row_*`, `quantize_row_q8_K_ref`), byte layout for byte layout and float
//! operation for float operation, so that the f32 results are **bitwise** identical to ggml's
//! (and to gguf-py's numpy dequantization, which follows the same order). The half-float
//! scales are widened exactly with the `half` crate. Rust never contracts `a * b - c` into a
//! fused multiply-add, so writing the same operations in the same order is enough.
//!
//! The golden test `crates/core/tests/ggml_quants.rs` checks every type against
//! `tests/golden/ggml_quants.json`, made by `tools/reference/make_ggml_quant_golden.py`.

use half::f16;

mod encode;
pub use encode::quantize_row;

/// Weights per super-block of the K-quants and IQ4_XS.
pub const QK_K: usize = 256;

/// ggml's `kvalues_iq4nl` (ggml-common.h): the 16 levels of IQ4_NL and IQ4_XS.
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// A ggml block type without a [`DType`](crate::DType) variant, with a reference
/// dequantizer in this module.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlQuant {
    Q5_0,
    Q5_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ4_NL,
    IQ4_XS,
}

impl GgmlQuant {
    /// Every type, in ggml type-id order.
    pub const ALL: [GgmlQuant; 10] = [
        GgmlQuant::Q5_0,
        GgmlQuant::Q5_1,
        GgmlQuant::Q2_K,
        GgmlQuant::Q3_K,
        GgmlQuant::Q4_K,
        GgmlQuant::Q5_K,
        GgmlQuant::Q6_K,
        GgmlQuant::Q8_K,
        GgmlQuant::IQ4_NL,
        GgmlQuant::IQ4_XS,
    ];

    /// The `ggml_type` id (ggml.h), as stored in a GGUF tensor info.
    pub const fn ggml_type(self) -> u32 {
        match self {
            GgmlQuant::Q5_0 => 6,
            GgmlQuant::Q5_1 => 7,
            GgmlQuant::Q2_K => 10,
            GgmlQuant::Q3_K => 11,
            GgmlQuant::Q4_K => 12,
            GgmlQuant::Q5_K => 13,
            GgmlQuant::Q6_K => 14,
            GgmlQuant::Q8_K => 15,
            GgmlQuant::IQ4_NL => 20,
            GgmlQuant::IQ4_XS => 23,
        }
    }

    /// The type with ggml type id `t`, if it is one of this module's.
    pub fn from_ggml_type(t: u32) -> Option<GgmlQuant> {
        GgmlQuant::ALL.into_iter().find(|q| q.ggml_type() == t)
    }

    /// Weights per block.
    pub const fn block_len(self) -> usize {
        match self {
            GgmlQuant::Q5_0 | GgmlQuant::Q5_1 | GgmlQuant::IQ4_NL => 32,
            _ => QK_K,
        }
    }

    /// Bytes per block (`sizeof(block_*)` in ggml-common.h).
    pub const fn block_bytes(self) -> usize {
        match self {
            GgmlQuant::Q5_0 => 2 + 4 + 16,
            GgmlQuant::Q5_1 => 2 + 2 + 4 + 16,
            GgmlQuant::Q2_K => QK_K / 16 + QK_K / 4 + 2 + 2,
            GgmlQuant::Q3_K => QK_K / 8 + QK_K / 4 + 12 + 2,
            GgmlQuant::Q4_K => 2 + 2 + 12 + QK_K / 2,
            GgmlQuant::Q5_K => 2 + 2 + 12 + QK_K / 8 + QK_K / 2,
            GgmlQuant::Q6_K => QK_K / 2 + QK_K / 4 + QK_K / 16 + 2,
            GgmlQuant::Q8_K => 4 + QK_K + 2 * (QK_K / 16),
            GgmlQuant::IQ4_NL => 2 + 16,
            GgmlQuant::IQ4_XS => 2 + 2 + QK_K / 64 + QK_K / 2,
        }
    }

    /// ggml's name for the type (`ggml_type_name`).
    pub const fn name(self) -> &'static str {
        match self {
            GgmlQuant::Q5_0 => "q5_0",
            GgmlQuant::Q5_1 => "q5_1",
            GgmlQuant::Q2_K => "q2_K",
            GgmlQuant::Q3_K => "q3_K",
            GgmlQuant::Q4_K => "q4_K",
            GgmlQuant::Q5_K => "q5_K",
            GgmlQuant::Q6_K => "q6_K",
            GgmlQuant::Q8_K => "q8_K",
            GgmlQuant::IQ4_NL => "iq4_nl",
            GgmlQuant::IQ4_XS => "iq4_xs",
        }
    }

    /// Bytes of a row of `n` weights, or `None` if `n` is not a whole number of blocks.
    pub const fn row_bytes(self, n: usize) -> Option<usize> {
        if !n.is_multiple_of(self.block_len()) {
            return None;
        }
        Some(n / self.block_len() * self.block_bytes())
    }
}

impl std::fmt::Display for GgmlQuant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Dequantizes one row (a whole number of blocks) of type `q` into `out`, bitwise as ggml's
/// reference `dequantize_row_*`.
///
/// Errors, without touching `out`, if `bytes` is not a whole number of blocks or `out` does
/// not hold exactly the weights those blocks encode. Never panics.
pub fn dequantize_row(q: GgmlQuant, bytes: &[u8], out: &mut [f32]) -> Result<(), String> {
    let bb = q.block_bytes();
    let bl = q.block_len();
    if !bytes.len().is_multiple_of(bb) {
        return Err(format!(
            "{q}: {} bytes is not a whole number of {bb}-byte blocks",
            bytes.len()
        ));
    }
    let nb = bytes.len() / bb;
    if out.len() != nb * bl {
        return Err(format!(
            "{q}: {nb} blocks hold {} weights but the output has room for {}",
            nb * bl,
            out.len()
        ));
    }
    let f: fn(&[u8], &mut [f32]) = match q {
        GgmlQuant::Q5_0 => block_q5_0,
        GgmlQuant::Q5_1 => block_q5_1,
        GgmlQuant::Q2_K => block_q2_k,
        GgmlQuant::Q3_K => block_q3_k,
        GgmlQuant::Q4_K => block_q4_k,
        GgmlQuant::Q5_K => block_q5_k,
        GgmlQuant::Q6_K => block_q6_k,
        GgmlQuant::Q8_K => block_q8_k,
        GgmlQuant::IQ4_NL => block_iq4_nl,
        GgmlQuant::IQ4_XS => block_iq4_xs,
    };
    for (b, y) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(bl)) {
        f(b, y);
    }
    Ok(())
}

/// `GGML_FP16_TO_FP32` of the little-endian half at `b[i..i + 2]` (exact).
#[inline(always)]
fn fp16(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

// Each `block_*` below takes exactly one block (`b.len() == block_bytes`) and writes exactly
// `block_len` weights; `dequantize_row` guarantees both. The comments give ggml's struct.

/// `block_q5_0 { half d; u8 qh[4]; u8 qs[16]; }`, `y = (q - 16) * d`.
fn block_q5_0(b: &[u8], y: &mut [f32]) {
    let d = fp16(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for j in 0..16 {
        let xh_0 = (((qh >> j) << 4) & 0x10) as u8;
        let xh_1 = ((qh >> (j + 12)) & 0x10) as u8;
        let x0 = ((qs[j] & 0x0f) | xh_0) as i32 - 16;
        let x1 = ((qs[j] >> 4) | xh_1) as i32 - 16;
        y[j] = x0 as f32 * d;
        y[j + 16] = x1 as f32 * d;
    }
}

/// `block_q5_1 { half d; half m; u8 qh[4]; u8 qs[16]; }`, `y = q * d + m`.
fn block_q5_1(b: &[u8], y: &mut [f32]) {
    let d = fp16(b, 0);
    let m = fp16(b, 2);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for j in 0..16 {
        let xh_0 = (((qh >> j) << 4) & 0x10) as u8;
        let xh_1 = ((qh >> (j + 12)) & 0x10) as u8;
        let x0 = ((qs[j] & 0x0f) | xh_0) as i32;
        let x1 = ((qs[j] >> 4) | xh_1) as i32;
        y[j] = x0 as f32 * d + m;
        y[j + 16] = x1 as f32 * d + m;
    }
}

/// `block_q2_K { u8 scales[16]; u8 qs[64]; half d; half dmin; }`,
/// `y = (d * sc) * q - (dmin * m)` per 16 weights.
fn block_q2_k(b: &[u8], y: &mut [f32]) {
    let scales = &b[0..16];
    let d = fp16(b, 80);
    let min = fp16(b, 82);
    let mut is = 0;
    let mut k = 0;
    for n in 0..2 {
        let q = &b[16 + 32 * n..16 + 32 * n + 32];
        for shift in [0, 2, 4, 6] {
            for half in 0..2 {
                let sc = scales[is];
                is += 1;
                let dl = d * (sc & 0x0f) as f32;
                let ml = min * (sc >> 4) as f32;
                for &ql in &q[16 * half..16 * half + 16] {
                    y[k] = dl * ((ql >> shift) & 3) as f32 - ml;
                    k += 1;
                }
            }
        }
    }
}

/// `block_q3_K { u8 hmask[32]; u8 qs[64]; u8 scales[12]; half d; }`,
/// `y = (d * (sc - 32)) * (q - (hmask bit ? 0 : 4))` per 16 weights.
fn block_q3_k(b: &[u8], y: &mut [f32]) {
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let hm = &b[0..32];
    let d_all = fp16(b, 108);
    let s = &b[96..108];
    let word = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (a0, a1, tmp) = (word(0), word(1), word(2));
    let aux = [
        (a0 & KMASK2) | ((tmp & KMASK1) << 4),
        (a1 & KMASK2) | (((tmp >> 2) & KMASK1) << 4),
        ((a0 >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4),
        ((a1 >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4),
    ];
    let mut scales = [0i8; 16];
    for (i, w) in aux.iter().enumerate() {
        for (j, byte) in w.to_le_bytes().into_iter().enumerate() {
            scales[4 * i + j] = byte as i8;
        }
    }
    let mut is = 0;
    let mut k = 0;
    let mut m: u8 = 1;
    for n in 0..2 {
        let q = &b[32 + 32 * n..32 + 32 * n + 32];
        for shift in [0, 2, 4, 6] {
            for half in 0..2 {
                let dl = d_all * (scales[is] as i32 - 32) as f32;
                is += 1;
                for l in 16 * half..16 * half + 16 {
                    let low = ((q[l] >> shift) & 3) as i32;
                    let high = if hm[l] & m != 0 { 0 } else { 4 };
                    y[k] = dl * (low - high) as f32;
                    k += 1;
                }
            }
            m = m.wrapping_shl(1);
        }
    }
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` (0..8) of a Q4_K or
/// Q5_K block from its 12 packed bytes.
#[inline(always)]
fn get_scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// `block_q4_K { half d; half dmin; u8 scales[12]; u8 qs[128]; }`,
/// `y = (d * sc) * q - (dmin * m)` per 32 weights.
fn block_q4_k(b: &[u8], y: &mut [f32]) {
    let d = fp16(b, 0);
    let min = fp16(b, 2);
    let scales = &b[4..16];
    for (g, (q, y)) in b[16..144]
        .chunks_exact(32)
        .zip(y.chunks_exact_mut(64))
        .enumerate()
    {
        let (sc, m) = get_scale_min_k4(2 * g, scales);
        let (d1, m1) = (d * sc as f32, min * m as f32);
        let (sc, m) = get_scale_min_k4(2 * g + 1, scales);
        let (d2, m2) = (d * sc as f32, min * m as f32);
        for l in 0..32 {
            y[l] = d1 * (q[l] & 0x0f) as f32 - m1;
            y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

/// `block_q5_K { half d; half dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]; }`,
/// `y = (d * sc) * q - (dmin * m)` per 32 weights, q with its fifth bit from `qh`.
fn block_q5_k(b: &[u8], y: &mut [f32]) {
    let d = fp16(b, 0);
    let min = fp16(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let (mut u1, mut u2) = (1u8, 2u8);
    for (g, (ql, y)) in b[48..176]
        .chunks_exact(32)
        .zip(y.chunks_exact_mut(64))
        .enumerate()
    {
        let (sc, m) = get_scale_min_k4(2 * g, scales);
        let (d1, m1) = (d * sc as f32, min * m as f32);
        let (sc, m) = get_scale_min_k4(2 * g + 1, scales);
        let (d2, m2) = (d * sc as f32, min * m as f32);
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y[l] = d1 * ((ql[l] & 0x0f) as i32 + h1) as f32 - m1;
            y[l + 32] = d2 * ((ql[l] >> 4) as i32 + h2) as f32 - m2;
        }
        u1 = u1.wrapping_shl(2);
        u2 = u2.wrapping_shl(2);
    }
}

/// `block_q6_K { u8 ql[128]; u8 qh[64]; i8 scales[16]; half d; }`,
/// `y = (d * sc) * (q - 32)` per 16 weights.
fn block_q6_k(b: &[u8], y: &mut [f32]) {
    let d = fp16(b, 208);
    for n in 0..2 {
        let ql = &b[64 * n..64 * n + 64];
        let qh = &b[128 + 32 * n..128 + 32 * n + 32];
        let sc = &b[192 + 8 * n..192 + 8 * n + 8];
        let y = &mut y[128 * n..128 * n + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i8 as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i8 as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 as i32 - 32;
            y[l] = d * sc[is] as i8 as f32 * q1 as f32;
            y[l + 32] = d * sc[is + 2] as i8 as f32 * q2 as f32;
            y[l + 64] = d * sc[is + 4] as i8 as f32 * q3 as f32;
            y[l + 96] = d * sc[is + 6] as i8 as f32 * q4 as f32;
        }
    }
}

/// `block_q8_K { f32 d; i8 qs[256]; i16 bsums[16]; }`, `y = d * q` (bsums unused).
fn block_q8_k(b: &[u8], y: &mut [f32]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (o, &q) in y.iter_mut().zip(&b[4..4 + QK_K]) {
        *o = d * q as i8 as f32;
    }
}

/// `block_iq4_nl { half d; u8 qs[16]; }`, `y = d * kvalues_iq4nl[q]`.
fn block_iq4_nl(b: &[u8], y: &mut [f32]) {
    let d = fp16(b, 0);
    for j in 0..16 {
        let q = b[2 + j];
        y[j] = d * KVALUES_IQ4NL[(q & 0x0f) as usize] as f32;
        y[j + 16] = d * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
    }
}

/// `block_iq4_xs { half d; u16 scales_h; u8 scales_l[4]; u8 qs[128]; }`,
/// `y = (d * (ls - 32)) * kvalues_iq4nl[q]` per 32 weights.
fn block_iq4_xs(b: &[u8], y: &mut [f32]) {
    let d = fp16(b, 0);
    let scales_h = u16::from_le_bytes([b[2], b[3]]) as i32;
    let scales_l = &b[4..8];
    for (ib, (qs, y)) in b[8..136]
        .chunks_exact(16)
        .zip(y.chunks_exact_mut(32))
        .enumerate()
    {
        let ls = ((scales_l[ib / 2] as i32 >> (4 * (ib % 2))) & 0x0f)
            | (((scales_h >> (2 * ib)) & 3) << 4);
        let dl = d * (ls - 32) as f32;
        for j in 0..16 {
            y[j] = dl * KVALUES_IQ4NL[(qs[j] & 0x0f) as usize] as f32;
            y[j + 16] = dl * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
        }
    }
}

/// ggml's `nearest_int`: round to nearest (ties to even) by the 1.5·2^23 trick, valid for
/// |x| <= 2^22 and deterministic (if meaningless) beyond.
#[inline(always)]
fn nearest_int(fval: f32) -> i32 {
    let val = fval + 12_582_912.0f32;
    (val.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// Quantizes `x` (a whole number of 256-weight blocks) into Q8_K blocks in `out`, bitwise as
/// ggml's `quantize_row_q8_K_ref`: per block `d = max / -127` of the value with the largest
/// magnitude (the first one on a tie), `q = min(127, nearest_int(x * (-127 / max)))` and
/// the 16 sums of 16 quants. An all-zero block stores `d = 0` and zero quants.
///
/// Errors, without touching `out`, if `x.len()` is not a multiple of 256 or `out.len()` is
/// not `x.len() / 256 * 292`.
pub fn quantize_row_q8_k_into(x: &[f32], out: &mut [u8]) -> Result<(), String> {
    if !x.len().is_multiple_of(QK_K) {
        return Err(format!(
            "q8_K: {} weights is not a whole number of 256-weight blocks",
            x.len()
        ));
    }
    let bb = GgmlQuant::Q8_K.block_bytes();
    if out.len() != x.len() / QK_K * bb {
        return Err(format!(
            "q8_K: {} weights need {} bytes but the output has {}",
            x.len(),
            x.len() / QK_K * bb,
            out.len()
        ));
    }
    for (x, y) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(bb)) {
        let mut max = 0f32;
        let mut amax = 0f32;
        for &v in x {
            let ax = v.abs();
            if ax > amax {
                amax = ax;
                max = v;
            }
        }
        if amax == 0.0 {
            y.fill(0);
            continue;
        }
        let iscale = -127.0f32 / max;
        let (head, bsums) = y.split_at_mut(4 + QK_K);
        let qs = &mut head[4..];
        for (q, &v) in qs.iter_mut().zip(x) {
            // C stores `MIN(127, v)` into an int8_t: out-of-range values wrap.
            *q = nearest_int(iscale * v).min(127) as i8 as u8;
        }
        for (s, g) in bsums.chunks_exact_mut(2).zip(qs.chunks_exact(16)) {
            let sum: i32 = g.iter().map(|&q| q as i8 as i32).sum();
            s.copy_from_slice(&(sum as i16).to_le_bytes());
        }
        head[..4].copy_from_slice(&(1.0f32 / iscale).to_le_bytes());
    }
    Ok(())
}

/// [`quantize_row_q8_k_into`] into a new buffer.
///
/// # Panics
/// If `x.len()` is not a multiple of 256.
pub fn quantize_row_q8_k(x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; x.len() / QK_K * GgmlQuant::Q8_K.block_bytes()];
    if let Err(e) = quantize_row_q8_k_into(x, &mut out) {
        panic!("{e}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_sizes_match_ggml() {
        let sizes = [22, 24, 84, 110, 144, 176, 210, 292, 18, 136];
        for (q, bytes) in GgmlQuant::ALL.into_iter().zip(sizes) {
            assert_eq!(GgmlQuant::from_ggml_type(q.ggml_type()), Some(q));
            assert_eq!(q.block_bytes(), bytes, "{q}");
        }
        for t in [0, 1, 2, 3, 8, 9, 16, 30, 99] {
            assert_eq!(GgmlQuant::from_ggml_type(t), None);
        }
    }

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(-2.5), -2);
        assert_eq!(nearest_int(-127.0), -127);
    }
}
