//! llama-bench-style model throughput: prompt processing (pp) and token generation (tg).

use std::path::PathBuf;

use anyhow::{bail, Result};
use rand::{Rng, SeedableRng};
use serde_json::json;
use tessera_engine::generate::generate;
use tessera_engine::{store, tuning, Engine, GenerateRequest, SamplingParams, SubBatchPolicy};
use tessera_kernels::plan::Precision;

use crate::stats::median;

#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub model: Option<PathBuf>,
    pub prompt_tokens: usize,
    pub gen_tokens: usize,
    pub threads: usize,
    pub precision: Precision,
    pub reps: usize,
    pub json: bool,
    /// Decode right after the prompt instead of from an empty context (llama-bench's tg).
    pub tg_after_prompt: bool,
    pub warmup: bool,
    pub seed: u64,
    pub sub_batching: SubBatchPolicy,
    /// Tensor-parallel rank counts, each measured in turn.
    pub tp: Vec<usize>,
    pub tp_backend: tessera_engine::TpBackend,
    pub kv_dtype: tessera_engine::KvDtype,
}

/// Index of the largest value (first on ties).
pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// One greedy request through the step engine (the same one `generate` and `serve` drive),
/// ignoring EOS: (seconds to the first token, seconds from it to the end).
fn timed_request(engine: &Engine, prompt: &[u32], max_tokens: usize) -> Result<(f64, f64)> {
    let req = GenerateRequest {
        prompt_ids: prompt.to_vec(),
        max_tokens,
        params: SamplingParams::greedy(),
        ignore_eos: true,
        ..Default::default()
    };
    let stats = generate(engine, &req, &mut |_| {})?;
    if stats.tokens.len() != max_tokens {
        bail!(
            "the request generated {} tokens, {max_tokens} expected",
            stats.tokens.len()
        );
    }
    Ok((stats.prefill_secs, stats.decode_secs))
}

/// One pp + tg run: (pp tokens/s, tg tokens/s, share of the pp and of the tg time rank 0
/// spent in tensor-parallel collectives), `NaN` for a part of length 0.
fn one_run(
    engine: &Engine,
    cfg: &ModelConfig,
    prompt: &[u32],
    tg: usize,
) -> Result<(f64, f64, f64, f64)> {
    let pp = prompt.len();
    let (mut pp_rate, mut tg_rate) = (f64::NAN, f64::NAN);
    let (mut pp_comm, mut tg_comm) = (f64::NAN, f64::NAN);
    engine.take_comm_secs();
    if pp > 0 && !cfg.tg_after_prompt {
        let (prefill, _) = timed_request(engine, prompt, 1)?;
        pp_rate = pp as f64 / prefill;
        pp_comm = engine.take_comm_secs() / prefill;
    }
    if pp > 0 && cfg.tg_after_prompt {
        // The prompt, then `tg` decode steps (each generated token after the first is one
        // forward). The communication share is over both.
        let (prefill, decode) = timed_request(engine, prompt, 1 + tg)?;
        pp_rate = pp as f64 / prefill;
        tg_rate = tg as f64 / decode;
        pp_comm = engine.take_comm_secs() / (prefill + decode);
        tg_comm = pp_comm;
    }
    if tg > 0 && !(cfg.tg_after_prompt && pp > 0) {
        // A fresh context, as llama-bench's tg test: `tg` forwards of one token from
        // position 0 (a one-token prompt, then `tg - 1` decodes).
        let first = [prompt.first().copied().unwrap_or(1)];
        let (prefill, decode) = timed_request(engine, &first, tg)?;
        tg_rate = tg as f64 / (prefill + decode);
        tg_comm = engine.take_comm_secs() / (prefill + decode);
    }
    Ok((pp_rate, tg_rate, pp_comm, tg_comm))
}

pub fn run_model(cfg: &ModelConfig) -> Result<()> {
    if cfg.tp.is_empty() || cfg.tp.contains(&0) {
        bail!("--tp needs positive rank counts");
    }
    if cfg.tp_backend == tessera_engine::TpBackend::Mpi && cfg.tp.len() != 1 {
        bail!("--tp-backend mpi measures the job's one rank count: give one --tp value");
    }
    for &tp in &cfg.tp {
        run_one_tp(cfg, tp)?;
    }
    Ok(())
}

fn run_one_tp(cfg: &ModelConfig, tp: usize) -> Result<()> {
    let path = store::resolve_model(cfg.model.as_deref())?;
    let mut engine = Engine::load_parallel(
        &path,
        cfg.threads,
        cfg.precision,
        tuning::load_planner(),
        tp,
        cfg.tp_backend,
        std::time::Duration::from_secs(10),
    )?;
    engine.sub_batching = cfg.sub_batching;
    engine.kv_dtype = cfg.kv_dtype;
    let c = &engine.config;
    let (pp, tg) = (cfg.prompt_tokens, cfg.gen_tokens);
    let needed = if cfg.tg_after_prompt {
        pp + tg
    } else {
        pp.max(tg)
    };
    if needed > c.max_position {
        bail!(
            "{needed} positions needed, but the model's context holds {}",
            c.max_position
        );
    }
    if cfg.reps == 0 {
        bail!("--reps must be at least 1");
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(cfg.seed);
    let prompt: Vec<u32> = (0..pp)
        .map(|_| rng.gen_range(0..c.vocab_size as u32))
        .collect();
    let info = |s: String| {
        if cfg.json {
            eprintln!("{s}");
        } else {
            println!("{s}");
        }
    };
    info(format!(
        "model {} ({}, {:.1} MiB), {} threads, {tp} tensor-parallel rank(s), precision {}, KV {}, isa {}, sub-batches {}, loaded in {:.2} s",
        engine.name,
        path.display(),
        engine.weight_bytes as f64 / (1 << 20) as f64,
        cfg.threads,
        cfg.precision,
        cfg.kv_dtype,
        tessera_engine::isa_name(),
        match cfg.sub_batching {
            SubBatchPolicy::Auto => "chosen per step".to_string(),
            SubBatchPolicy::Fixed(s) => format!("{} by {}", s.count, s.split),
        },
        engine.load_secs
    ));
    info(tessera_engine::kernel_variants_line());
    if let Some(w) = crate::stats::load_warning() {
        eprintln!("{w}");
    }
    if cfg.warmup {
        // Touch every weight page and fill the planner's memo for the shapes used below.
        one_run(&engine, cfg, &prompt, tg.min(4))?;
    }
    let (mut pps, mut tgs, mut pcs, mut tcs) = (vec![], vec![], vec![], vec![]);
    for rep in 0..cfg.reps {
        let (p, t, pc, tc) = one_run(&engine, cfg, &prompt, tg)?;
        let share = |x: f64| {
            if tp > 1 && x.is_finite() {
                format!(" ({:.0}% communication)", 100.0 * x)
            } else {
                String::new()
            }
        };
        info(format!(
            "run {}: pp{pp} {:>9.1} tok/s{}   tg{tg} {:>8.1} tok/s{}",
            rep + 1,
            p,
            share(pc),
            t,
            share(tc)
        ));
        pps.push(p);
        tgs.push(t);
        pcs.push(pc);
        tcs.push(tc);
    }
    let (pp_med, tg_med) = (median(&pps), median(&tgs));
    // Decode's memory bound, measured beside the runs: the weights a step reads over the
    // DRAM read bandwidth of all units.
    let dram_gbs = (tg > 0).then(|| tessera_kernels::calibrate::dram_read_gbs(&engine.pool));
    let tg_bound = dram_gbs.map(|g| g * 1e9 / engine.step_weight_bytes.max(1) as f64);
    if let (Some(g), Some(b)) = (dram_gbs, tg_bound) {
        info(format!(
            "decode bound: {:.1} MB of weights a token over {g:.1} GB/s of DRAM reads = {b:.1} tok/s",
            engine.step_weight_bytes as f64 / 1e6
        ));
    }
    let (pc_med, tc_med) = (median(&pcs), median(&tcs));
    let fin = |x: f64| x.is_finite().then_some(x);
    if cfg.json {
        println!(
            "{}",
            json!({
                "model": engine.name,
                "path": path.display().to_string(),
                "threads": cfg.threads,
                "tp": tp,
                "tp_backend": format!("{:?}", cfg.tp_backend).to_lowercase(),
                "pp_comm_share": fin(pc_med),
                "tg_comm_share": fin(tc_med),
                "precision": cfg.precision.to_string(),
                "kv_dtype": cfg.kv_dtype.to_string(),
                "prompt_tokens": pp,
                "gen_tokens": tg,
                "reps": cfg.reps,
                "tg_after_prompt": cfg.tg_after_prompt,
                "pp_tok_s": fin(pp_med),
                "tg_tok_s": fin(tg_med),
                "pp_runs": pps.iter().map(|&x| fin(x)).collect::<Vec<_>>(),
                "tg_runs": tgs.iter().map(|&x| fin(x)).collect::<Vec<_>>(),
                "step_weight_bytes": engine.step_weight_bytes,
                "dram_read_gbs": dram_gbs,
                "tg_bound_tok_s": tg_bound,
            })
        );
    } else {
        if tp > 1 {
            println!(
                "median (tp {tp}): pp{pp} {pp_med:.1} tok/s ({:.0}% communication)   tg{tg} {tg_med:.1} tok/s ({:.0}% communication)",
                100.0 * pc_med,
                100.0 * tc_med
            );
        } else {
            println!("median: pp{pp} {pp_med:.1} tok/s   tg{tg} {tg_med:.1} tok/s");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_first_of_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
        assert_eq!(argmax(&[f32::NEG_INFINITY]), 0);
    }
}
