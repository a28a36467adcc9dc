//! A live request's state in the step engine, and the one per-token pipeline every front end
//! shares: sample → EOS → accept → detokenize → stop strings.

use std::sync::Arc;

use tessera_core::Result;
use tessera_lora::LoraAdapter;
use tessera_tokenizer::{StreamDecoder, Tokenizer};

use crate::constrain::Constraint;
use crate::request::{FinishReason, GenerateRequest, TokenLogprob};
use crate::sampling::{logprob, Sampler};
use crate::stop::StopMatcher;

pub(crate) struct LiveRequest {
    pub adapter: Option<Arc<LoraAdapter>>,
    sampler: Sampler,
    stream: StreamDecoder,
    stops: StopMatcher,
    logprobs: Option<usize>,
    ignore_eos: bool,
    /// The request's grammar, and its masked logits.
    constraint: Option<Constraint>,
    masked: Vec<f32>,
    pub prompt_tokens: usize,
    /// Tokens generated and accepted (EOS not counted).
    pub generated: usize,
    /// Drafts per verification for this request: `None` follows the engine's setting.
    pub spec_tokens: Option<usize>,
    /// Prompt tokens the prefix cache served: where the first scheduled chunk started.
    pub cached_tokens: Option<usize>,
}

/// What a verification did.
pub(crate) struct Verification {
    /// The emitted tokens, in order.
    pub steps: Vec<TokenStep>,
    /// Drafts accepted before the token that ended the run (what the scheduler appends).
    pub accepted: usize,
    /// Drafts looked at (those past a finish are not), and of them the ones kept.
    pub examined: usize,
    pub kept: usize,
}

/// What one sampled token did.
pub(crate) struct TokenStep {
    pub token: u32,
    /// Text safe to emit now.
    pub text: String,
    /// The token's ids as emitted (empty for an EOS, which is not part of the output).
    pub tokens: Vec<u32>,
    pub logprobs: Vec<TokenLogprob>,
    /// `Stop` on EOS or a stop string.
    pub finish: Option<FinishReason>,
}

impl LiveRequest {
    pub fn new(req: &GenerateRequest, constraint: Option<Constraint>) -> Self {
        LiveRequest {
            constraint,
            masked: Vec::new(),
            adapter: req.adapter.clone(),
            sampler: Sampler::new(req.params.clone(), &req.prompt_ids)
                .with_logit_bias(req.logit_bias.clone()),
            stream: StreamDecoder::new(),
            stops: StopMatcher::new(&req.stop),
            logprobs: req.logprobs,
            ignore_eos: req.ignore_eos,
            prompt_tokens: req.prompt_ids.len(),
            generated: 0,
            spec_tokens: req.spec_tokens,
            cached_tokens: None,
        }
    }

    /// The request's grammar, if it has one (the step engine prepares its mask ahead).
    pub fn constraint_mut(&mut self) -> Option<&mut Constraint> {
        self.constraint.as_mut()
    }

    /// Samples the next token from `row` (masked by the request's grammar, with the mask
    /// prepared ahead or computed here) and runs it through EOS, penalties, detokenization
    /// and stop strings. An error is this request's alone.
    pub fn on_logits(&mut self, tok: &Tokenizer, row: &[f32]) -> Result<TokenStep> {
        let (token, _) = self.choose(row, None)?;
        self.emit(tok, row, token)
    }

    /// A verification chunk's rows: `rows[i]` is the target model's row at the position of
    /// `drafts[i]` (`rows` has one more, after the last draft). Each draft is verified in
    /// turn ([`crate::sampling::Sampler::verify`]) and its token emitted through the same
    /// pipeline as [`LiveRequest::on_logits`], until one is rejected (the token drawn in
    /// its place ends the run), the request finishes, or every draft is accepted (a token
    /// is then sampled from the last row). With greedy sampling the tokens are exactly those
    /// plain decoding gives.
    pub fn on_verify(
        &mut self,
        tok: &Tokenizer,
        rows: &[&[f32]],
        drafts: &[u32],
    ) -> Result<Verification> {
        debug_assert_eq!(rows.len(), drafts.len() + 1);
        let mut v = Verification {
            steps: Vec::with_capacity(rows.len()),
            accepted: 0,
            examined: 0,
            kept: 0,
        };
        for (i, row) in rows.iter().enumerate() {
            let draft = drafts.get(i).copied();
            let (token, kept) = self.choose(row, draft)?;
            v.examined += draft.is_some() as usize;
            v.kept += kept as usize;
            let step = self.emit(tok, row, token)?;
            let finished = step.finish.is_some();
            v.steps.push(step);
            if finished || !kept {
                break;
            }
            v.accepted += 1;
        }
        Ok(v)
    }

    /// The next token from `row` under the request's grammar: sampled, or with a `draft`,
    /// verified (whether it is the draft).
    fn choose(&mut self, row: &[f32], draft: Option<u32>) -> Result<(u32, bool)> {
        let pick = |sampler: &mut crate::sampling::Sampler, l: &[f32]| match draft {
            Some(d) => sampler.verify(l, d),
            None => (sampler.sample(l), false),
        };
        match &mut self.constraint {
            Some(c) => {
                c.masked(row, &mut self.masked)?;
                let (t, kept) = pick(&mut self.sampler, &self.masked);
                c.accept(t)?;
                Ok((t, kept))
            }
            None => Ok(pick(&mut self.sampler, row)),
        }
    }

    /// Runs a chosen token through EOS, penalties, detokenization and stop strings.
    fn emit(&mut self, tok: &Tokenizer, row: &[f32], token: u32) -> Result<TokenStep> {
        if !self.ignore_eos && tok.is_eos(token) {
            return Ok(TokenStep {
                token,
                text: self.flush(tok)?,
                tokens: vec![],
                logprobs: vec![],
                finish: Some(FinishReason::Stop),
            });
        }
        self.sampler.accept(token);
        self.generated += 1;
        let logprobs = match self.logprobs {
            Some(top) => vec![token_logprob(tok, row, token, top)],
            None => vec![],
        };
        let piece = self.stream.push(tok, token)?.unwrap_or_default();
        let (mut text, hit) = self.stops.push(&piece);
        // A grammar that allows nothing more ends the output (its text complete).
        let done = self.constraint.as_ref().is_some_and(Constraint::is_done);
        if done && !hit {
            text.push_str(&self.flush(tok)?);
        }
        Ok(TokenStep {
            token,
            text,
            tokens: vec![token],
            logprobs,
            finish: (hit || done).then_some(FinishReason::Stop),
        })
    }

    /// The index in the request's `stop` list of the stop string that ended it, if one did.
    pub fn stop_matched(&self) -> Option<usize> {
        self.stops.matched()
    }

    /// Text held back by the stream decoder and the stop matcher, at the end of a request
    /// (cut before a stop string completed by it).
    pub fn flush(&mut self, tok: &Tokenizer) -> Result<String> {
        let mut s = String::new();
        if let Some(t) = self.stream.finish(tok)? {
            let (emit, hit) = self.stops.push(&t);
            s.push_str(&emit);
            if hit {
                return Ok(s);
            }
        }
        s.push_str(&self.stops.flush());
        Ok(s)
    }
}

/// Log-probability of `token` under `row` and the `top` most likely alternatives.
pub fn token_logprob(tok: &Tokenizer, row: &[f32], token: u32, top: usize) -> TokenLogprob {
    let text = |id: u32| tok.decode(&[id]).unwrap_or_default();
    let mut idx: Vec<usize> = (0..row.len()).collect();
    let top_n = top.min(row.len());
    if top_n > 0 {
        idx.select_nth_unstable_by(top_n - 1, |&a, &b| row[b].total_cmp(&row[a]));
        idx.truncate(top_n);
        idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    } else {
        idx.clear();
    }
    TokenLogprob {
        token: text(token),
        logprob: logprob(row, token as usize),
        top: idx
            .into_iter()
            .map(|i| (text(i as u32), logprob(row, i)))
            .collect(),
    }
}
