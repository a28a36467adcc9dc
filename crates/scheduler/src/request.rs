//! Requests as the client submits them, and the scheduler's per-request state.
//!
//! A sequence's tokens are `prompt ++ generated`, held in one vector; `num_computed` of them
//! have KV in the cache. The scheduler's only job is to bring `num_computed` up to
//! `tokens.len()`; whenever a chunk reaches the end, the next token is sampled and appended.

use std::fmt;

/// Why a request left the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// EOS or a stop string, decided by the engine through `Scheduler::finish`.
    Stop,
    /// `max_tokens` generated, the context (`max_model_len`) reached, or the sequence outgrew
    /// the whole KV cache.
    Length,
    /// The client went away (`Scheduler::abort`).
    Aborted,
    /// The step computing it failed; the request was ended with an error.
    Error,
}

impl FinishReason {
    /// The name used on the wire (`finish_reason`) and in logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Aborted => "abort",
            FinishReason::Error => "error",
        }
    }
}

impl fmt::Display for FinishReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// Never admitted yet.
    Waiting,
    /// Admitted: holds KV blocks and is scheduled each step while budget allows.
    Running,
    /// Was running, lost its blocks; waits to be recomputed from prompt + generated tokens.
    Preempted,
    /// Left the scheduler; reported in the next plan's `finished`, then forgotten.
    Finished(FinishReason),
}

/// A generation request. `priority` is a class: lower is more urgent (0 is the usual class;
/// negative values are allowed).
#[derive(Clone, PartialEq)]
pub struct Request {
    pub id: u64,
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub priority: i32,
    /// LoRA adapter; requests with different adapters never share KV blocks.
    pub adapter: Option<u64>,
}

impl Request {
    pub fn new(id: u64, prompt: Vec<u32>, max_tokens: usize) -> Self {
        Request {
            id,
            prompt,
            max_tokens,
            priority: 0,
            adapter: None,
        }
    }
    pub fn with_priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }
    pub fn with_adapter(mut self, adapter: Option<u64>) -> Self {
        self.adapter = adapter;
        self
    }
}

// Counts, not prompt text, in logs.
impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request")
            .field("id", &self.id)
            .field("prompt_tokens", &self.prompt.len())
            .field("max_tokens", &self.max_tokens)
            .field("priority", &self.priority)
            .field("adapter", &self.adapter)
            .finish()
    }
}

#[derive(Clone)]
pub(crate) struct SeqState {
    pub id: u64,
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    pub max_tokens: usize,
    pub priority: i32,
    pub adapter: Option<u64>,
    pub status: Status,
    pub num_computed: usize,
    /// Order of arrival; kept across preemption so a preempted request keeps its place.
    pub arrival: u64,
    /// Step at arrival (aging counts from here, also across preemption).
    pub arrival_step: u64,
    /// Order of the latest admission (preemption victims are the most recent).
    pub admitted: u64,
    /// Tokens proposed by a drafter to verify after the last known one, for the next
    /// `schedule` only (see `Scheduler::propose`).
    pub draft: Vec<u32>,
}

impl SeqState {
    pub fn new(req: Request, arrival: u64, arrival_step: u64) -> Self {
        SeqState {
            id: req.id,
            prompt_len: req.prompt.len(),
            tokens: req.prompt,
            max_tokens: req.max_tokens,
            priority: req.priority,
            adapter: req.adapter,
            status: Status::Waiting,
            num_computed: 0,
            arrival,
            arrival_step,
            admitted: 0,
            draft: Vec::new(),
        }
    }
    pub fn generated(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }
    pub fn remaining(&self) -> usize {
        self.tokens.len() - self.num_computed
    }
    pub fn is_live(&self) -> bool {
        !matches!(self.status, Status::Finished(_))
    }
}

impl fmt::Debug for SeqState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SeqState")
            .field("id", &self.id)
            .field("prompt_tokens", &self.prompt_len)
            .field("generated", &self.generated().len())
            .field("num_computed", &self.num_computed)
            .field("status", &self.status)
            .field("priority", &self.priority)
            .field("adapter", &self.adapter)
            .finish()
    }
}
