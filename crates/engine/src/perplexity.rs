//! Perplexity the way llama.cpp's `llama-perplexity` computes it: the text is cut into
//! chunks of `ctx` tokens (BOS replacing the first token when the model adds BOS), each
//! chunk is evaluated from an empty cache, and only the second half of each chunk is scored
//! (every scored token then has at least `ctx/2` tokens of context).

use std::sync::Arc;
use std::time::Instant;

use tessera_lora::LoraAdapter;

use tessera_core::{Error, Result};

use crate::sampling::logprob;
use crate::Engine;

#[derive(Debug, Clone)]
pub struct PerplexityReport {
    pub ppl: f64,
    pub chunks: usize,
    pub scored_tokens: usize,
    pub tokens_per_sec: f64,
    /// Running perplexity after each chunk.
    pub running: Vec<f64>,
}

/// Perplexity of `tokens` in chunks of `ctx` under `adapter` (or the base model); `on_chunk(i, n, running_ppl)` reports progress.
pub fn perplexity(
    engine: &Engine,
    tokens: &[u32],
    ctx: usize,
    adapter: Option<&Arc<LoraAdapter>>,
    on_chunk: &mut dyn FnMut(usize, usize, f64),
) -> Result<PerplexityReport> {
    if ctx < 4 {
        return Err(Error::Config(format!(
            "--ctx {ctx} is too small (at least 4)"
        )));
    }
    if ctx > engine.config.max_position {
        return Err(Error::Config(format!(
            "--ctx {ctx} exceeds the model's context {}",
            engine.config.max_position
        )));
    }
    let n_chunks = tokens.len() / ctx;
    if n_chunks == 0 {
        return Err(Error::Other(format!(
            "the text has {} tokens; at least --ctx = {ctx} are needed",
            tokens.len()
        )));
    }
    let bos = if engine.tokenizer.bos_id().is_some()
        && tokens.first() == engine.tokenizer.bos_id().as_ref()
    {
        engine.tokenizer.bos_id()
    } else {
        None
    };
    let first = ctx / 2;
    let (mut nll, mut count) = (0f64, 0usize);
    let mut running = vec![];
    let t0 = Instant::now();
    for c in 0..n_chunks {
        let mut chunk: Vec<u32> = tokens[c * ctx..(c + 1) * ctx].to_vec();
        if let Some(b) = bos {
            chunk[0] = b;
        }
        let logits = engine.logits_all(&chunk, adapter)?;
        for j in first..ctx - 1 {
            nll -= logprob(logits.row(j), tokens[c * ctx + j + 1] as usize);
            count += 1;
        }
        let ppl = (nll / count as f64).exp();
        running.push(ppl);
        on_chunk(c, n_chunks, ppl);
    }
    let secs = t0.elapsed().as_secs_f64();
    Ok(PerplexityReport {
        ppl: (nll / count as f64).exp(),
        chunks: n_chunks,
        scored_tokens: count,
        tokens_per_sec: (n_chunks * ctx) as f64 / secs.max(1e-9),
        running,
    })
}
