//! Linear layers behind one trait.
//!
//! Everything that multiplies activations by a weight matrix implements [`Linear`]: the dense
//! base layer today; a LoRA delta (base + B·A·x per request) and column/row-parallel shards
//! wrap it later without the model noticing. Each call receives the row segments of its
//! input (which contiguous rows use which adapter), and a stacked layer (fused q/k/v or
//! gate/up) names the column range of each of its parts.

use std::ops::Range;
use std::sync::Arc;

use tessera_core::{Error, Result, WeightTensor};
use tessera_kernels::gemm::GemmWeight;
use tessera_kernels::plan::Precision;
use tessera_kernels::planner::Planner;
use tessera_lora::LoraAdapter;
use tessera_runtime::ThreadPool;

use crate::batch::RowSegment;

/// What a forward step executes on: the compute units, the planner that picks every matrix
/// product's strategy, and the arithmetic asked for.
pub struct ExecCtx<'a> {
    pub pool: &'a ThreadPool,
    pub planner: &'a Planner,
    pub precision: Precision,
    /// The step's adapters: a row segment's adapter slot indexes this table.
    pub adapters: &'a [Arc<LoraAdapter>],
}

pub trait Linear: Send + Sync {
    fn in_features(&self) -> usize;
    fn out_features(&self) -> usize;
    /// Output column ranges of the stacked parts, in order (one part for a plain layer).
    fn parts(&self) -> &[Range<usize>];
    /// `out[m, out_features] = x[m, in_features] · Wᵀ (+ bias)`, where `segments` say which
    /// contiguous rows of `x` use which adapter (they cover `0..m` in order).
    fn forward(
        &self,
        ctx: &ExecCtx,
        x: &[f32],
        m: usize,
        segments: &[RowSegment],
        out: &mut [f32],
    ) -> Result<()>;
}

/// Checks the buffers of a `Linear::forward` call: `x` holds `m` rows of `k`, `out` `m` rows
/// of `n`, and the segments cover `0..m` in order.
pub fn check_call(
    name: &str,
    x: &[f32],
    m: usize,
    k: usize,
    n: usize,
    segments: &[RowSegment],
    out: &[f32],
) -> Result<()> {
    if x.len() < m * k || out.len() < m * n {
        return Err(Error::Other(format!(
            "{name}: {m} rows need {} inputs and {} outputs, got {} and {}",
            m * k,
            m * n,
            x.len(),
            out.len()
        )));
    }
    let mut next = 0;
    for s in segments {
        if s.rows.start != next || s.rows.end < s.rows.start {
            return Err(Error::Other(format!(
                "{name}: row segments do not cover 0..{m} in order ({segments:?})"
            )));
        }
        next = s.rows.end;
    }
    if next != m && !(segments.is_empty() && m == 0) {
        return Err(Error::Other(format!(
            "{name}: row segments cover 0..{next}, the input has {m} rows"
        )));
    }
    Ok(())
}

/// A weight matrix in its stored format (plus, for the fast path, its interleaved repack),
/// with an optional f32 bias. Stacked parts of one format are one product; a stack that mixes
/// formats (a Q4_K_M file's Q5_0 q/k and Q8_0 v) runs one product per run of equal formats.
pub struct DenseLinear {
    /// Runs of consecutive parts with one format and their column ranges.
    runs: Vec<(GemmWeight, Range<usize>)>,
    k: usize,
    n: usize,
    pub bias: Option<Vec<f32>>,
    /// Column range of each stacked part.
    pub parts: Vec<Range<usize>>,
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
        let mut bias: Vec<f32> = Vec::new();
        let mut ranges: Vec<Range<usize>> = Vec::with_capacity(parts.len());
        let mut runs: Vec<(Vec<WeightTensor>, Range<usize>)> = Vec::new();
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
            let start = ranges.last().map_or(0, |r| r.end);
            ranges.push(start..start + out);
            match runs.last_mut() {
                Some((ws, cols)) if ws[0].dtype == w.dtype => {
                    cols.end += out;
                    ws.push(w);
                }
                _ => runs.push((vec![w], start..start + out)),
            }
        }
        let n = ranges.last().map_or(0, |r| r.end);
        let runs = runs
            .into_iter()
            .map(|(ws, cols)| {
                let name = ws[0].name.clone();
                let w = GemmWeight::stacked(ws, repack).ok_or_else(|| {
                    Error::Config(format!(
                        "{name}: stacked parts must be 2-D with {inp} columns"
                    ))
                })?;
                Ok((w, cols))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(DenseLinear {
            runs,
            k: inp,
            n,
            bias: any_bias.then_some(bias),
            parts: ranges,
        })
    }

    /// The weight runs (one per run of stacked parts sharing a format) and their columns.
    pub fn weights(&self) -> impl Iterator<Item = (&GemmWeight, &Range<usize>)> {
        self.runs.iter().map(|(w, c)| (w, c))
    }
}

thread_local! {
    /// One run's output columns when a stack mixes formats.
    static RUN_OUT: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Linear for DenseLinear {
    fn in_features(&self) -> usize {
        self.k
    }
    fn out_features(&self) -> usize {
        self.n
    }
    fn parts(&self) -> &[Range<usize>] {
        &self.parts
    }
    fn forward(
        &self,
        ctx: &ExecCtx,
        x: &[f32],
        m: usize,
        segments: &[RowSegment],
        out: &mut [f32],
    ) -> Result<()> {
        let (k, n) = (self.k, self.n);
        check_call("linear", x, m, k, n, segments, out)?;
        if m == 0 {
            return Ok(());
        }
        if let [(w, _)] = &self.runs[..] {
            tessera_kernels::matmul(
                ctx.pool,
                ctx.planner,
                ctx.precision,
                &x[..m * k],
                m,
                w,
                self.bias.as_deref(),
                &mut out[..m * n],
            );
            return Ok(());
        }
        RUN_OUT.with(|buf| {
            let mut buf = buf.borrow_mut();
            for (w, cols) in &self.runs {
                let nr = cols.len();
                buf.resize(m * nr, 0.0);
                let bias = self.bias.as_deref().map(|b| &b[cols.clone()]);
                tessera_kernels::matmul(
                    ctx.pool,
                    ctx.planner,
                    ctx.precision,
                    &x[..m * k],
                    m,
                    w,
                    bias,
                    &mut buf[..m * nr],
                );
                for i in 0..m {
                    out[i * n + cols.start..i * n + cols.end]
                        .copy_from_slice(&buf[i * nr..(i + 1) * nr]);
                }
            }
        });
        Ok(())
    }
}
