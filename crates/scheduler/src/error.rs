//! The one error type of the scheduler.

use tessera_kv::KvError;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchedError {
    /// The waiting queue holds `max_waiting` requests; retry later (HTTP 503/429).
    #[error("waiting queue full ({max_waiting} requests)")]
    QueueFull { max_waiting: usize },
    #[error("prompt of {len} tokens exceeds the context of {max_model_len}")]
    PromptTooLong { len: usize, max_model_len: usize },
    /// The prompt alone needs more KV blocks than the whole cache has.
    #[error("prompt needs {blocks} KV blocks, the cache has {capacity}")]
    ExceedsCache { blocks: usize, capacity: usize },
    #[error("invalid request {id}: {reason}")]
    InvalidRequest { id: u64, reason: String },
    #[error("request id {id} is already in use")]
    DuplicateId { id: u64 },
    #[error("invalid scheduler configuration: {reason}")]
    InvalidConfig { reason: String },
    /// `update` got no sampled token for a live sequence whose chunk wanted logits.
    #[error("no sampled token for request {id}, whose chunk wanted logits")]
    MissingSample { id: u64 },
    /// `update` got a token for a sequence whose chunk did not want logits, or two tokens.
    #[error("unexpected sampled token for request {id}")]
    UnexpectedSample { id: u64 },
    /// `StepPlan::validate` found a broken invariant.
    #[error("invalid step plan: {reason}")]
    InvalidPlan { reason: String },
    #[error(transparent)]
    Kv(#[from] KvError),
}
