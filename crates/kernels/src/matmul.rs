//! The entry point the model uses: plan a product from its shapes, then run the plan.
//!
//! `y[m, n] = Σ_k x[m, k] · W[n, k] (+ bias[n])` for f32 activations against a weight in any
//! stored format. See [`crate::plan`] for what a plan decides and [`crate::gemm`] for how it
//! is executed.

use tessera_runtime::ThreadPool;

use crate::gemm::{execute, GemmWeight};
use crate::plan::Precision;
use crate::planner::{Planner, ShapeKey};

/// Plans and computes `out = x · Wᵀ (+ bias)` with `x: [m, k]`, `W: [n, k]`, `out: [m, n]`.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    pool: &ThreadPool,
    planner: &Planner,
    precision: Precision,
    x: &[f32],
    m: usize,
    w: &GemmWeight,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    // The fast path needs the repacked weight or a ggml type's integer dots; without them the
    // exact family runs.
    let precision = if w.packed.is_some() || crate::qk::supports(w.dtype()) {
        precision
    } else {
        Precision::Exact
    };
    let key = ShapeKey::new(m, w.k(), w.n(), w.dtype(), precision, pool.units());
    let plan = planner.plan(&key);
    execute(pool, &plan, x, m, w, bias, out)
}

/// Naive f64 reference: weights dequantized by the reference definition, f64 accumulation.
pub fn matmul_reference(
    x: &[f32],
    m: usize,
    w: &tessera_core::WeightTensor,
    bias: Option<&[f32]>,
) -> Vec<f64> {
    let (n, k) = (w.rows(), w.cols());
    let mut wr = vec![0f32; k];
    let mut out = vec![0f64; m * n];
    for j in 0..n {
        w.dequantize_row(j, &mut wr);
        for i in 0..m {
            let s: f64 = (0..k).map(|t| x[i * k + t] as f64 * wr[t] as f64).sum();
            out[i * n + j] = s + bias.map_or(0.0, |b| b[j] as f64);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{KernelFamily, Plan};
    use crate::quant_acts::QuantizedActs;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};
    use tessera_core::tensor::quantize_row;
    use tessera_core::{DType, TensorBytes, WeightTensor};

    const DTYPES: [DType; 16] = DType::ALL;

    fn random_weight(dtype: DType, n: usize, k: usize, seed: u64) -> GemmWeight {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let bytes: Vec<u8> = (0..n)
            .flat_map(|_| {
                let row: Vec<f32> = (0..k).map(|_| rng.gen_range(-1.0..1.0)).collect();
                quantize_row(dtype, &row)
            })
            .collect();
        let t = WeightTensor::new("w", dtype, vec![n, k], TensorBytes::owned(&bytes)).unwrap();
        GemmWeight::new(t, true)
    }

    fn random_x(m: usize, k: usize, seed: u64) -> Vec<f32> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..m * k).map(|_| rng.gen_range(-2.0..2.0)).collect()
    }

    /// K: whole blocks for quantized formats, awkward (non-multiples of 8) for floats.
    fn k_for(dtype: DType, units: usize) -> usize {
        if dtype.is_super_block() {
            units.div_ceil(3) * 256
        } else if dtype.is_quantized() {
            units * 32
        } else {
            units * 7 + units % 5
        }
    }

    /// What the fast path computes exactly: the activations as their 8-bit quantization.
    fn dequantized_acts(x: &[f32], m: usize, k: usize) -> Vec<f32> {
        let q = QuantizedActs::quantize(x, m, k);
        (0..m * k).map(|i| q.qs[i] as f32 * q.d[i / 32]).collect()
    }

    fn run(
        plan: &Plan,
        pool: &ThreadPool,
        x: &[f32],
        m: usize,
        w: &GemmWeight,
        bias: Option<&[f32]>,
    ) -> Vec<f32> {
        let mut out = vec![f32::NAN; m * w.n()];
        execute(pool, plan, x, m, w, bias, &mut out);
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(40))]
        /// Every candidate plan of both precisions against the f64 reference; and every plan
        /// of a family gives bitwise the same result as the first (serial-equivalent) one.
        #[test]
        fn every_plan_matches_reference_and_each_other(m in 1usize..12, n in 1usize..30, kb in 1usize..10, d in 0usize..16, units in 1usize..4) {
            let dtype = DTYPES[d];
            let k = k_for(dtype, kb);
            let w = random_weight(dtype, n, k, (n * 31 + k) as u64);
            let x = random_x(m, k, (m * 7 + d) as u64);
            let bias: Vec<f32> = (0..n).map(|i| i as f32 * 0.1).collect();
            let pool = ThreadPool::new(units);
            let planner = Planner::untuned();
            for precision in [Precision::Exact, Precision::Fast] {
                let key = ShapeKey::new(m, k, n, dtype, precision, units);
                let plans = planner.candidates(&key);
                let fam = plans[0].tile.family;
                let xr = match fam {
                    KernelFamily::Q8Interleaved => dequantized_acts(&x, m, k),
                    KernelFamily::QkDot => crate::qk::QkActs::quantize(dtype, &x, m, k).dequantized(),
                    KernelFamily::F32Dot => x.clone(),
                };
                let reference = matmul_reference(&xr, m, &w.parts[0], Some(&bias));
                let first = run(&plans[0], &pool, &x, m, &w, Some(&bias));
                for (a, b) in first.iter().zip(&reference) {
                    let tol = 2e-5 * (k as f64) * 2.0 + 1e-4;
                    prop_assert!((*a as f64 - b).abs() <= tol, "{dtype} {precision} m={m} n={n} k={k}: {a} vs {b}");
                }
                // A deterministic sample of the other plans (all tiles, blocks and splits).
                for p in plans.iter().step_by((plans.len() / 25).max(1)) {
                    let other = run(p, &pool, &x, m, &w, Some(&bias));
                    prop_assert_eq!(&other, &first, "plan {} differs", p);
                }
            }
        }

        /// A row's result is bitwise the same at M = 1 and inside a larger batch.
        #[test]
        fn rows_are_batch_invariant(m in 2usize..24, n in 1usize..40, kb in 1usize..9, d in 0usize..16, pick in 0usize..1000) {
            let dtype = DTYPES[d];
            let k = k_for(dtype, kb);
            let w = random_weight(dtype, n, k, 3);
            let x = random_x(m, k, pick as u64);
            let row = pick % m;
            let pool = ThreadPool::new(2);
            let planner = Planner::untuned();
            for precision in [Precision::Exact, Precision::Fast] {
                let mut all = vec![0f32; m * n];
                matmul(&pool, &planner, precision, &x, m, &w, None, &mut all);
                let mut one = vec![0f32; n];
                matmul(&pool, &planner, precision, &x[row * k..(row + 1) * k], 1, &w, None, &mut one);
                prop_assert_eq!(&all[row * n..(row + 1) * n], &one[..]);
            }
        }
    }

    #[test]
    fn avx2_kernels_agree_with_portable_twins() {
        // The generic kernels are the reference for the SIMD ones (same order, FMA aside).
        if crate::Isa::active() != crate::Isa::Avx2Fma {
            return;
        }
        for dtype in DTYPES {
            for (m, n, kb) in [(1, 1, 1), (3, 9, 3), (5, 17, 7)] {
                let k = k_for(dtype, kb);
                let w = random_weight(dtype, n, k, 5);
                let x = random_x(m, k, 6);
                let planner = Planner::untuned();
                let pool = ThreadPool::new(1);
                let key = ShapeKey::new(m, k, n, dtype, Precision::Fast, 1);
                let plan = planner.candidates(&key)[0];
                let simd = run(&plan, &pool, &x, m, &w, None);
                let mut portable = vec![0f32; m * n];
                match plan.tile.family {
                    KernelFamily::F32Dot => {
                        let mut wr = vec![0f32; k];
                        for j in 0..n {
                            w.parts[0].dequantize_row(j, &mut wr);
                            for i in 0..m {
                                portable[i * n + j] =
                                    crate::generic::dot_f32(&x[i * k..(i + 1) * k], &wr);
                            }
                        }
                    }
                    KernelFamily::QkDot => {
                        let q = crate::qk::QkActs::quantize(dtype, &x, m, k);
                        for i in 0..m {
                            for j in 0..n {
                                let row = [w.row(j)];
                                let mut v = [0f32; 1];
                                crate::qk::tile(crate::Isa::Generic, dtype, &q, i, 1, &row, &mut v);
                                portable[i * n + j] = v[0];
                            }
                        }
                    }
                    KernelFamily::Q8Interleaved => {
                        let q = QuantizedActs::quantize(&x, m, k);
                        let pw = w.packed.as_ref().unwrap();
                        for i in 0..m {
                            for g in 0..pw.groups {
                                let mut v = [0f32; 8];
                                crate::generic::packed_group_row(pw, g, &q, i, &mut v);
                                for c in 0..8 {
                                    if g * 8 + c < n {
                                        portable[i * n + g * 8 + c] = v[c];
                                    }
                                }
                            }
                        }
                    }
                }
                for (a, b) in simd.iter().zip(&portable) {
                    assert!(
                        (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                        "{dtype}: {a} vs {b}"
                    );
                }
            }
        }
    }
}
