//! The step engine: the one loop under every front end (`generate`, `bench model`, `serve`).
//!
//! It owns the scheduler, the KV storage, the activation workspace and each live request's
//! state (sampler, stream decoder, stop matcher, counters). One [`StepEngine::step`] call runs
//! one step: `Scheduler::schedule() -> StepPlan`, the staged forward over the plan's chunks,
//! sampling (the per-token pipeline of [`crate::live`]), then `Scheduler::update(&plan,
//! &StepResult)`, and hands back what each request should hear as plain [`RequestEvent`]s.
//! When the scheduler fills steps by predicted time, each step's measured time refits the
//! step cost ([`crate::step_fit::OnlineFit`]) before the next is scheduled.
//!
//! A constrained request's token mask depends only on its grammar's state, known before the
//! forward: the masks of the step's constrained rows are computed on a helper thread while
//! the forward runs, so sampling waits for one only when it is late.
//!
//! Faults stay with the requests they hit: an error or a panic anywhere in the forward fails
//! the requests of that step (an error naming one sequence fails that one alone; the others
//! are recomputed next step), frees their KV blocks, and leaves the engine ready for the next
//! step. An error in one request's sampling (its grammar's mask, detokenizing) fails that
//! request alone, and the step goes on for the others.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use tessera_core::{Error, Result};
use tessera_scheduler::{KvMetrics, Request, SchedError, Scheduler, SchedulerConfig, StepPlan};

use crate::constrain::Constraint;
use crate::device::StepKv;
use crate::live::LiveRequest;
use crate::request::{FinishReason, GenerateRequest, RequestEvent, SubmitError};
use crate::speculate::Speculator;
use crate::step_fit::OnlineFit;
use crate::Engine;

pub use crate::window::{window_group, window_group_for};

mod run;
use run::Ran;

/// What one step did.
#[derive(Debug, Default)]
pub struct StepOutcome {
    /// Events for the front ends, in order per request.
    pub events: Vec<(u64, RequestEvent)>,
    /// Tokens and sequences the step computed (0 if it ran nothing).
    pub tokens: usize,
    pub seqs: usize,
    /// Requests preempted by this step's schedule.
    pub preempted: usize,
    /// Requests failed by this step.
    pub failed: usize,
    /// The step's predicted seconds, when the scheduler fills steps by predicted time.
    pub predicted_s: Option<f64>,
    /// Seconds of the step's forward and sampling (0 if it ran nothing).
    pub forward_s: f64,
    /// This step's speculative work (drafts verified and accepted), when speculating.
    pub spec: crate::spec::SpecStats,
}

/// A test-only fault injected into a step (see [`Engine::fault_hook`]).
#[cfg(feature = "fault-injection")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// A compute unit panics inside the forward.
    Panic,
    /// The forward returns an error.
    Error,
    /// The step panics outside its fault isolation, ending the thread that runs it.
    Crash,
    /// Tensor-parallel rank N dies before the step.
    KillRank(usize),
    /// Tensor-parallel rank N stops answering for this long before the step.
    StallRank(usize, std::time::Duration),
    /// Tensor-parallel rank N dies in the middle of the step's pipeline, after starting
    /// this many of its all-reduces.
    KillRankMidStep(usize, usize),
}

pub struct StepEngine<'e> {
    engine: &'e Engine,
    pub(crate) sched: Scheduler,
    /// The KV storage and activation buffers on the engine's device (one storage and
    /// workspace per tensor-parallel rank on the CPU).
    kv: Box<dyn StepKv + 'e>,
    pub(crate) live: HashMap<u64, LiveRequest>,
    /// Speculative decoding, when on (see [`crate::spec`]).
    pub(crate) spec: Option<Speculator>,
    /// The step cost refitted to measured steps, with a time budget.
    fit: Option<OnlineFit>,
    /// Whether constrained rows' masks are computed while the forward runs (else after it,
    /// row by row, as each is sampled).
    overlap_masks: bool,
}

impl<'e> StepEngine<'e> {
    /// An engine over `engine`'s model with a KV storage of `cfg.num_blocks` blocks. A model
    /// with sliding-window layers on one rank keeps those layers in a window group
    /// ([`window_group`]) where that takes fewer blocks.
    pub fn new(engine: &'e Engine, mut cfg: SchedulerConfig) -> Result<Self> {
        if cfg.window.is_none() {
            cfg.window = window_group(engine, &cfg);
        }
        let kv = engine.new_step_kv(
            cfg.block_size,
            cfg.num_blocks,
            cfg.window.map(|w| w.num_blocks),
        )?;
        let sched = Scheduler::new(cfg).map_err(|e| Error::Config(format!("scheduler: {e}")))?;
        let fit = sched.config().time_budget.map(|t| OnlineFit::new(t.cost));
        Ok(StepEngine {
            engine,
            sched,
            kv,
            live: HashMap::new(),
            fit,
            // Beside the forward only where a core is left over: on a machine whose cores
            // all run the forward, a mask thread takes time from it (the masks are then
            // computed after the forward, as each row is sampled).
            overlap_masks: engine.pool.units() < crate::engine::default_threads(),
            spec: None,
        })
    }

    pub fn engine(&self) -> &'e Engine {
        self.engine
    }
    pub fn config(&self) -> &SchedulerConfig {
        self.sched.config()
    }
    /// Requests submitted and not yet finished.
    pub fn has_work(&self) -> bool {
        self.sched.has_unfinished()
    }
    pub fn num_live(&self) -> usize {
        self.live.len()
    }
    pub fn num_waiting(&self) -> usize {
        self.sched.num_waiting()
    }
    pub fn num_running(&self) -> usize {
        self.sched.num_running()
    }
    /// Bytes of the KV storage (every rank's).
    pub fn kv_bytes(&self) -> usize {
        self.kv.bytes()
    }

    pub fn kv_metrics(&self) -> KvMetrics {
        self.sched.kv_metrics()
    }

    /// Whether a time budget's step cost is refitted to measured steps (on by default).
    pub fn refit_step_cost(&mut self, on: bool) {
        self.fit = match (on, self.sched.config().time_budget) {
            (true, Some(t)) => Some(self.fit.take().unwrap_or_else(|| OnlineFit::new(t.cost))),
            _ => None,
        };
    }

    /// Whether constrained rows' token masks are computed while the forward runs (by
    /// default, where the forward leaves a core free); off, each is computed after the
    /// forward, when its row is sampled.
    pub fn overlap_masks(&mut self, on: bool) {
        self.overlap_masks = on;
    }

    /// The refitted step cost's factors on its fixed and its other parts, if it is refitted.
    pub fn step_cost_scales(&self) -> Option<[f64; 2]> {
        self.fit.as_ref().map(OnlineFit::scales)
    }

    /// Refits the step cost to `plan`, which took `secs`, and hands the scheduler the new
    /// cost.
    fn refit(&mut self, plan: &StepPlan, secs: f64) {
        let (Some(fit), Some(mut tb)) = (self.fit.as_mut(), self.sched.config().time_budget) else {
            return;
        };
        let chunks = plan
            .seqs
            .iter()
            .map(|s| (s.start_pos, s.tokens.len(), s.wants_logits));
        fit.observe(fit.parts(chunks), secs);
        tb.cost = fit.cost();
        // Positive multiples of a valid cost's parts are valid.
        let _ = self.sched.set_time_budget(Some(tb));
    }

    /// Queues request `id` (ids are the caller's and must be unique among live requests).
    /// Its grammar, if it has one, is built here, on the calling thread: a front end with
    /// other threads builds it there and calls [`StepEngine::submit_with`].
    pub fn submit(&mut self, id: u64, req: &GenerateRequest) -> Result<(), SubmitError> {
        self.submit_with(id, req, None)
    }

    /// [`StepEngine::submit`] with the request's grammar already built from
    /// `req.constraint` (`Grammars::matcher`); `None` builds it here if there is one.
    pub fn submit_with(
        &mut self,
        id: u64,
        req: &GenerateRequest,
        built: Option<Constraint>,
    ) -> Result<(), SubmitError> {
        req.validate()
            .map_err(|e| SubmitError::Invalid(e.to_string()))?;
        let constraint = match (&req.constraint, built) {
            (None, _) => None,
            (Some(_), Some(c)) => Some(c),
            (Some(spec), None) => Some(
                self.engine
                    .grammars()
                    .and_then(|g| g.matcher(spec))
                    .map_err(|e| SubmitError::Invalid(e.to_string()))?,
            ),
        };
        // The adapter's id namespaces the prefix cache: KV computed under one adapter (or
        // the base) is never reused under another.
        let r = Request::new(id, req.prompt_ids.clone(), req.max_tokens)
            .with_priority(req.priority)
            .with_adapter(req.adapter.as_ref().map(|a| a.id));
        self.sched.add_request(r).map_err(|e| match e {
            SchedError::QueueFull { .. } => SubmitError::Overloaded(e.to_string()),
            e => SubmitError::Invalid(e.to_string()),
        })?;
        self.live.insert(id, LiveRequest::new(req, constraint));
        Ok(())
    }

    /// Ends request `id` at once, freeing its blocks; it hears nothing more. Returns false if
    /// it was not live.
    pub fn abort(&mut self, id: u64) -> bool {
        self.sched.abort(id);
        if let Some(sp) = &mut self.spec {
            sp.forget(id);
        }
        self.live.remove(&id).is_some()
    }

    /// Runs one step.
    pub fn step(&mut self) -> StepOutcome {
        let before = self.spec.as_ref().map(|s| s.stats);
        self.propose_drafts();
        let plan = self.sched.schedule();
        // A request's first chunk starts past the prompt tokens the prefix cache served.
        for s in &plan.seqs {
            if let Some(live) = self.live.get_mut(&s.id) {
                let prompt = live.prompt_tokens;
                live.cached_tokens.get_or_insert(s.start_pos.min(prompt));
            }
        }
        self.prefill_draft(&plan);
        let mut out = StepOutcome {
            tokens: plan.num_tokens(),
            seqs: plan.seqs.len(),
            preempted: plan.preempted.len(),
            predicted_s: self.sched.config().time_budget.map(|t| t.cost.plan(&plan)),
            ..Default::default()
        };
        // Requests the scheduler ended since the last step (e.g. one outgrowing the cache).
        for &(id, reason) in &plan.finished {
            self.complete(id, reason, &mut out.events);
        }
        if plan.is_empty() {
            return out;
        }
        #[cfg(feature = "fault-injection")]
        if let Some(hook) = &self.engine.fault_hook {
            if hook(&plan) == Some(Fault::Crash) {
                panic!("injected crash in step {}", plan.step);
            }
        }
        let t0 = Instant::now();
        let run = catch_unwind(AssertUnwindSafe(|| self.run_plan(&plan)));
        out.forward_s = t0.elapsed().as_secs_f64();
        match run {
            Ok(Ok(Ran {
                result,
                events,
                failed,
                verified,
            })) => {
                self.refit(&plan, out.forward_s);
                if let (Some(sp), Some(before)) = (&mut self.spec, before) {
                    sp.observe(&plan, out.forward_s, &verified);
                    out.spec = sp.stats.delta(&before);
                }
                out.events.extend(events);
                // Before the update, which then leaves the failed requests' entries alone.
                for (id, msg) in failed {
                    tracing::warn!("step {}: request {id}: {msg}", plan.step);
                    self.fail(id, &msg, &mut out);
                }
                match self.sched.update(&plan, &result) {
                    Ok(done) => {
                        for &(id, reason) in result.finished.iter().chain(&done) {
                            self.complete(id, reason, &mut out.events);
                        }
                    }
                    Err(e) => {
                        let msg = format!("internal scheduler error in step {}: {e}", plan.step);
                        self.fail_all(&plan, &msg, &mut out);
                    }
                }
            }
            Ok(Err(Error::Sequence { seq, reason })) if seq < plan.seqs.len() => {
                // Validation failed before any computation: only that request is at fault;
                // the others are recomputed from where they were next step.
                let id = plan.seqs[seq].id;
                tracing::warn!("step {}: request {id}: {reason}", plan.step);
                self.fail(
                    id,
                    &format!("the request cannot be computed: {reason}"),
                    &mut out,
                );
            }
            Ok(Err(e)) => {
                tracing::error!("step {} failed: {e}", plan.step);
                let msg = format!("the forward step failed: {e}");
                self.fail_all(&plan, &msg, &mut out);
            }
            Err(panic) => {
                let what = panic_message(&*panic);
                tracing::error!("step {} panicked: {what}", plan.step);
                let msg = format!("internal error: the engine step panicked ({what})");
                self.fail_all(&plan, &msg, &mut out);
            }
        }
        out
    }

    /// Sends a request's last text (for `Length`: what the decoders held back) and its
    /// `Finished` event, and forgets it.
    fn complete(&mut self, id: u64, reason: FinishReason, events: &mut Vec<(u64, RequestEvent)>) {
        if let Some(sp) = &mut self.spec {
            sp.forget(id);
        }
        let Some(mut live) = self.live.remove(&id) else {
            return;
        };
        if reason == FinishReason::Length {
            match live.flush(&self.engine.tokenizer) {
                Ok(text) if !text.is_empty() => events.push((
                    id,
                    RequestEvent::Text {
                        text,
                        tokens: vec![],
                        logprobs: vec![],
                    },
                )),
                Ok(_) => {}
                Err(e) => {
                    events.push((
                        id,
                        RequestEvent::Failed {
                            message: format!("detokenizing the output failed: {e}"),
                        },
                    ));
                    return;
                }
            }
        }
        events.push((
            id,
            RequestEvent::Finished {
                reason,
                prompt_tokens: live.prompt_tokens,
                completion_tokens: live.generated,
                cached_tokens: live.cached_tokens.unwrap_or(0),
                stop_index: live.stop_matched(),
            },
        ));
    }

    fn fail(&mut self, id: u64, message: &str, out: &mut StepOutcome) {
        self.sched.finish(id, FinishReason::Error);
        if let Some(sp) = &mut self.spec {
            sp.forget(id);
        }
        if self.live.remove(&id).is_some() {
            out.failed += 1;
            out.events.push((
                id,
                RequestEvent::Failed {
                    message: message.to_string(),
                },
            ));
        }
    }

    fn fail_all(&mut self, plan: &StepPlan, message: &str, out: &mut StepOutcome) {
        for s in &plan.seqs {
            self.fail(s.id, message, out);
        }
    }

    /// Live request `id`'s state (tests).
    #[cfg(test)]
    pub(crate) fn live_mut(&mut self, id: u64) -> Option<&mut LiveRequest> {
        self.live.get_mut(&id)
    }

    /// Consistency of the scheduler and its KV bookkeeping (tests).
    pub fn check(&self) -> Result<(), SchedError> {
        self.sched.check()
    }
}

/// The message of a caught panic.
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}
