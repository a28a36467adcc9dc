//! `y[m, n] = Σ_k x[m, k] · W[n, k] (+ bias[n])`: f32 activations against weights in any
//! stored format, exact path (weights dequantized to their reference f32 values).
//!
//! Parallel over N: each compute unit owns a contiguous, 4-aligned range of weight rows, so
//! every weight byte is read once per call whatever M is. Within a unit, groups of four
//! weight rows are dequantized into a small scratch buffer and dotted with every activation
//! row, sharing each activation load across the four rows.

use std::cell::RefCell;

use tessera_core::WeightTensor;
use tessera_runtime::{split_range_aligned, ThreadPool};

use crate::generic;
use crate::isa::Isa;

/// Weight rows handled together.
const ROW_GROUP: usize = 4;

/// A raw output pointer shared by units that write disjoint elements.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: units write disjoint (row, column) elements; `matmul` joins them before returning.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// Whole-struct access, so closures capture the `Sync` wrapper, not the raw field.
    fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

thread_local! {
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Computes `out = x · Wᵀ (+ bias)` with `x: [m, k]`, `W: [n, k]`, `out: [m, n]`.
pub fn matmul(
    pool: &ThreadPool,
    x: &[f32],
    m: usize,
    w: &WeightTensor,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    let (n, k) = (w.rows(), w.cols());
    assert_eq!(x.len(), m * k, "matmul: x is not [m, k]");
    assert_eq!(out.len(), m * n, "matmul: out is not [m, n]");
    if let Some(b) = bias {
        assert_eq!(b.len(), n, "matmul: bias is not [n]");
    }
    let isa = Isa::active();
    let out_ptr = OutPtr(out.as_mut_ptr());
    let units = pool.units().min(n.div_ceil(ROW_GROUP)).max(1);
    pool.run(|unit| {
        if unit >= units {
            return;
        }
        let rows = split_range_aligned(n, units, unit, ROW_GROUP);
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            if s.len() < ROW_GROUP * k {
                s.resize(ROW_GROUP * k, 0.0);
            }
            let mut n0 = rows.start;
            while n0 < rows.end {
                let g = (rows.end - n0).min(ROW_GROUP);
                for r in 0..g {
                    dequantize(isa, w, n0 + r, &mut s[r * k..(r + 1) * k]);
                }
                for mi in 0..m {
                    let xr = &x[mi * k..(mi + 1) * k];
                    let mut y = [0f32; ROW_GROUP];
                    dot_group(isa, xr, &s[..g * k], k, &mut y[..g]);
                    for r in 0..g {
                        let v = y[r] + bias.map_or(0.0, |b| b[n0 + r]);
                        // SAFETY: (mi, n0 + r) lies in this unit's disjoint column range
                        // and inside `out` (checked above).
                        unsafe { *out_ptr.at(mi * n + n0 + r) = v };
                    }
                }
                n0 += g;
            }
        });
    });
}

fn dequantize(isa: Isa, w: &WeightTensor, row: usize, out: &mut [f32]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Avx2Fma is only active when the CPU has AVX2, FMA and F16C; the row holds
        // exactly `out.len()` elements (WeightTensor checks its byte length).
        Isa::Avx2Fma => unsafe { crate::x86::avx2::dequantize(w.dtype, w.row(row), out) },
        _ => generic::dequantize(w.dtype, w.row(row), out),
    }
}

/// Dots `x` with each of the `y.len()` rows of `rows` (each `k` long).
fn dot_group(isa: Isa, x: &[f32], rows: &[f32], k: usize, y: &mut [f32]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma => {
            if y.len() == 4 {
                let p = |r: usize| rows[r * k..].as_ptr();
                // SAFETY: AVX2+FMA checked by `Isa`; each row slice holds `k` values.
                let v =
                    unsafe { crate::x86::avx2::dot4_f32(x.as_ptr(), [p(0), p(1), p(2), p(3)], k) };
                y.copy_from_slice(&v);
            } else {
                for (r, yr) in y.iter_mut().enumerate() {
                    // SAFETY: as above.
                    *yr =
                        unsafe { crate::x86::avx2::dot_f32(x.as_ptr(), rows[r * k..].as_ptr(), k) };
                }
            }
        }
        _ => {
            for (r, yr) in y.iter_mut().enumerate() {
                *yr = generic::dot_f32(x, &rows[r * k..(r + 1) * k]);
            }
        }
    }
}

/// Naive f64 reference: dequantize with the reference definition, accumulate in f64.
pub fn matmul_reference(x: &[f32], m: usize, w: &WeightTensor, bias: Option<&[f32]>) -> Vec<f64> {
    let (n, k) = (w.rows(), w.cols());
    let mut wr = vec![0f32; k];
    let mut out = vec![0f64; m * n];
    for j in 0..n {
        w.dequantize_row(j, &mut wr);
        for i in 0..m {
            let mut s = 0f64;
            for t in 0..k {
                s += x[i * k + t] as f64 * wr[t] as f64;
            }
            out[i * n + j] = s + bias.map_or(0.0, |b| b[j] as f64);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};
    use tessera_core::tensor::quantize_row;
    use tessera_core::{DType, TensorBytes};

    const DTYPES: [DType; 6] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
    ];

    fn random_weight(dtype: DType, n: usize, k: usize, seed: u64) -> WeightTensor {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let bytes: Vec<u8> = (0..n)
            .flat_map(|_| {
                let row: Vec<f32> = (0..k).map(|_| rng.gen_range(-1.0..1.0)).collect();
                quantize_row(dtype, &row)
            })
            .collect();
        WeightTensor::new("w", dtype, vec![n, k], TensorBytes::owned(&bytes)).unwrap()
    }

    fn random_x(m: usize, k: usize, seed: u64) -> Vec<f32> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..m * k).map(|_| rng.gen_range(-2.0..2.0)).collect()
    }

    /// K values: 1 block, primes of blocks, non-multiples of 8 lanes for plain floats.
    fn k_for(dtype: DType, units: usize) -> usize {
        if dtype.is_quantized() {
            units * 32
        } else {
            units * 7 + units % 5
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn matches_f64_reference(m in 1usize..10, n in 1usize..23, kb in 1usize..12, d in 0usize..6, threads in 1usize..4) {
            let dtype = DTYPES[d];
            let k = k_for(dtype, kb);
            let w = random_weight(dtype, n, k, 7);
            let x = random_x(m, k, 11);
            let bias: Vec<f32> = (0..n).map(|i| i as f32 * 0.1).collect();
            let pool = ThreadPool::new(threads);
            let mut out = vec![0f32; m * n];
            matmul(&pool, &x, m, &w, Some(&bias), &mut out);
            let r = matmul_reference(&x, m, &w, Some(&bias));
            for (a, b) in out.iter().zip(&r) {
                // f32 accumulation of k products of magnitude <= 2.
                let tol = 1e-5 * (k as f64) * 2.0 + 1e-5;
                prop_assert!((*a as f64 - b).abs() <= tol, "{dtype} m={m} n={n} k={k}: {a} vs {b}");
            }
        }

        #[test]
        fn rows_are_batch_invariant(m in 2usize..20, n in 1usize..40, kb in 1usize..9, d in 0usize..6, threads in 1usize..4, pick in 0usize..1000) {
            let dtype = DTYPES[d];
            let k = k_for(dtype, kb);
            let w = random_weight(dtype, n, k, 3);
            let x = random_x(m, k, pick as u64);
            let row = pick % m;
            let pool = ThreadPool::new(threads);
            let mut all = vec![0f32; m * n];
            matmul(&pool, &x, m, &w, None, &mut all);
            let single_pool = ThreadPool::new(1);
            let mut one = vec![0f32; n];
            matmul(&single_pool, &x[row * k..(row + 1) * k], 1, &w, None, &mut one);
            prop_assert_eq!(&all[row * n..(row + 1) * n], &one[..]);
        }
    }

    #[test]
    fn avx2_dequantize_is_bitwise_reference() {
        if Isa::active() != Isa::Avx2Fma {
            return;
        }
        for dtype in DTYPES {
            for k in [32usize, 64, 96, 320] {
                let w = random_weight(dtype, 3, k, k as u64);
                for r in 0..3 {
                    let mut a = vec![0f32; k];
                    let mut b = vec![0f32; k];
                    dequantize(Isa::Avx2Fma, &w, r, &mut a);
                    generic::dequantize(dtype, w.row(r), &mut b);
                    assert_eq!(a, b, "{dtype} k={k}");
                }
            }
        }
    }
}
