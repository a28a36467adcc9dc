//! `tessera tune`: measures the best candidate plans for the shapes a model really uses and
//! stores the winners (and a measured machine profile) in the tuning cache.
//!
//! For every distinct linear-layer weight shape of the model (dtype, K, N) and every M in
//! the ladder, the top candidates by predicted time are timed on synthetic data of that
//! shape (median of a few runs after a warm-up); the fastest becomes the bucket's entry.

use std::collections::BTreeSet;
use std::time::Instant;

use tessera_core::tensor::quantize_row;
use tessera_core::{DType, TensorBytes, WeightTensor};
use tessera_formats::ModelFiles;
use tessera_kernels::gemm::{execute, GemmWeight};
use tessera_kernels::plan::{Plan, Precision};
use tessera_kernels::planner::{Planner, ShapeKey, TunedPlan, TuningCache};
use tessera_runtime::ThreadPool;

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

/// A weight of the given shape with deterministic pseudo-random values.
pub fn synthetic_weight(dtype: DType, k: usize, n: usize, repack: bool) -> GemmWeight {
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
    let t = WeightTensor::new("synthetic", dtype, vec![n, k], TensorBytes::owned(&bytes))
        .expect("consistent shape");
    GemmWeight::new(t, repack)
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
    execute(pool, plan, x, m, w, None, out);
    let mut times = vec![];
    let start = Instant::now();
    while times.len() < 3 || (start.elapsed().as_secs_f64() < 0.02 && times.len() < 50) {
        let t = Instant::now();
        execute(pool, plan, x, m, w, None, out);
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

pub struct TuneOptions {
    pub precision: Precision,
    pub m_list: Vec<usize>,
    /// Candidates timed per shape.
    pub top: usize,
}

/// Tunes `shapes` on `pool`, adding entries to `cache`. `progress(done, total, label)`.
pub fn tune(
    pool: &ThreadPool,
    planner: &Planner,
    shapes: &[(DType, usize, usize)],
    opts: &TuneOptions,
    cache: &mut TuningCache,
    progress: &mut dyn FnMut(usize, usize, &str),
) {
    let total = shapes.len() * opts.m_list.len();
    let mut done = 0;
    for &(dtype, k, n) in shapes {
        let w = synthetic_weight(dtype, k, n, tessera_kernels::wants_repack(opts.precision));
        for &m in &opts.m_list {
            let key = ShapeKey::new(m, k, n, dtype, opts.precision, pool.units());
            progress(done, total, &format!("{dtype} m={m} k={k} n={n}"));
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
                .collect();
            let mut out = vec![0f32; m * n];
            let mut best: Option<(f64, Plan)> = None;
            for plan in planner.candidates(&key).into_iter().take(opts.top.max(1)) {
                let secs = time_plan(pool, &plan, &x, m, &w, &mut out);
                if best.is_none_or(|(b, _)| secs < b) {
                    best = Some((secs, plan));
                }
            }
            let (secs, plan) = best.expect("at least one candidate");
            let (m_parts, n_parts) = plan.parallel.parts();
            cache.plans.insert(
                key.bucket().to_text(&planner.profile.cpu),
                TunedPlan {
                    mr: plan.tile.mr,
                    nr: plan.tile.nr,
                    mc: plan.tile.mc,
                    nc: plan.tile.nc,
                    m_parts,
                    n_parts,
                    measured_us: secs * 1e6,
                },
            );
            done += 1;
        }
    }
    progress(done, total, "done");
}
