//! The scheduler's step-cost predictor ([`tessera_scheduler::StepCost`]) calibrated from this
//! engine's model: its stage profile (the one tensor parallelism's sub-batch planner uses,
//! [`crate::overlap_plan::measure_profile`]) turned into a step-time model
//! ([`tessera_sim::StepModel`]) and that model's predictions fitted to the scheduler's few
//! linear terms. Under tensor parallelism the group's calibrated model is reused (its link
//! included); otherwise the profile is measured here at start-up, twice, keeping each
//! figure's smaller time (a core taken by another process only ever adds time; about 1 s for
//! SmolLM2-135M on 2 threads).

use tessera_core::Result;
use tessera_model::SubBatching;
use tessera_parallel::link::CommCost;
use tessera_scheduler::StepCost;
use tessera_sim::{MeasuredProfile, StepModel, StepShape};

use crate::overlap_plan;
use crate::Engine;

/// Row counts whose predicted times the per-token line is fitted through.
const FIT_ROWS: [usize; 6] = [1, 4, 16, 64, 128, 256];
/// Context of the one-row step whose extra time over a fresh row gives the per-key cost.
const KEY_PROBE: usize = 1024;
/// Logits-row counts the head's line is fitted through.
const HEAD_ROWS: [usize; 2] = [1, 64];

/// Predicted seconds of `shape` in one sub-batch.
fn predict(model: &StepModel, shape: &StepShape) -> f64 {
    model.predict(shape, SubBatching::WHOLE).step
}

/// `n` one-row sequences at position 0 (almost no attention), no logits.
fn rows(n: usize) -> StepShape {
    StepShape {
        seq_rows: vec![1; n],
        seq_start: vec![0; n],
        logit_rows: 0,
    }
}

/// Least-squares line `a + b·x` through `(x, y)` points weighted by `1/y²` (relative
/// errors, so small steps count as much as large ones); `b` is at least a tiny positive
/// slope.
fn fit_line(points: &[(f64, f64)]) -> (f64, f64) {
    let (mut sw, mut sx, mut sy, mut sxx, mut sxy) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(x, y) in points {
        let w = 1.0 / (y * y).max(1e-18);
        sw += w;
        sx += w * x;
        sy += w * y;
        sxx += w * x * x;
        sxy += w * x * y;
    }
    let det = sw * sxx - sx * sx;
    if points.len() < 2 || det.abs() < 1e-30 {
        let (x, y) = points.first().copied().unwrap_or((1.0, 0.0));
        return (0.0, (y / x.max(1.0)).max(1e-12));
    }
    let b = (sw * sxy - sx * sy) / det;
    let a = (sy - b * sx) / sw;
    (a, b.max(1e-12))
}

/// The scheduler's cost terms from `model`'s predictions: the per-token line fitted through
/// steps of up to `max_rows` fresh rows (the intercept, never negative, is the fixed part),
/// the per-key cost from a one-row step at context [`KEY_PROBE`], and the head's line
/// through one and 64 logits rows.
pub fn fit(model: &StepModel, max_rows: usize) -> StepCost {
    let top = max_rows.clamp(16, *FIT_ROWS.last().expect("rows"));
    let pts: Vec<(f64, f64)> = FIT_ROWS
        .iter()
        .filter(|&&n| n <= top)
        .map(|&n| (n as f64, predict(model, &rows(n))))
        .collect();
    let (fixed, per_token) = fit_line(&pts);
    let fresh = predict(model, &rows(1));
    let deep = predict(
        model,
        &StepShape {
            seq_rows: vec![1],
            seq_start: vec![KEY_PROBE],
            logit_rows: 0,
        },
    );
    let per_key = ((deep - fresh) / KEY_PROBE as f64).max(0.0);
    let head: Vec<f64> = HEAD_ROWS
        .iter()
        .map(|&k| {
            let mut s = rows(k);
            s.logit_rows = k;
            predict(model, &s) - predict(model, &rows(k))
        })
        .collect();
    let per_logit_row = ((head[1] - head[0]) / (HEAD_ROWS[1] - HEAD_ROWS[0]) as f64).max(0.0);
    StepCost {
        fixed_s: fixed.max(0.0),
        per_token_s: per_token,
        per_key_s: per_key,
        head_fixed_s: (head[0] - per_logit_row).max(0.0),
        per_logit_row_s: per_logit_row,
    }
}

/// Each figure of `a` and `b` (profiles of the same ladders) at its smaller value.
pub fn min_profile(a: &MeasuredProfile, b: &MeasuredProfile) -> MeasuredProfile {
    let mut m = a.clone();
    for (p, q) in m.points.iter_mut().zip(&b.points) {
        if p.rows == q.rows {
            p.attn_s = p.attn_s.min(q.attn_s);
            p.mlp_s = p.mlp_s.min(q.mlp_s);
        }
    }
    for (p, q) in m.head.iter_mut().zip(&b.head) {
        if p.0 == q.0 {
            p.1 = p.1.min(q.1);
        }
    }
    m.attn_s_per_key = a.attn_s_per_key.min(b.attn_s_per_key);
    m.embed_s_per_row = a.embed_s_per_row.min(b.embed_s_per_row);
    m
}

/// The step-time model of this engine: the tensor-parallel group's, or one measured now on
/// the engine's compute units (the smaller figures of two measurements).
pub fn step_model(engine: &Engine) -> Result<StepModel> {
    if let Some(m) = engine.step_model() {
        return Ok(m);
    }
    let measure = || overlap_plan::measure_profile(&engine.model, &engine.ctx());
    let profile = min_profile(&measure()?, &measure()?);
    Ok(overlap_plan::step_model(
        &engine.config,
        1,
        profile,
        CommCost::FREE,
        0.0,
    ))
}

/// [`fit`] of [`step_model`]: the scheduler's predictor for steps of up to `max_rows` rows.
pub fn calibrate(engine: &Engine, max_rows: usize) -> Result<StepCost> {
    Ok(fit(&step_model(engine)?, max_rows))
}

/// Prompt tokens of the reference short request the default budget is sized for.
pub const REFERENCE_PROMPT: usize = 32;
/// The default budget over the reference request's own predicted step.
pub const DEFAULT_BUDGET_FACTOR: f64 = 1.5;

/// The default step-time budget for `c`: 1.5 times the predicted step of a fresh
/// 32-token prompt. Such a request then completes its prefill in one step, and one arriving
/// while long prompts prefill waits for the step in flight (on average half a budget) and
/// then its own step: about 1.75 times its time on an idle server. Slower machines (or
/// models) get a proportionally larger budget.
pub fn default_budget_s(c: &StepCost) -> f64 {
    DEFAULT_BUDGET_FACTOR * c.step([(0, REFERENCE_PROMPT, true)])
}

/// One line describing `c` (start-up notes, benchmarks).
pub fn describe(c: &StepCost) -> String {
    format!(
        "{:.2} ms + {:.3} ms/token + {:.1} ns/key attended + logits {:.2} ms + {:.3} ms/row",
        c.fixed_s * 1e3,
        c.per_token_s * 1e3,
        c.per_key_s * 1e9,
        c.head_fixed_s * 1e3,
        c.per_logit_row_s * 1e3
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tessera_sim::{MeasuredProfile, StagePoint};

    use super::*;

    /// A profile whose stages are exactly `a + b·rows` per layer, attention `k` per key.
    fn linear(layers: usize, a: f64, b: f64, k: f64) -> StepModel {
        let points = [1, 16, 256, 1024]
            .iter()
            .map(|&r| StagePoint {
                rows: r,
                attn_s: a + b * r as f64,
                mlp_s: a + b * r as f64,
            })
            .collect();
        StepModel {
            layers,
            hidden: 64,
            vocab: 100,
            ranks: 1,
            act_bytes: 4,
            compute: Arc::new(MeasuredProfile {
                points,
                attn_s_per_key: k,
                head: vec![(1, 3e-3), (64, 3e-3 + 63.0 * 1e-5)],
                embed_s_per_row: 0.0,
            }),
            comm: CommCost::FREE,
            embed_reduced: false,
            comm_cpu_share: 0.0,
        }
    }

    #[test]
    fn linear_profiles_are_fitted_exactly() {
        let m = linear(30, 1e-4, 2e-5, 3e-9);
        let c = fit(&m, 128);
        let close = |x: f64, y: f64| (x - y).abs() <= 1e-9 + 1e-6 * y.abs();
        assert!(close(c.fixed_s, 30.0 * 2.0 * 1e-4), "{c:?}");
        assert!(close(c.per_token_s, 30.0 * 2.0 * 2e-5), "{c:?}");
        assert!(close(c.per_key_s, 30.0 * 3e-9), "{c:?}");
        assert!(close(c.per_logit_row_s, 1e-5), "{c:?}");
        assert!(close(c.head_fixed_s, 3e-3 - 1e-5), "{c:?}");
        // The fitted terms predict the model's own steps, attention and head included.
        let shape = StepShape {
            seq_rows: vec![40, 1],
            seq_start: vec![500, 90],
            logit_rows: 1,
        };
        let want = predict(&m, &shape);
        let got = c.step([(500, 40, false), (90, 1, true)]);
        assert!(close(got, want), "{got} {want}");
    }

    #[test]
    fn the_default_budget_holds_the_reference_request() {
        let c = fit(&linear(30, 1e-4, 2e-5, 3e-9), 128);
        let b = default_budget_s(&c);
        let own = c.step([(0, REFERENCE_PROMPT, true)]);
        assert!((b / own - DEFAULT_BUDGET_FACTOR).abs() < 1e-12);
        assert!(c.step([(0, 30, true)]) < b - c.fixed_s);
    }

    #[test]
    fn the_smaller_figures_are_kept() {
        let p = |t: f64, k: f64| MeasuredProfile {
            points: vec![StagePoint {
                rows: 1,
                attn_s: t,
                mlp_s: 2.0 * t,
            }],
            attn_s_per_key: k,
            head: vec![(1, t)],
            embed_s_per_row: t,
        };
        let m = min_profile(&p(1.0, 5.0), &p(3.0, 4.0));
        assert_eq!(m.points[0].attn_s, 1.0);
        assert_eq!(m.points[0].mlp_s, 2.0);
        assert_eq!(m.attn_s_per_key, 4.0);
        assert_eq!((m.head[0].1, m.embed_s_per_row), (1.0, 1.0));
    }

    #[test]
    fn fits_are_valid_predictors() {
        // A concave profile (per-row cost falling with rows) still gives a usable line.
        let mut m = linear(2, 1e-3, 1e-5, 0.0);
        let prof = MeasuredProfile {
            points: [
                (1, 1e-3),
                (4, 1.1e-3),
                (16, 1.5e-3),
                (64, 2.5e-3),
                (256, 6e-3),
            ]
            .iter()
            .map(|&(rows, t)| StagePoint {
                rows,
                attn_s: t,
                mlp_s: t,
            })
            .collect(),
            attn_s_per_key: 0.0,
            head: vec![(1, 1e-3)],
            embed_s_per_row: 0.0,
        };
        m.compute = Arc::new(prof);
        let c = fit(&m, 256);
        assert!(c.validate().is_ok(), "{c:?}");
        for n in [1usize, 16, 64, 256] {
            let want = predict(&m, &rows(n));
            let got = c.step([(0, n, false)]);
            assert!((got / want - 1.0).abs() < 0.5, "{n}: {got} vs {want}");
        }
    }
}
