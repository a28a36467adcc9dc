//! Numerics of the real Qwen2.5-Coder Q4_K_M files (issue 40) against Hugging Face
//! transformers, on the exact path.
//!
//! The goldens `tests/golden/qwen2.5-coder-{0.5b,1.5b}-q4_k_m.json` are written by
//! `tools/reference/make_golden.py --model qwen2.5-coder-0.5b` (and `-1.5b`): transformers
//! loading the same GGUF, every tensor dequantized to f32, token ids from the GGUF's own
//! tokenizer through transformers, cross-checked against llama.cpp's tokenizer on the same
//! file. Checked here, for every prompt: the chat template's text and ids, the tokenizer ids,
//! the argmax at every position (no position is excused, near-ties included), the last
//! position's top-20 logits within 1e-3 relative (`|got - want| <= 1e-3 * max(|want|, 1)`),
//! and the greedy continuation (ids and text); and the tokenizer cases.
//!
//! The model files are large and not in the repository: `python3 tools/fetch_model.py
//! qwen2.5-coder-0.5b` (and `qwen2.5-coder-1.5b`) puts them in the user cache. A missing file
//! skips its test with a line saying SKIPPED, unless `TESSERA_REQUIRE_REAL_MODELS=1`, which
//! makes it fail. A file whose SHA-256 is not the golden's fails.
//!
//! Run with `cargo test --release -p tessera-engine --test real_models` (debug builds are
//! far too slow for a 1.5B model).

use std::fmt::Write as _;
use std::io::Read;
use std::path::PathBuf;
use std::sync::Mutex;

mod common;

use common::golden::{chat_messages, floats, ids};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tessera_engine::generate::generate;
use tessera_engine::sampling::argmax;
use tessera_engine::GenerateRequest;
use tessera_engine::{store, Engine, SamplingParams};

/// Relative tolerance of the last position's top-20 logits.
const TOP20_REL_TOL: f64 = 1e-3;
/// Compute units, as the SmolLM2 golden test uses.
const THREADS: usize = 2;

/// One model at a time: both tests together would not fit the CPUs' time well, and their
/// timings printed below would mean nothing.
static HEAVY: Mutex<()> = Mutex::new(());

fn golden(name: &str) -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/golden")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn sha256_file(path: &std::path::Path) -> String {
    let mut f = std::fs::File::open(path).unwrap();
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 22];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The cached model file named by the golden, or `None` (test skipped) when it is absent and
/// real models are not required.
fn model_file(g: &Value, fetch_name: &str) -> Option<PathBuf> {
    let file = g["model_file"].as_str().unwrap();
    let path = store::cache_dir().join("models").join(file);
    if path.is_file() {
        return Some(path);
    }
    let required = std::env::var("TESSERA_REQUIRE_REAL_MODELS").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "TESSERA_REQUIRE_REAL_MODELS=1 but {} is missing (python3 tools/fetch_model.py {fetch_name})",
        path.display()
    );
    eprintln!(
        "SKIPPED: {} is not cached (python3 tools/fetch_model.py {fetch_name})",
        path.display()
    );
    None
}

/// Checks one model against its golden; every mismatch is collected, with its figures, and
/// the test fails at the end listing all of them.
fn check_model(golden_name: &str, fetch_name: &str) {
    let g = golden(golden_name);
    let Some(path) = model_file(&g, fetch_name) else {
        return;
    };
    let _one_at_a_time = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let sha = sha256_file(&path);
    assert_eq!(
        sha,
        g["model_sha256"].as_str().unwrap(),
        "{}: not the file the golden was made from",
        path.display()
    );
    let t0 = std::time::Instant::now();
    let e = Engine::load(&path, THREADS)
        .unwrap_or_else(|err| panic!("loading {}: {err}", path.display()));
    eprintln!("{golden_name}: loaded in {:.1?}", t0.elapsed());

    let mut fails: Vec<String> = vec![];
    let steps = g["greedy_steps"].as_u64().unwrap() as usize;
    let greedy_key = format!("greedy{steps}");

    for p in g["prompts"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let text = p["text"].as_str().unwrap();
        let want_ids = ids(&p["ids"]);

        if let Some(msgs) = chat_messages(&p["chat_messages"]) {
            match e.tokenizer.apply_chat_template(&msgs, true) {
                Ok(t) if t == text => {}
                Ok(t) => fails.push(format!(
                    "{name}: chat template renders {t:?}, transformers {text:?}"
                )),
                Err(err) => fails.push(format!("{name}: chat template fails: {err}")),
            }
            match e.tokenizer.encode_chat(&msgs, true) {
                Ok(got) if got == want_ids => {}
                Ok(got) => fails.push(format!(
                    "{name}: chat ids {got:?}, transformers {want_ids:?}"
                )),
                Err(err) => fails.push(format!("{name}: encode_chat fails: {err}")),
            }
        }
        let got_ids = e.tokenizer.encode(text).unwrap();
        if got_ids != want_ids {
            let at = got_ids
                .iter()
                .zip(&want_ids)
                .position(|(a, b)| a != b)
                .unwrap_or(got_ids.len().min(want_ids.len()));
            fails.push(format!(
                "{name}: token ids differ from index {at}: tessera {:?} vs transformers {:?} \
                 ({} vs {} ids)",
                &got_ids[at..(at + 8).min(got_ids.len())],
                &want_ids[at..(at + 8).min(want_ids.len())],
                got_ids.len(),
                want_ids.len()
            ));
        }
        let decoded = e.tokenizer.decode(&want_ids).unwrap();
        if decoded != text {
            fails.push(format!("{name}: decode of the golden ids is {decoded:?}"));
        }

        // Numerics always on the golden's ids, so a tokenizer difference does not hide them.
        let n = want_ids.len();
        let t0 = std::time::Instant::now();
        let logits = e.logits_all(&want_ids, None).unwrap();
        let t_fwd = t0.elapsed();
        let want_argmax = ids(&p["argmax"]);
        let margins = floats(&p["margin"]);
        let mut argmax_bad = 0;
        for i in 0..n {
            let row = logits.row(i);
            let got = argmax(row);
            if got != want_argmax[i] {
                argmax_bad += 1;
                let w = want_argmax[i] as usize;
                fails.push(format!(
                    "{name}: argmax at position {i}/{n}: tessera {got} (logit {:.6}) vs \
                     transformers {w} (tessera's logit for it {:.6}; tessera margin {:.6}, \
                     transformers margin {})",
                    row[got as usize],
                    row[w],
                    row[got as usize] - row[w],
                    margins[i]
                ));
            }
        }
        let last = logits.row(n - 1);
        let (mut worst_rel, mut worst_abs) = (0f64, 0f64);
        for (rank, pair) in p["top20"].as_array().unwrap().iter().enumerate() {
            let id = pair[0].as_u64().unwrap() as usize;
            let want = pair[1].as_f64().unwrap();
            let got = last[id] as f64;
            let abs = (got - want).abs();
            let rel = abs / want.abs().max(1.0);
            worst_rel = worst_rel.max(rel);
            worst_abs = worst_abs.max(abs);
            if rel > TOP20_REL_TOL {
                fails.push(format!(
                    "{name}: top-20 #{rank} token {id}: tessera {got:.6} vs transformers {want} \
                     (|diff| {abs:.3e}, relative {rel:.3e})"
                ));
            }
        }
        let min_margin = margins.iter().cloned().fold(f64::INFINITY, f64::min);
        eprintln!(
            "{golden_name} {name}: {n} positions in {t_fwd:.1?}, {argmax_bad} argmax differ \
             (smallest transformers margin {min_margin:.6}); top-20 max |diff| {worst_abs:.3e}, \
             max relative {worst_rel:.3e}"
        );

        let req = GenerateRequest {
            prompt_ids: want_ids.clone(),
            max_tokens: steps,
            params: SamplingParams::greedy(),
            stop: vec![],
            ignore_eos: true,
            ..Default::default()
        };
        let mut streamed = String::new();
        let t0 = std::time::Instant::now();
        let stats = generate(&e, &req, &mut |t| streamed.push_str(t)).unwrap();
        eprintln!(
            "{golden_name} {name}: {steps} greedy tokens in {:.1?}",
            t0.elapsed()
        );
        let want_greedy = ids(&p[&greedy_key]);
        let want_text = p[format!("{greedy_key}_text")].as_str().unwrap();
        if stats.tokens != want_greedy {
            let at = stats
                .tokens
                .iter()
                .zip(&want_greedy)
                .position(|(a, b)| a != b)
                .unwrap_or(stats.tokens.len().min(want_greedy.len()));
            let gm = floats(&p[format!("{greedy_key}_margin")]);
            let mut msg = String::new();
            write!(
                msg,
                "{name}: greedy continuation differs from step {at}: tessera {:?} vs \
                 transformers {:?}",
                stats.tokens, want_greedy
            )
            .unwrap();
            if at < gm.len() {
                write!(msg, " (transformers margin at that step {})", gm[at]).unwrap();
            }
            fails.push(msg);
        }
        let got_text = e.tokenizer.decode(&stats.tokens).unwrap();
        if got_text != want_text {
            fails.push(format!(
                "{name}: greedy text {got_text:?} vs transformers {want_text:?}"
            ));
        }
        if streamed != got_text {
            fails.push(format!(
                "{name}: streamed text {streamed:?} is not the decode of its tokens {got_text:?}"
            ));
        }
    }

    let mut cases_bad = 0;
    let cases = g["tokenizer_cases"].as_array().unwrap();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids_transformers_gguf"]);
        if !case["ids_llama_cpp"].is_null() && ids(&case["ids_llama_cpp"]) != want {
            eprintln!("note: transformers and llama.cpp tokenize {text:?} differently");
        }
        let got = e.tokenizer.encode(text).unwrap();
        if got != want {
            cases_bad += 1;
            fails.push(format!(
                "tokenizer case {text:?}: tessera {got:?} vs transformers {want:?}"
            ));
        }
        let back = e.tokenizer.decode(&want).unwrap();
        if back != text {
            fails.push(format!("tokenizer case {text:?}: decodes to {back:?}"));
        }
    }
    eprintln!(
        "{golden_name}: {}/{} tokenizer cases identical",
        cases.len() - cases_bad,
        cases.len()
    );

    assert!(
        fails.is_empty(),
        "{golden_name}: {} mismatches against transformers:\n{}",
        fails.len(),
        fails.join("\n")
    );
}

#[test]
fn qwen2_5_coder_0_5b_q4_k_m_matches_transformers() {
    check_model("qwen2.5-coder-0.5b-q4_k_m.json", "qwen2.5-coder-0.5b");
}

#[test]
fn qwen2_5_coder_1_5b_q4_k_m_matches_transformers() {
    check_model("qwen2.5-coder-1.5b-q4_k_m.json", "qwen2.5-coder-1.5b");
}

/// Chat prompts with tools, an assistant's calls and tool results: the GGUF's own template
/// (Qwen2.5's) rendered with the same `tools` and messages as transformers renders them,
/// text and ids (tools/reference/make_tools_chat_golden.py).
#[test]
fn qwen_tool_prompts_match_transformers() {
    let g = golden("chat_tools/qwen2.5-coder-0.5b.json");
    let Some(path) = model_file(&g, "qwen2.5-coder-0.5b") else {
        return;
    };
    let files = tessera_formats::load_model(&path).unwrap();
    let tok = tessera_tokenizer::Tokenizer::from_spec(&files.tokenizer).unwrap();
    let extras = tessera_tokenizer::ChatExtras {
        tools: Some(g["tools"].clone()),
        kwargs: Default::default(),
    };
    for case in g["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let msgs: Vec<tessera_tokenizer::ChatMessage> =
            serde_json::from_value(case["messages"].clone()).unwrap();
        let text = tok.apply_chat_template_with(&msgs, true, &extras).unwrap();
        assert_eq!(text, case["text"].as_str().unwrap(), "{name}: text");
        let got = tok.encode_chat_with(&msgs, true, &extras).unwrap();
        assert_eq!(got, ids(&case["ids"]), "{name}: ids");
    }
}
