//! The hybrid step scheduler, after vLLM v1 (`vllm/v1/core/sched/scheduler.py`) and
//! Sarathi-Serve's stall-free batching: no prefill or decode phase, each sequence catches
//! `num_computed` up to its token count under one per-step budget: of tokens, and, with a
//! [`crate::TimeBudget`], of predicted time.
//!
//! A step is built in three passes, each spending the same budget:
//! 1. one decode token for every running sequence that is caught up (admission order);
//! 2. the next chunk of every running sequence still behind (unfinished prefill, or a resumed
//!    one recomputing), at most `max_prefill_chunk`, end rounded down to `chunk_align`; while
//!    admissible requests wait, these chunks leave half the budget free for pass 3, so a short
//!    request is not queued behind a long prompt's whole prefill;
//! 3. admissions from the waiting queue (see [`crate::policy`]) with a prefix-cache lookup,
//!    cached tokens counting as computed, while budget, `max_num_seqs` and blocks allow. The
//!    first request that does not fit stops admission (no overtaking), and nothing is admitted
//!    in a step that preempted. Admission never preempts.
//!
//! Since `max_num_batched_tokens >= max_num_seqs`, pass 1 always fits: a long prompt can never
//! stall decodes. When a running sequence cannot get a block, the victim chosen by
//! [`crate::policy::victim`] (possibly itself) loses all its blocks and returns to waiting as
//! `Preempted`, keeping its arrival order and aging; it is recomputed later from prompt +
//! generated tokens, most of it usually from the prefix cache. A victim already in the plan is
//! taken out and its tokens returned to the budget. A sequence that alone needs more blocks
//! than the cache has finishes with `Length`.
//!
//! ## Steps budgeted by predicted time
//!
//! Tokens are a poor measure of a step's time once prompts are long: a chunk deep in a
//! 3,600-token prompt attends thousands of keys per token and costs several times what a
//! chunk at its start does, so a token budget that keeps shallow steps short lets deep ones
//! run for most of a second, and a short request arriving meanwhile waits for that step and
//! then shares the next. With `time_budget` set ([`crate::TimeBudget`]: a
//! [`crate::StepCost`] fitted by the engine from its measured stage profile, and a budget in
//! seconds), passes 2 and 3 fill the step until its *predicted* time reaches the budget (the
//! token budget stays an upper limit), so deep chunks get fewer tokens
//! ([`timed`] holds the arithmetic). Only long prefills are sized by time: a sequence of at
//! most `long_prefill_tokens` known tokens gets its chunks by the token rules above, wherever
//! the rules below size one (its chunks still count in the step's predicted time):
//!
//! - the budget is raised, if need be, so the fixed parts take at most a quarter of a step
//!   ([`crate::TimeBudget::effective_s`]: on a machine too slow or too busy for the budget,
//!   steps still amortize their overhead);
//! - the decodes always run; prefill work (pass 2 and 3 together) gets what they leave of
//!   the budget, and at least a quarter of it however many decodes there are;
//! - while a request waits, the head of the queue decides the split. If its whole remaining
//!   prompt fits in the prefill time (a short request), the step is a *short step*: no
//!   running chunk (but the oldest's minimum chunk when the step before was a short step
//!   too), then the head and any other waiting request that fits whole, and nothing more:
//!   the head's time to first token is this step's time, so the step is as short as the
//!   head's own prefill. Otherwise running chunks get half the prefill time, the head and
//!   those after it the rest, and what admissions leave goes back to the running chunks;
//! - running chunks go oldest first, up to an eighth of the prefill time and at least one
//!   token (or up to the next `chunk_align` boundary), so a long prefill progresses at least
//!   every other step whatever arrives; then shortest remaining first, so a chunked short
//!   prompt finishes before long ones go on. When nothing at all progressed, the head of the
//!   queue is admitted with that minimum chunk, so even a budget too small for one token
//!   moves the queue.
//!
//! A step's predicted time therefore stays within the budget except for the mandatory part:
//! the decodes with the fixed parts, the prefill floor when decodes alone fill the budget,
//! and one minimum chunk. A short request arriving while long prompts
//! prefill waits for the step in flight (at most one budget) and then one short step.
//!
//! With `adapter_serial`, a step takes the sequences of one adapter only (the running
//! adapters take turns step by step; with none running, the first admissible request's).
//!
//! Plan order: scheduling order (decodes, chunks, admissions), then, with `group_by_adapter`,
//! stably grouped so each adapter's sequences form one contiguous run (fewer LoRA segments).
//!
//! State changes only in `schedule` (allocations, admissions, preemptions) and in `update`,
//! `finish` and `abort`; `num_computed` advances in `update`, so a plan is applied exactly
//! once (a stale entry, whose `start_pos` no longer matches, is skipped). Building a step is
//! in `fill` (the decode pass, the token-budget passes, what both budgets share) and
//! [`timed`] (the time-budget passes).

mod fill;
pub mod timed;

use std::collections::{HashMap, HashSet};

use tessera_kv::{KvManager, KvMetrics};

use crate::plan::{ScheduledSeq, StepPlan, StepResult};
use crate::request::{FinishReason, Request, SeqState, Status};
use crate::{SchedError, SchedulerConfig, TimeBudget};

#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    kv: KvManager,
    seqs: HashMap<u64, SeqState>,
    /// Waiting and preempted ids, unordered (ordered per step by the admission key).
    waiting: Vec<u64>,
    /// Running ids in admission order.
    running: Vec<u64>,
    /// Left since the last plan.
    finished: Vec<(u64, FinishReason)>,
    step: u64,
    next_arrival: u64,
    next_admission: u64,
    /// The last step was a short step in which the oldest running prefill got nothing (the
    /// next one gives it its minimum chunk; see `timed`).
    oldest_skipped: bool,
}

/// A scheduling decision before it becomes a [`ScheduledSeq`].
#[derive(Debug, Clone, Copy)]
struct Pick {
    id: u64,
    start: usize,
    len: usize,
    /// The chunk reaches the sequence's last known token (samples the next).
    logits: bool,
    /// Drafted tokens appended to the chunk for verification (counted in `len`).
    draft: usize,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig) -> Result<Self, SchedError> {
        cfg.validate()?;
        Ok(Scheduler {
            kv: match cfg.window {
                None => KvManager::new(cfg.num_blocks, cfg.block_size, cfg.prefix_caching)?,
                Some(w) => KvManager::with_window(
                    cfg.num_blocks,
                    cfg.block_size,
                    cfg.prefix_caching,
                    w.window,
                    w.num_blocks,
                )?,
            },
            cfg,
            seqs: HashMap::new(),
            waiting: Vec::new(),
            running: Vec::new(),
            finished: Vec::new(),
            step: 0,
            next_arrival: 0,
            next_admission: 0,
            oldest_skipped: false,
        })
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }
    pub fn kv(&self) -> &KvManager {
        &self.kv
    }
    pub fn kv_metrics(&self) -> KvMetrics {
        self.kv.metrics()
    }
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }
    pub fn num_running(&self) -> usize {
        self.running.len()
    }
    /// Requests waiting or running.
    pub fn has_unfinished(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }
    /// `None` for unknown ids and for finished ones already reported in a plan.
    pub fn status(&self, id: u64) -> Option<Status> {
        self.seqs.get(&id).map(|s| s.status)
    }
    pub fn num_computed(&self, id: u64) -> Option<usize> {
        self.seqs.get(&id).map(|s| s.num_computed)
    }
    /// Tokens generated so far (kept until the finish is reported).
    pub fn generated(&self, id: u64) -> Option<&[u32]> {
        self.seqs.get(&id).map(|s| s.generated())
    }

    /// The whole token sequence (prompt and generated) of a live request.
    pub fn tokens(&self, id: u64) -> Option<&[u32]> {
        self.seqs.get(&id).map(|s| s.tokens.as_slice())
    }

    /// Tokens request `id` may still generate (`max_tokens` less those generated).
    pub fn tokens_left(&self, id: u64) -> Option<usize> {
        self.seqs
            .get(&id)
            .map(|s| s.max_tokens.saturating_sub(s.generated().len()))
    }

    /// Running requests whose every known token has KV: the next step decodes them, and a
    /// drafter may propose tokens for them to verify ([`Scheduler::propose`]).
    pub fn decoding(&self) -> Vec<u64> {
        self.running
            .iter()
            .copied()
            .filter(|id| {
                self.seqs
                    .get(id)
                    .is_some_and(|s| s.status == Status::Running && s.remaining() == 1)
            })
            .collect()
    }

    /// Proposes `draft` as the tokens following request `id`'s last known one, to be
    /// verified in the next step alongside its decode token. The next `schedule` takes as
    /// many as its token budget, the blocks free without preemption, the context and
    /// `max_tokens` allow (possibly none), and forgets the rest. Returns false, keeping
    /// nothing, unless `id` is decoding ([`Scheduler::decoding`]).
    pub fn propose(&mut self, id: u64, draft: Vec<u32>) -> bool {
        match self.seqs.get_mut(&id) {
            Some(s) if s.status == Status::Running && s.remaining() == 1 => {
                s.draft = draft;
                true
            }
            _ => false,
        }
    }

    /// Replaces the step-time budget from the next `schedule` on (the engine refits the
    /// step cost to the steps it measures). An invalid one is refused and nothing changes.
    pub fn set_time_budget(&mut self, t: Option<TimeBudget>) -> Result<(), SchedError> {
        if let Some(t) = &t {
            t.validate()?;
        }
        self.cfg.time_budget = t;
        Ok(())
    }

    /// Queues a request. Rejects it at once if it can never run or the queue is full.
    pub fn add_request(&mut self, req: Request) -> Result<(), SchedError> {
        let id = req.id;
        if self.seqs.contains_key(&id) {
            return Err(SchedError::DuplicateId { id });
        }
        if req.prompt.is_empty() || req.max_tokens == 0 {
            return Err(SchedError::InvalidRequest {
                id,
                reason: "empty prompt or max_tokens 0".into(),
            });
        }
        if req.prompt.len() > self.cfg.max_model_len {
            return Err(SchedError::PromptTooLong {
                len: req.prompt.len(),
                max_model_len: self.cfg.max_model_len,
            });
        }
        let blocks = self.kv.blocks_for(req.prompt.len());
        if blocks > self.cfg.num_blocks {
            return Err(SchedError::ExceedsCache {
                blocks,
                capacity: self.cfg.num_blocks,
            });
        }
        if self.waiting.len() >= self.cfg.max_waiting {
            return Err(SchedError::QueueFull {
                max_waiting: self.cfg.max_waiting,
            });
        }
        let st = SeqState::new(req, self.next_arrival, self.step);
        self.next_arrival += 1;
        self.seqs.insert(id, st);
        self.waiting.push(id);
        Ok(())
    }

    /// Ends a live request for `reason` (EOS or stop string: `Stop`) and frees its blocks at
    /// once. Returns false if it is unknown or already finished.
    pub fn finish(&mut self, id: u64, reason: FinishReason) -> bool {
        let Some(st) = self.seqs.get_mut(&id) else {
            return false;
        };
        if !st.is_live() {
            return false;
        }
        st.status = Status::Finished(reason);
        self.running.retain(|&r| r != id);
        self.waiting.retain(|&w| w != id);
        if self.kv.has_seq(id) {
            // Known to exist: cannot fail.
            let _ = self.kv.free_seq(id);
        }
        self.finished.push((id, reason));
        true
    }

    /// The client went away: frees everything the request holds, wherever it is.
    pub fn abort(&mut self, id: u64) -> bool {
        self.finish(id, FinishReason::Aborted)
    }

    /// Applies a step's results: first ends the requests the engine finished (EOS, stop
    /// strings, errors: their blocks are freed and their sampled token dropped), then, for
    /// every other entry, advances `num_computed`, appends the sampled token of each chunk
    /// that wanted logits (after a verification chunk's accepted drafts, releasing the
    /// blocks only its rejected ones used), registers newly full blocks in the prefix cache and finishes
    /// sequences at `max_tokens` or the context (`Length`). Entries for requests aborted or
    /// finished since the plan are skipped. All-or-nothing: a missing or unexpected sample is
    /// an error before anything changes. Returns the requests finished here for `Length`.
    pub fn update(
        &mut self,
        plan: &StepPlan,
        result: &StepResult,
    ) -> Result<Vec<(u64, FinishReason)>, SchedError> {
        let wanting: HashSet<u64> = plan
            .seqs
            .iter()
            .filter(|s| s.wants_logits)
            .map(|s| s.id)
            .collect();
        let mut tokens: HashMap<u64, u32> = HashMap::new();
        for &(id, t) in &result.sampled {
            if !wanting.contains(&id) || tokens.insert(id, t).is_some() {
                return Err(SchedError::UnexpectedSample { id });
            }
        }
        let mut accepted: HashMap<u64, usize> = HashMap::new();
        for &(id, a) in &result.accepted {
            let ok = plan.get(id).is_some_and(|s| a <= s.draft);
            if !ok || accepted.insert(id, a).is_some() {
                return Err(SchedError::UnexpectedSample { id });
            }
        }
        let ended: HashSet<u64> = result.finished.iter().map(|f| f.0).collect();
        for s in plan
            .seqs
            .iter()
            .filter(|s| s.wants_logits && !ended.contains(&s.id) && self.entry_is_live(s))
        {
            if !tokens.contains_key(&s.id) {
                return Err(SchedError::MissingSample { id: s.id });
            }
        }

        for &(id, reason) in &result.finished {
            self.finish(id, reason);
        }
        let mut done = Vec::new();
        for s in &plan.seqs {
            if !self.entry_is_live(s) {
                continue;
            }
            let Some(st) = self.seqs.get_mut(&s.id) else {
                continue;
            };
            if s.draft > 0 {
                // The accepted drafts and the token after them become known; the KV of the
                // rejected positions is given back.
                let a = accepted.get(&s.id).copied().unwrap_or(0);
                st.tokens.extend_from_slice(&s.drafts()[..a]);
                st.num_computed = s.known_end() + a;
                self.kv.truncate(s.id, st.num_computed)?;
            } else {
                st.num_computed = s.end_pos();
            }
            if s.wants_logits && st.num_computed == st.tokens.len() {
                if let Some(&t) = tokens.get(&s.id) {
                    st.tokens.push(t);
                }
            }
            let computed = &st.tokens[..st.num_computed];
            self.kv.commit_full_blocks(s.id, computed)?;
            let over =
                st.generated().len() >= st.max_tokens || st.tokens.len() >= self.cfg.max_model_len;
            if over && self.finish(s.id, FinishReason::Length) {
                done.push((s.id, FinishReason::Length));
            }
        }
        Ok(done)
    }

    /// Whether a plan entry still applies: its request runs and is where the plan left it.
    fn entry_is_live(&self, s: &ScheduledSeq) -> bool {
        self.seqs.get(&s.id).is_some_and(|st| {
            st.status == Status::Running
                && st.num_computed == s.start_pos
                && s.known_end() <= st.tokens.len()
        })
    }

    /// Consistency of the scheduler with its KV bookkeeping (for tests; O(blocks + requests)).
    pub fn check(&self) -> Result<(), SchedError> {
        self.kv.check()?;
        let fail = |reason: String| Err(SchedError::InvalidPlan { reason });
        for &id in &self.running {
            let Some(st) = self.seqs.get(&id) else {
                return fail(format!("running {id} has no state"));
            };
            if st.status != Status::Running {
                return fail(format!("running {id} has status {:?}", st.status));
            }
            let table = self.kv.block_table(id).map_or(0, |t| t.len());
            if table < self.kv.blocks_for(st.num_computed) {
                return fail(format!("running {id} has too few blocks"));
            }
            if st.num_computed > st.tokens.len() {
                return fail(format!("running {id} computed past its tokens"));
            }
        }
        for &id in &self.waiting {
            match self.seqs.get(&id) {
                Some(st) if matches!(st.status, Status::Waiting | Status::Preempted) => {}
                _ => return fail(format!("waiting {id} in a wrong state")),
            }
            if self.kv.has_seq(id) {
                return fail(format!("waiting {id} holds blocks"));
            }
        }
        if self.kv.num_seqs() != self.running.len() {
            return fail("block tables for requests not running".into());
        }
        let live = self.seqs.values().filter(|s| s.is_live()).count();
        if live != self.running.len() + self.waiting.len() {
            return fail("live requests neither running nor waiting".into());
        }
        Ok(())
    }
}
