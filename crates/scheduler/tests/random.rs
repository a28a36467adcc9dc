//! Randomized workloads: adds, steps, aborts and engine stops in any order keep every
//! invariant, and at the end all blocks are back and every request's tokens are exact.

mod common;

use std::collections::HashMap;

use common::*;
use proptest::prelude::*;
use tessera_scheduler::{FinishReason, Request, Scheduler, SchedulerConfig, StepCost, TimeBudget};

#[derive(Debug, Clone)]
enum Op {
    Add {
        fam: u32,
        len: usize,
        max_tokens: usize,
        priority: i32,
        adapter: Option<u64>,
    },
    Step,
    /// A step with drafts of up to this many tokens, partly right.
    SpecStep(usize),
    Abort(usize),
    Stop(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u32..3, 1usize..40, 1usize..12, -1i32..3, proptest::option::of(0u64..2))
            .prop_map(|(fam, len, max_tokens, priority, adapter)| Op::Add { fam, len, max_tokens, priority, adapter }),
        4 => Just(Op::Step),
        2 => (1usize..6).prop_map(Op::SpecStep),
        1 => (0usize..64).prop_map(Op::Abort),
        1 => (0usize..64).prop_map(Op::Stop),
    ]
}

fn config() -> impl Strategy<Value = SchedulerConfig> {
    (
        4usize..40,
        prop_oneof![Just(1usize), Just(2), Just(4), Just(8)],
        1usize..6,
        0usize..40,
        1usize..24,
        any::<bool>(),
        0u64..4,
        any::<bool>(),
        proptest::option::of((0.5f64..20.0, prop_oneof![Just(0.0f64), Just(1e-4)])),
    )
        .prop_map(
            |(blocks, bs, seqs, extra, chunk, prefix, aging, align, time)| {
                let mut c = SchedulerConfig::new(blocks, bs);
                c.max_num_seqs = seqs;
                c.max_num_batched_tokens = seqs + extra;
                c.max_prefill_chunk = chunk;
                c.chunk_align = if align {
                    4.min(chunk).min(seqs + extra)
                } else {
                    1
                };
                c.max_model_len = 48;
                c.max_waiting = 16;
                c.prefix_caching = prefix;
                c.aging_steps = aging;
                // Half the cases fill steps by predicted time (milliseconds, per-key cost).
                c.time_budget = time.map(|(ms, per_key)| {
                    TimeBudget::secs(
                        StepCost {
                            fixed_s: 1e-3,
                            per_token_s: 1e-3,
                            per_key_s: per_key,
                            per_key2_s: 0.0,
                            head_fixed_s: 0.5e-3,
                            per_logit_row_s: 0.2e-3,
                        },
                        ms * 1e-3,
                    )
                });
                c
            },
        )
}

type Seen = HashMap<u64, Vec<u32>>;

/// Notes finishes (each reported once) and the latest generated tokens of every request.
fn record(
    s: &Scheduler,
    plan: &tessera_scheduler::StepPlan,
    next: u64,
    seen: &mut Seen,
    reasons: &mut HashMap<u64, FinishReason>,
) -> Result<(), TestCaseError> {
    for &(id, r) in &plan.finished {
        prop_assert!(
            reasons.insert(id, r).is_none(),
            "finish of {} reported twice",
            id
        );
    }
    for id in 0..next {
        if let Some(g) = s.generated(id) {
            seen.insert(id, g.to_vec());
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_add_step_abort(cfg in config(), ops in proptest::collection::vec(op(), 1..120)) {
        let mut s = Scheduler::new(cfg.clone()).unwrap();
        // id -> (prompt_len, max_tokens); generated tokens as last seen; finish reasons.
        let mut reqs: HashMap<u64, (usize, usize)> = HashMap::new();
        let mut seen: HashMap<u64, Vec<u32>> = HashMap::new();
        let mut reasons: HashMap<u64, FinishReason> = HashMap::new();
        let mut next = 0u64;
        for o in ops {
            match o {
                Op::Add { fam, len, max_tokens, priority, adapter } => {
                    // Families share prefixes, so prefix caching gets exercised.
                    let p: Vec<u32> = (0..len as u32).map(|i| fam * 1000 + i + 1).collect();
                    let r = Request::new(next, p, max_tokens).with_priority(priority).with_adapter(adapter);
                    if s.add_request(r).is_ok() {
                        reqs.insert(next, (len, max_tokens));
                    }
                    next += 1;
                }
                Op::Step => {
                    let plan = step(&mut s);
                    record(&s, &plan, next, &mut seen, &mut reasons)?;
                }
                Op::SpecStep(k) => {
                    let plan = spec_step(&mut s, k, next);
                    record(&s, &plan, next, &mut seen, &mut reasons)?;
                }
                Op::Abort(i) if next > 0 => { s.abort(i as u64 % next); }
                Op::Stop(i) if next > 0 => { s.finish(i as u64 % next, FinishReason::Stop); }
                _ => {}
            }
            s.check().map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
        let mut steps = 0;
        while s.has_unfinished() {
            steps += 1;
            prop_assert!(steps < 2000, "no progress");
            let plan = step(&mut s);
            record(&s, &plan, next, &mut seen, &mut reasons)?;
        }
        let plan = s.schedule();
        record(&s, &plan, next, &mut seen, &mut reasons)?;
        s.check().unwrap();
        prop_assert_eq!(s.kv().pool().used(), 0);
        prop_assert_eq!(s.kv().pool().available(), cfg.num_blocks);
        for (id, &(plen, max_tokens)) in &reqs {
            let reason = reasons.get(id).copied();
            prop_assert!(reason.is_some(), "request {} never reported finished", id);
            let g = seen.get(id).cloned().unwrap_or_default();
            prop_assert!(g.len() <= max_tokens);
            prop_assert_eq!(&g, &expected(*id, plen, g.len()), "request {} tokens", id);
            if reason == Some(FinishReason::Length) {
                let cap = cfg.num_blocks * cfg.block_size;
                let end = plen + g.len();
                prop_assert!(g.len() == max_tokens || end >= cfg.max_model_len || end > cap - cfg.block_size,
                    "request {} finished Length early: {} of {} tokens", id, g.len(), max_tokens);
            }
        }
    }
}
