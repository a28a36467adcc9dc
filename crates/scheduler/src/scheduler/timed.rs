//! Passes 2 and 3 under a step-time budget ([`crate::TimeBudget`]): the step is filled until
//! its predicted time ([`crate::StepCost`]) reaches the budget, the token budget staying an
//! upper limit. See the scheduler's module docs for the rules; this file holds their
//! arithmetic.

use super::fill::{AdmitBy, Fill};
use super::Scheduler;
use crate::cost::TimeBudget;
use crate::request::Status;

/// Share of the budget prefill work (chunks and admissions) always gets, however much the
/// decodes take.
pub const PREFILL_FLOOR: f64 = 0.25;
/// Share of the prefill time the oldest running prefill is served first with (the rest
/// goes shortest remaining first); in a short step it gets nothing, or its minimum chunk
/// after another short step.
pub const OLDEST_SHARE: f64 = 0.125;

impl Scheduler {
    /// Predicted seconds of the step so far (its fixed part included even when empty).
    fn predicted(&self, tb: &TimeBudget, f: &Fill) -> f64 {
        let c = &tb.cost;
        let logits = f.picks.iter().any(|p| p.logits);
        c.fixed_s
            + if logits { c.head_fixed_s } else { 0.0 }
            + f.picks
                .iter()
                .map(|p| c.chunk(p.start, p.len, p.logits))
                .sum::<f64>()
    }

    /// The longest chunk of a sequence of `known` tokens at `start` with `remaining` tokens
    /// that keeps the step's predicted time within `limit_s`, in at most `tokens` tokens,
    /// aligned as [`Scheduler::chunk_len`] aligns (0 if none fits). Without a time budget,
    /// or for a sequence that is no long prefill (see
    /// [`crate::SchedulerConfig::long_prefill_tokens`]): by tokens.
    pub(super) fn fit_time(
        &self,
        f: &Fill,
        known: usize,
        start: usize,
        remaining: usize,
        tokens: usize,
        limit_s: f64,
    ) -> usize {
        let tb = match &self.cfg.time_budget {
            Some(tb) if known > self.cfg.long_prefill_tokens => tb,
            _ => return self.chunk_len(start, remaining, tokens),
        };
        let c = &tb.cost;
        let left = limit_s - self.predicted(tb, f);
        let first_logits = !f.picks.iter().any(|p| p.logits);
        let logit_cost = c.per_logit_row_s + if first_logits { c.head_fixed_s } else { 0.0 };
        let max = remaining.min(tokens).min(self.cfg.max_prefill_chunk);
        let n = c.max_tokens(start, max, remaining, logit_cost, left);
        self.chunk_len(start, remaining, n)
    }

    /// The smallest chunk that moves a sequence at `start` forward: one token, or up to the
    /// next `chunk_align` boundary, or what remains.
    pub(super) fn min_chunk(&self, start: usize, remaining: usize) -> usize {
        let a = self.cfg.chunk_align.max(1);
        (a - start % a).min(remaining)
    }

    /// Running sequences still behind (prefill or recompute), picked already or not: the
    /// oldest (first admitted), and all of them shortest remaining first.
    fn behind(&self, f: &Fill) -> (Option<u64>, Vec<u64>) {
        let mut behind: Vec<(usize, usize, u64)> = self
            .running
            .iter()
            .enumerate()
            .filter_map(|(i, &id)| {
                let st = self.seqs.get(&id)?;
                let live = st.status == Status::Running && !f.excluded(st);
                (live && st.remaining() > 1).then_some((st.remaining(), i, id))
            })
            .collect();
        let oldest = behind.iter().min_by_key(|b| b.1).map(|b| b.2);
        behind.sort_unstable();
        (oldest, behind.into_iter().map(|b| b.2).collect())
    }

    /// Grows the chunks of `order`'s sequences (a picked one re-fitted as a whole, never
    /// shrunk) while the step's predicted time stays within `limit_s` and running chunks
    /// leave `tokens_reserved` tokens; with `forced`, a sequence that fits nothing still gets
    /// [`Scheduler::min_chunk`].
    fn grow_chunks(
        &mut self,
        f: &mut Fill,
        order: &[u64],
        tokens_reserved: usize,
        limit_s: f64,
        forced: bool,
    ) {
        for &id in order {
            let Some(st) = self.seqs.get(&id) else {
                continue;
            };
            if st.status != Status::Running {
                continue;
            }
            let (known, start, remaining) = (st.tokens.len(), st.num_computed, st.remaining());
            let prev = f
                .picks
                .iter()
                .position(|p| p.id == id)
                .map(|i| f.picks.remove(i));
            f.budget += prev.map_or(0, |p| p.len);
            let tokens = f.budget.saturating_sub(tokens_reserved);
            let mut len = self.fit_time(f, known, start, remaining, tokens, limit_s);
            if forced && len == 0 && prev.is_none() {
                // The mandatory minimum: past the reserves, within the token budget.
                len = self.min_chunk(start, remaining);
                if len > f.budget {
                    len = 0;
                }
            }
            let len = len.max(prev.map_or(0, |p| p.len));
            if len > 0 && self.grow_or_preempt(id, start + len, f) {
                self.push_pick(f, id, start, len);
            } else if let Some(p) = prev {
                // The sequence was preempted or finished growing: its chunk goes. Otherwise
                // (an allocation error) it keeps the chunk it had.
                if self
                    .seqs
                    .get(&id)
                    .is_some_and(|s| s.status == Status::Running)
                {
                    self.push_pick(f, id, p.start, p.len);
                }
            }
        }
    }

    /// Passes 2 and 3 by predicted time. The decodes are in `f` already.
    pub(super) fn fill_by_time(&mut self, f: &mut Fill, tb: &TimeBudget) {
        let decodes: Vec<u64> = f.picks.iter().map(|p| p.id).collect();
        let used = self.predicted(tb, f);
        // Prefill work gets what the decodes leave, and never less than the floor.
        let budget = tb.effective_s();
        let prefill = (budget - used).max(budget * PREFILL_FLOOR);
        let limit = used + prefill;
        let token_reserve = if f.waiting {
            self.cfg.max_num_batched_tokens / 2
        } else {
            0
        };
        // The head of the queue, and whether its whole prompt fits in this step.
        let head = if f.waiting && f.preempted.is_empty() {
            self.admission_order(f.only).first().copied()
        } else {
            None
        };
        // A short step: the head's whole remaining prompt fits in the prefill time (within
        // the tokens running chunks leave). Its time to first token is this step's time, so
        // running chunks get only the oldest's minimum chunk.
        let whole = head.is_some_and(|id| {
            let Some(st) = self.seqs.get(&id) else {
                return false;
            };
            let cached = self.kv.peek_prefix(st.adapter, &st.tokens);
            let remaining = st.tokens.len() - cached;
            let tokens = f.budget.min(token_reserve);
            self.fit_time(f, st.tokens.len(), cached, remaining, tokens, limit) == remaining
        });
        // The oldest first: a small guaranteed share, so nothing starves (a short step leaves
        // it out, but never two in a row: then it gets its minimum chunk). Then, but in a
        // short step, the shortest remaining first, up to all the prefill time when nothing
        // waits, half of it otherwise.
        let (oldest, _) = self.behind(f);
        let skip = whole && !self.oldest_skipped;
        if let Some(o) = oldest.filter(|_| !skip) {
            let share = if whole {
                used
            } else {
                used + prefill * OLDEST_SHARE
            };
            self.grow_chunks(f, &[o], token_reserve, share, true);
        }
        if !whole {
            let running = if head.is_some() {
                prefill / 2.0
            } else {
                prefill
            };
            let (_, srpt) = self.behind(f);
            self.grow_chunks(f, &srpt, token_reserve, used + running, false);
        }
        // The oldest's minimum chunk, if any, comes on top of a short step's head.
        let admit_limit = if whole {
            limit + (self.predicted(tb, f) - used)
        } else {
            limit
        };
        let admitted = if f.preempted.is_empty() {
            self.admit(
                f,
                AdmitBy::Time {
                    limit_s: admit_limit,
                    whole_only: whole,
                },
            )
        } else {
            0
        };
        self.oldest_skipped =
            skip && admitted > 0 && oldest.is_some_and(|o| !f.picks.iter().any(|p| p.id == o));
        // What admissions left goes back to the running chunks, except in a short step.
        if !(whole && admitted > 0) {
            let (_, srpt) = self.behind(f);
            self.grow_chunks(f, &srpt, 0, limit, false);
        }
        // No prefill progress at all (a short step that admitted nothing, a budget too small
        // for any token): the oldest running prefill, or else the head of the queue, still
        // gets its minimum chunk, so prefill work always progresses.
        let progressed = |f: &Fill| f.picks.iter().any(|p| !decodes.contains(&p.id));
        if !progressed(f) {
            if let Some(o) = oldest {
                self.grow_chunks(f, &[o], 0, used, true);
            }
        }
        if !progressed(f) && head.is_some() && f.preempted.is_empty() {
            self.admit(f, AdmitBy::Minimum);
        }
    }
}
