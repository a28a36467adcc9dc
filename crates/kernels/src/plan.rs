//! Strategies for one matrix product, as plain data.
//!
//! A [`Plan`] pairs a [`TilePlan`] (how the product is cut into blocks and register tiles,
//! and which kernel family computes them) with a [`ParallelPlan`] (how blocks are spread over
//! compute units). Plans are pure values: the planner produces them, the executor
//! ([`crate::gemm`]) follows them, tests and `tessera plan` print them.
//!
//! Numerics are fixed by the [`KernelFamily`], which the planner derives from the weight's
//! dtype and the requested [`Precision`] only, never from M: every tiling and parallel split
//! of a family computes each output element with the same operations in the same order. The
//! exact family has three kernels ([`F32Kernel`]) that the planner picks between by shape;
//! all three follow that family's one summation order, so the choice changes no result.

use std::fmt;

use tessera_core::DType;

/// Which arithmetic the user asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Precision {
    /// Weights dequantized to their exact f32 values, f32 activations and accumulation.
    Exact,
    /// Block-quantized weights meet 8-bit quantized activations in integer dot products
    /// (float formats run as in `Exact`).
    Fast,
}

impl Precision {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "exact" => Some(Precision::Exact),
            "fast" => Some(Precision::Fast),
            _ => None,
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Precision::Exact => "exact",
            Precision::Fast => "fast",
        })
    }
}

/// The kernel family, which fixes the numerics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelFamily {
    /// f32 dot products over whole K (8 lane partial sums, a fixed lane tree); weight rows
    /// are dequantized `nc` at a time into a scratch panel and reused for every activation row.
    F32Dot,
    /// Integer dot products of 8-row interleaved weights (repacked at load) with activations
    /// quantized to 8-bit blocks; per-block scales applied in f32.
    Q8Interleaved,
    /// Integer dot products of stored rows of the ggml types (Q5_x, the K-quants, IQ4_x)
    /// with activations quantized to Q8_K (8-bit 32-blocks for the 32-weight types), as
    /// llama.cpp computes them; per-block scales applied in f32 (`crate::qk`).
    QkDot,
}

impl KernelFamily {
    /// The family for a weight format under a precision.
    pub fn for_weight(dtype: DType, precision: Precision) -> Self {
        match (precision, dtype) {
            (Precision::Fast, DType::Q4_0 | DType::Q4_1 | DType::Q8_0) => {
                KernelFamily::Q8Interleaved
            }
            (Precision::Fast, d) if crate::qk::supports(d) => KernelFamily::QkDot,
            _ => KernelFamily::F32Dot,
        }
    }

    /// Register-tile shapes the family's kernels implement.
    pub fn tiles(self) -> &'static [(usize, usize)] {
        match self {
            KernelFamily::F32Dot => &[
                (1, 4),
                (2, 4),
                (3, 4),
                (4, 3),
                (2, 2),
                (1, 8),
                (4, 2),
                (1, 1),
            ],
            KernelFamily::Q8Interleaved => &[(1, 8), (2, 8), (3, 8), (4, 8)],
            KernelFamily::QkDot => crate::qk::TILES,
        }
    }
}

/// Which kernel runs an [`KernelFamily::F32Dot`] plan. All three compute every element in
/// the family's canonical order (see `crate::exact`), so they agree bitwise on one ISA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum F32Kernel {
    /// Weight rows dequantized `nc` at a time into a row-major panel, then `mr × nr` dot
    /// tiles (the original kernel; the reference for the other two).
    Panel,
    /// Small M: weights dequantized in registers straight into the dot products, read once
    /// per `mr` activation rows (`crate::exact::stream_range`).
    Stream,
    /// Large M: `nc × kc` weight blocks dequantized once into panels interleaved by `nr`
    /// rows, `mr × nr` register tiles with lane accumulators carried across K blocks
    /// (`crate::exact::packed_range`).
    Packed,
}

impl F32Kernel {
    /// Register tiles the kernel implements (edges use smaller ones of the same kernel).
    pub fn tiles(self) -> &'static [(usize, usize)] {
        match self {
            F32Kernel::Panel => KernelFamily::F32Dot.tiles(),
            F32Kernel::Stream => &[(1, 8), (1, 4), (2, 2), (3, 2), (4, 1)],
            F32Kernel::Packed => &[(3, 4), (2, 4), (4, 3), (4, 2)],
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            F32Kernel::Panel => "panel",
            F32Kernel::Stream => "stream",
            F32Kernel::Packed => "packed",
        }
    }

    /// The kernel [`Self::name`] names.
    pub fn parse(s: &str) -> Option<Self> {
        [F32Kernel::Panel, F32Kernel::Stream, F32Kernel::Packed]
            .into_iter()
            .find(|k| k.name() == s)
    }
}

/// How an activation row enters the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActFeed {
    F32,
    /// Quantized to 8-bit blocks of 32 once per call.
    Q8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TilePlan {
    pub family: KernelFamily,
    /// The F32Dot family's kernel (Q8Interleaved plans carry `Panel`, unused).
    pub kernel: F32Kernel,
    /// Register tile: activation rows × weight rows.
    pub mr: usize,
    pub nr: usize,
    /// Cache blocks: activation rows and weight rows handled together, and the K extent (a
    /// K block below K only for the packed kernel, which carries lane accumulators across).
    pub mc: usize,
    pub nc: usize,
    pub kc: usize,
    /// Activations packed (quantized) before the kernel runs.
    pub pack_a: bool,
    /// Weights in a kernel layout: repacked at load (Q8Interleaved) or dequantized per `nc`
    /// block into a scratch panel (F32Dot over quantized weights).
    pub pack_b: bool,
    /// K is never split across units: a split would change the summation order with the plan.
    pub split_k: usize,
    /// Elements per quantization block of the weight (1 for float formats).
    pub row_block: usize,
    pub act_feed: ActFeed,
}

/// How tiles are spread over compute units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParallelSplit {
    /// Each unit takes a contiguous range of weight rows (all activation rows).
    N,
    /// Each unit takes a contiguous range of activation rows (all weight rows).
    M,
    /// `m_parts × n_parts` grid of (activation rows, weight rows) ranges.
    Grid { m_parts: usize, n_parts: usize },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParallelPlan {
    pub split: ParallelSplit,
    pub units: usize,
}

impl ParallelPlan {
    /// (m_parts, n_parts) of the split.
    pub fn parts(&self) -> (usize, usize) {
        match self.split {
            ParallelSplit::N => (1, self.units),
            ParallelSplit::M => (self.units, 1),
            ParallelSplit::Grid { m_parts, n_parts } => (m_parts, n_parts),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plan {
    pub tile: TilePlan,
    pub parallel: ParallelPlan,
    /// The cost model's (or the tuner's measured) time, microseconds.
    pub predicted_us: f64,
}

impl fmt::Display for TilePlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let family = match self.family {
            KernelFamily::F32Dot => format!("F32Dot/{}", self.kernel.name()),
            KernelFamily::Q8Interleaved => "Q8Interleaved".to_string(),
            KernelFamily::QkDot => "QkDot".to_string(),
        };
        write!(
            f,
            "{} {}x{} mc={} nc={} kc={} packA={} packB={} splitK={} act={:?}",
            family,
            self.mr,
            self.nr,
            self.mc,
            self.nc,
            self.kc,
            self.pack_a,
            self.pack_b,
            self.split_k,
            self.act_feed
        )
    }
}

impl fmt::Display for ParallelPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.split {
            ParallelSplit::N => write!(f, "split N over {}", self.units),
            ParallelSplit::M => write!(f, "split M over {}", self.units),
            ParallelSplit::Grid { m_parts, n_parts } => write!(f, "grid {m_parts}x{n_parts}"),
        }
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} | {} | {:.1} us",
            self.tile, self.parallel, self.predicted_us
        )
    }
}
