//! Scheduler behaviour without a model: exact counts, orders and block ownership.

mod common;

use common::*;
use tessera_scheduler::{
    FinishReason, Request, SchedError, ScheduledSeq, Scheduler, SchedulerConfig, Status, StepPlan,
    StepResult,
};

/// Finished reasons collected over a run.
fn finished_of(plans: &[StepPlan]) -> Vec<(u64, FinishReason)> {
    plans.iter().flat_map(|p| p.finished.clone()).collect()
}

#[test]
fn single_request_prefills_in_chunks_then_decodes() {
    let mut s = Scheduler::new(cfg(64, 4)).unwrap();
    s.add_request(req(1, 70, 3)).unwrap();
    let p = step(&mut s);
    assert_eq!((p.seqs[0].start_pos, p.seqs[0].tokens.len()), (0, 32));
    assert!(!p.seqs[0].wants_logits);
    let p = step(&mut s);
    assert_eq!((p.seqs[0].start_pos, p.seqs[0].tokens.len()), (32, 32));
    let p = step(&mut s);
    assert_eq!((p.seqs[0].start_pos, p.seqs[0].tokens.len()), (64, 6));
    assert!(p.seqs[0].wants_logits);
    assert_eq!(s.generated(1).unwrap(), expected(1, 70, 1));
    let p = step(&mut s);
    assert_eq!(
        (p.seqs[0].start_pos, p.seqs[0].tokens.clone()),
        (70, expected(1, 70, 1))
    );
    assert_eq!(p.seqs[0].block_table.len(), 18);
    step(&mut s);
    assert_eq!(s.status(1), Some(Status::Finished(FinishReason::Length)));
    assert_eq!(s.generated(1).unwrap(), expected(1, 70, 3));
    assert_eq!(s.kv().pool().used(), 0);
    let p = s.schedule();
    assert_eq!(p.finished, [(1, FinishReason::Length)]);
    assert_eq!(s.status(1), None, "forgotten once reported");
}

#[test]
fn budget_and_seq_limit_are_respected() {
    let mut c = cfg(512, 4);
    c.max_num_batched_tokens = 40;
    c.max_num_seqs = 5;
    let mut s = Scheduler::new(c).unwrap();
    for id in 0..12 {
        s.add_request(req(id, 10 + 7 * id as usize, 6)).unwrap();
    }
    let plans = run_to_end(&mut s, 500);
    for p in &plans {
        assert!(p.num_tokens() <= 40);
        assert!(p.seqs.len() <= 5);
    }
    assert!(
        plans.iter().any(|p| p.num_tokens() == 40),
        "budget gets filled"
    );
    assert_eq!(finished_of(&plans).len(), 12);
    assert_eq!(s.kv().pool().used(), 0);
}

#[test]
fn long_prompt_never_stalls_decodes() {
    let mut c = cfg(512, 4);
    c.max_model_len = 1024;
    let mut s = Scheduler::new(c).unwrap();
    for id in 1..=3 {
        s.add_request(req(id, 5, 400)).unwrap();
    }
    step(&mut s);
    s.add_request(req(9, 888, 2)).unwrap();
    let mut prefill_steps = 0;
    let mut next_pos = 0;
    while s.num_computed(9).unwrap_or(0) < 888 {
        let p = step(&mut s);
        for id in 1..=3 {
            let q = p.get(id).expect("every decode runs every step");
            assert_eq!(q.tokens.len(), 1);
            assert!(q.wants_logits);
        }
        if let Some(q) = p.get(9) {
            assert_eq!(q.start_pos, next_pos, "chunks are contiguous");
            assert!(q.tokens.len() <= 32);
            next_pos = q.end_pos();
            prefill_steps += 1;
        }
        // Decodes come before the prefill chunk in the plan.
        assert_eq!(p.seqs.last().map(|q| q.id), Some(9));
    }
    assert_eq!(prefill_steps, 888usize.div_ceil(32));
}

#[test]
fn chunk_ends_are_aligned_unless_they_finish_the_prompt() {
    let mut c = cfg(512, 16);
    c.max_prefill_chunk = 40;
    c.chunk_align = 16;
    let mut s = Scheduler::new(c).unwrap();
    s.add_request(req(1, 100, 1)).unwrap();
    let lens: Vec<usize> = (0..3).map(|_| step(&mut s).seqs[0].tokens.len()).collect();
    // 40 -> end 32; 72 -> end 64; the last 36 complete the prompt, so no rounding.
    assert_eq!(lens, [32, 32, 36]);
    assert_eq!(s.status(1), Some(Status::Finished(FinishReason::Length)));
}

#[test]
fn priority_class_then_arrival() {
    let mut c = cfg(512, 4);
    c.max_num_seqs = 1;
    let mut s = Scheduler::new(c).unwrap();
    s.add_request(req(1, 4, 1).with_priority(5)).unwrap();
    s.add_request(req(2, 4, 1).with_priority(0)).unwrap();
    s.add_request(req(3, 4, 1).with_priority(0)).unwrap();
    s.add_request(req(4, 4, 1).with_priority(-1)).unwrap();
    let order: Vec<u64> = (0..4).map(|_| step(&mut s).seqs[0].id).collect();
    assert_eq!(order, [4, 2, 3, 1]);
}

/// Steps with one new urgent request arriving every step; returns the step at which the
/// low-priority request 0 was admitted.
fn admitted_under_stream(aging_steps: u64, steps: u64) -> Option<u64> {
    let mut c = cfg(512, 4);
    c.max_num_seqs = 1;
    c.aging_steps = aging_steps;
    let mut s = Scheduler::new(c).unwrap();
    s.add_request(req(0, 4, 1).with_priority(3)).unwrap();
    for k in 1..=steps {
        s.add_request(req(k, 4, 1).with_priority(0)).unwrap();
        let p = step(&mut s);
        if p.get(0).is_some() {
            return Some(p.step);
        }
    }
    None
}

#[test]
fn aging_prevents_starvation() {
    assert_eq!(
        admitted_under_stream(0, 60),
        None,
        "without aging it starves"
    );
    // Class 3 needs 3 * 4 = 12 steps to reach class 0; it then wins on arrival order.
    assert_eq!(admitted_under_stream(4, 60), Some(12));
}

#[test]
fn preemption_under_block_pressure_recomputes_and_completes() {
    // 8 blocks of 4: each request needs 5 blocks at its end, both cannot hold them at once.
    let mut c = cfg(8, 4);
    c.prefix_caching = false;
    let mut s = Scheduler::new(c).unwrap();
    s.add_request(req(1, 8, 10)).unwrap();
    s.add_request(req(2, 8, 10)).unwrap();
    let plans = run_to_end(&mut s, 200);
    let preempted: Vec<u64> = plans.iter().flat_map(|p| p.preempted.clone()).collect();
    assert!(!preempted.is_empty());
    assert_eq!(
        preempted[0], 2,
        "the latest admitted of equal class goes first"
    );
    let fin = finished_of(&plans);
    assert_eq!(fin.len(), 2);
    assert!(fin.iter().all(|&(_, r)| r == FinishReason::Length));
    // The resumed request recomputed prompt + generated tokens from position 0.
    let resumed = plans
        .iter()
        .skip_while(|p| !p.preempted.contains(&2))
        .skip(1)
        .find_map(|p| p.get(2).cloned())
        .unwrap();
    assert_eq!(resumed.start_pos, 0);
    assert!(resumed.tokens.len() > 8, "prompt plus generated tokens");
    assert_eq!(s.kv().pool().used(), 0);
}

#[test]
fn all_tokens_accounted_after_preemption() {
    let mut c = cfg(8, 4);
    c.prefix_caching = false;
    let mut s = Scheduler::new(c).unwrap();
    s.add_request(req(1, 8, 10)).unwrap();
    s.add_request(req(2, 8, 10)).unwrap();
    let mut outputs = std::collections::HashMap::new();
    while s.has_unfinished() {
        step(&mut s);
        for id in [1, 2] {
            if let Some(g) = s.generated(id) {
                outputs.insert(id, g.to_vec());
            }
        }
    }
    for id in [1, 2] {
        assert_eq!(outputs[&id], expected(id, 8, 10));
    }
}

#[test]
fn urgent_sequence_is_never_preempted_for_a_less_urgent_one() {
    let mut c = cfg(8, 4);
    c.prefix_caching = false;
    let mut s = Scheduler::new(c).unwrap();
    s.add_request(req(1, 8, 10).with_priority(2)).unwrap();
    step(&mut s);
    s.add_request(req(2, 8, 10).with_priority(0)).unwrap();
    let plans = run_to_end(&mut s, 200);
    let preempted: Vec<u64> = plans.iter().flat_map(|p| p.preempted.clone()).collect();
    assert!(!preempted.is_empty());
    assert!(preempted.iter().all(|&id| id == 1), "{preempted:?}");
    assert_eq!(finished_of(&plans).len(), 2);
}

#[test]
fn sequence_outgrowing_the_cache_finishes_with_length() {
    let mut c = cfg(2, 4);
    c.prefix_caching = false;
    let mut s = Scheduler::new(c).unwrap();
    s.add_request(req(1, 6, 100)).unwrap();
    let plans = run_to_end(&mut s, 50);
    assert_eq!(finished_of(&plans), [(1, FinishReason::Length)]);
    assert_eq!(plans.iter().map(|p| p.preempted.len()).sum::<usize>(), 0);
    // 8 positions of KV: the prompt (6) plus the decodes of tokens 7 and 8, sampling 3 tokens.
    assert_eq!(plans.iter().filter(|p| !p.seqs.is_empty()).count(), 3);
}

#[test]
fn abort_frees_blocks_wherever_the_request_is() {
    let mut s = Scheduler::new(cfg(64, 4)).unwrap();
    s.add_request(req(1, 40, 50)).unwrap(); // prefilling
    s.add_request(req(2, 4, 50)).unwrap();
    step(&mut s);
    step(&mut s);
    s.add_request(req(3, 4, 50)).unwrap(); // waiting
    assert!(s.kv().pool().used() > 0);
    assert!(s.abort(1));
    assert!(s.abort(2));
    assert!(s.abort(3));
    assert!(!s.abort(3), "second abort is a no-op");
    assert!(!s.abort(77));
    s.check().unwrap();
    assert_eq!(s.kv().pool().used(), 0);
    let p = s.schedule();
    assert!(p.seqs.is_empty());
    assert_eq!(p.finished.len(), 3);
    assert!(p.finished.iter().all(|&(_, r)| r == FinishReason::Aborted));
}

#[test]
fn abort_between_schedule_and_update_skips_the_entry() {
    let mut s = Scheduler::new(cfg(64, 4)).unwrap();
    s.add_request(req(1, 4, 5)).unwrap();
    s.add_request(req(2, 4, 5)).unwrap();
    let plan = s.schedule();
    s.abort(1);
    let sampled = [(1, 5), (2, 6)];
    let done = s.update(&plan, &StepResult::sampled(sampled)).unwrap();
    assert!(done.is_empty());
    assert_eq!(s.generated(2).unwrap(), [6]);
    assert_eq!(s.generated(1).unwrap(), [] as [u32; 0]);
    s.check().unwrap();
    // Applying the same plan twice is harmless: its entries are stale.
    s.update(&plan, &StepResult::sampled([(2, 7)])).unwrap();
    assert_eq!(s.generated(2).unwrap(), [6]);
}

#[test]
fn engine_finish_stops_and_frees() {
    let mut s = Scheduler::new(cfg(64, 4)).unwrap();
    s.add_request(req(1, 4, 50)).unwrap();
    step(&mut s);
    assert!(s.finish(1, FinishReason::Stop));
    assert_eq!(s.status(1), Some(Status::Finished(FinishReason::Stop)));
    assert_eq!(s.kv().pool().used(), 0);
    assert!(!s.finish(1, FinishReason::Stop));
}

#[test]
fn step_result_finishes_end_requests_and_drop_their_token() {
    let mut s = Scheduler::new(cfg(64, 4)).unwrap();
    s.add_request(req(1, 4, 50)).unwrap();
    s.add_request(req(2, 4, 50)).unwrap();
    s.add_request(req(3, 4, 50)).unwrap();
    let plan = s.schedule();
    // 1 sampled EOS, 3's step failed; 2 goes on.
    let result = StepResult {
        sampled: vec![(1, 9), (2, 10), (3, 11)],
        finished: vec![(1, FinishReason::Stop), (3, FinishReason::Error)],
        ..Default::default()
    };
    let done = s.update(&plan, &result).unwrap();
    assert!(
        done.is_empty(),
        "engine-side finishes are not reported back"
    );
    assert_eq!(s.status(1), Some(Status::Finished(FinishReason::Stop)));
    assert_eq!(s.status(3), Some(Status::Finished(FinishReason::Error)));
    assert_eq!(s.generated(1).unwrap(), [] as [u32; 0], "EOS not appended");
    assert_eq!(s.generated(2).unwrap(), [10]);
    s.check().unwrap();
    let next = s.schedule();
    assert_eq!(next.seqs.iter().map(|q| q.id).collect::<Vec<_>>(), vec![2]);
    let mut fin = next.finished.clone();
    fin.sort_by_key(|f| f.0);
    assert_eq!(fin, vec![(1, FinishReason::Stop), (3, FinishReason::Error)]);
    // A finished entry needs no sample.
    s.update(
        &next,
        &StepResult {
            sampled: vec![],
            finished: vec![(2, FinishReason::Stop)],
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(s.kv().pool().used(), 0);
    assert!(!s.has_unfinished());
}

#[test]
fn update_is_all_or_nothing() {
    let mut s = Scheduler::new(cfg(64, 4)).unwrap();
    s.add_request(req(1, 4, 5)).unwrap();
    s.add_request(req(2, 40, 5)).unwrap();
    let plan = s.schedule();
    assert!(plan.get(1).unwrap().wants_logits);
    assert!(!plan.get(2).unwrap().wants_logits);
    assert_eq!(
        s.update(&plan, &StepResult::default()),
        Err(SchedError::MissingSample { id: 1 })
    );
    assert_eq!(
        s.update(&plan, &StepResult::sampled([(1, 3), (2, 4)])),
        Err(SchedError::UnexpectedSample { id: 2 })
    );
    assert_eq!(
        s.update(&plan, &StepResult::sampled([(1, 3), (1, 4)])),
        Err(SchedError::UnexpectedSample { id: 1 })
    );
    assert_eq!(s.num_computed(1), Some(0), "nothing applied");
    s.update(&plan, &StepResult::sampled([(1, 3)])).unwrap();
    assert_eq!(s.num_computed(1), Some(4));
    assert_eq!(s.num_computed(2), Some(32));
}

#[test]
fn context_limit_finishes_with_length() {
    let mut c = cfg(64, 4);
    c.max_model_len = 10;
    let mut s = Scheduler::new(c).unwrap();
    s.add_request(req(1, 8, 100)).unwrap();
    run_to_end(&mut s, 20);
    // 8 prompt tokens + 2 generated reach the context of 10.
    let mut s2 = Scheduler::new(SchedulerConfig {
        max_model_len: 10,
        ..cfg(64, 4)
    })
    .unwrap();
    s2.add_request(req(1, 8, 100)).unwrap();
    step(&mut s2);
    step(&mut s2);
    assert_eq!(s2.generated(1).unwrap().len(), 2);
    assert_eq!(s2.status(1), Some(Status::Finished(FinishReason::Length)));
}

#[test]
fn shared_prefix_shares_physical_blocks() {
    let mut s = Scheduler::new(cfg(64, 4)).unwrap();
    let prefix = prompt(12, 42);
    let a = [prefix.clone(), vec![1, 2]].concat();
    let b = [prefix.clone(), vec![3, 4, 5]].concat();
    s.add_request(Request::new(1, a, 20)).unwrap();
    let pa = step(&mut s);
    s.add_request(Request::new(2, b, 20)).unwrap();
    let pb = step(&mut s);
    let qa = pa.get(1).unwrap();
    let qb = pb.get(2).unwrap();
    assert_eq!(qb.start_pos, 12, "the 3-block prefix counts as computed");
    assert_eq!(qb.tokens, [3, 4, 5]);
    assert_eq!(qa.block_table[..3], qb.block_table[..3]);
    assert_ne!(qa.block_table[3], qb.block_table[3]);
    for &blk in &qb.block_table[..3] {
        assert_eq!(s.kv().pool().ref_count(blk), 2);
    }
    // Both decode in the same step, each writing only its own block.
    let p = step(&mut s);
    assert_eq!(p.seqs.len(), 2);
    let m = s.kv_metrics();
    assert_eq!(m.prefix_hit_tokens, 12);
    assert_eq!(m.prefix_query_tokens, 14 + 15);
}

#[test]
fn different_adapters_never_share_prefix_blocks() {
    let mut s = Scheduler::new(cfg(64, 4)).unwrap();
    let p = prompt(13, 5);
    s.add_request(Request::new(1, p.clone(), 5).with_adapter(Some(1)))
        .unwrap();
    step(&mut s);
    s.add_request(Request::new(2, p.clone(), 5).with_adapter(Some(2)))
        .unwrap();
    s.add_request(Request::new(3, p.clone(), 5)).unwrap();
    s.add_request(Request::new(4, p.clone(), 5).with_adapter(Some(1)))
        .unwrap();
    let plan = step(&mut s);
    assert_eq!(plan.get(2).unwrap().start_pos, 0);
    assert_eq!(plan.get(3).unwrap().start_pos, 0);
    assert_eq!(plan.get(4).unwrap().start_pos, 12, "same adapter shares");
    let t1 = s.kv().block_table(1).unwrap().to_vec();
    for id in [2, 3] {
        let t = s.kv().block_table(id).unwrap();
        assert!(t.iter().all(|b| !t1.contains(b)));
    }
}

#[test]
fn same_adapter_sequences_are_adjacent() {
    let mut s = Scheduler::new(cfg(256, 4)).unwrap();
    let adapters = [Some(1), Some(2), None, Some(1), Some(2), None, Some(1)];
    for (i, a) in adapters.iter().enumerate() {
        s.add_request(req(i as u64, 6, 4).with_adapter(*a)).unwrap();
    }
    for _ in 0..3 {
        let p = step(&mut s);
        let ids: Vec<u64> = p.seqs.iter().map(|q| q.id).collect();
        assert_eq!(
            ids,
            [0, 3, 6, 1, 4, 2, 5],
            "one run per adapter, stable inside"
        );
    }
    // Off: scheduling order.
    let mut c = cfg(256, 4);
    c.group_by_adapter = false;
    let mut s = Scheduler::new(c).unwrap();
    for (i, a) in adapters.iter().enumerate() {
        s.add_request(req(i as u64, 6, 4).with_adapter(*a)).unwrap();
    }
    let ids: Vec<u64> = step(&mut s).seqs.iter().map(|q| q.id).collect();
    assert_eq!(ids, [0, 1, 2, 3, 4, 5, 6]);
}

#[test]
fn add_request_rejections() {
    let mut c = cfg(4, 4);
    c.max_waiting = 2;
    c.max_model_len = 20;
    let mut s = Scheduler::new(c).unwrap();
    assert!(matches!(
        s.add_request(req(1, 21, 1)),
        Err(SchedError::PromptTooLong {
            len: 21,
            max_model_len: 20
        })
    ));
    assert!(matches!(
        s.add_request(req(1, 17, 1)),
        Err(SchedError::ExceedsCache {
            blocks: 5,
            capacity: 4
        })
    ));
    assert!(matches!(
        s.add_request(Request::new(1, vec![], 1)),
        Err(SchedError::InvalidRequest { .. })
    ));
    assert!(matches!(
        s.add_request(req(1, 3, 0)),
        Err(SchedError::InvalidRequest { .. })
    ));
    s.add_request(req(1, 3, 1)).unwrap();
    assert_eq!(
        s.add_request(req(1, 3, 1)),
        Err(SchedError::DuplicateId { id: 1 })
    );
    s.add_request(req(2, 3, 1)).unwrap();
    assert_eq!(
        s.add_request(req(3, 3, 1)),
        Err(SchedError::QueueFull { max_waiting: 2 })
    );
    assert_eq!(s.num_waiting(), 2);
}

#[test]
fn config_validation() {
    let ok = cfg(8, 4);
    assert!(Scheduler::new(ok.clone()).is_ok());
    for bad in [
        SchedulerConfig {
            block_size: 0,
            ..ok.clone()
        },
        SchedulerConfig {
            max_num_batched_tokens: 4,
            ..ok.clone()
        },
        SchedulerConfig {
            chunk_align: 0,
            ..ok.clone()
        },
        SchedulerConfig {
            chunk_align: 64,
            ..ok.clone()
        },
    ] {
        assert!(matches!(
            Scheduler::new(bad),
            Err(SchedError::InvalidConfig { .. })
        ));
    }
}

fn entry(id: u64, start: usize, len: usize, table: Vec<u32>) -> ScheduledSeq {
    ScheduledSeq {
        id,
        start_pos: start,
        tokens: vec![1; len],
        block_table: table,
        wants_logits: true,
        adapter: None,
        window_table: None,
        draft: 0,
    }
}

#[test]
fn validate_catches_broken_plans() {
    let limits = cfg(64, 4).limits();
    let plan = |seqs| StepPlan {
        step: 1,
        seqs,
        preempted: vec![],
        finished: vec![],
    };
    // Shared prefix blocks untouched by both: fine.
    assert!(plan(vec![
        entry(1, 8, 1, vec![0, 1, 2]),
        entry(2, 8, 2, vec![0, 1, 3])
    ])
    .validate(&limits)
    .is_ok());
    let bad = [
        plan(vec![entry(1, 0, 65, (0..17).collect())]),
        plan(vec![entry(1, 0, 1, vec![0]), entry(1, 1, 1, vec![0])]),
        plan(vec![entry(1, 0, 5, vec![0])]),
        plan(vec![entry(1, 0, 0, vec![0])]),
        plan(vec![
            entry(1, 4, 1, vec![0, 1]),
            entry(2, 8, 1, vec![0, 1, 2]),
        ]),
        plan(vec![entry(1, 0, 2, vec![3, 3])]),
        plan(vec![entry(1, 510, 4, (0..129).collect())]),
        plan((0..9).map(|i| entry(i, 0, 1, vec![i as u32])).collect()),
    ];
    for (i, p) in bad.iter().enumerate() {
        assert!(
            matches!(p.validate(&limits), Err(SchedError::InvalidPlan { .. })),
            "case {i}"
        );
    }
    let mut p = plan(vec![entry(1, 0, 1, vec![0])]);
    p.preempted.push(1);
    assert!(p.validate(&limits).is_err());
}

#[test]
fn short_request_starts_next_step_during_a_long_prefill() {
    let mut c = cfg(512, 4);
    c.max_model_len = 2048;
    c.max_num_batched_tokens = 64;
    c.max_prefill_chunk = 64;
    let mut s = Scheduler::new(c).unwrap();
    s.add_request(req(1, 1000, 4)).unwrap();
    let first = step(&mut s);
    assert_eq!(
        first.get(1).unwrap().tokens.len(),
        64,
        "alone, the long prompt takes the budget"
    );
    s.add_request(req(2, 20, 4)).unwrap();
    let p = step(&mut s);
    // The long prefill left half the budget, and the short prompt fits in it whole.
    let short = p
        .get(2)
        .expect("the short request is admitted in the very next step");
    assert_eq!(short.tokens.len(), 20);
    assert!(short.wants_logits);
    assert_eq!(p.get(1).unwrap().tokens.len(), 32);
    // Once nothing waits, the long prompt gets the whole budget again (minus the decode).
    let p = step(&mut s);
    assert_eq!(p.get(1).unwrap().tokens.len(), 63);
}

#[test]
fn adapter_serial_steps_hold_one_adapter_and_take_turns() {
    let mut c = cfg(256, 4);
    c.adapter_serial = true;
    let mut s = Scheduler::new(c).unwrap();
    for (id, adapter) in [(1, None), (2, Some(7)), (3, Some(9)), (4, Some(7))] {
        s.add_request(req(id, 6, 5).with_adapter(adapter)).unwrap();
    }
    let plans = run_to_end(&mut s, 200);
    let mut seen = std::collections::HashSet::new();
    for p in &plans {
        let adapters: std::collections::HashSet<_> = p.seqs.iter().map(|q| q.adapter).collect();
        assert!(
            adapters.len() <= 1,
            "step {} mixes adapters {adapters:?}",
            p.step
        );
        seen.extend(adapters);
    }
    assert_eq!(seen.len(), 3, "every adapter ran");
    for id in 1..=4 {
        assert!(plans
            .iter()
            .any(|p| p.finished.contains(&(id, FinishReason::Length))));
    }
    // Without the option, the same requests share steps.
    let mut s = Scheduler::new(cfg(256, 4)).unwrap();
    for (id, adapter) in [(1, None), (2, Some(7)), (3, Some(9)), (4, Some(7))] {
        s.add_request(req(id, 6, 5).with_adapter(adapter)).unwrap();
    }
    let p = s.schedule();
    assert_eq!(p.seqs.len(), 4);
}

#[test]
fn verification_appends_accepted_drafts_and_releases_rejected_blocks() {
    let mut s = Scheduler::new(cfg(64, 4)).unwrap();
    s.add_request(req(1, 5, 50)).unwrap();
    step(&mut s); // prefill: 5 known + 1 sampled
    assert_eq!(s.decoding(), vec![1]);
    let n = s.tokens(1).unwrap().len();
    assert_eq!(n, 6);
    // Two right drafts, then wrong ones.
    let right: Vec<u32> = (0..2).map(|j| sample(1, n + j)).collect();
    let draft = [right.clone(), vec![7, 7, 7, 7]].concat();
    assert!(s.propose(1, draft.clone()));
    assert!(!s.propose(2, vec![1]), "unknown request");
    let plan = s.schedule();
    let q = plan.get(1).unwrap();
    assert_eq!((q.start_pos, q.draft, q.tokens.len()), (5, 6, 7));
    assert_eq!(q.drafts(), draft.as_slice());
    assert!(q.wants_logits);
    assert!(
        s.kv().block_table(1).unwrap().len() >= 3,
        "blocks for 12 positions"
    );
    let result = StepResult {
        sampled: vec![(1, sample(1, n + 2))],
        accepted: vec![(1, 2)],
        ..Default::default()
    };
    s.update(&plan, &result).unwrap();
    s.check().unwrap();
    assert_eq!(s.generated(1).unwrap(), expected(1, 5, 4).as_slice());
    assert_eq!(s.num_computed(1), Some(8));
    assert_eq!(
        s.kv().block_table(1).unwrap().len(),
        2,
        "rejected positions' block freed"
    );
    // A draft is for one step only; without one the next step decodes one token.
    let plan = s.schedule();
    assert_eq!(plan.get(1).unwrap().draft, 0);
    // Accepting more than was drafted is refused before anything changes.
    let bad = StepResult {
        sampled: vec![(1, 3)],
        accepted: vec![(1, 1)],
        ..Default::default()
    };
    assert!(s.update(&plan, &bad).is_err());
}

#[test]
fn drafts_respect_max_tokens_and_budget() {
    let mut c = cfg(64, 4);
    c.max_num_batched_tokens = 8;
    let mut s = Scheduler::new(c).unwrap();
    s.add_request(req(1, 5, 4)).unwrap();
    s.add_request(req(2, 5, 50)).unwrap();
    step(&mut s);
    step(&mut s);
    assert_eq!(s.decoding().len(), 2);
    // Request 1 has 2 tokens to go: a verification makes at most k + 1 known, so k <= 1.
    assert!(s.propose(1, vec![1, 2, 3, 4]));
    assert!(s.propose(2, vec![1, 2, 3, 4, 5, 6, 7, 8, 9]));
    let plan = s.schedule();
    assert_eq!(plan.get(1).unwrap().draft, 1);
    // 8 tokens: two decodes, one draft of request 1, five of request 2.
    assert_eq!(plan.get(2).unwrap().draft, 5);
    assert_eq!(plan.num_tokens(), 8);
}
