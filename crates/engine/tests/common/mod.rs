//! Checks shared by the engine's integration tests.

#![allow(dead_code)]

pub mod golden;
pub mod tiny;

use std::sync::Arc;
use std::time::Duration;

use tessera_engine::request::LoraAdapter;
use tessera_engine::{
    Engine, GenerateRequest, RequestEvent, SamplingParams, SplitBy, StepEngine, SubBatching,
    KV_BLOCK_SIZE,
};
use tessera_kernels::plan::Precision;
use tessera_kernels::planner::Planner;
use tessera_model::{BatchMeta, LogitsFor, SeqChunk};
use tessera_scheduler::SchedulerConfig;

/// The default model over `tp` local ranks of one thread each (2 threads in all), untuned,
/// with a 10 s collective timeout.
pub fn tp_engine(tp: usize, precision: Precision) -> Engine {
    let path = tessera_engine::store::resolve_model(None).expect("default model");
    Engine::load_tp(
        &path,
        2,
        precision,
        Planner::untuned(),
        tp,
        Duration::from_secs(10),
    )
    .unwrap()
}

/// Logits of two steps over `prompts`: first every prompt's prefill (the last prompt only up
/// to its middle), then a mixed step of one decode token per other prompt and the rest of the
/// last prompt, all positions' logits asked for; run with `sub`.
fn two_steps(e: &mut Engine, prompts: &[Vec<u32>], sub: SubBatching) -> Vec<Vec<f32>> {
    two_steps_with(e, prompts, &[], &[], sub)
}

/// [`two_steps`] with prompt i run under adapter slot `slots[i]` of `adapters` (the base
/// model where `slots` has no entry or `None`).
fn two_steps_with(
    e: &mut Engine,
    prompts: &[Vec<u32>],
    adapters: &[Arc<LoraAdapter>],
    slots: &[Option<u32>],
    sub: SubBatching,
) -> Vec<Vec<f32>> {
    let slot = |i: usize| slots.get(i).copied().flatten();
    e.sub_batching = sub.into();
    let blocks_per_seq = prompts
        .iter()
        .map(|p| (p.len() + 1).div_ceil(KV_BLOCK_SIZE))
        .max()
        .unwrap_or(1);
    let n = prompts.len();
    let mut kv = e.new_kv(KV_BLOCK_SIZE, blocks_per_seq * n).unwrap();
    // Interleaved block tables: sequence i holds blocks i, i + n, i + 2n, ...
    let table =
        |i: usize| -> Vec<u32> { (0..blocks_per_seq).map(|b| (b * n + i) as u32).collect() };
    let last = n - 1;
    let half = prompts[last].len() / 2;
    let first = BatchMeta {
        seqs: prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let toks = if i == last {
                    p[..half].to_vec()
                } else {
                    p.clone()
                };
                let mut c = SeqChunk::new(toks, 0, table(i), LogitsFor::All);
                c.adapter = slot(i);
                c
            })
            .collect(),
    };
    let l1 = e.forward_kv_with(&first, &mut kv, adapters).unwrap();
    let second = BatchMeta {
        seqs: prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut c = if i == last {
                    SeqChunk::new(p[half..].to_vec(), half, table(i), LogitsFor::All)
                } else {
                    SeqChunk::new(vec![p[0]], p.len(), table(i), LogitsFor::Last)
                };
                c.adapter = slot(i);
                c
            })
            .collect(),
    };
    let l2 = e.forward_kv_with(&second, &mut kv, adapters).unwrap();
    e.sub_batching = SubBatching::WHOLE.into();
    vec![l1.data, l2.data]
}

/// For S in 1..=4 and both split modes, the logits of a prefill step and a mixed
/// decode/prefill step are bitwise identical to the one-pass forward.
pub fn assert_sub_batch_invariant(e: &mut Engine, prompts: &[Vec<u32>]) {
    assert_sub_batch_invariant_with(e, prompts, &[], &[])
}

/// [`assert_sub_batch_invariant`] with prompt i under adapter slot `slots[i]` of `adapters`.
pub fn assert_sub_batch_invariant_with(
    e: &mut Engine,
    prompts: &[Vec<u32>],
    adapters: &[Arc<LoraAdapter>],
    slots: &[Option<u32>],
) {
    let whole = two_steps_with(e, prompts, adapters, slots, SubBatching::WHOLE);
    assert!(whole.iter().all(|l| !l.is_empty()));
    for split in [SplitBy::Sequence, SplitBy::Tokens] {
        for count in 1..=4 {
            let got = two_steps_with(e, prompts, adapters, slots, SubBatching { count, split });
            for (step, (a, b)) in whole.iter().zip(&got).enumerate() {
                assert!(
                    a == b,
                    "step {}: {count} sub-batches by {split} change the logits ({} values differ)",
                    step + 1,
                    a.iter()
                        .zip(b)
                        .filter(|(x, y)| x.to_bits() != y.to_bits())
                        .count()
                );
            }
        }
    }
}

/// Greedy 8-token continuations of `prompts` served one after another by a step engine
/// (prefills in chunks of 16), with the prefix cache on or off; and the prompt tokens the
/// cache served.
pub fn one_after_another(
    e: &Engine,
    prompts: &[Vec<u32>],
    prefix_caching: bool,
    max_model_len: usize,
) -> (Vec<Vec<u32>>, u64) {
    let reqs: Vec<GenerateRequest> = prompts
        .iter()
        .map(|p| GenerateRequest {
            prompt_ids: p.clone(),
            max_tokens: 8,
            params: SamplingParams::greedy(),
            ignore_eos: true,
            ..Default::default()
        })
        .collect();
    requests_one_after_another(e, &reqs, prefix_caching, max_model_len)
}

/// [`one_after_another`] for whole requests (their adapters, lengths, sampling).
pub fn requests_one_after_another(
    e: &Engine,
    reqs: &[GenerateRequest],
    prefix_caching: bool,
    max_model_len: usize,
) -> (Vec<Vec<u32>>, u64) {
    let mut cfg = SchedulerConfig::new(32, KV_BLOCK_SIZE);
    cfg.prefix_caching = prefix_caching;
    cfg.max_model_len = max_model_len;
    cfg.max_prefill_chunk = 16;
    let mut steps = StepEngine::new(e, cfg).unwrap();
    let mut out = vec![];
    for (id, req) in reqs.iter().enumerate() {
        steps.submit(id as u64, req).unwrap();
        let mut toks = vec![];
        let mut done = false;
        while !done {
            for (_, ev) in steps.step().events {
                match ev {
                    RequestEvent::Text { tokens, .. } => toks.extend(tokens),
                    RequestEvent::Finished { .. } => done = true,
                    RequestEvent::Failed { message } => panic!("request {id}: {message}"),
                }
            }
        }
        assert_eq!(toks.len(), req.max_tokens);
        out.push(toks);
    }
    (out, steps.kv_metrics().prefix_hit_tokens)
}

/// Greedy tokens of each request, run all at once through one step engine (prefills in
/// chunks of 16, steps of at most 64 tokens); every KV block is back at the end.
pub fn run_together(e: &Engine, reqs: &[GenerateRequest]) -> Vec<Vec<u32>> {
    let mut cfg = SchedulerConfig::new(256, KV_BLOCK_SIZE);
    cfg.max_num_batched_tokens = 64;
    cfg.max_prefill_chunk = 16;
    cfg.max_model_len = 1024;
    let mut steps = StepEngine::new(e, cfg).unwrap();
    for (i, r) in reqs.iter().enumerate() {
        steps.submit(i as u64, r).unwrap();
    }
    let mut out = vec![vec![]; reqs.len()];
    let mut done = 0;
    while done < reqs.len() {
        for (id, ev) in steps.step().events {
            match ev {
                RequestEvent::Text { tokens, .. } => out[id as usize].extend(tokens),
                RequestEvent::Finished { .. } => done += 1,
                RequestEvent::Failed { message } => panic!("request {id}: {message}"),
            }
        }
    }
    assert_eq!(steps.kv_metrics().blocks_used, 0);
    out
}
