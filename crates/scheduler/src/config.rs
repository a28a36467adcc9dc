//! Scheduler configuration and the limits a [`crate::StepPlan`] is validated against.

use crate::{SchedError, TimeBudget};

#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerConfig {
    /// KV positions per block.
    pub block_size: usize,
    /// Blocks in the KV cache.
    pub num_blocks: usize,
    /// Token budget of one step: decode tokens plus prefill chunk tokens.
    pub max_num_batched_tokens: usize,
    /// Most sequences running at once (and so in one step).
    pub max_num_seqs: usize,
    /// Longest prefill chunk of one sequence in one step.
    pub max_prefill_chunk: usize,
    /// A chunk that does not finish the known tokens ends on a multiple of this many positions
    /// (1 = no rounding). Chunks that would round to nothing wait for the next step.
    pub chunk_align: usize,
    /// Context length: prompts longer are rejected, sequences reaching it finish (`Length`).
    pub max_model_len: usize,
    /// Bound of the waiting queue (`add_request` returns `QueueFull` beyond it).
    pub max_waiting: usize,
    /// A waiting request's priority class improves by one every `aging_steps` steps
    /// (0 = no aging).
    pub aging_steps: u64,
    /// Share full blocks of identical prefixes (per adapter).
    pub prefix_caching: bool,
    /// Emit each adapter's sequences as one contiguous run of the plan (see `scheduler`).
    pub group_by_adapter: bool,
    /// Only one adapter's sequences (or only the base model's) share a step, taking turns
    /// step by step, as llama.cpp's server batches: the baseline co-batching is measured
    /// against. Off by default.
    pub adapter_serial: bool,
    /// Fill steps by predicted time as well as tokens (see [`crate::cost`] and the
    /// scheduler's module docs); `None`: by tokens alone.
    pub time_budget: Option<TimeBudget>,
    /// Under a time budget, only *long prefills* are chunked by predicted time: sequences of
    /// more than this many known tokens (prompt, plus generated ones when recomputed). A
    /// shorter one is chunked by the token rules alone, as without a time budget: cutting a
    /// short prompt finer than the token budget only buys latency its own few steps cannot
    /// lose, and costs throughput (each extra step pays the step's fixed part again, and
    /// smaller matrix products run less efficiently). 0: every prefill is long.
    pub long_prefill_tokens: usize,
    /// A window group: the sliding-window layers' KV kept apart, each sequence holding only
    /// the blocks it still attends (`tessera_kv::KvManager::with_window`).
    pub window: Option<WindowGroup>,
}

/// The window group of a model with sliding-window layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowGroup {
    /// Positions the windowed layers attend back.
    pub window: usize,
    /// Blocks of the group's own storage.
    pub num_blocks: usize,
}

impl WindowGroup {
    /// Window blocks one sequence holds at most: those from `start + 1 - window` to the end
    /// of a chunk of `chunk`, plus the blocks of the step before it (released the next step).
    pub fn blocks_per_seq(&self, block_size: usize, chunk: usize) -> usize {
        (self.window + 2 * chunk).div_ceil(block_size) + 2
    }
}

impl SchedulerConfig {
    /// Defaults for a cache of `num_blocks` blocks of `block_size` positions.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        SchedulerConfig {
            block_size,
            num_blocks,
            max_num_batched_tokens: 2048,
            max_num_seqs: 64,
            max_prefill_chunk: 512,
            chunk_align: 1,
            max_model_len: 4096,
            max_waiting: 1024,
            aging_steps: 64,
            prefix_caching: true,
            group_by_adapter: true,
            adapter_serial: false,
            time_budget: None,
            long_prefill_tokens: 0,
            window: None,
        }
    }

    pub fn limits(&self) -> Limits {
        Limits {
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_num_seqs: self.max_num_seqs,
            block_size: self.block_size,
            max_model_len: self.max_model_len,
        }
    }

    pub fn validate(&self) -> Result<(), SchedError> {
        let fail = |reason: &str| {
            Err(SchedError::InvalidConfig {
                reason: reason.into(),
            })
        };
        if self.block_size == 0 || self.num_blocks == 0 {
            return fail("block_size and num_blocks must be positive");
        }
        if self.max_num_seqs == 0 || self.max_prefill_chunk == 0 || self.max_model_len == 0 {
            return fail("max_num_seqs, max_prefill_chunk and max_model_len must be positive");
        }
        // Every running sequence's decode token fits every step, so prefills never stall decodes.
        if self.max_num_batched_tokens < self.max_num_seqs {
            return fail("max_num_batched_tokens must be at least max_num_seqs");
        }
        if self.chunk_align == 0
            || self.chunk_align > self.max_prefill_chunk
            || self.chunk_align > self.max_num_batched_tokens
        {
            return fail(
                "chunk_align must be in 1..=min(max_prefill_chunk, max_num_batched_tokens)",
            );
        }
        if let Some(t) = &self.time_budget {
            t.validate()?;
        }
        if let Some(w) = &self.window {
            let chunk = self.max_prefill_chunk.min(self.max_num_batched_tokens);
            if w.window == 0 || w.num_blocks < w.blocks_per_seq(self.block_size, chunk) {
                return fail("the window group must hold at least one sequence's window");
            }
        }
        Ok(())
    }
}

/// What a plan must respect; see [`crate::StepPlan::validate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_num_batched_tokens: usize,
    pub max_num_seqs: usize,
    pub block_size: usize,
    pub max_model_len: usize,
}
