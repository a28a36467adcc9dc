//! llama-bench-style model throughput: prompt processing (pp) and token generation (tg).

use std::path::PathBuf;

use anyhow::{bail, Result};
use rand::{Rng, SeedableRng};
use serde_json::json;
use tessera_engine::generate::generate;
use tessera_engine::{store, tuning, Engine, GenerateRequest, SamplingParams, SubBatching};
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
    pub sub_batching: SubBatching,
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

/// One pp + tg run; returns (pp tokens/s, tg tokens/s), `NaN` for a part of length 0.
fn one_run(engine: &Engine, cfg: &ModelConfig, prompt: &[u32], tg: usize) -> Result<(f64, f64)> {
    let pp = prompt.len();
    let mut pp_rate = f64::NAN;
    let mut tg_rate = f64::NAN;
    if pp > 0 {
        // The prompt in chunks of PREFILL_CHUNK, then (after the prompt) `tg` decode steps:
        // each generated token after the first is one forward.
        let extra = if cfg.tg_after_prompt { tg } else { 0 };
        let (prefill, decode) = timed_request(engine, prompt, 1 + extra)?;
        pp_rate = pp as f64 / prefill;
        if extra > 0 {
            tg_rate = tg as f64 / decode;
        }
    }
    if tg > 0 && !(cfg.tg_after_prompt && pp > 0) {
        // A fresh context, as llama-bench's tg test: `tg` forwards of one token from
        // position 0 (a one-token prompt, then `tg - 1` decodes).
        let first = [prompt.first().copied().unwrap_or(1)];
        let (prefill, decode) = timed_request(engine, &first, tg)?;
        tg_rate = tg as f64 / (prefill + decode);
    }
    Ok((pp_rate, tg_rate))
}

pub fn run_model(cfg: &ModelConfig) -> Result<()> {
    let path = store::resolve_model(cfg.model.as_deref())?;
    let mut engine = Engine::load_with(&path, cfg.threads, cfg.precision, tuning::load_planner())?;
    engine.sub_batching = cfg.sub_batching;
    let c = &engine.model.config;
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
        "model {} ({}, {:.1} MiB), {} threads, precision {}, isa {}, sub-batches {} by {}, loaded in {:.2} s",
        engine.name,
        path.display(),
        engine.weight_bytes as f64 / (1 << 20) as f64,
        engine.pool.units(),
        cfg.precision,
        tessera_engine::isa_name(),
        cfg.sub_batching.count,
        cfg.sub_batching.split,
        engine.load_secs
    ));
    if let Some(w) = crate::stats::load_warning() {
        eprintln!("{w}");
    }
    if cfg.warmup {
        // Touch every weight page and fill the planner's memo for the shapes used below.
        one_run(&engine, cfg, &prompt, tg.min(4))?;
    }
    let mut pps = Vec::new();
    let mut tgs = Vec::new();
    for rep in 0..cfg.reps {
        let (p, t) = one_run(&engine, cfg, &prompt, tg)?;
        info(format!(
            "run {}: pp{pp} {:>9.1} tok/s   tg{tg} {:>8.1} tok/s",
            rep + 1,
            p,
            t
        ));
        pps.push(p);
        tgs.push(t);
    }
    let (pp_med, tg_med) = (median(&pps), median(&tgs));
    let fin = |x: f64| x.is_finite().then_some(x);
    if cfg.json {
        println!(
            "{}",
            json!({
                "model": engine.name,
                "path": path.display().to_string(),
                "threads": engine.pool.units(),
                "precision": cfg.precision.to_string(),
                "prompt_tokens": pp,
                "gen_tokens": tg,
                "reps": cfg.reps,
                "tg_after_prompt": cfg.tg_after_prompt,
                "pp_tok_s": fin(pp_med),
                "tg_tok_s": fin(tg_med),
                "pp_runs": pps.iter().map(|&x| fin(x)).collect::<Vec<_>>(),
                "tg_runs": tgs.iter().map(|&x| fin(x)).collect::<Vec<_>>(),
            })
        );
    } else {
        println!("median: pp{pp} {pp_med:.1} tok/s   tg{tg} {tg_med:.1} tok/s");
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
