//! A model-free driver: a fake sampler whose token depends only on (request, position), so a
//! recomputed (preempted) sequence samples exactly what it would have.

#![allow(dead_code)]

use tessera_scheduler::{Request, Scheduler, SchedulerConfig, StepPlan, StepResult};

pub fn sample(id: u64, len: usize) -> u32 {
    ((id * 7919 + len as u64 * 104_729) % 50_000) as u32 + 1
}

/// Tokens a request generates: `sample(id, prompt_len + k)` for k = 0..n.
pub fn expected(id: u64, prompt_len: usize, n: usize) -> Vec<u32> {
    (0..n).map(|k| sample(id, prompt_len + k)).collect()
}

pub fn prompt(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32).map(|i| seed * 10_000 + i + 1).collect()
}

pub fn cfg(num_blocks: usize, block_size: usize) -> SchedulerConfig {
    let mut c = SchedulerConfig::new(num_blocks, block_size);
    c.max_num_batched_tokens = 64;
    c.max_num_seqs = 8;
    c.max_prefill_chunk = 32;
    c.max_model_len = 512;
    c.max_waiting = 64;
    c.aging_steps = 0;
    c
}

/// Schedules, validates, "runs" the plan and updates; returns the plan.
pub fn step(s: &mut Scheduler) -> StepPlan {
    let plan = s.schedule();
    plan.validate(&s.config().limits()).expect("valid plan");
    s.check().expect("consistent before update");
    let sampled: Vec<(u64, u32)> = plan
        .seqs
        .iter()
        .filter(|q| q.wants_logits)
        .map(|q| (q.id, sample(q.id, q.end_pos())))
        .collect();
    s.update(&plan, &StepResult::sampled(sampled.clone()))
        .expect("update");
    s.check().expect("consistent after update");
    plan
}

/// Steps until nothing is left; returns the plans.
pub fn run_to_end(s: &mut Scheduler, max_steps: usize) -> Vec<StepPlan> {
    let mut plans = Vec::new();
    while s.has_unfinished() {
        assert!(
            plans.len() < max_steps,
            "did not finish in {max_steps} steps"
        );
        plans.push(step(s));
    }
    plans.push(s.schedule());
    plans
}

pub fn req(id: u64, len: usize, max_tokens: usize) -> Request {
    Request::new(id, prompt(len, id as u32), max_tokens)
}
