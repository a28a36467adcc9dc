//! One request, start to finish, on a step engine of its own: the prompt is prefilled in
//! chunks, then decoded token by token until EOS, a stop string or the token limit, with the
//! text streamed as it completes. Same scheduler, forward and per-token pipeline as `serve`.

use std::time::Instant;

use tessera_core::{Error, Result};
use tessera_scheduler::SchedulerConfig;

use crate::draft::DraftModel;
use crate::request::{FinishReason, GenerateRequest, RequestEvent};
use crate::spec::SpecConfig;
use crate::step::StepEngine;
use crate::{Engine, KV_BLOCK_SIZE};

/// Longest prefill chunk in one forward (bounds activation memory).
pub const PREFILL_CHUNK: usize = 512;

#[derive(Debug, Clone)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    pub tokens: Vec<u32>,
    /// Until the first token was sampled.
    pub prefill_secs: f64,
    /// From the first token to the end.
    pub decode_secs: f64,
    pub finish: FinishReason,
    /// The request's speculative work, when speculating.
    pub spec: Option<crate::spec::SpecStats>,
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

/// A scheduler for one sequence of up to `positions` positions: whole-prompt chunks of
/// [`PREFILL_CHUNK`], no prefix caching.
pub fn single_request_config(engine: &Engine, positions: usize) -> SchedulerConfig {
    let mut cfg = SchedulerConfig::new(positions.div_ceil(KV_BLOCK_SIZE).max(1), KV_BLOCK_SIZE);
    cfg.max_num_seqs = 1;
    cfg.max_num_batched_tokens = PREFILL_CHUNK;
    cfg.max_prefill_chunk = PREFILL_CHUNK;
    cfg.max_model_len = engine.config.max_position;
    cfg.max_waiting = 1;
    cfg.prefix_caching = false;
    cfg
}

/// Runs `req`, calling `on_text` with each completed piece of generated text.
pub fn generate(
    engine: &Engine,
    req: &GenerateRequest,
    on_text: &mut dyn FnMut(&str),
) -> Result<GenerationStats> {
    generate_with(engine, req, &mut None, on_text)
}

/// [`generate`] with speculative decoding when `spec` holds its settings (and the draft
/// model for a draft-model drafter), which are handed back there afterwards.
pub fn generate_with(
    engine: &Engine,
    req: &GenerateRequest,
    spec: &mut Option<(SpecConfig, Option<DraftModel>)>,
    on_text: &mut dyn FnMut(&str),
) -> Result<GenerationStats> {
    // Before the clamp to the context below, so every front end refuses the same values.
    req.validate().map_err(|e| Error::Other(e.to_string()))?;
    let ctx_len = engine.config.max_position;
    let n_prompt = req.prompt_ids.len();
    if n_prompt == 0 {
        return Err(Error::Other("the prompt is empty".into()));
    }
    if n_prompt >= ctx_len {
        return Err(Error::Other(format!(
            "the prompt has {n_prompt} tokens; at most {} fit in the context of {ctx_len} \
             (one position is left for the answer)",
            ctx_len - 1
        )));
    }
    let max_tokens = req.max_tokens.min(ctx_len - n_prompt);
    if max_tokens == 0 {
        return Err(Error::Other("max_tokens must be at least 1".into()));
    }
    let mut steps = StepEngine::new(engine, single_request_config(engine, n_prompt + max_tokens))?;
    if let Some((cfg, model)) = spec.take() {
        steps.set_speculation(Some(cfg), model)?;
    }
    let result = run_one(&mut steps, req, max_tokens, n_prompt, on_text);
    *spec = steps.take_speculation();
    result
}

fn run_one(
    steps: &mut StepEngine<'_>,
    req: &GenerateRequest,
    max_tokens: usize,
    n_prompt: usize,
    on_text: &mut dyn FnMut(&str),
) -> Result<GenerationStats> {
    let req = GenerateRequest {
        max_tokens,
        ..req.clone()
    };
    steps
        .submit(0, &req)
        .map_err(|e| Error::Other(e.to_string()))?;
    let t0 = Instant::now();
    let mut first: Option<Instant> = None;
    let mut tokens = Vec::new();
    loop {
        let out = steps.step();
        for (_, ev) in out.events {
            match ev {
                RequestEvent::Text {
                    text, tokens: t, ..
                } => {
                    if first.is_none() && !t.is_empty() {
                        first = Some(Instant::now());
                    }
                    tokens.extend(t);
                    if !text.is_empty() {
                        on_text(&text);
                    }
                }
                RequestEvent::Finished { reason, .. } => {
                    let end = Instant::now();
                    let first = first.unwrap_or(end);
                    return Ok(GenerationStats {
                        prompt_tokens: n_prompt,
                        tokens,
                        prefill_secs: (first - t0).as_secs_f64(),
                        decode_secs: (end - first).as_secs_f64(),
                        finish: reason,
                        spec: steps.spec_stats().map(|s| s.1),
                    });
                }
                RequestEvent::Failed { message } => return Err(Error::Other(message)),
            }
        }
        if !steps.has_work() {
            return Err(Error::Other(
                "the engine stopped before the request finished".into(),
            ));
        }
    }
}
