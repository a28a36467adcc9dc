//! `tessera tune`: measures the best candidate plans for the shapes a model really uses and
//! stores the winners in the tuning cache.
//!
//! For every distinct linear-layer weight shape of the model (dtype, K, N) and every M in
//! the ladder, the top candidates by predicted time are timed on synthetic data of that
//! shape (in interleaved rounds, each a median of a few runs after a warm-up); the lowest
//! median over the rounds, confirmed against the model's own first choice in rounds of its
//! own, becomes the bucket's entry. Up to [`crate::cold_weights::STEP_COLD_MAX_M`] rows
//! (unless told otherwise) the weight is read from DRAM as a model step reads it
//! ([`crate::cold_weights`]): each timing is one pass over copies of it that together pass
//! the last-level cache. Timed on one weight warm in the caches (`--warm`), small products
//! favour tiles that a step, reading its weights from DRAM, runs slower.
//!
//! The candidates are ranked by the planner that plans without tuning (the CPU's class
//! profile), so the untuned plan is always among them and timing only ever replaces it with
//! a plan measured faster. Raw tile rates measured on small products
//! (`calibrate::measure_profile`) would not do for the ranking: they are not the rates the
//! cost model was fitted with, and they rank some kernels too low to be timed at all (the
//! outer-product tiles at large M).

use std::collections::BTreeSet;
use std::time::Instant;

use tessera_core::tensor::quantize_row;
use tessera_core::{DType, TensorBytes, WeightTensor};
use tessera_formats::ModelFiles;
use tessera_kernels::gemm::{execute, GemmWeight};
use tessera_kernels::plan::{Plan, Precision};
use tessera_kernels::planner::{Planner, ShapeKey, TunedPlan, TuningCache};
use tessera_runtime::ThreadPool;

use crate::cold_weights::{cold_copies, product_pass};

/// The M ladder `tune` covers.
pub const M_LADDER: [usize; 11] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];

/// Distinct (dtype, K, N) of the model's matrix products as the forward runs them: q/k/v
/// fused into one product, gate/up fused, the output and down projections, and the output
/// embedding.
pub fn model_shapes(files: &ModelFiles) -> Vec<(DType, usize, usize)> {
    let mut set = BTreeSet::new();
    let mut add = |parts: &[&str]| {
        let ts: Vec<_> = parts.iter().filter_map(|n| files.tensors.get(*n)).collect();
        if ts.len() == parts.len() && !ts.is_empty() {
            let n: usize = ts.iter().map(|t| t.rows()).sum();
            set.insert((ts[0].dtype.ggml_type(), ts[0].cols(), n));
        }
    };
    for l in 0..files.config.n_layers {
        let p = |s: &str| format!("blk.{l}.{s}.weight");
        add(&[&p("attn_q"), &p("attn_k"), &p("attn_v")]);
        add(&[&p("attn_output")]);
        add(&[&p("ffn_gate"), &p("ffn_up")]);
        add(&[&p("ffn_down")]);
    }
    if files.tensors.contains_key("output.weight") && !files.config.tie_embeddings {
        add(&["output.weight"]);
    } else {
        add(&["token_embd.weight"]);
    }
    set.into_iter()
        .map(|(d, k, n)| (DType::from_ggml_type(d).expect("loaded dtype"), k, n))
        .collect()
}

/// Parses `DTYPE:KxN` (`q4_1:576x1536`) into the (dtype, K, N) [`tune`] takes.
pub fn parse_weight_shape(s: &str) -> Result<(DType, usize, usize), String> {
    let bad = || format!("{s:?}: expected DTYPE:KxN, e.g. q4_1:576x1536");
    let (d, kn) = s.trim().split_once(':').ok_or_else(bad)?;
    let dtype = DType::parse(d.trim()).ok_or_else(|| format!("{s:?}: unknown dtype {d:?}"))?;
    let (k, n) = kn.split_once(['x', 'X']).ok_or_else(bad)?;
    let (k, n): (usize, usize) = (
        k.trim().parse().map_err(|_| bad())?,
        n.trim().parse().map_err(|_| bad())?,
    );
    if k == 0 || n == 0 || k % dtype.block_len() != 0 {
        return Err(format!(
            "{s:?}: K and N must be positive, K a multiple of {}'s block of {}",
            dtype,
            dtype.block_len()
        ));
    }
    Ok((dtype, k, n))
}

/// A weight of the given shape with deterministic pseudo-random values.
pub fn synthetic_weight(dtype: DType, k: usize, n: usize, repack: bool) -> GemmWeight {
    weight_of(dtype, k, n, &synthetic_bytes(dtype, k, n), repack)
}

/// The stored bytes of [`synthetic_weight`].
fn synthetic_bytes(dtype: DType, k: usize, n: usize) -> Vec<u8> {
    let mut state = 0x9e3779b97f4a7c15u64 ^ (k * 31 + n) as u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    let mut bytes = Vec::with_capacity(dtype.row_bytes(k).unwrap_or(0) * n);
    for _ in 0..n {
        let row: Vec<f32> = (0..k).map(|_| next()).collect();
        bytes.extend(quantize_row(dtype, &row));
    }
    bytes
}

/// An `n × k` weight of `dtype` over its own copy of `bytes`, repacked as the model would.
fn weight_of(dtype: DType, k: usize, n: usize, bytes: &[u8], repack: bool) -> GemmWeight {
    let t = WeightTensor::new("synthetic", dtype, vec![n, k], TensorBytes::owned(bytes))
        .expect("consistent shape");
    GemmWeight::new(t, repack)
}

/// Where a candidate reads its weight from while it is timed.
#[derive(Clone, Copy)]
enum Weights<'a> {
    /// One weight, in the caches after its first run.
    Warm(&'a GemmWeight),
    /// Copies that together pass the last-level cache, run in turn: from DRAM.
    Cold(&'a [GemmWeight]),
}

impl Weights<'_> {
    /// Seconds of one product of `plan`: a median of runs on the warm weight, or one pass
    /// over the cold copies divided by their count.
    fn time(self, pool: &ThreadPool, plan: &Plan, x: &[f32], m: usize, out: &mut [f32]) -> f64 {
        match self {
            Weights::Warm(w) => time_runs(pool, plan, x, m, w, out, 0.004),
            Weights::Cold(copies) => {
                product_pass(pool, plan, x, m, copies, out) / copies.len() as f64
            }
        }
    }
}

/// Median seconds of `plan` over a few runs after one warm-up (at least ~20 ms of runs).
pub fn time_plan(
    pool: &ThreadPool,
    plan: &Plan,
    x: &[f32],
    m: usize,
    w: &GemmWeight,
    out: &mut [f32],
) -> f64 {
    time_runs(pool, plan, x, m, w, out, 0.02)
}

/// Median seconds of `plan` over at least 3 runs and `min_secs` of runs, after a warm-up.
fn time_runs(
    pool: &ThreadPool,
    plan: &Plan,
    x: &[f32],
    m: usize,
    w: &GemmWeight,
    out: &mut [f32],
    min_secs: f64,
) -> f64 {
    execute(pool, plan, x, m, w, None, out);
    let mut times = vec![];
    let start = Instant::now();
    while times.len() < 3 || (start.elapsed().as_secs_f64() < min_secs && times.len() < 50) {
        let t = Instant::now();
        execute(pool, plan, x, m, w, None, out);
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// Interleaved rounds in which every candidate of a shape is timed once, so that a slow
/// spell of the host falls on all of them alike instead of on whichever candidate happened
/// to run during it.
const ROUNDS: usize = 5;

/// Medians of each plan over [`ROUNDS`] interleaved rounds (after one untimed pass of each
/// over cold copies, which warms the code and evicts the previous plan's weights).
fn medians(
    pool: &ThreadPool,
    plans: &[Plan],
    x: &[f32],
    m: usize,
    w: Weights,
    out: &mut [f32],
) -> Vec<f64> {
    if matches!(w, Weights::Cold(_)) {
        for plan in plans {
            w.time(pool, plan, x, m, out);
        }
    }
    let mut times = vec![Vec::with_capacity(ROUNDS); plans.len()];
    for _ in 0..ROUNDS {
        for (plan, t) in plans.iter().zip(times.iter_mut()) {
            t.push(w.time(pool, plan, x, m, out));
        }
    }
    times
        .into_iter()
        .map(|mut t| {
            t.sort_by(f64::total_cmp);
            t[t.len() / 2]
        })
        .collect()
}

/// How much faster than the model's own choice a challenger must run in the finals to
/// replace it. Plans closer than this are level within a shared host's noise, and a swap
/// between them would only make the tuned plan follow the noise.
const REPLACE_MARGIN: f64 = 0.03;

/// The candidate with the lowest median over [`ROUNDS`] interleaved rounds, and that median.
/// When that is not the model's first choice (`plans[0]`), the two are timed afresh and only
/// the new rounds decide: the fastest of several noisy medians is biased fast (one lucky
/// median can make a plan look fastest at half another's usual speed). The challenger must
/// then beat the model's choice by [`REPLACE_MARGIN`].
fn fastest(
    pool: &ThreadPool,
    plans: Vec<Plan>,
    x: &[f32],
    m: usize,
    w: Weights,
    out: &mut [f32],
) -> (f64, Plan) {
    let t = medians(pool, &plans, x, m, w, out);
    let best = (0..plans.len())
        .min_by(|&a, &b| t[a].total_cmp(&t[b]))
        .expect("at least one candidate");
    if best == 0 {
        return (t[0], plans[0]);
    }
    let finals = [plans[0], plans[best]];
    let f = medians(pool, &finals, x, m, w, out);
    if f[1] < f[0] * (1.0 - REPLACE_MARGIN) {
        (f[1], finals[1])
    } else {
        (f[0], finals[0])
    }
}

pub struct TuneOptions {
    pub precision: Precision,
    pub m_list: Vec<usize>,
    /// Candidates timed per shape.
    pub top: usize,
    /// The largest M timed with its weight from DRAM (cold copies, as a model step reads
    /// it); larger M on one warm weight. The CLI passes
    /// [`crate::cold_weights::STEP_COLD_MAX_M`], or 0 (every M warm) under `--warm`.
    pub cold_max_m: usize,
}

/// Tunes `shapes` on `pool`, adding entries to `cache`. `progress(done, total, label)`.
pub fn tune(
    pool: &ThreadPool,
    shapes: &[(DType, usize, usize)],
    opts: &TuneOptions,
    cache: &mut TuningCache,
    progress: &mut dyn FnMut(usize, usize, &str),
) {
    let planner = Planner::untuned();
    let total = shapes.len() * opts.m_list.len();
    let mut done = 0;
    for &(dtype, k, n) in shapes {
        let repack = tessera_kernels::wants_repack(opts.precision);
        let bytes = synthetic_bytes(dtype, k, n);
        let w = weight_of(dtype, k, n, &bytes, repack);
        let copies = if opts.m_list.iter().any(|&m| m <= opts.cold_max_m) {
            progress(done, total, &format!("{dtype} k={k} n={n}: cold copies"));
            let make = || Ok::<_, std::convert::Infallible>(weight_of(dtype, k, n, &bytes, repack));
            cold_copies(bytes.len(), make).unwrap_or_else(|never| match never {})
        } else {
            vec![]
        };
        for &m in &opts.m_list {
            let key = ShapeKey::new(m, k, n, dtype, opts.precision, pool.units());
            progress(done, total, &format!("{dtype} m={m} k={k} n={n}"));
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
                .collect();
            let mut out = vec![0f32; m * n];
            let plans: Vec<Plan> = planner
                .candidates(&key)
                .into_iter()
                .take(opts.top.max(1))
                .collect();
            let weights = if m <= opts.cold_max_m {
                Weights::Cold(&copies)
            } else {
                Weights::Warm(&w)
            };
            let (secs, plan) = fastest(pool, plans, &x, m, weights, &mut out);
            cache.plans.insert(
                key.bucket().to_text(&planner.profile.cpu),
                TunedPlan::of(&plan, secs * 1e6),
            );
            done += 1;
        }
    }
    progress(done, total, "done");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tuning_stores_one_of_the_timed_candidates_per_shape() {
        let pool = ThreadPool::new(2);
        let opts = TuneOptions {
            precision: Precision::Exact,
            m_list: vec![1, 5, 13],
            top: 3,
            cold_max_m: 5,
        };
        let mut cache = TuningCache::default();
        let shapes = [(DType::Q4_1, 64, 48), (DType::F32, 40, 24)];
        tune(&pool, &shapes, &opts, &mut cache, &mut |_, _, _| {});
        assert_eq!(cache.plans.len(), shapes.len() * opts.m_list.len());
        // Ranked by the planner that plans without tuning: its candidates were timed.
        let planner = Planner::untuned();
        let tuned = Planner::new(planner.profile.clone(), cache);
        for &(dtype, k, n) in &shapes {
            for &m in &opts.m_list {
                let key = ShapeKey::new(m, k, n, dtype, Precision::Exact, pool.units());
                let plan = tuned.plan(&key);
                let timed = planner.candidates(&key);
                assert!(
                    timed
                        .iter()
                        .take(opts.top)
                        .any(|c| c.tile == plan.tile && c.parallel == plan.parallel),
                    "{dtype} {m}x{k}x{n}: {plan} is not among the timed candidates"
                );
            }
        }
    }

    #[test]
    fn weight_shapes_parse_or_say_why_not() {
        assert_eq!(
            parse_weight_shape("q4_1:576x1536"),
            Ok((DType::Q4_1, 576, 1536))
        );
        assert_eq!(parse_weight_shape(" f32:7X3 "), Ok((DType::F32, 7, 3)));
        for bad in [
            "q4_1",
            "q9:64x64",
            "q4_1:64",
            "q4_1:0x8",
            "q4_1:33x8",
            "f32:ax2",
        ] {
            assert!(parse_weight_shape(bad).is_err(), "{bad}");
        }
    }
}
