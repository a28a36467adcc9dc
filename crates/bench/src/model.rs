//! llama-bench-style model throughput: prompt processing (pp) and token generation (tg).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use rand::{Rng, SeedableRng};
use serde_json::json;
use tessera_engine::generate::{BLOCK_SIZE, PREFILL_CHUNK};
use tessera_engine::{store, tuning, Engine};
use tessera_kernels::plan::Precision;
use tessera_model::{BatchMeta, KvStorage, LogitsFor, SeqChunk};

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

/// `[start, end)` ranges of the prefill chunks of a prompt of `n` tokens.
pub fn chunks(n: usize, chunk: usize) -> Vec<(usize, usize)> {
    (0..n)
        .step_by(chunk.max(1))
        .map(|s| (s, (s + chunk.max(1)).min(n)))
        .collect()
}

fn forward(
    engine: &Engine,
    kv: &mut KvStorage,
    table: &[u32],
    tokens: &[u32],
    start: usize,
    logits: LogitsFor,
) -> Result<Option<u32>> {
    let chunk = SeqChunk {
        tokens: tokens.to_vec(),
        start_pos: start,
        block_table: table.to_vec(),
        logits,
    };
    let l = engine
        .model
        .forward(&BatchMeta { seqs: vec![chunk] }, kv, &engine.ctx())?;
    Ok(l.last_of(0).map(|row| argmax(row) as u32))
}

/// Seconds to prefill `prompt` into `kv` from position 0, and the greedy next token.
fn prefill(
    engine: &Engine,
    kv: &mut KvStorage,
    table: &[u32],
    prompt: &[u32],
) -> Result<(f64, u32)> {
    let t = Instant::now();
    let mut next = 0;
    let parts = chunks(prompt.len(), PREFILL_CHUNK);
    let last = parts.len().saturating_sub(1);
    for (i, &(s, e)) in parts.iter().enumerate() {
        let want = if i == last {
            LogitsFor::Last
        } else {
            LogitsFor::None
        };
        if let Some(tok) = forward(engine, kv, table, &prompt[s..e], s, want)? {
            next = tok;
        }
    }
    Ok((t.elapsed().as_secs_f64(), next))
}

/// Seconds for `n` single-token forwards from position `start`, feeding back the argmax.
fn decode(
    engine: &Engine,
    kv: &mut KvStorage,
    table: &[u32],
    mut tok: u32,
    start: usize,
    n: usize,
) -> Result<f64> {
    let t = Instant::now();
    for i in 0..n {
        tok = forward(engine, kv, table, &[tok], start + i, LogitsFor::Last)?.unwrap_or(tok);
    }
    Ok(t.elapsed().as_secs_f64())
}

/// One pp + tg run; returns (pp tokens/s, tg tokens/s), `NaN` for a part of length 0.
fn one_run(engine: &Engine, cfg: &ModelConfig, prompt: &[u32], tg: usize) -> Result<(f64, f64)> {
    let pp = prompt.len();
    let positions = if cfg.tg_after_prompt {
        pp + tg
    } else {
        pp.max(tg)
    };
    let mut kv = engine
        .model
        .new_kv_storage(BLOCK_SIZE, positions.div_ceil(BLOCK_SIZE).max(1))?;
    let table: Vec<u32> = (0..kv.num_blocks() as u32).collect();
    let mut pp_rate = f64::NAN;
    let mut first = prompt.first().copied().unwrap_or(0);
    if pp > 0 {
        let (secs, next) = prefill(engine, &mut kv, &table, prompt)?;
        pp_rate = pp as f64 / secs;
        first = next;
    }
    let mut tg_rate = f64::NAN;
    if tg > 0 {
        let (tok, start) = if cfg.tg_after_prompt {
            (first, pp)
        } else {
            // A fresh context, as llama-bench's tg test: decode from position 0.
            kv = engine
                .model
                .new_kv_storage(BLOCK_SIZE, positions.div_ceil(BLOCK_SIZE).max(1))?;
            (prompt.first().copied().unwrap_or(1), 0)
        };
        let secs = decode(engine, &mut kv, &table, tok, start, tg)?;
        tg_rate = tg as f64 / secs;
    }
    Ok((pp_rate, tg_rate))
}

pub fn run_model(cfg: &ModelConfig) -> Result<()> {
    let path = store::resolve_model(cfg.model.as_deref())?;
    let engine = Engine::load_with(&path, cfg.threads, cfg.precision, tuning::load_planner())?;
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
        "model {} ({}, {:.1} MiB), {} threads, precision {}, isa {}, loaded in {:.2} s",
        engine.name,
        path.display(),
        engine.weight_bytes as f64 / (1 << 20) as f64,
        engine.pool.units(),
        cfg.precision,
        tessera_engine::isa_name(),
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

    #[test]
    fn chunks_cover_the_prompt() {
        assert_eq!(chunks(0, 512), vec![]);
        assert_eq!(chunks(5, 512), vec![(0, 5)]);
        assert_eq!(chunks(1030, 512), vec![(0, 512), (512, 1024), (1024, 1030)]);
        assert_eq!(chunks(1024, 512), vec![(0, 512), (512, 1024)]);
    }
}
