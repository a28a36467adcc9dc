//! One step's decisions as owned plain data, and the invariants every plan satisfies.
//!
//! The engine turns each [`ScheduledSeq`] into a model `SeqChunk` (`tokens`, `start_pos`,
//! `block_table`, logits `Last` when `wants_logits` else `None`), runs the forward, samples
//! one token per `wants_logits` entry and hands them, with the requests it ended (EOS, stop
//! strings, errors), to `Scheduler::update` as a [`StepResult`].

use std::collections::{HashMap, HashSet};

use crate::{FinishReason, Limits, SchedError};

/// One sequence's share of a step: compute `tokens` at positions
/// `start_pos..start_pos + tokens.len()`.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduledSeq {
    pub id: u64,
    /// Positions `0..start_pos` already have KV (computed earlier or prefix-cache hits).
    pub start_pos: usize,
    pub tokens: Vec<u32>,
    /// Physical blocks for positions `[i * block_size, (i + 1) * block_size)`; covers at least
    /// `start_pos + tokens.len()` positions.
    pub block_table: Vec<u32>,
    /// The chunk ends at the last known token: sample the next one from its last position.
    pub wants_logits: bool,
    pub adapter: Option<u64>,
    /// With a window group: its blocks by block index (`tessera_kv::DROPPED` where the
    /// sequence no longer attends them).
    pub window_table: Option<Vec<u32>>,
    /// Speculative verification: the last `draft` of `tokens` are drafted, not known. The
    /// engine needs logits for every row from the last known token on (`draft + 1` rows) and
    /// reports in [`StepResult::accepted`] how many drafts the target model agreed with.
    pub draft: usize,
}

impl ScheduledSeq {
    pub fn end_pos(&self) -> usize {
        self.start_pos + self.tokens.len()
    }
    /// Where the known tokens of the chunk end (drafts excluded).
    pub fn known_end(&self) -> usize {
        self.end_pos() - self.draft
    }
    /// The drafted tokens of a verification chunk.
    pub fn drafts(&self) -> &[u32] {
        &self.tokens[self.tokens.len() - self.draft..]
    }
}

/// What the engine made of a plan: plain data for `Scheduler::update`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StepResult {
    /// The token sampled for every entry that wanted logits (an EOS token included). For a
    /// verification chunk: the token sampled after its accepted drafts.
    pub sampled: Vec<(u64, u32)>,
    /// For verification chunks: how many of the drafts (a prefix of them) were accepted;
    /// a chunk missing here accepted none.
    pub accepted: Vec<(u64, usize)>,
    /// Requests the engine ended this step, with why: `Stop` for EOS or a stop string
    /// (their sampled token is not appended), `Error` for a failure.
    pub finished: Vec<(u64, FinishReason)>,
}

impl StepResult {
    /// A result with samples and no engine-side finishes.
    pub fn sampled(sampled: impl Into<Vec<(u64, u32)>>) -> Self {
        StepResult {
            sampled: sampled.into(),
            ..Default::default()
        }
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct StepPlan {
    /// Step number (1 for the first `schedule()`).
    pub step: u64,
    pub seqs: Vec<ScheduledSeq>,
    /// Requests preempted this step (KV freed; they will be recomputed).
    pub preempted: Vec<u64>,
    /// Requests that left since the previous plan, with why (finished, stopped, aborted).
    pub finished: Vec<(u64, FinishReason)>,
}

impl StepPlan {
    pub fn num_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.tokens.len()).sum()
    }
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }
    pub fn get(&self, id: u64) -> Option<&ScheduledSeq> {
        self.seqs.iter().find(|s| s.id == id)
    }

    /// Checks the invariants of a plan: budget and sequence count respected, no sequence twice,
    /// non-empty chunks inside the context, tables covering the chunk, and every block written
    /// this step (those covering `start_pos..end`) owned by that sequence alone. Blocks may
    /// appear in several tables only inside their untouched prefix: shared, refcounted, full
    /// prefix blocks.
    pub fn validate(&self, limits: &Limits) -> Result<(), SchedError> {
        let fail = |reason: String| Err(SchedError::InvalidPlan { reason });
        if self.seqs.len() > limits.max_num_seqs {
            return fail(format!(
                "{} sequences > max_num_seqs {}",
                self.seqs.len(),
                limits.max_num_seqs
            ));
        }
        if self.num_tokens() > limits.max_num_batched_tokens {
            return fail(format!(
                "{} tokens > budget {}",
                self.num_tokens(),
                limits.max_num_batched_tokens
            ));
        }
        let bs = limits.block_size;
        let mut ids = HashSet::new();
        // Block -> (sequence, whether that sequence writes it this step).
        let mut owners: HashMap<u32, (u64, bool)> = HashMap::new();
        for s in &self.seqs {
            if !ids.insert(s.id) {
                return fail(format!("request {} scheduled twice", s.id));
            }
            if s.tokens.is_empty() {
                return fail(format!("request {} has an empty chunk", s.id));
            }
            if s.draft > 0 && (s.draft >= s.tokens.len() || !s.wants_logits) {
                return fail(format!(
                    "request {} has a malformed verification chunk",
                    s.id
                ));
            }
            if s.end_pos() > limits.max_model_len {
                return fail(format!("request {} runs past the context", s.id));
            }
            if s.block_table.len() < s.end_pos().div_ceil(bs) {
                return fail(format!(
                    "request {}: {} blocks cannot hold {} positions",
                    s.id,
                    s.block_table.len(),
                    s.end_pos()
                ));
            }
            let written = s.start_pos / bs..s.end_pos().div_ceil(bs);
            let mut own = HashSet::new();
            for (i, &b) in s.block_table.iter().enumerate() {
                if !own.insert(b) {
                    return fail(format!("request {} holds block {b} twice", s.id));
                }
                let writes = written.contains(&i);
                if let Some(&(other, other_writes)) = owners.get(&b) {
                    if writes || other_writes {
                        return fail(format!(
                            "block {b} written by one of requests {other} and {} while shared",
                            s.id
                        ));
                    }
                }
                owners.insert(b, (s.id, writes));
            }
        }
        for &id in &self.preempted {
            if ids.contains(&id) {
                return fail(format!("request {id} both scheduled and preempted"));
            }
        }
        for &(id, _) in &self.finished {
            if ids.contains(&id) {
                return fail(format!("request {id} both scheduled and finished"));
            }
        }
        Ok(())
    }
}
