//! Linear layers behind one trait.
//!
//! Everything that multiplies activations by a weight matrix implements [`Linear`]: the dense
//! base layer today; a LoRA delta (base + B·A·x per request) and column/row-parallel shards
//! wrap it later without the model noticing.

use tessera_core::{Error, Result, WeightTensor};
use tessera_kernels::gemm::GemmWeight;
use tessera_kernels::plan::Precision;
use tessera_kernels::planner::Planner;
use tessera_runtime::ThreadPool;

/// What a forward step executes on: the compute units, the planner that picks every matrix
/// product's strategy, and the arithmetic asked for.
pub struct ExecCtx<'a> {
    pub pool: &'a ThreadPool,
    pub planner: &'a Planner,
    pub precision: Precision,
}

pub trait Linear: Send + Sync {
    fn in_features(&self) -> usize;
    fn out_features(&self) -> usize;
    /// `out[m, out_features] = x[m, in_features] · Wᵀ (+ bias)`.
    fn forward(&self, ctx: &ExecCtx, x: &[f32], m: usize, out: &mut [f32]);
}

/// A weight matrix in its stored format (plus, for the fast path, its interleaved repack),
/// with an optional f32 bias.
pub struct DenseLinear {
    pub weight: GemmWeight,
    pub bias: Option<Vec<f32>>,
}

impl DenseLinear {
    /// Wraps `weight` (`[out, in]`), checking it against the expected shape; `repack` builds
    /// the integer-dot layout for block-quantized weights.
    pub fn new(
        weight: WeightTensor,
        bias: Option<&WeightTensor>,
        out: usize,
        inp: usize,
        repack: bool,
    ) -> Result<Self> {
        if weight.shape != [out, inp] {
            return Err(Error::ShapeMismatch {
                name: weight.name.clone(),
                got: weight.shape.clone(),
                expected: vec![out, inp],
            });
        }
        let bias = match bias {
            Some(b) if b.numel() != out => {
                return Err(Error::ShapeMismatch {
                    name: b.name.clone(),
                    got: b.shape.clone(),
                    expected: vec![out],
                })
            }
            Some(b) => Some(b.to_f32_vec()),
            None => None,
        };
        Ok(DenseLinear {
            weight: GemmWeight::new(weight, repack),
            bias,
        })
    }
}

impl Linear for DenseLinear {
    fn in_features(&self) -> usize {
        self.weight.k()
    }
    fn out_features(&self) -> usize {
        self.weight.n()
    }
    fn forward(&self, ctx: &ExecCtx, x: &[f32], m: usize, out: &mut [f32]) {
        tessera_kernels::matmul(
            ctx.pool,
            ctx.planner,
            ctx.precision,
            x,
            m,
            &self.weight,
            self.bias.as_deref(),
            out,
        )
    }
}
