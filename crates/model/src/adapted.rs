//! A linear layer with LoRA deltas: the base product for every row, then, for every run of
//! rows whose adapter adapts this layer, `scale · B (A x)` added to each stacked part's
//! columns (fused q/k/v and gate/up apply each part's own factors to its column range). The
//! adapters are the step's ([`ExecCtx::adapters`]), owned outside the model; all segments
//! of all adapters go through one segment-grouped shrink/expand ([`tessera_kernels::lora`]),
//! whose split over the compute units the LoRA planner picks from the shapes. Factors reach
//! the kernels in the element type the adapter file stores (f32, f16, bf16).

use std::cell::RefCell;
use std::ops::Range;

use tessera_core::{Error, Result};
use tessera_kernels::lora::{lora_apply, plan_lora, FactorView, LoraTask};
use tessera_lora::{Factors, Target};

use crate::batch::RowSegment;
use crate::linear::{ExecCtx, Linear};

thread_local! {
    static SHRUNK: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The kernels' view of a factor, in the element type it is held in (halves stay halves:
/// the kernels convert them in registers).
fn view(f: &Factors) -> FactorView<'_> {
    match f {
        Factors::F32(v) => FactorView::F32(v),
        Factors::F16(v) => FactorView::F16(v),
        Factors::BF16(v) => FactorView::BF16(v),
    }
}

pub struct AdaptedLinear {
    base: Box<dyn Linear>,
    layer: usize,
    /// The adapter target of each stacked part of `base`, in order.
    targets: Vec<Target>,
}

impl AdaptedLinear {
    pub fn new(base: Box<dyn Linear>, layer: usize, targets: Vec<Target>) -> Result<Self> {
        if targets.len() != base.parts().len() {
            return Err(Error::Config(format!(
                "layer {layer}: {} adapter targets for {} stacked parts",
                targets.len(),
                base.parts().len()
            )));
        }
        Ok(AdaptedLinear {
            base,
            layer,
            targets,
        })
    }
}

impl Linear for AdaptedLinear {
    fn in_features(&self) -> usize {
        self.base.in_features()
    }
    fn out_features(&self) -> usize {
        self.base.out_features()
    }
    fn parts(&self) -> &[Range<usize>] {
        self.base.parts()
    }
    fn forward(
        &self,
        ctx: &ExecCtx,
        x: &[f32],
        m: usize,
        segments: &[RowSegment],
        out: &mut [f32],
    ) -> Result<()> {
        self.base.forward(ctx, x, m, segments, out)?;
        let mut tasks = Vec::new();
        for seg in segments {
            let Some(slot) = seg.adapter else {
                continue;
            };
            let adapter = ctx.adapters.get(slot as usize).ok_or_else(|| {
                Error::Other(format!(
                    "adapter slot {slot} is not among the step's {} adapters",
                    ctx.adapters.len()
                ))
            })?;
            for (part, &target) in self.base.parts().iter().zip(&self.targets) {
                if let Some(md) = adapter.module(self.layer, target) {
                    tasks.push(LoraTask {
                        rows: seg.rows.clone(),
                        rank: md.rank,
                        a: view(&md.a),
                        b_t: view(&md.b_t),
                        scale: md.scale,
                        col0: part.start,
                        n: part.len(),
                    });
                }
            }
        }
        if tasks.is_empty() {
            return Ok(());
        }
        let k = self.in_features();
        let plan = plan_lora(&tasks, k, ctx.pool.units());
        SHRUNK.with(|s| {
            lora_apply(
                ctx.pool,
                &plan,
                &x[..m * k],
                k,
                &tasks,
                &mut out[..m * self.out_features()],
                self.out_features(),
                &mut s.borrow_mut(),
            )
        });
        Ok(())
    }
}
