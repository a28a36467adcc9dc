//! LoRA adapters under tensor parallelism in one process, on the default model (3 KV groups
//! of 3 heads: R = 2 splits them 2 + 1, R = 3 one each; the MLP on whole blocks). Each rank
//! holds its part of an adapter (B's rows for q/k/v/gate/up, A's columns for o/down); the
//! row-parallel deltas join the partial sums before the all-reduce.
//! - R = 2 and 3 give R = 1's argmax at every position with logits within 1e-4, under
//!   every test adapter (all seven modules with rank and alpha patterns, q/v rsLoRA, k/o);
//! - a step mixing the base and several adapters is bitwise the same for every sub-batching;
//! - in a step engine, requests of different adapters batched together get the tokens they
//!   get alone;
//! - an adapter's per-rank parts go once nobody holds the adapter.

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;
use tessera_engine::request::LoraAdapter;
use tessera_engine::sampling::argmax;
use tessera_engine::{Engine, GenerateRequest, SamplingParams};
use tessera_kernels::plan::Precision;

mod common;

const ADAPTERS: [&str; 3] = ["rand-all7", "rand-qv-rslora", "rand-ko"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn goldens() -> Value {
    let p = root().join("tests/golden/lora/goldens.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn prompts(g: &Value) -> Vec<Vec<u32>> {
    g["base"]["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            p["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        })
        .collect()
}

use common::tp_engine as engine;

fn load(e: &Engine, g: &Value, name: &str) -> Arc<LoraAdapter> {
    let rel = g["adapters"][name]["path"].as_str().unwrap();
    e.load_adapter(&root().join(rel))
        .unwrap_or_else(|err| panic!("loading {rel}: {err}"))
}

#[test]
fn ranks_2_and_3_match_one_rank_under_every_adapter() {
    let g = goldens();
    let prompts = prompts(&g);
    let one = engine(1, Precision::Exact);
    let reference: Vec<Vec<_>> = ADAPTERS
        .iter()
        .map(|n| {
            let a = load(&one, &g, n);
            let base = one.logits_all(&prompts[0], None).unwrap();
            let all: Vec<_> = prompts
                .iter()
                .map(|p| one.logits_all(p, Some(&a)).unwrap())
                .collect();
            // The adapter changes the logits (else this test proves nothing).
            assert!(all[0].data != base.data, "{n} changes nothing");
            all
        })
        .collect();
    drop(one);
    for tp in [2, 3] {
        let e = engine(tp, Precision::Exact);
        for (name, want) in ADAPTERS.iter().zip(&reference) {
            let a = load(&e, &g, name);
            for (p, want) in prompts.iter().zip(want) {
                let got = e.logits_all(p, Some(&a)).unwrap();
                for i in 0..p.len() {
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
            }
        }
    }
}

#[test]
fn sub_batches_with_mixed_adapters_change_nothing() {
    let g = goldens();
    let prompts: Vec<Vec<u32>> = prompts(&g).into_iter().cycle().take(5).collect();
    for (tp, precision) in [
        (2, Precision::Exact),
        (2, Precision::Fast),
        (3, Precision::Exact),
    ] {
        let mut e = engine(tp, precision);
        let adapters: Vec<_> = ADAPTERS.iter().map(|n| load(&e, &g, n)).collect();
        let slots = [None, Some(0), Some(1), Some(0), Some(2)];
        common::assert_sub_batch_invariant_with(&mut e, &prompts, &adapters, &slots);
    }
}

#[test]
fn a_mixed_batch_under_tensor_parallelism_gives_every_request_its_tokens_alone() {
    let g = goldens();
    let prompts = prompts(&g);
    let e = engine(2, Precision::Exact);
    let loras: Vec<Option<Arc<LoraAdapter>>> = std::iter::once(None)
        .chain(ADAPTERS.iter().map(|n| Some(load(&e, &g, n))))
        .collect();
    let reqs: Vec<GenerateRequest> = (0..8)
        .map(|i| GenerateRequest {
            prompt_ids: prompts[i % prompts.len()].clone(),
            max_tokens: 10,
            params: SamplingParams::greedy(),
            ignore_eos: true,
            adapter: loras[i % loras.len()].clone(),
            ..Default::default()
        })
        .collect();
    let together = common::run_together(&e, &reqs);
    for (i, r) in reqs.iter().enumerate() {
        let alone = common::run_together(&e, std::slice::from_ref(r));
        assert_eq!(
            together[i], alone[0],
            "request {i} changed in a mixed batch"
        );
    }
    assert_eq!(reqs[0].prompt_ids, reqs[6].prompt_ids);
    assert_ne!(together[0], together[6], "the adapter changed nothing");
}

#[test]
fn an_adapters_rank_parts_go_with_it() {
    let g = goldens();
    let prompts = prompts(&g);
    let e = engine(2, Precision::Exact);
    let a = load(&e, &g, "rand-all7");
    assert_eq!(e.tp_adapters_held(), 1, "parts made at load");
    let with = e.logits_all(&prompts[0], Some(&a)).unwrap();
    drop(a);
    // Still held until a step notices the adapter is gone.
    e.logits_all(&prompts[0], None).unwrap();
    assert_eq!(
        e.tp_adapters_held(),
        0,
        "parts kept after the adapter was dropped"
    );
    // Loaded again (a new id), it gives the same logits.
    let again = load(&e, &g, "rand-all7");
    assert_eq!(
        e.logits_all(&prompts[0], Some(&again)).unwrap().data,
        with.data
    );
    // An adapter loaded without the engine (no parts made ahead) is sharded at first use.
    let direct = Arc::new(
        LoraAdapter::load(
            &root().join(g["adapters"]["rand-all7"]["path"].as_str().unwrap()),
            &e.config,
        )
        .unwrap(),
    );
    assert_eq!(
        e.logits_all(&prompts[0], Some(&direct)).unwrap().data,
        with.data
    );
    assert_eq!(e.tp_adapters_held(), 2);
}
