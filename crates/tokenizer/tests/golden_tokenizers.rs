//! Token ids of awkward strings (unicode, code, digits, whitespace runs, special tokens in
//! text, the empty string) against Hugging Face transformers, for every tokenizer golden in
//! `tests/golden/tokenizers/` (written by `tools/reference/make_tokenizer_golden.py`).
//!
//! For each case: Tessera's ids (no BOS) equal the golden's expected ids (`expect`:
//! transformers' unless the golden's note says why not), and decoding them gives the text
//! the same reference decodes them to (`decoded`, special tokens kept), whole and streamed
//! token by token ([`StreamDecoder`]). The BOS rule is checked once per
//! tokenizer. llama.cpp's ids are recorded in the goldens beside transformers' and not
//! checked here (where the two differ, transformers is the reference).
//!
//! The tiny vocabularies are committed next to their goldens. The others are real files
//! outside the repository, in Tessera's cache folder (model files in `models/`, llama.cpp's
//! vocabulary files in its source tree under `llama.cpp/`, one made from a SentencePiece
//! model in `tokenizers/`). A missing one skips with a line saying SKIPPED, except that
//! with `TESSERA_REQUIRE_REAL_MODELS=1` the model files `tools/fetch_model.py` knows are
//! fetched (and a failed fetch fails), and with `TESSERA_REQUIRE_TOKENIZER_FILES=1` every
//! missing file fails. A file whose SHA-256 is not the golden's fails.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::Value;
use sha2::{Digest, Sha256};
use tessera_formats::gguf::{GgufFile, MetaValue};
use tessera_formats::{TokenizerSource, TokenizerSpec};
use tessera_tokenizer::{StreamDecoder, Tokenizer};

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The golden's `model_file`: `tests/...` in the repository, `cache:...` in Tessera's cache
/// folder, where a `*` component is any folder (the last name, sorted, that has the file).
fn resolve(recorded: &str) -> PathBuf {
    if recorded.starts_with("tests/") {
        return repo_root().join(recorded);
    }
    let rest = recorded
        .strip_prefix("cache:")
        .unwrap_or_else(|| panic!("model_file {recorded:?}: not tests/... or cache:..."));
    let mut paths = vec![tessera_core::cache_dir()];
    for part in rest.split('/') {
        paths = if part == "*" {
            let mut next: Vec<PathBuf> = paths
                .iter()
                .filter_map(|p| std::fs::read_dir(p).ok())
                .flatten()
                .filter_map(|e| e.ok().map(|e| e.path()))
                .collect();
            next.sort();
            next.reverse();
            next
        } else {
            paths.into_iter().map(|p| p.join(part)).collect()
        };
    }
    let first = paths.first().cloned();
    paths
        .into_iter()
        .find(|p| p.exists())
        .or(first)
        .unwrap_or_else(|| tessera_core::cache_dir().join(rest))
}

fn required() -> bool {
    std::env::var("TESSERA_REQUIRE_REAL_MODELS").is_ok_and(|v| v == "1")
}

/// The golden's file, or `None` (test skipped, with a line saying so) when it is absent.
/// A model file that `tools/fetch_model.py` fetches (the golden's `fetch`) is fetched when
/// `TESSERA_REQUIRE_REAL_MODELS=1`, and its absence then fails; a file no tool here
/// fetches (llama.cpp's vocabulary files, made ones) is skipped unless
/// `TESSERA_REQUIRE_TOKENIZER_FILES=1`.
fn model_file(name: &str, golden: &Value) -> Option<PathBuf> {
    let recorded = golden["model_file"].as_str().unwrap();
    let path = resolve(recorded);
    if path.is_file() {
        return Some(path);
    }
    let how = golden["fetch"].as_str();
    if let (Some(fetch), true) = (how, required()) {
        let python = std::env::var("TESSERA_PYTHON").unwrap_or_else(|_| "python3".into());
        let status = std::process::Command::new(python)
            .arg(repo_root().join("tools/fetch_model.py"))
            .arg(fetch)
            .stdout(std::process::Stdio::null())
            .status();
        assert!(
            status.is_ok_and(|s| s.success()) && path.is_file(),
            "TESSERA_REQUIRE_REAL_MODELS=1 but {} is missing and python3 tools/fetch_model.py {fetch} failed",
            path.display()
        );
        return Some(path);
    }
    let hint = golden["how"].as_str().unwrap_or("see its golden");
    let all = std::env::var("TESSERA_REQUIRE_TOKENIZER_FILES").is_ok_and(|v| v == "1");
    assert!(
        !all,
        "TESSERA_REQUIRE_TOKENIZER_FILES=1 but {} is missing ({hint})",
        path.display()
    );
    eprintln!("SKIPPED: {name}: {} is not here ({hint})", path.display());
    None
}

fn sha256_file(path: &Path) -> String {
    let mut f = std::fs::File::open(path).unwrap();
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn strings(f: &GgufFile, key: &str) -> Vec<String> {
    f.get(key)
        .and_then(MetaValue::as_array)
        .unwrap_or_else(|| panic!("{key} missing"))
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

/// The tokenizer part of a GGUF, as `tessera_formats::load` reads it (the model files
/// here may be vocabulary-only, which `load_model` does not open).
fn gguf_spec(f: &GgufFile) -> TokenizerSpec {
    let tokens = strings(f, "tokenizer.ggml.tokens");
    let token_types: Vec<i32> = match f
        .get("tokenizer.ggml.token_type")
        .and_then(MetaValue::as_array)
    {
        Some(a) => a.iter().map(|v| v.as_i64().unwrap_or(1) as i32).collect(),
        None => vec![1; tokens.len()],
    };
    let id = |k: &str| f.get(k).and_then(MetaValue::as_u64).map(|v| v as u32);
    let source = match f.get("tokenizer.ggml.model").and_then(MetaValue::as_str) {
        Some("gpt2") => TokenizerSource::GgufBpe {
            tokens,
            token_types,
            merges: strings(f, "tokenizer.ggml.merges"),
            pre: f
                .get("tokenizer.ggml.pre")
                .and_then(MetaValue::as_str)
                .unwrap_or("default")
                .to_string(),
        },
        Some("llama") => TokenizerSource::GgufSpm {
            scores: f
                .get("tokenizer.ggml.scores")
                .and_then(MetaValue::as_array)
                .map(|a| a.iter().map(|v| v.as_f64().unwrap_or(0.0) as f32).collect())
                .unwrap_or_else(|| vec![0.0; tokens.len()]),
            tokens,
            token_types,
            add_space_prefix: f
                .get("tokenizer.ggml.add_space_prefix")
                .and_then(MetaValue::as_bool)
                .unwrap_or(true),
            arch: f
                .get("general.architecture")
                .and_then(MetaValue::as_str)
                .map(str::to_string),
        },
        other => panic!("tokenizer model {other:?}"),
    };
    let add_bos = f
        .get("tokenizer.ggml.add_bos_token")
        .and_then(MetaValue::as_bool)
        .unwrap_or(matches!(source, TokenizerSource::GgufSpm { .. }));
    TokenizerSpec {
        source,
        bos_id: id("tokenizer.ggml.bos_token_id"),
        eos_ids: id("tokenizer.ggml.eos_token_id").into_iter().collect(),
        add_bos,
        chat_template: None,
    }
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn check(name: &str) {
    // Other case sets (make_tokenizer_golden.py --fuzz N --out DIR) are checked the same way.
    let dir = std::env::var_os("TESSERA_TOKENIZER_GOLDENS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("tests/golden/tokenizers"));
    let gp = dir.join(format!("{name}.json"));
    let golden: Value = serde_json::from_str(&std::fs::read_to_string(&gp).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", gp.display()));
    let Some(path) = model_file(name, &golden) else {
        return;
    };
    assert_eq!(
        sha256_file(&path),
        golden["sha256"].as_str().unwrap(),
        "{}: not the file the golden was made from",
        path.display()
    );
    let f = GgufFile::open(&path).unwrap();
    let mut spec = gguf_spec(&f);
    drop(f);
    let add_bos = spec.add_bos;
    spec.add_bos = false;
    // Built a few times (TESSERA_TOKENIZER_BUILDS, default 1): the fastest is printed.
    let builds: usize = std::env::var("TESSERA_TOKENIZER_BUILDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let mut best = f64::INFINITY;
    let mut tok = None;
    for _ in 0..builds.max(1) {
        let t0 = Instant::now();
        tok = Some(Tokenizer::from_spec(&spec).unwrap());
        best = best.min(t0.elapsed().as_secs_f64());
    }
    let tok = tok.unwrap();
    eprintln!(
        "{name}: tokenizer built in {:.0} ms ({} tokens; fastest of {builds})",
        best * 1e3,
        tok.vocab_size()
    );
    assert_eq!(tok.vocab_size(), tok.inner().get_vocab_size(true));
    // The tokenizer.json document of the same vocabulary (what `gguf::tokenizer_json`
    // writes, e.g. for a Hugging Face folder) loads as the same tokenizer.
    let doc = tessera_tokenizer::gguf::tokenizer_json(&spec.source).unwrap();
    let via_json = Tokenizer::from_spec(&TokenizerSpec {
        source: TokenizerSource::HfJson(doc.to_string()),
        ..spec.clone()
    })
    .unwrap();
    assert_eq!(via_json.vocab_size(), tok.vocab_size());
    let expect = golden["expect"].as_str().unwrap();
    let cases = golden["cases"].as_array().unwrap();
    let mut failures = vec![];
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let want = ids(&c[expect]);
        let got = tok.encode(text).unwrap();
        let got_json = via_json.encode(text).unwrap();
        if got_json != got {
            failures.push(format!(
                "{text:?}: tokenizer.json gives {got_json:?}, not {got:?}"
            ));
        }
        if got != want {
            let pieces = |v: &[u32]| -> Vec<String> {
                v.iter()
                    .map(|&i| tok.token_text(i).unwrap_or_default())
                    .collect()
            };
            failures.push(format!(
                "{text:?}\n   want {want:?} {:?}\n   got  {got:?} {:?}",
                pieces(&want),
                pieces(&got)
            ));
        }
        let want_text = c["decoded"].as_str().unwrap();
        let decoded = tok.decode(&want).unwrap();
        if decoded != want_text {
            failures.push(format!(
                "decode of {text:?}: want {want_text:?}, got {decoded:?}"
            ));
        }
        // Streamed token by token, the same text.
        let mut stream = StreamDecoder::new();
        let mut streamed = String::new();
        for &id in &want {
            streamed.extend(stream.push(&tok, id).unwrap());
        }
        streamed.extend(stream.finish(&tok).unwrap());
        if streamed != want_text {
            failures.push(format!(
                "streamed decode of {text:?}: want {want_text:?}, got {streamed:?}"
            ));
        }
    }
    if add_bos {
        spec.add_bos = true;
        let with_bos = Tokenizer::from_spec(&spec).unwrap();
        let bos = spec.bos_id.unwrap();
        let plain = tok.encode("Hello").unwrap();
        assert_eq!(
            with_bos.encode("Hello").unwrap(),
            [&[bos][..], &plain].concat()
        );
    }
    eprintln!("{name}: {} cases, {} failures", cases.len(), failures.len());
    assert!(failures.is_empty(), "{name}:\n{}", failures.join("\n"));
}

#[test]
fn gemma3() {
    check("gemma3");
}

#[test]
fn qwen2_5_coder() {
    check("qwen2.5-coder");
}

#[test]
fn smollm2() {
    check("smollm2");
}

#[test]
fn llama3_bpe() {
    check("llama3-bpe");
}

#[test]
fn llama2_spm() {
    check("llama2-spm");
}

#[test]
fn phi3() {
    check("phi3");
}

#[test]
fn mistral_v3() {
    check("mistral-v3");
}

#[test]
fn tiny_spm() {
    check("tiny-spm");
}

#[test]
fn tiny_spm_noprefix() {
    check("tiny-spm-noprefix");
}

#[test]
fn tiny_llama3_bpe() {
    check("tiny-llama3-bpe");
}
