//! Steps budgeted by predicted time: chunk sizes follow attention's cost, short arrivals get
//! in at once and whole, long prefills never starve, decodes always run, and plans stay
//! within the budget except for their mandatory part.

mod common;

use common::*;
use proptest::prelude::*;
use tessera_scheduler::scheduler::timed::PREFILL_FLOOR;
use tessera_scheduler::{
    Request, SchedError, Scheduler, SchedulerConfig, StepCost, StepPlan, TimeBudget,
};

/// About SmolLM2-135M's exact path on 2 cores: 3 ms a step, 1.6 ms a token, 2.2 µs per key
/// attended (all layers) and 1 ns more per position of the query, the head 1 ms + 0.74 ms
/// a row.
const COST: StepCost = StepCost {
    fixed_s: 3e-3,
    per_token_s: 1.6e-3,
    per_key_s: 2.2e-6,
    per_key2_s: 1e-9,
    head_fixed_s: 1e-3,
    per_logit_row_s: 0.74e-3,
};

fn timed(budget_ms: f64) -> SchedulerConfig {
    let mut c = SchedulerConfig::new(4096, 16);
    c.max_num_batched_tokens = 512;
    c.max_num_seqs = 32;
    c.max_prefill_chunk = 512;
    c.max_model_len = 8192;
    c.aging_steps = 0;
    c.time_budget = Some(TimeBudget::secs(COST, budget_ms * 1e-3));
    c
}

/// Runs steps until request `id` has computed at least `pos` positions.
fn run_until(s: &mut Scheduler, id: u64, pos: usize) {
    for _ in 0..10_000 {
        if s.num_computed(id).unwrap_or(0) >= pos {
            return;
        }
        step(s);
    }
    panic!("request {id} never reached {pos}");
}

/// A scheduler on `cfg` with `n` 8-token requests (ids `0..n`) of `max_tokens` each, stepped
/// until every one of them decodes.
fn decoding(cfg: SchedulerConfig, n: u64, max_tokens: usize) -> Scheduler {
    let mut s = Scheduler::new(cfg).unwrap();
    for id in 0..n {
        s.add_request(req(id, 8, max_tokens)).unwrap();
    }
    for _ in 0..1000 {
        if (0..n).all(|id| s.generated(id).is_some_and(|g| !g.is_empty())) {
            return s;
        }
        step(&mut s);
    }
    panic!("{n} requests never all decoded");
}

#[test]
fn deep_chunks_get_fewer_tokens_and_steps_stay_in_budget() {
    let mut s = Scheduler::new(timed(100.0)).unwrap();
    s.add_request(req(1, 3600, 2)).unwrap();
    let mut chunks = Vec::new();
    while s.num_computed(1).unwrap_or(0) < 3600 {
        let p = step(&mut s);
        let e = p.get(1).unwrap();
        assert!(
            COST.plan(&p) <= 0.1 + 1e-12,
            "step {}: {}",
            p.step,
            COST.plan(&p)
        );
        chunks.push((e.start_pos, e.tokens.len()));
    }
    // Each chunk is as long as the budget allows at its depth: one more token would not fit.
    for &(start, len) in &chunks[..chunks.len() - 1] {
        assert!(COST.step([(start, len + 1, false)]) > 0.1, "{start} {len}");
    }
    let first = chunks[0].1;
    let last_full = chunks[chunks.len() - 2].1;
    assert!(first >= 50, "{chunks:?}");
    assert!(
        last_full * 3 < first,
        "deep chunks are much shorter: {chunks:?}"
    );
    assert!(chunks.windows(2).all(|w| w[1].1 <= w[0].1), "{chunks:?}");
}

#[test]
fn a_short_arrival_runs_whole_in_the_next_step_and_that_step_is_short() {
    let mut s = Scheduler::new(timed(100.0)).unwrap();
    for id in 1..=3 {
        s.add_request(req(id, 3600, 4)).unwrap();
    }
    run_until(&mut s, 1, 2000);
    let before: Vec<usize> = (1..=3).map(|id| s.num_computed(id).unwrap()).collect();
    s.add_request(req(9, 30, 4)).unwrap();
    let p = step(&mut s);
    let short = p.get(9).expect("admitted in the very next step");
    assert_eq!((short.start_pos, short.tokens.len()), (0, 30));
    assert!(
        short.wants_logits,
        "its whole prompt: the first token comes from this step"
    );
    // The step is the short prompt's own.
    assert_eq!(
        p.seqs.len(),
        1,
        "{:?}",
        p.seqs.iter().map(|e| e.id).collect::<Vec<_>>()
    );
    let alone = COST.step([(0, 30, true)]);
    assert!((COST.plan(&p) - alone).abs() < 1e-12);
    // Another short arrival in the very next step: a short step again, but now the oldest
    // long prefill gets its minimum chunk (it never waits two steps in a row).
    s.add_request(req(10, 25, 4)).unwrap();
    let p = step(&mut s);
    assert_eq!(p.get(10).map(|e| e.tokens.len()), Some(25));
    assert_eq!(p.get(1).map(|e| e.tokens.len()), Some(1));
    assert!(s.num_computed(1).unwrap() > before[0]);
    // Once nothing waits the long prompts get the whole budget again.
    let p = step(&mut s);
    let longs: usize = (1..=3)
        .filter_map(|id| p.get(id))
        .map(|e| e.tokens.len())
        .sum();
    assert!(longs > 0);
    assert!(COST.plan(&p) > 0.09, "{}", COST.plan(&p));
}

#[test]
fn only_long_prefills_are_chunked_by_time() {
    // A budget that 16 decodes nearly fill: by time, a prompt gets only a few tokens.
    let mut c = timed(45.0);
    c.max_num_batched_tokens = 128;
    c.max_prefill_chunk = 64;
    c.long_prefill_tokens = 200;
    let mut s = decoding(c.clone(), 16, 100);
    // A 150-token prompt (not long) gets its chunks by tokens: the longest chunk, within
    // the half of the token budget admissions keep.
    s.add_request(req(50, 150, 4)).unwrap();
    let p = step(&mut s);
    assert_eq!(p.get(50).map(|e| e.tokens.len()), Some(64));
    let p = step(&mut s);
    assert_eq!(p.get(50).map(|e| e.tokens.len()), Some(64));
    // A 3,000-token one (long) gets what the time budget leaves: far fewer.
    s.add_request(req(60, 3000, 4)).unwrap();
    let mut got = 0;
    for _ in 0..3 {
        got = got.max(step(&mut s).get(60).map_or(0, |e| e.tokens.len()));
    }
    assert!(got > 0 && got < 40, "{got}");
    // With every prefill long, the short prompt is chunked by time too.
    c.long_prefill_tokens = 0;
    let mut s = decoding(c, 16, 100);
    s.add_request(req(50, 150, 4)).unwrap();
    let first = step(&mut s).get(50).map_or(0, |e| e.tokens.len());
    assert!(first > 0 && first < 40, "{first}");
}

#[test]
fn a_long_prefill_progresses_under_a_stream_of_short_arrivals() {
    let mut s = Scheduler::new(timed(60.0)).unwrap();
    s.add_request(req(1, 3000, 1)).unwrap();
    step(&mut s);
    let mut next = 100;
    let mut last = s.num_computed(1).unwrap();
    while s.num_computed(1).is_some_and(|n| n < 3000) {
        // A new short request every step, more than the budget can take.
        for _ in 0..2 {
            // Beyond the queue's bound they are refused: the stream goes on regardless.
            let _ = s.add_request(req(next, 40, 1));
            next += 1;
        }
        step(&mut s);
        let now = s.num_computed(1).unwrap_or(3000);
        assert!(now > last, "the long prefill stalled at {last}");
        last = now;
        assert!(next < 20_000, "too many steps");
    }
}

#[test]
fn a_long_prefill_progresses_every_other_step_under_short_arrivals() {
    let mut s = Scheduler::new(timed(100.0)).unwrap();
    s.add_request(req(1, 3000, 1)).unwrap();
    step(&mut s);
    let mut next = 100;
    let mut history = vec![s.num_computed(1).unwrap()];
    for _ in 0..200 {
        // A short request that fits whole arrives every step.
        s.add_request(req(next, 10, 1)).unwrap();
        next += 1;
        let p = step(&mut s);
        assert!(
            p.get(next - 1).is_some(),
            "each short request starts at once"
        );
        history.push(s.num_computed(1).unwrap());
    }
    for w in history.windows(3) {
        assert!(w[2] > w[0], "stalled two steps at {}", w[0]);
    }
}

#[test]
fn shortest_remaining_prefill_goes_after_the_oldest() {
    let mut s = Scheduler::new(timed(100.0)).unwrap();
    s.add_request(req(1, 3000, 1)).unwrap();
    s.add_request(req(2, 3000, 1)).unwrap();
    run_until(&mut s, 2, 1);
    // A 400-token prompt does not fit one step: it is chunked, then served right after the
    // oldest, before the other long one.
    s.add_request(req(3, 400, 1)).unwrap();
    step(&mut s);
    assert!(s.num_computed(3).unwrap() > 0);
    let (before2, before3) = (s.num_computed(2).unwrap(), s.num_computed(3).unwrap());
    let p = step(&mut s);
    assert!(p.get(1).is_some(), "the oldest always gets a chunk");
    assert!(s.num_computed(3).unwrap() > before3);
    let gained2 = s.num_computed(2).unwrap() - before2;
    let gained3 = s.num_computed(3).unwrap() - before3;
    if s.num_computed(3).unwrap() < 400 {
        // The longer one gets at most the crumbs the shorter one's chunk left.
        assert!(gained3 >= 10 * gained2, "{gained3} vs {gained2}");
    }
}

#[test]
fn decodes_always_run_and_admissions_keep_a_floor() {
    // Budget 20 ms, but 24 decodes cost more than that alone.
    let mut s = decoding(timed(20.0), 24, 200);
    s.add_request(req(99, 8, 3)).unwrap();
    let p = step(&mut s);
    for id in 0..24 {
        assert_eq!(p.get(id).map(|e| e.tokens.len()), Some(1), "decode of {id}");
    }
    let decodes = COST.step((0..24).map(|id| (p.get(id).unwrap().start_pos, 1, true)));
    assert!(
        decodes > 0.02,
        "the decodes alone exceed the budget: {decodes}"
    );
    assert!(p.get(99).is_some(), "the prefill floor still admits");
    assert!(COST.plan(&p) <= decodes + 0.02 * PREFILL_FLOOR + 1e-12);
}

#[test]
fn the_budget_can_be_replaced_between_steps() {
    let mut s = Scheduler::new(timed(100.0)).unwrap();
    s.add_request(req(1, 3000, 1)).unwrap();
    let wide = step(&mut s).get(1).unwrap().tokens.len();
    let slow = StepCost {
        per_token_s: 4.0 * COST.per_token_s,
        ..COST
    };
    s.set_time_budget(Some(TimeBudget::secs(slow, 0.1)))
        .unwrap();
    let narrow = step(&mut s).get(1).unwrap().tokens.len();
    assert!(narrow * 3 < wide, "{narrow} vs {wide}");
    let bad = TimeBudget::secs(slow, -1.0);
    assert!(s.set_time_budget(Some(bad)).is_err());
    assert_eq!(s.config().time_budget, Some(TimeBudget::secs(slow, 0.1)));
    s.set_time_budget(None).unwrap();
    assert_eq!(
        step(&mut s).get(1).unwrap().tokens.len(),
        512,
        "by tokens again"
    );
}

#[test]
fn bad_time_budgets_are_refused() {
    for (budget, fixed) in [
        (0.0, 1e-3),
        (f64::INFINITY, 1e-3),
        (0.1, -1.0),
        (0.1, f64::NAN),
    ] {
        let mut c = timed(100.0);
        c.time_budget = Some(TimeBudget::secs(
            StepCost {
                fixed_s: fixed,
                ..COST
            },
            budget,
        ));
        assert!(matches!(
            Scheduler::new(c),
            Err(SchedError::InvalidConfig { .. })
        ));
    }
}

/// The predicted time a plan may take: the budget, or the decodes (requests caught up
/// before the step) plus the prefill floor, plus the oldest prefill's minimum chunk.
fn allowed(tb: &TimeBudget, caught_up: &[(u64, usize)], p: &StepPlan, align: usize) -> f64 {
    let c = &tb.cost;
    let decodes = c.step(caught_up.iter().map(|&(_, pos)| (pos, 1, true)));
    let budget = tb.effective_s();
    let base = budget.max(decodes + budget * PREFILL_FLOOR);
    let forced = p
        .seqs
        .iter()
        .map(|e| c.chunk(e.start_pos, e.tokens.len().min(align), true) + c.head_fixed_s)
        .fold(0.0, f64::max);
    base + forced + 1e-12
}

fn config() -> impl Strategy<Value = SchedulerConfig> {
    (
        8usize..64,
        prop_oneof![Just(1usize), Just(4), Just(16)],
        1usize..6,
        0usize..64,
        1usize..48,
        any::<bool>(),
        1.0f64..40.0,
        prop_oneof![Just(0.0f64), Just(1e-5), Just(1e-4)],
        proptest::option::of(1usize..64),
        prop_oneof![Just(0usize), 1usize..96],
    )
        .prop_map(
            |(blocks, bs, seqs, extra, chunk, align, ms, per_key, relative, long_prefill)| {
                let mut c = SchedulerConfig::new(blocks, bs);
                c.max_num_seqs = seqs;
                c.max_num_batched_tokens = seqs + extra;
                c.max_prefill_chunk = chunk;
                c.chunk_align = if align {
                    4.min(chunk).min(seqs + extra)
                } else {
                    1
                };
                c.max_model_len = 96;
                c.max_waiting = 16;
                c.long_prefill_tokens = long_prefill;
                let cost = StepCost {
                    fixed_s: 1e-3,
                    per_token_s: 1e-3,
                    per_key_s: per_key,
                    per_key2_s: 0.0,
                    head_fixed_s: 0.5e-3,
                    per_logit_row_s: 0.2e-3,
                };
                // Absolute budgets, or relative to a prompt's predicted step.
                c.time_budget = Some(match relative {
                    None => TimeBudget::secs(cost, ms * 1e-3),
                    Some(tokens) => TimeBudget::relative(cost, ms / 10.0, tokens),
                });
                c
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Random arrivals under random time budgets: every plan within what it may take, every
    /// request finished with exactly its tokens (so none starved).
    #[test]
    fn plans_respect_the_time_budget(
        cfg in config(),
        arrivals in proptest::collection::vec((0usize..6, 1usize..90, 1usize..8), 1..40),
    ) {
        let tb = cfg.time_budget.unwrap();
        let (align, long_prefill) = (cfg.chunk_align, cfg.long_prefill_tokens);
        let mut s = Scheduler::new(cfg).unwrap();
        let mut lens = std::collections::HashMap::new();
        let mut arrivals = arrivals.into_iter();
        let mut pending = arrivals.next();
        let mut id = 0u64;
        for n in 0.. {
            prop_assert!(n < 5000, "no progress");
            // Requests arrive at random steps.
            while let Some((gap, len, max_tokens)) = pending {
                if gap > 0 && n % gap != 0 {
                    break;
                }
                if s.add_request(Request::new(id, prompt(len, id as u32), max_tokens)).is_ok() {
                    lens.insert(id, len);
                }
                id += 1;
                pending = arrivals.next();
            }
            if pending.is_none() && !s.has_unfinished() {
                break;
            }
            let caught_up: Vec<(u64, usize)> = lens
                .iter()
                .filter_map(|(&i, &len)| {
                    let done = s.num_computed(i)?;
                    let total = len + s.generated(i)?.len();
                    (s.status(i) == Some(tessera_scheduler::Status::Running) && done + 1 == total)
                        .then_some((i, done))
                })
                .collect();
            // Sequences too short to be long prefills, chunked by tokens alone: their
            // chunks (but decodes) come on top of what the budget allows.
            let short: Vec<u64> = lens
                .iter()
                .filter(|&(&i, &len)| {
                    len + s.generated(i).map_or(0, |g| g.len()) <= long_prefill
                        && !caught_up.iter().any(|c| c.0 == i)
                })
                .map(|(&i, _)| i)
                .collect();
            let p = step(&mut s);
            let t = tb.cost.plan(&p);
            let by_tokens: f64 = p
                .seqs
                .iter()
                .filter(|e| short.contains(&e.id))
                .map(|e| tb.cost.chunk(e.start_pos, e.tokens.len(), true) + tb.cost.head_fixed_s)
                .sum();
            let may = allowed(&tb, &caught_up, &p, align) + by_tokens;
            prop_assert!(t <= may, "step {}: {} > {}", p.step, t, may);
            for &(i, _) in &caught_up {
                prop_assert!(p.get(i).is_some() || p.preempted.contains(&i)
                    || !s.status(i).is_some_and(|st| st == tessera_scheduler::Status::Running),
                    "decode of {} skipped", i);
            }
        }
        prop_assert_eq!(s.kv().pool().used(), 0);
    }
}
