//! Activation rows quantized to 8-bit blocks, the input of the integer-dot ("fast") path.
//!
//! Each row is cut into 32-element blocks; a block stores `d = amax / 127` (f32), the quants
//! `q = round(x / d)` (i8), their sum `Σq` (i32, for Q4_0's offset) and `s = d · Σq` (f32, for
//! Q4_1's minimum). Quantization is row-local, so a row's quants do not depend on the batch.

use tessera_core::blocks::QK;

#[derive(Debug, Clone, Default)]
pub struct QuantizedActs {
    pub rows: usize,
    pub blocks_per_row: usize,
    pub d: Vec<f32>,
    pub s: Vec<f32>,
    pub qsum: Vec<i32>,
    pub qs: Vec<i8>,
}

impl QuantizedActs {
    /// Quantizes `m` rows of `k` values (`k` a multiple of 32).
    pub fn quantize(x: &[f32], m: usize, k: usize) -> Self {
        assert_eq!(
            k % QK,
            0,
            "quantized activations need K to be a multiple of {QK}"
        );
        assert_eq!(x.len(), m * k);
        let nb = k / QK;
        let mut out = QuantizedActs {
            rows: m,
            blocks_per_row: nb,
            d: vec![0.0; m * nb],
            s: vec![0.0; m * nb],
            qsum: vec![0; m * nb],
            qs: vec![0; m * k],
        };
        for (b, xb) in x.chunks_exact(QK).enumerate() {
            let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            let mut sum = 0i32;
            for (q, &v) in out.qs[b * QK..(b + 1) * QK].iter_mut().zip(xb) {
                *q = (v * id).round() as i8;
                sum += *q as i32;
            }
            out.d[b] = d;
            out.qsum[b] = sum;
            out.s[b] = d * sum as f32;
        }
        out
    }

    /// Quants of row `r`, block `b`.
    #[inline]
    pub fn block(&self, r: usize, b: usize) -> &[i8] {
        let i = r * self.blocks_per_row + b;
        &self.qs[i * QK..(i + 1) * QK]
    }
}
