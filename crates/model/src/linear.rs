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
        Self::stacked(vec![(weight, bias, out)], inp, repack)
    }

    /// Several projections of the same input stacked along the output (fused q/k/v, or
    /// gate/up): one matrix product computes them all. Each part is `(weight, bias, out)`.
    pub fn stacked(
        parts: Vec<(WeightTensor, Option<&WeightTensor>, usize)>,
        inp: usize,
        repack: bool,
    ) -> Result<Self> {
        let mut weights = Vec::with_capacity(parts.len());
        let mut bias: Vec<f32> = Vec::new();
        let any_bias = parts.iter().any(|p| p.1.is_some());
        for (w, b, out) in parts {
            if w.shape != [out, inp] {
                return Err(Error::ShapeMismatch {
                    name: w.name.clone(),
                    got: w.shape.clone(),
                    expected: vec![out, inp],
                });
            }
            match b {
                Some(b) if b.numel() != out => {
                    return Err(Error::ShapeMismatch {
                        name: b.name.clone(),
                        got: b.shape.clone(),
                        expected: vec![out],
                    })
                }
                Some(b) => bias.extend(b.to_f32_vec()),
                None if any_bias => bias.extend(std::iter::repeat_n(0.0, out)),
                None => {}
            }
            weights.push(w);
        }
        let names: Vec<String> = weights
            .iter()
            .map(|w| format!("{} ({})", w.name, w.dtype))
            .collect();
        let weight = GemmWeight::stacked(weights, repack).ok_or_else(|| {
            Error::Config(format!(
                "cannot fuse tensors of different formats: {}",
                names.join(", ")
            ))
        })?;
        Ok(DenseLinear {
            weight,
            bias: any_bias.then_some(bias),
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
