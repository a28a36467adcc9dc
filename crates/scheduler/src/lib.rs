//! The step scheduler: which tokens of which requests each forward step computes, under a
//! token budget, with chunked prefill, priority classes with aging, preemption by recompute,
//! prefix caching and adapter grouping. Depends only on the KV bookkeeping (`tessera-kv`);
//! no tensors, no model, no threads, so every decision is testable without a model.
//!
//! Loop: `add_request` → (`schedule` → forward of the plan → `update` with a [`StepResult`]:
//! the sampled tokens and the requests the engine ended) while `has_unfinished`; `abort` at
//! any time.
//!
//! - [`config`]: configuration and plan limits.
//! - [`cost`]: the step-cost predictor (predicted step time) for time-budgeted steps.
//! - [`request`]: requests, status, finish reasons.
//! - [`plan`]: the plan as plain data and its invariants.
//! - [`policy`]: admission order (priority, aging), preemption victim, adapter grouping.
//! - [`scheduler`]: the state machine.

pub mod config;
pub mod cost;
mod error;
pub mod plan;
pub mod policy;
pub mod request;
pub mod scheduler;

pub use config::{Limits, SchedulerConfig, WindowGroup};
pub use cost::{Budget, StepCost, TimeBudget};
pub use error::SchedError;
pub use plan::{ScheduledSeq, StepPlan, StepResult};
pub use request::{FinishReason, Request, Status};
pub use scheduler::Scheduler;
pub use tessera_kv::{KvError, KvMetrics};
