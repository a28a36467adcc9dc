//! The scheduler's step-cost predictor ([`tessera_scheduler::StepCost`]) calibrated from this
//! engine's model at start-up, from three measurements:
//!
//! - whole steps (every layer, embedding to last norm) of 1, 16 and 64 fresh rows through
//!   [`Engine::time_step`]: the fixed and per-token parts. The stage profile cannot give
//!   these: it times layer 0 alone, again and again, so that layer's weights stay in cache,
//!   while a real step streams every layer's weights (and the KV) from memory, a fixed cost
//!   of several milliseconds that a one-layer profile never sees;
//! - the stage profile tensor parallelism's sub-batch planner uses
//!   ([`crate::overlap_plan::measure_profile`], through its step-time model
//!   [`tessera_sim::StepModel`]; under tensor parallelism the group's, already measured):
//!   attention's cost per key over a 1,024-token prefill, and the head's per logits row;
//! - one more prefill, of [`DEEP_PROBE`] tokens: a key costs more deep in a long context
//!   (the keys outgrow the caches), and the two per-key averages fix its cost as
//!   `per_key + per_key2 × position`.
//!
//! About 2 s on 2 threads for SmolLM2-135M. The machine may be shared and its state drifts
//! from the moment measured: [`crate::step_fit::OnlineFit`] refits the cost to every step the
//! engine runs, with one factor on the fixed parts and one on the rest.

use tessera_core::Result;
use tessera_model::{BatchMeta, LogitsFor, SeqChunk, SubBatching};
use tessera_parallel::link::CommCost;
use tessera_scheduler::{StepCost, TimeBudget};
use tessera_sim::{StepModel, StepShape};

use crate::overlap_plan;
use crate::{Engine, StepMode, KV_BLOCK_SIZE};

/// Rows of the whole steps the fixed and per-token parts are fitted through.
pub const STEP_ROWS: [usize; 3] = [1, 16, 64];
/// Timed repetitions of each whole step (the fastest counts), after one warm-up.
const STEP_REPS: usize = 3;
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

/// Average seconds (every layer) of one key attended over the prefill of a fresh
/// `rows`-token prompt.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KeyAverage {
    pub rows: usize,
    pub per_key_s: f64,
}

/// `per_key + per_key2 × position` from two [`KeyAverage`]s: over a prefill of `n` rows the
/// keys attended average `per_key + per_key2 × (2n − 1) / 3`. Neither is negative; with one
/// average (or two at the same length) the cost is flat.
pub fn key_terms(a: KeyAverage, b: Option<KeyAverage>) -> (f64, f64) {
    let depth = |k: &KeyAverage| (2.0 * k.rows as f64 - 1.0) / 3.0;
    let Some(b) = b.filter(|b| b.rows > a.rows) else {
        return (a.per_key_s.max(0.0), 0.0);
    };
    let k2 = ((b.per_key_s - a.per_key_s) / (depth(&b) - depth(&a))).max(0.0);
    let k1 = a.per_key_s - k2 * depth(&a);
    if k1 >= 0.0 {
        (k1, k2)
    } else {
        // Through the origin and the deeper average.
        (0.0, (b.per_key_s / depth(&b)).max(0.0))
    }
}

/// The scheduler's cost terms: the line through `steps` (`(rows, seconds)` of whole steps of
/// fresh rows; its intercept, never negative, is the fixed part), the per-key terms from the
/// profile's average over a `probe_rows` prefill and `deep`, a second one ([`key_terms`]),
/// and the head's line through one and 64 logits rows of `model`.
pub fn fit(
    model: &StepModel,
    steps: &[(usize, f64)],
    probe_rows: usize,
    deep: Option<KeyAverage>,
) -> StepCost {
    let pts: Vec<(f64, f64)> = steps.iter().map(|&(n, t)| (n as f64, t)).collect();
    let (fixed, per_token) = fit_line(&pts);
    let fresh = predict(model, &rows(1));
    let probe = predict(
        model,
        &StepShape {
            seq_rows: vec![1],
            seq_start: vec![KEY_PROBE],
            logit_rows: 0,
        },
    );
    let profiled = KeyAverage {
        rows: probe_rows,
        per_key_s: ((probe - fresh) / KEY_PROBE as f64).max(0.0),
    };
    let (per_key, per_key2) = key_terms(profiled, deep);
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
        per_key2_s: per_key2,
        head_fixed_s: (head[0] - per_logit_row).max(0.0),
        per_logit_row_s: per_logit_row,
    }
}

/// The step-time model of this engine: the tensor-parallel group's, or one measured now on
/// the engine's compute units.
pub fn step_model(engine: &Engine) -> Result<StepModel> {
    if let Some(m) = engine.step_model() {
        return Ok(m);
    }
    let profile = overlap_plan::measure_profile(&engine.model, &engine.ctx())?;
    Ok(overlap_plan::step_model(
        &engine.config,
        1,
        profile,
        CommCost::FREE,
        0.0,
    ))
}

/// Length of the second prefill timed for the per-key terms (at most the model's context).
pub const DEEP_PROBE: usize = 2048;

/// The [`KeyAverage`] of a fresh prefill of [`DEEP_PROBE`] tokens (or the model's context)
/// on this engine's compute units: layer 0's attention time beyond that of as many one-row
/// sequences (from `model`'s profile), per key, times the layers. `None` when the context is
/// no longer than the profile's own probe.
pub fn measure_deep(engine: &Engine, model: &StepModel) -> Result<Option<KeyAverage>> {
    let n = DEEP_PROBE.min(engine.config.max_position);
    if n <= profile_probe_rows(engine) {
        return Ok(None);
    }
    let t = engine.model.time_stages(&engine.ctx(), &[n], 1)?;
    let extra = (t.attn_s - model.compute.attn(n, n)).max(0.0);
    let keys = (n * (n - 1) / 2) as f64;
    Ok(Some(KeyAverage {
        rows: n,
        per_key_s: extra / keys * model.layers as f64,
    }))
}

/// The length of the prefill the stage profile takes its per-key figure from.
fn profile_probe_rows(engine: &Engine) -> usize {
    let top = *overlap_plan::PROFILE_ROWS.last().expect("a ladder");
    top.min(engine.config.max_position)
}

/// Seconds of a whole step of `n` fresh one-row sequences (no logits) on `engine`: the
/// fastest of [`STEP_REPS`] after a warm-up.
pub fn time_whole_step(engine: &Engine, n: usize) -> Result<f64> {
    let mut kv = engine.new_kv(KV_BLOCK_SIZE, n.max(1))?;
    let vocab = engine.config.vocab_size.max(1);
    let batch = BatchMeta {
        seqs: (0..n)
            .map(|i| {
                let token = ((i * 7919 + 13) % vocab) as u32;
                SeqChunk::new(vec![token], 0, vec![i as u32], LogitsFor::None)
            })
            .collect(),
    };
    let mut best = f64::INFINITY;
    for rep in 0..=STEP_REPS {
        let t = engine.time_step(&batch, &mut kv, StepMode::Full)?;
        if rep > 0 {
            best = best.min(t);
        }
    }
    Ok(best)
}

/// The scheduler's predictor: [`fit`] of [`time_whole_step`] at [`STEP_ROWS`] (those up to
/// `max_rows`, at least two), [`step_model`] and [`measure_deep`].
pub fn calibrate(engine: &Engine, max_rows: usize) -> Result<StepCost> {
    let model = step_model(engine)?;
    let mut steps = Vec::new();
    for (i, &n) in STEP_ROWS.iter().enumerate() {
        if i < 2 || n <= max_rows {
            steps.push((n, time_whole_step(engine, n)?));
        }
    }
    let deep = measure_deep(engine, &model)?;
    Ok(fit(&model, &steps, profile_probe_rows(engine), deep))
}

/// Prompt tokens of the reference short request the default budget is sized for.
pub const REFERENCE_PROMPT: usize = 32;
/// The default budget over the reference request's own predicted step.
pub const DEFAULT_BUDGET_FACTOR: f64 = 1.25;

/// The default step-time budget with cost `c`: 1.25 times the predicted step of a fresh
/// 32-token prompt, following the cost as it is refitted. Such a request then completes its
/// prefill in one step, and one arriving while long prompts prefill waits for the step in
/// flight (on average half a budget) and then its own step: about 1.6 times its time on an
/// idle server, plus the request's own overheads (HTTP, tokenizing, the step loop's turn).
/// That stays below 2 with a margin; a factor of 1.5 would bring it close to 2. Slower
/// machines (or models) get a proportionally larger budget.
pub fn auto_budget(c: StepCost) -> TimeBudget {
    TimeBudget::relative(c, DEFAULT_BUDGET_FACTOR, REFERENCE_PROMPT)
}

/// One line describing `c` (start-up notes, benchmarks).
pub fn describe(c: &StepCost) -> String {
    format!(
        "{:.2} ms + {:.3} ms/token + ({:.2} + {:.2}/1k positions) µs/key attended + logits \
         {:.2} ms + {:.3} ms/row",
        c.fixed_s * 1e3,
        c.per_token_s * 1e3,
        c.per_key_s * 1e6,
        c.per_key2_s * 1e9,
        c.head_fixed_s * 1e3,
        c.per_logit_row_s * 1e3
    )
}

#[cfg(test)]
pub(crate) mod tests {
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

    /// Whole steps of `ns` fresh rows as `m` predicts them.
    fn model_steps(m: &StepModel, ns: &[usize]) -> Vec<(usize, f64)> {
        ns.iter().map(|&n| (n, predict(m, &rows(n)))).collect()
    }

    #[test]
    fn linear_profiles_are_fitted_exactly() {
        let m = linear(30, 1e-4, 2e-5, 3e-9);
        let c = fit(&m, &model_steps(&m, &[1, 16, 64, 128]), 1024, None);
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
        let m = linear(30, 1e-4, 2e-5, 3e-9);
        let c = fit(&m, &model_steps(&m, &STEP_ROWS), 1024, None);
        let b = auto_budget(c).budget_s();
        let own = c.step([(0, REFERENCE_PROMPT, true)]);
        assert!((b / own - DEFAULT_BUDGET_FACTOR).abs() < 1e-12);
        assert!(c.step([(0, 30, true)]) < b - c.fixed_s);
    }

    /// A plausible step cost for the tests here and in `step_fit`.
    pub(crate) fn base() -> StepCost {
        StepCost {
            fixed_s: 3e-3,
            per_token_s: 1.3e-3,
            per_key_s: 1.1e-6,
            per_key2_s: 1e-9,
            head_fixed_s: 1e-3,
            per_logit_row_s: 0.4e-3,
        }
    }

    #[test]
    fn two_key_averages_give_the_growth_with_depth() {
        // A key at position p costs 1 µs + 2 ns × p: over a prefill of n rows the keys
        // average 1 µs + 2 ns × (2n − 1) / 3.
        let avg = |n: usize| KeyAverage {
            rows: n,
            per_key_s: 1e-6 + 2e-9 * (2.0 * n as f64 - 1.0) / 3.0,
        };
        let (k1, k2) = key_terms(avg(1024), Some(avg(2048)));
        assert!(
            (k1 - 1e-6).abs() < 1e-15 && (k2 - 2e-9).abs() < 1e-18,
            "{k1} {k2}"
        );
        // The naive sum over a prefill agrees with the averages.
        let n = 2048;
        let cost = StepCost {
            per_key_s: k1,
            per_key2_s: k2,
            ..base()
        };
        let naive: f64 = (0..n).map(|p| (k1 + k2 * p as f64) * p as f64).sum();
        let keys = (n * (n - 1) / 2) as f64;
        let fitted = cost.chunk(0, n, false) - cost.per_token_s * n as f64;
        assert!((fitted / naive - 1.0).abs() < 1e-9);
        assert!((naive / keys - avg(n).per_key_s).abs() < 1e-15);
        // One average, or a cheaper deep one: flat; never negative.
        assert_eq!(key_terms(avg(1024), None), (avg(1024).per_key_s, 0.0));
        let cheap = KeyAverage {
            rows: 2048,
            per_key_s: 1e-7,
        };
        assert_eq!(key_terms(avg(1024), Some(cheap)).1, 0.0);
        let (k1, k2) = key_terms(
            KeyAverage {
                rows: 1024,
                per_key_s: 1e-7,
            },
            Some(avg(4096)),
        );
        assert!(k1 >= 0.0 && k2 > 0.0);
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
        let c = fit(&m, &model_steps(&m, &[1, 4, 16, 64, 256]), 1024, None);
        assert!(c.validate().is_ok(), "{c:?}");
        for n in [1usize, 16, 64, 256] {
            let want = predict(&m, &rows(n));
            let got = c.step([(0, n, false)]);
            assert!((got / want - 1.0).abs() < 0.5, "{n}: {got} vs {want}");
        }
    }
}
