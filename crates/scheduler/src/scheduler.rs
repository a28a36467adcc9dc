//! The hybrid step scheduler, after vLLM v1 (`vllm/v1/core/sched/scheduler.py`) and
//! Sarathi-Serve's stall-free batching: no prefill or decode phase, each sequence catches
//! `num_computed` up to its token count under one per-step token budget.
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
//! With `adapter_serial`, a step takes the sequences of one adapter only (the running
//! adapters take turns step by step; with none running, the first admissible request's).
//!
//! Plan order: scheduling order (decodes, chunks, admissions), then, with `group_by_adapter`,
//! stably grouped so each adapter's sequences form one contiguous run (fewer LoRA segments).
//!
//! State changes only in `schedule` (allocations, admissions, preemptions) and in `update`,
//! `finish` and `abort`; `num_computed` advances in `update`, so a plan is applied exactly
//! once (a stale entry, whose `start_pos` no longer matches, is skipped).

use std::collections::{HashMap, HashSet};

use tessera_kv::{KvError, KvManager, KvMetrics};

use crate::plan::{ScheduledSeq, StepPlan, StepResult};
use crate::policy;
use crate::request::{FinishReason, Request, SeqState, Status};
use crate::{SchedError, SchedulerConfig};

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
}

/// A scheduling decision before it becomes a [`ScheduledSeq`].
#[derive(Debug, Clone, Copy)]
struct Pick {
    id: u64,
    start: usize,
    len: usize,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig) -> Result<Self, SchedError> {
        cfg.validate()?;
        Ok(Scheduler {
            kv: KvManager::new(cfg.num_blocks, cfg.block_size, cfg.prefix_caching)?,
            cfg,
            seqs: HashMap::new(),
            waiting: Vec::new(),
            running: Vec::new(),
            finished: Vec::new(),
            step: 0,
            next_arrival: 0,
            next_admission: 0,
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

    /// Chunk length for a sequence at `start` with `remaining` tokens and `budget` left.
    fn chunk_len(&self, start: usize, remaining: usize, budget: usize) -> usize {
        let n = remaining.min(budget).min(self.cfg.max_prefill_chunk);
        if n == remaining || self.cfg.chunk_align <= 1 {
            return n;
        }
        let end = (start + n) / self.cfg.chunk_align * self.cfg.chunk_align;
        end.saturating_sub(start)
    }

    /// Builds the next step. Never fails: requests that cannot proceed are preempted or
    /// finished and reported in the plan.
    pub fn schedule(&mut self) -> StepPlan {
        self.step += 1;
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut picks: Vec<Pick> = Vec::new();
        let mut preempted: Vec<u64> = Vec::new();
        let mut deferred: Vec<u64> = Vec::new();

        // While requests wait and could be admitted, partial prefills of running sequences
        // leave half the budget to them: a short request arriving during a long prompt's
        // prefill starts in the next step instead of after the whole prompt.
        let reserve = if !self.waiting.is_empty() && self.running.len() < self.cfg.max_num_seqs {
            self.cfg.max_num_batched_tokens / 2
        } else {
            0
        };
        let only = self.serial_adapter();
        let excluded = |st: &SeqState| only.is_some_and(|a| st.adapter != a);
        // Passes 1 and 2: running sequences, decodes first.
        for decode_pass in [true, false] {
            for id in self.running.clone() {
                let Some(st) = self.seqs.get(&id) else {
                    continue;
                };
                if st.status != Status::Running || picks.iter().any(|p| p.id == id) || excluded(st)
                {
                    continue;
                }
                let remaining = st.remaining();
                if (remaining == 1) != decode_pass || remaining == 0 {
                    continue;
                }
                let start = st.num_computed;
                let avail = if decode_pass {
                    budget
                } else {
                    budget.saturating_sub(reserve)
                };
                let len = self.chunk_len(start, remaining, avail);
                if len == 0 {
                    if !decode_pass && reserve > 0 {
                        deferred.push(id);
                    }
                    continue;
                }
                if self.grow_or_preempt(id, start + len, &mut picks, &mut budget, &mut preempted) {
                    picks.push(Pick { id, start, len });
                    budget -= len;
                }
            }
        }

        // Pass 3: admissions.
        if preempted.is_empty() {
            self.admit(&mut picks, &mut budget, only);
        }

        // Pass 2 again for chunks the reserve held back, with what admissions left over, so
        // running prefills always progress when nothing could be admitted.
        for id in deferred {
            let Some(st) = self.seqs.get(&id) else {
                continue;
            };
            if st.status != Status::Running || picks.iter().any(|p| p.id == id) {
                continue;
            }
            let (start, remaining) = (st.num_computed, st.remaining());
            let len = self.chunk_len(start, remaining, budget);
            if len > 0
                && self.grow_or_preempt(id, start + len, &mut picks, &mut budget, &mut preempted)
            {
                picks.push(Pick { id, start, len });
                budget -= len;
            }
        }

        let plan = self.build_plan(picks, preempted);
        debug_assert!(
            plan.validate(&self.cfg.limits()).is_ok(),
            "{:?}",
            plan.validate(&self.cfg.limits())
        );
        plan
    }

    /// Makes `id`'s table cover `positions`, preempting victims as needed. Returns false if
    /// `id` itself was preempted or finished instead.
    fn grow_or_preempt(
        &mut self,
        id: u64,
        positions: usize,
        picks: &mut Vec<Pick>,
        budget: &mut usize,
        preempted: &mut Vec<u64>,
    ) -> bool {
        loop {
            match self.kv.allocate_for(id, positions) {
                Ok(()) => return true,
                Err(KvError::OutOfBlocks { .. }) => {}
                Err(_) => return false,
            }
            if self.kv.blocks_for(positions) > self.cfg.num_blocks {
                self.finish(id, FinishReason::Length);
                return false;
            }
            let candidates: Vec<(u64, (i32, u64))> = self
                .running
                .iter()
                .filter_map(|r| self.seqs.get(r).map(|s| (*r, (s.priority, s.admitted))))
                .collect();
            let Some(v) = policy::victim(candidates.iter().map(|c| c.1)) else {
                return false;
            };
            let victim = candidates[v].0;
            if let Some(i) = picks.iter().position(|p| p.id == victim) {
                *budget += picks.remove(i).len;
            }
            self.preempt(victim);
            preempted.push(victim);
            if victim == id {
                return false;
            }
        }
    }

    fn preempt(&mut self, id: u64) {
        if self.kv.has_seq(id) {
            let _ = self.kv.free_seq(id);
        }
        self.running.retain(|&r| r != id);
        if let Some(st) = self.seqs.get_mut(&id) {
            st.status = Status::Preempted;
            st.num_computed = 0;
            self.waiting.push(id);
        }
    }

    /// Waiting ids in admission order.
    fn admission_order(&self) -> Vec<u64> {
        let (step, aging) = (self.step, self.cfg.aging_steps);
        let mut order: Vec<(i64, u64, u64)> = self
            .waiting
            .iter()
            .filter_map(|id| self.seqs.get(id))
            .map(|s| {
                let waited = step.saturating_sub(s.arrival_step);
                let (p, a) = policy::admission_key(s.priority, s.arrival, waited, aging);
                (p, a, s.id)
            })
            .collect();
        order.sort_unstable();
        order.into_iter().map(|o| o.2).collect()
    }

    /// With `adapter_serial`, the one adapter (`Some(None)`: the base model) this step runs.
    fn serial_adapter(&self) -> Option<Option<u64>> {
        if !self.cfg.adapter_serial {
            return None;
        }
        let mut active: Vec<Option<u64>> = Vec::new();
        for st in self.running.iter().filter_map(|id| self.seqs.get(id)) {
            if !active.contains(&st.adapter) {
                active.push(st.adapter);
            }
        }
        if active.is_empty() {
            let first = self.admission_order().first().copied()?;
            return Some(self.seqs.get(&first)?.adapter);
        }
        Some(active[(self.step as usize) % active.len()])
    }

    fn admit(&mut self, picks: &mut Vec<Pick>, budget: &mut usize, only: Option<Option<u64>>) {
        let mut order = self.admission_order();
        if let Some(a) = only {
            order.retain(|id| self.seqs.get(id).is_some_and(|s| s.adapter == a));
        }
        for id in order {
            if self.running.len() >= self.cfg.max_num_seqs || *budget == 0 {
                break;
            }
            let Some(st) = self.seqs.get(&id) else {
                continue;
            };
            let cached = self.kv.peek_prefix(st.adapter, &st.tokens);
            let len = self.chunk_len(cached, st.tokens.len() - cached, *budget);
            if len == 0 {
                break;
            }
            match self.kv.admit(id, st.adapter, &st.tokens, cached + len) {
                Ok(c) => debug_assert_eq!(c, cached),
                Err(_) => break,
            }
            let admitted = self.next_admission;
            self.next_admission += 1;
            if let Some(st) = self.seqs.get_mut(&id) {
                st.status = Status::Running;
                st.num_computed = cached;
                st.admitted = admitted;
            }
            self.waiting.retain(|&w| w != id);
            self.running.push(id);
            picks.push(Pick {
                id,
                start: cached,
                len,
            });
            *budget -= len;
        }
    }

    fn build_plan(&mut self, picks: Vec<Pick>, preempted: Vec<u64>) -> StepPlan {
        let mut seqs: Vec<ScheduledSeq> = picks
            .into_iter()
            .filter_map(|p| {
                let st = self.seqs.get(&p.id)?;
                let end = p.start + p.len;
                Some(ScheduledSeq {
                    id: p.id,
                    start_pos: p.start,
                    tokens: st.tokens[p.start..end].to_vec(),
                    block_table: self.kv.block_table(p.id)?.to_vec(),
                    wants_logits: end == st.tokens.len(),
                    adapter: st.adapter,
                })
            })
            .collect();
        if self.cfg.group_by_adapter {
            seqs = policy::group_stable(seqs, |s| s.adapter);
        }
        let finished = std::mem::take(&mut self.finished);
        for (id, _) in &finished {
            if self.seqs.get(id).is_some_and(|s| !s.is_live()) {
                self.seqs.remove(id);
            }
        }
        StepPlan {
            step: self.step,
            seqs,
            preempted,
            finished,
        }
    }

    /// Applies a step's results: first ends the requests the engine finished (EOS, stop
    /// strings, errors: their blocks are freed and their sampled token dropped), then, for
    /// every other entry, advances `num_computed`, appends the sampled token of each chunk
    /// that wanted logits, registers newly full blocks in the prefix cache and finishes
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
            st.num_computed = s.end_pos();
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
                && s.end_pos() <= st.tokens.len()
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
