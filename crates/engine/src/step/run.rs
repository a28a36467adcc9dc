//! One step's forward and sampling ([`StepEngine::run_plan`]): the adapter table, the
//! chunks' inputs, the forward through the engine's device, the token masks computed beside
//! it, and each chunk's sampled tokens as events.

use std::collections::HashMap;
use std::sync::Arc;
use std::thread;

use tessera_core::Result;
use tessera_lora::LoraAdapter;
use tessera_model::{BatchMeta, LogitsFor, SeqChunk};
use tessera_scheduler::{StepPlan, StepResult};

#[cfg(feature = "fault-injection")]
use super::Fault;
use super::StepEngine;
use crate::constrain::Constraint;
use crate::live::{LiveRequest, TokenStep};
use crate::request::{FinishReason, RequestEvent};
use crate::speculate::Verified;
#[cfg(feature = "fault-injection")]
use tessera_core::Error;

/// What [`StepEngine::run_plan`] did: the scheduler's result, the events, and the requests
/// whose sampling failed (with why), which are not in the result.
pub(super) struct Ran {
    pub(super) result: StepResult,
    pub(super) events: Vec<(u64, RequestEvent)>,
    pub(super) failed: Vec<(u64, String)>,
    pub(super) verified: Vec<Verified>,
}

impl StepEngine<'_> {
    /// The forward over `plan` and sampling for every chunk that reached its end. Changes no
    /// scheduler state, so a failure can be undone by failing the plan's requests.
    pub(super) fn run_plan(&mut self, plan: &StepPlan) -> Result<Ran> {
        // The step's adapter table: each distinct adapter of the plan gets a slot.
        let mut adapters: Vec<Arc<LoraAdapter>> = Vec::new();
        let mut seqs = Vec::with_capacity(plan.seqs.len());
        for s in &plan.seqs {
            let logits = if s.draft > 0 {
                LogitsFor::All
            } else if s.wants_logits {
                LogitsFor::Last
            } else {
                LogitsFor::None
            };
            let mut chunk =
                SeqChunk::new(s.tokens.clone(), s.start_pos, s.block_table.clone(), logits);
            chunk.window_table = s.window_table.clone();
            if let Some(a) = self.live.get(&s.id).and_then(|l| l.adapter.as_ref()) {
                let slot = match adapters.iter().position(|x| x.id == a.id) {
                    Some(i) => i,
                    None => {
                        adapters.push(a.clone());
                        adapters.len() - 1
                    }
                };
                chunk.adapter = Some(slot as u32);
            }
            seqs.push(chunk);
        }
        let batch = BatchMeta { seqs };
        let engine = self.engine;
        #[cfg(feature = "fault-injection")]
        if let Some(hook) = &engine.fault_hook {
            match hook(plan) {
                Some(Fault::Panic) => engine.pool.run(|u| {
                    if u + 1 == engine.pool.units() {
                        panic!("injected fault in step {}", plan.step)
                    }
                }),
                Some(Fault::Error) => {
                    return Err(Error::Other(format!(
                        "injected fault in step {}",
                        plan.step
                    )))
                }
                Some(Fault::KillRank(r)) => {
                    engine.inject_rank_fault(r, crate::tp::RankFault::Die);
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                Some(Fault::StallRank(r, d)) => {
                    engine.inject_rank_fault(r, crate::tp::RankFault::Stall(d));
                }
                Some(Fault::KillRankMidStep(r, n)) => {
                    engine.inject_rank_fault(r, crate::tp::RankFault::DieAfter(n));
                }
                Some(Fault::Crash) | None => {}
            }
        }
        // The masks of the rows that sample a token, computed on a thread of their own while
        // this one runs the forward. A scoped thread per step rather than a persistent one:
        // it borrows the grammars in place (no hand-over of the matchers, no channel), costs
        // tens of microseconds against a forward of milliseconds, and exists only in steps
        // with constrained rows. It computes the masks in plan order; the forward's end
        // waits for it only if it is still at work. A mask's error or panic is kept in its
        // request's `Constraint` and fails that request when its row is sampled; if the
        // thread cannot start, each mask is computed then instead.
        let ahead = if self.overlap_masks {
            masks_to_prepare(plan, &mut self.live)
        } else {
            Vec::new()
        };
        let kv = &mut self.kv;
        let logits = if ahead.is_empty() {
            kv.forward(&batch, &adapters)?
        } else {
            thread::scope(|scope| {
                let _ = thread::Builder::new()
                    .name("tessera-mask".into())
                    .spawn_scoped(scope, move || {
                        ahead.into_iter().for_each(Constraint::prepare)
                    });
                kv.forward(&batch, &adapters)
            })?
        };
        let mut result = StepResult::default();
        let mut events = Vec::new();
        let mut failed = Vec::new();
        let mut verified = Vec::new();
        let tok = &*engine.tokenizer;
        for (i, s) in plan.seqs.iter().enumerate() {
            if !s.wants_logits {
                continue;
            }
            let Some(live) = self.live.get_mut(&s.id) else {
                continue;
            };
            let steps = if s.draft > 0 {
                let rows = logits.rows_of(i);
                let rows = &rows[rows.len().saturating_sub(s.draft + 1)..];
                live.on_verify(tok, rows, s.drafts()).map(|v| {
                    result.accepted.push((s.id, v.accepted));
                    verified.push(Verified {
                        id: s.id,
                        drafted: v.examined,
                        accepted: v.kept,
                        emitted: v.steps.len(),
                    });
                    v.steps
                })
            } else {
                let Some(row) = logits.last_of(i) else {
                    continue;
                };
                live.on_logits(tok, row).map(|t| vec![t])
            };
            let steps = match steps {
                Ok(t) => t,
                Err(e) => {
                    failed.push((s.id, format!("sampling the next token failed: {e}")));
                    continue;
                }
            };
            let (token, finish, event) = merge_steps(steps);
            result.sampled.push((s.id, token));
            if let Some(reason) = finish {
                result.finished.push((s.id, reason));
            }
            if let Some(ev) = event {
                events.push((s.id, ev));
            }
        }
        Ok(Ran {
            result,
            events,
            failed,
            verified,
        })
    }
}

/// One entry's emitted tokens as the scheduler and the front ends hear them: the last token
/// (what the scheduler appends after any accepted drafts), the finish if one ended the
/// request, and one `Text` event with every token's text, ids and log-probabilities (none
/// if there is nothing to say).
fn merge_steps(steps: Vec<TokenStep>) -> (u32, Option<FinishReason>, Option<RequestEvent>) {
    let token = steps.last().map_or(0, |t| t.token);
    let finish = steps.iter().find_map(|t| t.finish);
    let (mut text, mut tokens, mut logprobs) = (String::new(), Vec::new(), Vec::new());
    for t in steps {
        text.push_str(&t.text);
        tokens.extend(t.tokens);
        logprobs.extend(t.logprobs);
    }
    let event = (!text.is_empty() || !tokens.is_empty()).then_some(RequestEvent::Text {
        text,
        tokens,
        logprobs,
    });
    (token, finish, event)
}

/// The grammars of `plan`'s rows that sample a token this step, in plan order.
fn masks_to_prepare<'a>(
    plan: &StepPlan,
    live: &'a mut HashMap<u64, LiveRequest>,
) -> Vec<&'a mut Constraint> {
    if !live.values_mut().any(|l| l.constraint_mut().is_some()) {
        return Vec::new();
    }
    let order: HashMap<u64, usize> = plan
        .seqs
        .iter()
        .enumerate()
        .filter(|(_, s)| s.wants_logits)
        .map(|(i, s)| (s.id, i))
        .collect();
    let mut ahead: Vec<(usize, &mut Constraint)> = live
        .iter_mut()
        .filter_map(|(id, l)| Some((*order.get(id)?, l.constraint_mut()?)))
        .collect();
    ahead.sort_unstable_by_key(|a| a.0);
    ahead.into_iter().map(|a| a.1).collect()
}
