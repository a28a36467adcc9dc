//! One request, start to finish: prefill the prompt in chunks, then decode token by token
//! until EOS, a stop string or the token limit, streaming text as it completes.

use std::time::Instant;

use tessera_core::{Error, Result};
use tessera_model::{BatchMeta, LogitsFor, SeqChunk};
use tessera_tokenizer::StreamDecoder;

use crate::sampling::{Sampler, SamplingParams};
use crate::stop::StopMatcher;
use crate::Engine;

/// KV positions per block.
pub const BLOCK_SIZE: usize = 16;
/// Longest prefill chunk in one forward (bounds activation memory).
pub const PREFILL_CHUNK: usize = 512;

#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt_ids: Vec<u32>,
    pub max_tokens: usize,
    pub params: SamplingParams,
    pub stop: Vec<String>,
    /// Keep generating past EOS (benchmarks, golden checks).
    pub ignore_eos: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS or a stop string.
    Stop,
    /// `max_tokens` or the context reached.
    Length,
}

#[derive(Debug, Clone)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    pub tokens: Vec<u32>,
    pub prefill_secs: f64,
    pub decode_secs: f64,
    pub finish: FinishReason,
}

impl GenerationStats {
    pub fn prefill_tok_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_secs.max(1e-9)
    }
    /// Decode rate over the tokens produced after the first (the first comes from prefill).
    pub fn decode_tok_s(&self) -> f64 {
        self.tokens.len().saturating_sub(1) as f64 / self.decode_secs.max(1e-9)
    }
}

/// Runs `req`, calling `on_text` with each completed piece of generated text.
pub fn generate(
    engine: &Engine,
    req: &GenerateRequest,
    on_text: &mut dyn FnMut(&str),
) -> Result<GenerationStats> {
    req.params.validate()?;
    let ctx_len = engine.model.config.max_position;
    let n_prompt = req.prompt_ids.len();
    if n_prompt == 0 {
        return Err(Error::Other("the prompt is empty".into()));
    }
    if n_prompt >= ctx_len {
        return Err(Error::Other(format!(
            "the prompt has {n_prompt} tokens; the context holds {ctx_len}"
        )));
    }
    let max_tokens = req.max_tokens.min(ctx_len - n_prompt);
    let total = n_prompt + max_tokens;
    let mut kv = engine
        .model
        .new_kv_storage(BLOCK_SIZE, total.div_ceil(BLOCK_SIZE))?;
    let table: Vec<u32> = (0..kv.num_blocks() as u32).collect();
    let ctx = engine.ctx();

    let t0 = Instant::now();
    let mut logits = None;
    for start in (0..n_prompt).step_by(PREFILL_CHUNK) {
        let end = (start + PREFILL_CHUNK).min(n_prompt);
        let chunk = SeqChunk {
            tokens: req.prompt_ids[start..end].to_vec(),
            start_pos: start,
            block_table: table.clone(),
            logits: if end == n_prompt {
                LogitsFor::Last
            } else {
                LogitsFor::None
            },
        };
        logits = Some(
            engine
                .model
                .forward(&BatchMeta { seqs: vec![chunk] }, &mut kv, &ctx)?,
        );
    }
    let prefill_secs = t0.elapsed().as_secs_f64();
    let mut logits = logits.expect("prompt is not empty");

    let t1 = Instant::now();
    let mut sampler = Sampler::new(req.params.clone(), &req.prompt_ids);
    let mut stream = StreamDecoder::new();
    let mut stops = StopMatcher::new(&req.stop);
    let mut tokens = Vec::new();
    let mut finish = FinishReason::Length;
    let mut stop_string_hit = false;
    while tokens.len() < max_tokens {
        let next = sampler.sample(logits.last_of(0).expect("one row per step"));
        if !req.ignore_eos && engine.tokenizer.is_eos(next) {
            finish = FinishReason::Stop;
            break;
        }
        sampler.accept(next);
        tokens.push(next);
        if let Some(text) = stream.push(&engine.tokenizer, next)? {
            let (out, hit) = stops.push(&text);
            if !out.is_empty() {
                on_text(&out);
            }
            if hit {
                finish = FinishReason::Stop;
                stop_string_hit = true;
                break;
            }
        }
        if tokens.len() == max_tokens {
            break;
        }
        let pos = n_prompt + tokens.len() - 1;
        let chunk = SeqChunk {
            tokens: vec![next],
            start_pos: pos,
            block_table: table.clone(),
            logits: LogitsFor::Last,
        };
        logits = engine
            .model
            .forward(&BatchMeta { seqs: vec![chunk] }, &mut kv, &ctx)?;
    }
    if !stop_string_hit {
        let mut rest = String::new();
        if let Some(text) = stream.finish(&engine.tokenizer)? {
            let (out, hit) = stops.push(&text);
            rest.push_str(&out);
            if hit {
                finish = FinishReason::Stop;
            } else {
                rest.push_str(&stops.flush());
            }
        } else {
            rest.push_str(&stops.flush());
        }
        if !rest.is_empty() {
            on_text(&rest);
        }
    }
    Ok(GenerationStats {
        prompt_tokens: n_prompt,
        tokens,
        prefill_secs,
        decode_secs: t1.elapsed().as_secs_f64(),
        finish,
    })
}
