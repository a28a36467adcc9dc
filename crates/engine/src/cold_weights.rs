//! Weights as a model step reads them: from DRAM. A step runs every layer's products once,
//! so by the time it comes back to a weight the model's other weights have passed through
//! the caches; a benchmark or tuning loop that runs one product over and over reads its
//! weight from a cache instead, and at small M (where the weight's streaming bounds the
//! product) that favours other tiles than the step's: a tile that reads fewer weight rows at
//! once can run level with another on a warm weight and clearly behind it from DRAM.
//!
//! A cold measurement copies the weight until the copies together pass the last-level cache
//! twice and runs the product once over each copy in turn. `tessera tune` times M up to
//! [`STEP_COLD_MAX_M`] this way and `tessera bench gemm` judges those rows this way.

use std::time::Instant;

use tessera_kernels::calibrate;
use tessera_kernels::gemm::{execute, GemmWeight};
use tessera_kernels::plan::Plan;
use tessera_runtime::ThreadPool;

/// The largest M judged with its weights from DRAM: a model's step reads them from there,
/// and at small M a tile that packs the weights first, or reads fewer rows at once, can win
/// on warm caches and lose on cold weights.
pub const STEP_COLD_MAX_M: usize = 8;

/// Bytes the cold copies of a weight fill together: twice the last-level cache, at least
/// 256 MiB and at most 3 GiB.
pub fn cold_bytes() -> usize {
    (2 * calibrate::last_level_cache_bytes()).clamp(256 << 20, 3 << 30)
}

/// Copies of a weight of `stored_bytes` that together exceed [`cold_bytes`] (at least 2, at
/// most 16,384 of them), each built by `make` as the model loads it.
pub fn cold_copies<E>(
    stored_bytes: usize,
    make: impl Fn() -> Result<GemmWeight, E>,
) -> Result<Vec<GemmWeight>, E> {
    let count = cold_bytes().div_ceil(stored_bytes.max(1)).clamp(2, 16_384);
    (0..count).map(|_| make()).collect()
}

/// Seconds of one pass of `plan`: the product run once over every copy in turn.
pub fn product_pass(
    pool: &ThreadPool,
    plan: &Plan,
    x: &[f32],
    m: usize,
    copies: &[GemmWeight],
    out: &mut [f32],
) -> f64 {
    let t = Instant::now();
    for w in copies {
        execute(pool, plan, x, m, w, None, out);
    }
    t.elapsed().as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::{DType, TensorBytes, WeightTensor};

    #[test]
    fn copies_exceed_the_cold_bytes() {
        let made = std::cell::Cell::new(0);
        let make = || -> tessera_core::Result<GemmWeight> {
            made.set(made.get() + 1);
            let t = WeightTensor::new("w", DType::F32, vec![1, 4], TensorBytes::owned(&[0u8; 16]))?;
            Ok(GemmWeight::new(t, false))
        };
        let stored = cold_bytes() / 4 + 1;
        let copies = cold_copies(stored, make).unwrap();
        assert_eq!((copies.len(), made.get()), (4, 4));
        assert!(copies.len() * stored >= cold_bytes() && 3 * stored < cold_bytes());
        // At least two copies, however large one is.
        assert_eq!(cold_copies(usize::MAX, make).unwrap().len(), 2);
    }
}
