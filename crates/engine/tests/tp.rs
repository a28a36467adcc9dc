//! Tensor parallelism in one process on the default model: R = 2, 3, 4 ranks (3 KV groups of
//! 3 heads: R = 2 splits them 2 + 1, R = 4 replicates KV heads) give R = 1's argmax at every
//! position with logits within 1e-4 on the exact path, and the golden greedy continuations;
//! results are bitwise the same from run to run and for every sub-batching.

use std::path::PathBuf;

use serde_json::Value;
use tessera_engine::generate::generate;
use tessera_engine::sampling::argmax;
use tessera_engine::{Engine, GenerateRequest, SamplingParams};
use tessera_kernels::plan::Precision;

mod common;

fn golden_prompts() -> Vec<(String, Vec<u32>, Vec<u32>)> {
    let p =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/smollm2-135m-q4_1.json");
    let g: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    g["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                ids(&p["ids"]),
                ids(&p["greedy32"]),
            )
        })
        .collect()
}

use common::tp_engine as engine;

#[test]
fn ranks_2_to_4_match_one_rank_on_the_exact_path() {
    let prompts = golden_prompts();
    let one = engine(1, Precision::Exact);
    let reference: Vec<_> = prompts
        .iter()
        .map(|(_, ids, _)| one.logits_all(ids, None).unwrap())
        .collect();
    drop(one);
    for tp in [2, 3, 4] {
        let e = engine(tp, Precision::Exact);
        assert_eq!(e.tp_size(), tp);
        for ((name, ids, greedy), want) in prompts.iter().zip(&reference) {
            let got = e.logits_all(ids, None).unwrap();
            assert_eq!(got.rows, want.rows);
            for i in 0..ids.len() {
                assert_eq!(
                    argmax(got.row(i)),
                    argmax(want.row(i)),
                    "tp {tp} {name}: argmax at {i}"
                );
            }
            let d = got
                .data
                .iter()
                .zip(&want.data)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(d <= 1e-4, "tp {tp} {name}: logits differ by {d}");
            // Bitwise the same on a second run.
            assert!(
                e.logits_all(ids, None).unwrap().data == got.data,
                "tp {tp} {name}: not reproducible"
            );
            let req = GenerateRequest {
                prompt_ids: ids.clone(),
                max_tokens: 32,
                params: SamplingParams::greedy(),
                ignore_eos: true,
                ..Default::default()
            };
            let stats = generate(&e, &req, &mut |_| {}).unwrap();
            assert_eq!(&stats.tokens, greedy, "tp {tp} {name}: greedy continuation");
        }
    }
}

#[test]
fn sub_batches_under_tensor_parallelism_change_nothing() {
    let prompts: Vec<Vec<u32>> = golden_prompts().into_iter().take(4).map(|p| p.1).collect();
    for (tp, precision) in [
        (2, Precision::Exact),
        (2, Precision::Fast),
        (3, Precision::Exact),
    ] {
        let mut e = engine(tp, precision);
        common::assert_sub_batch_invariant(&mut e, &prompts);
    }
}

#[test]
fn a_request_among_others_gets_its_tokens_alone_under_tensor_parallelism() {
    use tessera_engine::{RequestEvent, StepEngine, KV_BLOCK_SIZE};
    let e = engine(2, Precision::Fast);
    let prompts: Vec<Vec<u32>> = golden_prompts().into_iter().map(|p| p.1).collect();
    let reqs: Vec<GenerateRequest> = prompts
        .iter()
        .map(|p| GenerateRequest {
            prompt_ids: p.clone(),
            max_tokens: 10,
            params: SamplingParams::greedy(),
            ignore_eos: true,
            ..Default::default()
        })
        .collect();
    let run = |reqs: &[GenerateRequest]| -> Vec<Vec<u32>> {
        let mut cfg = tessera_scheduler::SchedulerConfig::new(128, KV_BLOCK_SIZE);
        cfg.max_num_batched_tokens = 48;
        cfg.max_num_seqs = 8;
        cfg.max_prefill_chunk = 16;
        cfg.max_model_len = 512;
        let mut steps = StepEngine::new(&e, cfg).unwrap();
        for (i, r) in reqs.iter().enumerate() {
            steps.submit(i as u64, r).unwrap();
        }
        let mut out = vec![vec![]; reqs.len()];
        while steps.has_work() {
            for (id, ev) in steps.step().events {
                match ev {
                    RequestEvent::Text { tokens, .. } => out[id as usize].extend(tokens),
                    RequestEvent::Failed { message } => panic!("{message}"),
                    _ => {}
                }
            }
        }
        out
    };
    let together = run(&reqs);
    for (i, r) in reqs.iter().enumerate() {
        assert_eq!(run(std::slice::from_ref(r))[0], together[i], "request {i}");
    }
}

/// The step-time model chooses a sub-batching per step (counted in the overlap stats), the
/// chosen step's logits are bitwise those of one sub-batch, and the benchmarks' compute-only
/// and communication-only steps run on every rank without disturbing the next real step.
#[test]
fn the_per_step_choice_and_the_timing_modes_change_no_result() {
    use tessera_engine::{StepMode, SubBatchPolicy, SubBatching, KV_BLOCK_SIZE};
    use tessera_model::{BatchMeta, LogitsFor, SeqChunk};
    let mut e = engine(2, Precision::Fast);
    let stats = e.overlap_stats();
    let link = stats.link.expect("the link is measured at start-up");
    assert!(
        link.latency_s >= 0.0 && link.secs_per_byte >= 0.0,
        "{link:?}"
    );
    assert!(e.step_model().is_some());
    let lens = [40usize, 3, 70, 1];
    let blocks: usize = lens.iter().map(|n| n.div_ceil(KV_BLOCK_SIZE)).sum();
    let mut next = 0u32;
    let batch = BatchMeta {
        seqs: lens
            .iter()
            .map(|&n| {
                let b = n.div_ceil(KV_BLOCK_SIZE) as u32;
                let table = (next..next + b).collect();
                next += b;
                let toks = (0..n as u32).map(|i| 100 + i * 13 % 900).collect();
                SeqChunk::new(toks, 0, table, LogitsFor::All)
            })
            .collect(),
    };
    let run = |e: &mut Engine, policy: SubBatchPolicy| {
        e.sub_batching = policy;
        let mut kv = e.new_kv(KV_BLOCK_SIZE, blocks).unwrap();
        for mode in [StepMode::ComputeOnly, StepMode::CommOnly] {
            e.time_step(&batch, &mut kv, mode).unwrap();
        }
        e.forward_kv(&batch, &mut kv).unwrap()
    };
    let whole = run(&mut e, SubBatching::WHOLE.into());
    let auto = run(&mut e, SubBatchPolicy::Auto);
    assert_eq!(whole.rows, auto.rows);
    assert!(
        whole
            .data
            .iter()
            .zip(&auto.data)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "the chosen sub-batching changed the logits"
    );
    let stats = e.overlap_stats();
    let steps: u64 = stats.choices.iter().map(|c| c.1).sum();
    assert_eq!(steps, 6, "every step counted: {:?}", stats.choices);
    let (_, est) = stats.last.expect("a prediction for the last step");
    assert!(est.step > 0.0 && est.step >= est.compute.max(est.comm) * 0.999);
}
