//! Steps filled by predicted time compute what steps filled by tokens compute: the step-cost
//! model calibrated from the default model is a valid predictor, and generating with a time
//! budget (which cuts prompts into uneven chunks, shorter deep in the context, and short
//! steps for arrivals) gives every request bitwise the tokens it gets alone by tokens.

use tessera_engine::{step_cost, store, Engine, GenerateRequest, RequestEvent, SamplingParams};
use tessera_engine::{StepEngine, KV_BLOCK_SIZE};
use tessera_scheduler::{SchedulerConfig, StepCost, TimeBudget};

fn engine() -> Engine {
    let path = store::resolve_model(None).expect("default model (run `tessera pull`)");
    Engine::load(&path, 2).unwrap_or_else(|e| panic!("loading {}: {e}", path.display()))
}

fn config(time: Option<TimeBudget>) -> SchedulerConfig {
    let mut cfg = SchedulerConfig::new(256, KV_BLOCK_SIZE);
    cfg.max_num_batched_tokens = 96;
    cfg.max_num_seqs = 8;
    cfg.max_prefill_chunk = 64;
    cfg.max_model_len = 1024;
    cfg.time_budget = time;
    cfg
}

/// Runs `reqs`, request `i` submitted before step `arrive[i]`; returns each one's tokens and
/// the tokens of every step.
fn run(
    e: &Engine,
    cfg: SchedulerConfig,
    reqs: &[GenerateRequest],
    arrive: &[usize],
) -> (Vec<Vec<u32>>, Vec<usize>) {
    let mut steps = StepEngine::new(e, cfg).unwrap();
    let mut out = vec![vec![]; reqs.len()];
    let mut sizes = Vec::new();
    for n in 0.. {
        for (i, r) in reqs.iter().enumerate().filter(|(i, _)| arrive[*i] == n) {
            steps.submit(i as u64, r).unwrap();
        }
        if !steps.has_work() && arrive.iter().all(|&a| a <= n) {
            break;
        }
        let o = steps.step();
        sizes.push(o.tokens);
        for (id, ev) in o.events {
            match ev {
                RequestEvent::Text { tokens, .. } => out[id as usize].extend(tokens),
                RequestEvent::Failed { message } => panic!("{message}"),
                _ => {}
            }
        }
    }
    (out, sizes)
}

#[test]
fn time_budgeted_steps_give_every_request_its_tokens() {
    let e = engine();
    let cost = step_cost::calibrate(&e, 96).unwrap();
    assert!(cost.validate().is_ok(), "{cost:?}");
    assert!(step_cost::auto_budget(cost).validate().is_ok(), "{cost:?}");

    // A cost with a steep per-key term, so chunk sizes shrink with depth; a budget of about
    // 40 tokens at the start of a prompt.
    let steep = TimeBudget::secs(
        StepCost {
            fixed_s: 1e-3,
            per_token_s: 1e-3,
            per_key_s: 4e-6,
            per_key2_s: 0.0,
            head_fixed_s: 0.5e-3,
            per_logit_row_s: 0.2e-3,
        },
        42e-3,
    );
    let prompt = |n: usize, seed: u32| -> Vec<u32> {
        (0..n as u32)
            .map(|i| (i * 7919 + seed * 104_729) % 40_000 + 100)
            .collect()
    };
    let reqs: Vec<GenerateRequest> = [(600, 1), (300, 2), (25, 3), (9, 4)]
        .iter()
        .map(|&(n, seed)| GenerateRequest {
            prompt_ids: prompt(n, seed),
            max_tokens: 6,
            params: SamplingParams::greedy(),
            ignore_eos: true,
            ..Default::default()
        })
        .collect();
    // The long prompts first; the short ones arrive while they prefill.
    let arrive = [0, 0, 3, 9];
    let (timed, sizes) = run(&e, config(Some(steep)), &reqs, &arrive);
    let (by_tokens, _) = run(&e, config(None), &reqs, &arrive);
    assert_eq!(timed, by_tokens);
    for (i, r) in reqs.iter().enumerate() {
        let (alone, _) = run(&e, config(None), std::slice::from_ref(r), &[0]);
        assert_eq!(alone[0], timed[i], "request {i}");
        assert_eq!(timed[i].len(), 6);
    }
    // The steps were cut by time: deep ones hold fewer tokens than the token budget allows.
    assert!(sizes.iter().all(|&n| n <= 96), "{sizes:?}");
    assert!(sizes.iter().any(|&n| n < 20), "{sizes:?}");
}
