//! Activation rows quantized to 8-bit blocks, the input of the integer-dot ("fast") path.
//!
//! Each row is cut into 32-element blocks; a block stores `d = amax / 127` (f32), the quants
//! `q = round(x / d)` (i8), their sum `Σq` (i32, for Q4_0's offset) and `s = d · Σq` (f32, for
//! Q4_1's minimum). Quantization is row-local, so a row's quants do not depend on the batch.

use tessera_core::blocks::QK;
use tessera_runtime::{split_range, DisjointMut, ThreadPool};

/// Quantizes every block of `x` (outputs are indexed from the first block of `x`).
fn quantize_blocks(x: &[f32], d: &mut [f32], s: &mut [f32], qsum: &mut [i32], qs: &mut [i8]) {
    #[cfg(target_arch = "x86_64")]
    if crate::Isa::active() == crate::Isa::Avx2Fma {
        let nb = x.len() / QK;
        // SAFETY: AVX2+FMA present; lengths: nb blocks in every output, 32·nb quants.
        unsafe {
            crate::x86::avx2::quantize_q8_blocks(
                x,
                &mut d[..nb],
                &mut s[..nb],
                &mut qsum[..nb],
                &mut qs[..nb * QK],
            )
        };
        return;
    }
    quantize_blocks_portable(x, d, s, qsum, qs)
}

fn quantize_blocks_portable(
    x: &[f32],
    d: &mut [f32],
    s: &mut [f32],
    qsum: &mut [i32],
    qs: &mut [i8],
) {
    for b in 0..x.len() / QK {
        let xb = &x[b * QK..(b + 1) * QK];
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
        let db = amax / 127.0;
        let id = if db > 0.0 { 1.0 / db } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in qs[b * QK..(b + 1) * QK].iter_mut().zip(xb) {
            *q = (v * id).round() as i8;
            sum += *q as i32;
        }
        d[b] = db;
        qsum[b] = sum;
        s[b] = db * sum as f32;
    }
}

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
        let mut out = Self::zeroed(x, m, k);
        quantize_blocks(x, &mut out.d, &mut out.s, &mut out.qsum, &mut out.qs);
        out
    }

    /// As [`Self::quantize`], rows split over the pool's units (results are identical).
    pub fn quantize_parallel(pool: &ThreadPool, x: &[f32], m: usize, k: usize) -> Self {
        let mut out = Self::zeroed(x, m, k);
        let nb = out.blocks_per_row;
        if m < 2 * pool.units() {
            quantize_blocks(x, &mut out.d, &mut out.s, &mut out.qsum, &mut out.qs);
            return out;
        }
        let d = DisjointMut::new(&mut out.d);
        let s = DisjointMut::new(&mut out.s);
        let qsum = DisjointMut::new(&mut out.qsum);
        let qs = DisjointMut::new(&mut out.qs);
        let units = pool.units();
        pool.run(|u| {
            let rows = split_range(m, units, u);
            let (b0, b1) = (rows.start * nb, rows.end * nb);
            let n = b1 - b0;
            // SAFETY: units own disjoint block ranges [b0, b1) of every output vector, which
            // outlive the parallel operation.
            unsafe {
                quantize_blocks(
                    &x[b0 * QK..b1 * QK],
                    d.slice(b0, n),
                    s.slice(b0, n),
                    qsum.slice(b0, n),
                    qs.slice(b0 * QK, n * QK),
                )
            }
        });
        out
    }

    fn zeroed(x: &[f32], m: usize, k: usize) -> Self {
        assert_eq!(
            k % QK,
            0,
            "quantized activations need K to be a multiple of {QK}"
        );
        assert_eq!(x.len(), m * k);
        let nb = k / QK;
        QuantizedActs {
            rows: m,
            blocks_per_row: nb,
            d: vec![0.0; m * nb],
            s: vec![0.0; m * nb],
            qsum: vec![0; m * nb],
            qs: vec![0; m * k],
        }
    }

    /// Quantizes with the portable loop whatever the ISA (tests compare it with the SIMD one).
    pub fn quantize_portable(x: &[f32], m: usize, k: usize) -> Self {
        let mut out = Self::zeroed(x, m, k);
        quantize_blocks_portable(x, &mut out.d, &mut out.s, &mut out.qsum, &mut out.qs);
        out
    }

    /// Quants of row `r`, block `b`.
    #[inline]
    pub fn block(&self, r: usize, b: usize) -> &[i8] {
        let i = r * self.blocks_per_row + b;
        &self.qs[i * QK..(i + 1) * QK]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn simd_quantization_equals_portable(x in proptest::collection::vec(-50f32..50.0, 32..=256), scale in 0f32..3.0) {
            let k = x.len() / 32 * 32;
            let x: Vec<f32> = x[..k].iter().map(|v| v * scale).collect();
            let a = QuantizedActs::quantize(&x, 1, k);
            let b = QuantizedActs::quantize_portable(&x, 1, k);
            prop_assert_eq!(&a.qs, &b.qs);
            prop_assert_eq!(&a.qsum, &b.qsum);
            prop_assert_eq!(&a.d, &b.d);
            prop_assert_eq!(&a.s, &b.s);
        }
    }
}
