//! Building one step: the decode pass every step starts with, the token-budget passes
//! (chunked prefills, admissions, the deferred chunks), and what both budgets share: chunk
//! lengths, block growth with preemption, admission order and the plan itself. The
//! time-budget passes are in [`super::timed`].

use tessera_kv::KvError;

use super::{Pick, Scheduler};
use crate::plan::{ScheduledSeq, StepPlan};
use crate::policy;
use crate::request::{FinishReason, SeqState, Status};

/// A step under construction: tokens left in the token budget, the picks so far and the
/// requests preempted to make room.
pub(super) struct Fill {
    pub budget: usize,
    pub picks: Vec<Pick>,
    pub preempted: Vec<u64>,
    /// With `adapter_serial`, the one adapter this step runs.
    pub only: Option<Option<u64>>,
    /// Requests wait and could be admitted (decided before the decode pass).
    pub waiting: bool,
}

impl Fill {
    pub fn has(&self, id: u64) -> bool {
        self.picks.iter().any(|p| p.id == id)
    }
    pub fn excluded(&self, st: &SeqState) -> bool {
        self.only.is_some_and(|a| st.adapter != a)
    }
}

/// How an admission's chunk is sized.
#[derive(Debug, Clone, Copy)]
pub(super) enum AdmitBy {
    /// By the token budget alone.
    Tokens,
    /// By the token budget and the predicted step time reaching `limit_s`; with
    /// `whole_only`, only requests whose whole remaining prompt fits are admitted.
    Time { limit_s: f64, whole_only: bool },
    /// The first request only, with its minimum chunk (see `timed`).
    Minimum,
}

impl Scheduler {
    /// Chunk length for a sequence at `start` with `remaining` tokens and `budget` left.
    pub(super) fn chunk_len(&self, start: usize, remaining: usize, budget: usize) -> usize {
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
        let mut f = Fill {
            budget: self.cfg.max_num_batched_tokens,
            picks: Vec::new(),
            preempted: Vec::new(),
            only: self.serial_adapter(),
            waiting: !self.waiting.is_empty() && self.running.len() < self.cfg.max_num_seqs,
        };
        self.schedule_decodes(&mut f);
        self.extend_drafts(&mut f);
        match self.cfg.time_budget {
            Some(t) => self.fill_by_time(&mut f, &t),
            None => self.fill_by_tokens(&mut f),
        }
        let plan = self.build_plan(f.picks, f.preempted);
        for st in self.seqs.values_mut() {
            st.draft.clear();
        }
        debug_assert!(
            plan.validate(&self.cfg.limits()).is_ok(),
            "{:?}",
            plan.validate(&self.cfg.limits())
        );
        plan
    }

    /// Pass 1: one token for every running sequence that is caught up.
    fn schedule_decodes(&mut self, f: &mut Fill) {
        for id in self.running.clone() {
            let Some(st) = self.seqs.get(&id) else {
                continue;
            };
            if st.status != Status::Running || f.has(id) || f.excluded(st) || st.remaining() != 1 {
                continue;
            }
            let start = st.num_computed;
            if f.budget > 0 && self.grow_or_preempt(id, start + 1, f) {
                self.push_pick(f, id, start, 1);
            }
        }
    }

    /// Appends the proposed drafts to the decode picks: as many as the token budget left
    /// after every decode, the blocks available without preempting anyone, the context and
    /// `max_tokens` allow. A verification of `k` drafts makes at most `k + 1` tokens known.
    fn extend_drafts(&mut self, f: &mut Fill) {
        for i in 0..f.picks.len() {
            let p = f.picks[i];
            let Some(st) = self.seqs.get(&p.id) else {
                continue;
            };
            if st.draft.is_empty() || p.len != 1 || !p.logits {
                continue;
            }
            let known = st.tokens.len();
            let left = st.max_tokens.saturating_sub(st.generated().len());
            let k = st
                .draft
                .len()
                .min(f.budget)
                .min(self.cfg.max_model_len.saturating_sub(known + 1))
                .min(left.saturating_sub(1));
            if k == 0 {
                continue;
            }
            let end = p.start + 1 + k;
            let k = match self.kv.allocate_for(p.id, end) {
                Ok(()) => k,
                // What the table already covers: drafts never take blocks from others.
                Err(_) => {
                    let have = self.kv.block_table(p.id).map_or(0, <[u32]>::len);
                    (have * self.cfg.block_size)
                        .saturating_sub(p.start + 1)
                        .min(k)
                }
            };
            if k > 0 {
                f.picks[i].len += k;
                f.picks[i].draft = k;
                f.budget -= k;
            }
        }
    }

    /// Records a pick of `len` tokens of `id` from `start` and spends its tokens.
    pub(super) fn push_pick(&self, f: &mut Fill, id: u64, start: usize, len: usize) {
        let logits = self
            .seqs
            .get(&id)
            .is_some_and(|st| start + len == st.tokens.len());
        f.picks.push(Pick {
            id,
            start,
            len,
            logits,
            draft: 0,
        });
        f.budget -= len;
    }

    /// Passes 2 and 3 by tokens: the chunks of running sequences still behind (leaving half
    /// the budget while requests wait), admissions, then the chunks the reserve held back.
    fn fill_by_tokens(&mut self, f: &mut Fill) {
        // While requests wait and could be admitted, partial prefills of running sequences
        // leave half the budget to them: a short request arriving during a long prompt's
        // prefill starts in the next step instead of after the whole prompt.
        let reserve = if f.waiting {
            self.cfg.max_num_batched_tokens / 2
        } else {
            0
        };
        let mut deferred: Vec<u64> = Vec::new();
        for id in self.running.clone() {
            let Some(st) = self.seqs.get(&id) else {
                continue;
            };
            if st.status != Status::Running || f.has(id) || f.excluded(st) || st.remaining() <= 1 {
                continue;
            }
            let (start, remaining) = (st.num_computed, st.remaining());
            let len = self.chunk_len(start, remaining, f.budget.saturating_sub(reserve));
            if len == 0 {
                if reserve > 0 {
                    deferred.push(id);
                }
                continue;
            }
            if self.grow_or_preempt(id, start + len, f) {
                self.push_pick(f, id, start, len);
            }
        }

        // Pass 3: admissions.
        if f.preempted.is_empty() {
            self.admit(f, AdmitBy::Tokens);
        }

        // Pass 2 again for chunks the reserve held back, with what admissions left over, so
        // running prefills always progress when nothing could be admitted.
        for id in deferred {
            let Some(st) = self.seqs.get(&id) else {
                continue;
            };
            if st.status != Status::Running || f.has(id) {
                continue;
            }
            let (start, remaining) = (st.num_computed, st.remaining());
            let len = self.chunk_len(start, remaining, f.budget);
            if len > 0 && self.grow_or_preempt(id, start + len, f) {
                self.push_pick(f, id, start, len);
            }
        }
    }

    /// Makes `id`'s table cover `positions`, preempting victims as needed. Returns false if
    /// `id` itself was preempted or finished instead.
    pub(super) fn grow_or_preempt(&mut self, id: u64, positions: usize, f: &mut Fill) -> bool {
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
            if let Some(i) = f.picks.iter().position(|p| p.id == victim) {
                f.budget += f.picks.remove(i).len;
            }
            self.preempt(victim);
            f.preempted.push(victim);
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

    /// Waiting ids in admission order (with `adapter_serial`, of this step's adapter only).
    pub(super) fn admission_order(&self, only: Option<Option<u64>>) -> Vec<u64> {
        let (step, aging) = (self.step, self.cfg.aging_steps);
        let mut order: Vec<(i64, u64, u64)> = self
            .waiting
            .iter()
            .filter_map(|id| self.seqs.get(id))
            .filter(|s| only.is_none_or(|a| s.adapter == a))
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
            let first = self.admission_order(None).first().copied()?;
            return Some(self.seqs.get(&first)?.adapter);
        }
        Some(active[(self.step as usize) % active.len()])
    }

    /// Pass 3: admissions in order while the budget (and `by`), `max_num_seqs` and blocks
    /// allow; the first request that does not fit stops them. Returns how many were
    /// admitted.
    pub(super) fn admit(&mut self, f: &mut Fill, by: AdmitBy) -> usize {
        let mut admitted = 0;
        for id in self.admission_order(f.only) {
            if self.running.len() >= self.cfg.max_num_seqs || f.budget == 0 {
                break;
            }
            let Some(st) = self.seqs.get(&id) else {
                continue;
            };
            let cached = self.kv.peek_prefix(st.adapter, &st.tokens);
            let remaining = st.tokens.len() - cached;
            let len = match by {
                AdmitBy::Tokens => self.chunk_len(cached, remaining, f.budget),
                AdmitBy::Time {
                    limit_s,
                    whole_only,
                } => {
                    let n = self.fit_time(f, st.tokens.len(), cached, remaining, f.budget, limit_s);
                    if whole_only && n < remaining {
                        0
                    } else {
                        n
                    }
                }
                AdmitBy::Minimum => {
                    let n = self.min_chunk(cached, remaining);
                    if admitted > 0 || n > f.budget {
                        0
                    } else {
                        n
                    }
                }
            };
            if len == 0 {
                break;
            }
            match self.kv.admit(id, st.adapter, &st.tokens, cached + len) {
                Ok(c) => debug_assert_eq!(c, cached),
                Err(_) => break,
            }
            let order = self.next_admission;
            self.next_admission += 1;
            if let Some(st) = self.seqs.get_mut(&id) {
                st.status = Status::Running;
                st.num_computed = cached;
                st.admitted = order;
            }
            self.waiting.retain(|&w| w != id);
            self.running.push(id);
            self.push_pick(f, id, cached, len);
            admitted += 1;
        }
        admitted
    }

    pub(super) fn build_plan(&mut self, picks: Vec<Pick>, preempted: Vec<u64>) -> StepPlan {
        // The window group lets go of the blocks no position from this chunk on attends.
        for p in &picks {
            let _ = self.kv.slide(p.id, p.start);
        }
        let mut seqs: Vec<ScheduledSeq> = picks
            .into_iter()
            .filter_map(|p| {
                let st = self.seqs.get(&p.id)?;
                let end = p.start + p.len - p.draft;
                let mut tokens = st.tokens[p.start..end].to_vec();
                tokens.extend_from_slice(&st.draft[..p.draft]);
                Some(ScheduledSeq {
                    id: p.id,
                    start_pos: p.start,
                    tokens,
                    block_table: self.kv.block_table(p.id)?.to_vec(),
                    wants_logits: end == st.tokens.len(),
                    adapter: st.adapter,
                    window_table: self.kv.window_table(p.id).map(<[u32]>::to_vec),
                    draft: p.draft,
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
}
