//! `tessera bench tp`: sub-batch pipelining under tensor parallelism, measured.
//!
//! For each step size (fresh prefills of four sequences of uneven lengths, 1:2:3:2), each
//! forced sub-batching (S = 1, 2, 4, both splits) and the step-time model's own choice: the
//! step time, the compute time alone (the same step with no collective), the communication
//! time alone (the same collectives with no compute) and the share of communication hidden,
//! (T(S=1) − T(S)) / T_comm(S=1). Medians of several runs. `--json` prints one object per row.

use std::path::PathBuf;

use anyhow::{bail, Result};
use serde_json::json;
use tessera_engine::{
    store, tuning, Engine, StepMode, SubBatchPolicy, SubBatching, TpBackend, KV_BLOCK_SIZE,
};
use tessera_kernels::plan::Precision;
use tessera_model::{BatchMeta, KvStorage, LogitsFor, SeqChunk, SplitBy};

use crate::stats::median;

pub struct TpBenchConfig {
    pub model: Option<PathBuf>,
    pub threads: usize,
    pub precision: Precision,
    pub tp: usize,
    pub backend: TpBackend,
    pub tokens: Vec<usize>,
    pub reps: usize,
    pub json: bool,
    /// Free text copied into every JSON row (e.g. the link a script shaped).
    pub label: Option<String>,
}

/// One measured row.
#[derive(Debug, Clone)]
pub struct TpRow {
    pub tokens: usize,
    pub spec: SubBatching,
    pub step_ms: f64,
    pub compute_ms: f64,
    pub comm_ms: f64,
    pub predicted_ms: f64,
    pub chosen: bool,
}

/// The step of `tokens` tokens: four fresh sequences of lengths in the ratio 1:2:3:2 (at
/// least one token each), one logits row each.
pub fn bench_step(tokens: usize) -> BatchMeta {
    let lens = tessera_sim::report::bench_lens(tokens);
    let mut next = 0u32;
    let seqs = lens
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let blocks = len.div_ceil(KV_BLOCK_SIZE) as u32;
            let table = (next..next + blocks).collect();
            next += blocks;
            let toks = (0..len)
                .map(|j| ((j * 31 + i * 7 + 1) % 1000) as u32 + 10)
                .collect();
            SeqChunk::new(toks, 0, table, LogitsFor::Last)
        })
        .collect();
    BatchMeta { seqs }
}

fn blocks_of(batch: &BatchMeta) -> usize {
    batch
        .seqs
        .iter()
        .map(|s| s.block_table.len())
        .sum::<usize>()
        .max(1)
}

/// Median milliseconds of `reps` runs of `batch` under `mode` (after one warm-up).
fn time(
    engine: &Engine,
    batch: &BatchMeta,
    kv: &mut [KvStorage],
    mode: StepMode,
    reps: usize,
) -> Result<f64> {
    engine.time_step(batch, kv, mode)?;
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps.max(1) {
        t.push(engine.time_step(batch, kv, mode)? * 1e3);
    }
    Ok(median(&t))
}

pub fn run_tp(cfg: &TpBenchConfig) -> Result<()> {
    if cfg.tp < 2 {
        bail!("--tp must be at least 2: overlap needs communication");
    }
    if cfg.tokens.is_empty() || cfg.tokens.contains(&0) {
        bail!("--tokens: give positive step sizes");
    }
    let path = store::resolve_model(cfg.model.as_deref())?;
    let mut engine = Engine::load_parallel(
        &path,
        cfg.threads,
        cfg.precision,
        tuning::load_planner(),
        cfg.tp,
        cfg.backend,
        std::time::Duration::from_secs(60),
    )?;
    let stats = engine.overlap_stats();
    let link = stats.link.unwrap_or(tessera_sim::CommCost::FREE);
    let model = engine.step_model();
    eprintln!(
        "bench tp: {} on {} ranks ({:?}), {} threads, {}; all-reduce measured at {:.1} µs + {:.3} GB/s",
        engine.name,
        cfg.tp,
        cfg.backend,
        cfg.threads,
        cfg.precision,
        link.latency_s * 1e6,
        link.gbytes_per_s()
    );
    let forced: Vec<SubBatching> = [
        (1, SplitBy::Sequence),
        (2, SplitBy::Tokens),
        (4, SplitBy::Tokens),
        (2, SplitBy::Sequence),
        (4, SplitBy::Sequence),
    ]
    .iter()
    .map(|&(count, split)| SubBatching { count, split })
    .collect();
    let mut rows: Vec<TpRow> = Vec::new();
    for &tokens in &cfg.tokens {
        let batch = bench_step(tokens);
        let mut kv = engine.new_kv(KV_BLOCK_SIZE, blocks_of(&batch))?;
        let reps = if tokens >= 512 {
            cfg.reps.div_ceil(2).max(3)
        } else {
            cfg.reps
        };
        let shape = tessera_sim::StepShape::of_batch(&batch);
        let mut measure = |engine: &mut Engine, policy: SubBatchPolicy| -> Result<TpRow> {
            engine.sub_batching = policy;
            let step_ms = time(engine, &batch, &mut kv, StepMode::Full, reps)?;
            let spec = engine
                .overlap_stats()
                .last
                .map(|l| l.0)
                .unwrap_or(SubBatching::WHOLE);
            engine.sub_batching = spec.into();
            let compute_ms = time(engine, &batch, &mut kv, StepMode::ComputeOnly, reps)?;
            let comm_ms = time(engine, &batch, &mut kv, StepMode::CommOnly, reps)?;
            let predicted_ms = model
                .as_ref()
                .map_or(f64::NAN, |m| m.predict(&shape, spec).step * 1e3);
            eprintln!(
                "  {tokens} tokens, S={} by {}: {step_ms:.2} ms",
                spec.count, spec.split
            );
            Ok(TpRow {
                tokens,
                spec,
                step_ms,
                compute_ms,
                comm_ms,
                predicted_ms,
                chosen: matches!(policy, SubBatchPolicy::Auto),
            })
        };
        for &f in &forced {
            rows.push(measure(&mut engine, f.into())?);
        }
        rows.push(measure(&mut engine, SubBatchPolicy::Auto)?);
    }
    print_rows(cfg, &rows, &link, engine.pool.units());
    Ok(())
}

fn print_rows(cfg: &TpBenchConfig, rows: &[TpRow], link: &tessera_sim::CommCost, units: usize) {
    let base = |tokens: usize| {
        rows.iter()
            .find(|r| r.tokens == tokens && r.spec.count == 1 && !r.chosen)
            .expect("S=1 is always measured")
    };
    let hidden = |r: &TpRow| {
        let b = base(r.tokens);
        if b.comm_ms > 0.0 {
            (b.step_ms - r.step_ms) / b.comm_ms
        } else {
            0.0
        }
    };
    if cfg.json {
        for r in rows {
            println!(
                "{}",
                json!({
                    "tokens": r.tokens,
                    "s": r.spec.count,
                    "split": r.spec.split.to_string(),
                    "step_ms": round(r.step_ms),
                    "compute_ms": round(r.compute_ms),
                    "comm_ms": round(r.comm_ms),
                    "hidden": round(hidden(r)),
                    "chosen": r.chosen,
                    "predicted_ms": round(r.predicted_ms),
                    "tp": cfg.tp,
                    "backend": format!("{:?}", cfg.backend).to_lowercase(),
                    "threads": cfg.threads,
                    "threads_per_rank": units,
                    "precision": cfg.precision.to_string(),
                    "link_latency_us": round(link.latency_s * 1e6),
                    "link_gb_s": round(link.gbytes_per_s()),
                    "link_points": link.points,
                    "label": cfg.label,
                })
            );
        }
        return;
    }
    println!(
        "{:>6} {:>2} {:>8} {:>9} {:>10} {:>8} {:>7} {:>9} {:>7}",
        "tokens", "S", "split", "step_ms", "compute_ms", "comm_ms", "hidden", "predicted", "chosen"
    );
    for r in rows {
        println!(
            "{:>6} {:>2} {:>8} {:>9.2} {:>10.2} {:>8.2} {:>6.0}% {:>9.2} {:>7}",
            r.tokens,
            r.spec.count,
            r.spec.split.to_string(),
            r.step_ms,
            r.compute_ms,
            r.comm_ms,
            100.0 * hidden(r),
            r.predicted_ms,
            if r.chosen { "chosen" } else { "" }
        );
    }
    for &t in &cfg.tokens {
        let best = rows
            .iter()
            .filter(|r| r.tokens == t && !r.chosen)
            .map(|r| r.step_ms)
            .fold(f64::INFINITY, f64::min);
        if let Some(c) = rows.iter().find(|r| r.tokens == t && r.chosen) {
            println!(
                "{t} tokens: the choice (S={} by {}) takes {:.1}% of the best forced sub-batching's time",
                c.spec.count,
                c.spec.split,
                100.0 * c.step_ms / best
            );
        }
    }
}

fn round(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_steps_have_the_asked_tokens_in_four_uneven_sequences() {
        for t in [1, 4, 16, 17, 64, 1000, 1024] {
            let b = bench_step(t);
            let n: usize = b.seqs.iter().map(|s| s.tokens.len()).sum();
            assert_eq!(n, t.max(4), "{t}");
            assert_eq!(b.seqs.len(), 4);
            assert!(b.seqs.iter().all(|s| !s.tokens.is_empty()));
        }
        let lens: Vec<usize> = bench_step(16).seqs.iter().map(|s| s.tokens.len()).collect();
        assert_eq!(lens, vec![2, 4, 6, 4]);
    }
}
