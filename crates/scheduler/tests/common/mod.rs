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

/// Like [`step`], with speculation: before scheduling, every decoding request is proposed a
/// draft of up to `max_k` tokens whose first `wrong_at(id, n)` are right (what
/// [`sample`] gives there) and the rest wrong; the fake verifier accepts the longest right
/// prefix and samples the token after it, as a target model would.
pub fn spec_step(s: &mut Scheduler, max_k: usize, salt: u64) -> StepPlan {
    for id in s.decoding() {
        let n = s.tokens(id).expect("decoding").len();
        let h = (id * 31 + n as u64 * 17 + salt * 7) % 97;
        let k = (h as usize) % (max_k + 1);
        let right = (h as usize / 3) % (k + 1);
        let draft: Vec<u32> = (0..k)
            .map(|j| {
                let t = sample(id, n + j);
                if j < right {
                    t
                } else {
                    t + 1
                }
            })
            .collect();
        assert!(s.propose(id, draft));
    }
    let plan = s.schedule();
    plan.validate(&s.config().limits()).expect("valid plan");
    s.check().expect("consistent before update");
    let mut result = StepResult::default();
    for q in plan.seqs.iter().filter(|q| q.wants_logits) {
        let e = q.known_end();
        let a = q
            .drafts()
            .iter()
            .enumerate()
            .take_while(|&(j, &t)| t == sample(q.id, e + j))
            .count();
        if q.draft > 0 {
            result.accepted.push((q.id, a));
        }
        result.sampled.push((q.id, sample(q.id, e + a)));
    }
    s.update(&plan, &result).expect("update");
    s.check().expect("consistent after update");
    plan
}
