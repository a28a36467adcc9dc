//! What front ends submit to the step engine and what they hear back, as plain data.

use std::sync::Arc;

pub use tessera_lora::LoraAdapter;
pub use tessera_scheduler::FinishReason;

use crate::sampling::SamplingParams;

/// One generation request (one choice; a front end submits `n` of them for `n` choices).
#[derive(Debug, Clone, Default)]
pub struct GenerateRequest {
    pub prompt_ids: Vec<u32>,
    pub max_tokens: usize,
    pub params: SamplingParams,
    pub stop: Vec<String>,
    /// Keep generating past EOS (benchmarks, golden checks).
    pub ignore_eos: bool,
    /// Report the log-probability of each token and of this many top alternatives.
    pub logprobs: Option<usize>,
    /// Priority class: lower runs first (0 is the usual class).
    pub priority: i32,
    /// The fine-tuned variant to run (`None`: the base model). The request holds it until it
    /// finishes, so unloading it elsewhere never changes this request's output.
    pub adapter: Option<Arc<LoraAdapter>>,
    /// What the output must match (a JSON schema, a regex, ...); `None`: anything.
    pub constraint: Option<crate::constrain::ConstraintSpec>,
    /// Most drafted tokens verified per step for this request, overriding the engine's
    /// speculative setting (0: no speculation); `None`: the engine's.
    pub spec_tokens: Option<usize>,
    /// Added to the logits of these token ids before sampling (greedy included), after the
    /// penalties and the grammar's mask: OpenAI's `logit_bias`, values in [-100, 100].
    pub logit_bias: Vec<(u32, f32)>,
}

/// One token's log-probability and its top alternatives.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f64,
    pub top: Vec<(String, f64)>,
}

/// What a request hears from the engine, in order: any number of `Text`, then exactly one of
/// `Finished` or `Failed`.
#[derive(Debug, Clone, PartialEq)]
pub enum RequestEvent {
    /// Tokens generated this step, the text they completed (possibly empty: held back by the
    /// stream decoder or a possible stop string), and their log-probabilities when asked.
    Text {
        text: String,
        tokens: Vec<u32>,
        logprobs: Vec<TokenLogprob>,
    },
    Finished {
        reason: FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
        /// Prompt tokens the prefix cache served at admission (their KV was reused).
        cached_tokens: usize,
        /// The index in the request's `stop` list of the stop string that ended it (`None`:
        /// the end-of-sequence token, a grammar's end, a limit).
        stop_index: Option<usize>,
    },
    /// The request was ended by an error (a failed or panicking step); its KV blocks are free.
    Failed { message: String },
}

/// Why a submission was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SubmitError {
    /// The request itself is invalid (parameters, prompt length).
    #[error("{0}")]
    Invalid(String),
    /// The engine is at capacity; retry later.
    #[error("{0}")]
    Overloaded(String),
}
