//! Every model family against Hugging Face transformers, on the exact path (issue 41).
//!
//! Tiny random models (`tests/models/tiny-<family>/` and `tiny-<family>.gguf`), made by
//! `tools/reference/make_family_golden.py` with transformers from each family's real config
//! scaled down and converted to GGUF by llama.cpp's own converter; goldens in
//! `tests/golden/families/`. Both files of each family must give, for every prompt: the
//! tokenizer's ids (and the chat template's text and ids), the argmax at every position, the
//! last position's top-20 logits within [`F32_TOL`] (absolute, the weights are exact in both
//! files), and the greedy continuation. Phi-3's LongRoPE regime follows the engine's
//! context: prompts of the short regime run with the context cut to the original one.
//!
//! The real Gemma 3 270M Q4_K_M file is checked the same way (top-20 within 1e-3 relative),
//! when cached (`python3 tools/fetch_model.py gemma3-270m`; SKIPPED otherwise, unless
//! `TESSERA_REQUIRE_REAL_MODELS=1`).
//!
//! Each family's PEFT adapter (`tests/models/lora-<family>/`, every projection under PEFT's
//! names, Phi-3's fused `qkv_proj` and `gate_up_proj` included; `make_family_lora.py`) on
//! both files against transformers + peft (`tests/golden/families/lora-<family>.json`).
//!
//! And what every family must keep: two tensor-parallel ranks give one rank's logits, an f16
//! KV cache stays close to f32, a prompt served from the prefix cache gets the tokens it
//! gets without, and rows are batch invariant.

mod common;

use common::golden::{chat_messages, floats, ids};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use tessera_engine::generate::generate;
use tessera_engine::sampling::argmax;
use tessera_engine::{store, Engine, GenerateRequest, SamplingParams};
use tessera_formats::ModelFiles;
use tessera_kernels::plan::Precision;
use tessera_lora::LoraAdapter;

/// Top-20 logits of the f32-computed tiny models (`|d| <= tol · max(|want|, 1)`).
const F32_TOL: f64 = 1e-4;
/// Top-20 logits of quantized files: relative tolerance (`|d| <= tol · max(|want|, 1)`).
const QUANT_REL_TOL: f64 = 1e-3;
const THREADS: usize = 2;

const FAMILIES: [&str; 6] = ["llama3", "qwen3", "gemma3", "gemma2", "phi3", "mistral"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn golden(name: &str) -> Value {
    let p = root().join("tests/golden/families").join(name);
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// An engine on `files` with the context cut to `context` when given.
fn engine(mut files: ModelFiles, context: Option<usize>, precision: Precision) -> Engine {
    if let Some(c) = context {
        files.config.max_position = c;
    }
    Engine::from_files(
        files,
        THREADS,
        precision,
        tessera_engine::tuning::load_planner(),
    )
    .unwrap()
}

/// How close the last position's top-20 must be: `|d| <= tol · max(|want|, 1)`.
#[derive(Clone, Copy)]
struct Tol(f64);

/// Which prompts a file is checked on, and whether their continuations too.
struct Take<'a> {
    prompt: &'a dyn Fn(&Value) -> bool,
    greedy: bool,
}

/// The golden with its prompts' expected outputs replaced by variant `name`'s.
fn variant(g: &Value, name: &str) -> Value {
    let mut v = g.clone();
    let alt = g["variant_goldens"][name]["prompts"]
        .as_array()
        .unwrap()
        .clone();
    for p in v["prompts"].as_array_mut().unwrap() {
        let a = alt.iter().find(|a| a["name"] == p["name"]).unwrap();
        // The variant records ids, not text: the main continuation's text does not apply.
        let keys: Vec<String> = p
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| k.ends_with("_text"))
            .cloned()
            .collect();
        for k in keys {
            p[k.as_str()] = Value::Null;
        }
        for (k, x) in a.as_object().unwrap() {
            p[k] = x.clone();
        }
    }
    v
}

/// Ids of `text` as the golden's prompt was tokenized (with or without the special tokens).
fn encode_like(e: &Engine, text: &str, with_bos: bool) -> Vec<u32> {
    let mut got = e.tokenizer.encode(text).unwrap();
    if !with_bos && !got.is_empty() && got.first() == e.tokenizer.bos_id().as_ref() {
        got.remove(0);
    }
    got
}

/// Checks `e` against the golden's prompts that `take` selects; returns every mismatch.
fn check_prompts(
    e: &Engine,
    g: &Value,
    what: &str,
    tol: Tol,
    take: &Take,
    adapter: Option<&Arc<LoraAdapter>>,
) -> Vec<String> {
    let mut fails = vec![];
    let steps = g["greedy_steps"].as_u64().unwrap() as usize;
    let greedy_key = format!("greedy{steps}");
    for p in g["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| (take.prompt)(p))
    {
        let name = format!("{what} {}", p["name"].as_str().unwrap());
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
        } else {
            let with_bos = p["bos_prepended"].as_bool().unwrap_or(true);
            let got = encode_like(e, text, with_bos);
            if got != want_ids {
                fails.push(format!("{name}: ids {got:?}, transformers {want_ids:?}"));
            }
        }
        // Numerics on the golden's ids, so a tokenizer difference does not hide them.
        let n = want_ids.len();
        let logits = e.logits_all(&want_ids, adapter).unwrap();
        let want_argmax = ids(&p["argmax"]);
        let margins = floats(&p["margin"]);
        let mut bad = 0;
        for i in 0..n {
            let row = logits.row(i);
            let got = argmax(row);
            if got != want_argmax[i] {
                bad += 1;
                let w = want_argmax[i] as usize;
                fails.push(format!(
                    "{name}: argmax at {i}/{n}: tessera {got} ({:.6}) vs transformers {w} \
                     (tessera's logit {:.6}; transformers margin {})",
                    row[got as usize], row[w], margins[i]
                ));
            }
        }
        let last = logits.row(n - 1);
        let mut worst = 0f64;
        for (rank, pair) in p["top20"].as_array().unwrap().iter().enumerate() {
            let id = pair[0].as_u64().unwrap() as usize;
            let want = pair[1].as_f64().unwrap();
            let got = last[id] as f64;
            let err = (got - want).abs() / want.abs().max(1.0);
            worst = worst.max(err);
            if err > tol.0 {
                fails.push(format!(
                    "{name}: top-20 #{rank} token {id}: {got:.6} vs {want} (error {err:.2e})"
                ));
            }
        }
        eprintln!("{name}: {n} positions, {bad} argmax differ, top-20 worst error {worst:.2e}");
        if !take.greedy {
            continue;
        }
        let req = GenerateRequest {
            prompt_ids: want_ids.clone(),
            max_tokens: steps,
            params: SamplingParams::greedy(),
            ignore_eos: true,
            adapter: adapter.cloned(),
            ..Default::default()
        };
        let mut streamed = String::new();
        let stats = generate(e, &req, &mut |t| streamed.push_str(t)).unwrap();
        let want_greedy = ids(&p[&greedy_key]);
        if stats.tokens != want_greedy {
            fails.push(format!(
                "{name}: greedy {:?} vs transformers {want_greedy:?}",
                stats.tokens
            ));
        }
        let got_text = e.tokenizer.decode(&stats.tokens).unwrap();
        let want_text = p[format!("{greedy_key}_text")].as_str();
        if want_text.is_some_and(|w| got_text != w) && stats.tokens == want_greedy {
            fails.push(format!(
                "{name}: greedy text {got_text:?} vs {want_text:?} for the same ids"
            ));
        }
    }
    fails
}

/// The golden's tokenizer cases (ids without BOS, as transformers gives them with
/// `add_special_tokens=False`), and their decoding.
fn check_tokenizer_cases(e: &Engine, g: &Value, what: &str) -> Vec<String> {
    let mut fails = vec![];
    let Some(cases) = g["tokenizer_cases"].as_array() else {
        return fails;
    };
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want = ids(case
            .get("ids_transformers")
            .unwrap_or(&case["ids_transformers_gguf"]));
        let with_bos = !want.is_empty() && want.first() == e.tokenizer.bos_id().as_ref();
        let got = encode_like(e, text, with_bos);
        if got != want {
            fails.push(format!(
                "{what} tokenizer case {text:?}: {got:?} vs transformers {want:?}"
            ));
        }
    }
    fails
}

/// Both files of a tiny family against its golden.
fn check_tiny(family: &str) {
    check_files(family, &format!("tiny-{family}.json"), None);
}

/// Both files of a tiny family against golden `name`, with the adapter folder `lora`
/// (relative to the repository) when given.
fn check_files(family: &str, name: &str, lora: Option<&str>) {
    let g = golden(name);
    // The family's config (the base golden records it).
    let base = golden(&format!("tiny-{family}.json"));
    let facts = &base["config_facts"]["config"];
    let mut fails = vec![];
    let files = [
        ("gguf", root().join(g["model_file"].as_str().unwrap())),
        ("hf", root().join(g["hf_folder"].as_str().unwrap())),
    ];
    for (kind, path) in files {
        let what = format!("tiny-{family} {kind}");
        let loaded = tessera_formats::load_model(&path).unwrap_or_else(|e| panic!("{what}: {e}"));
        // Phi-3's LongRoPE: the short factors while the context fits the original one.
        let original = match &loaded.config.rope_scaling {
            tessera_formats::RopeScaling::LongRope {
                original_max_position,
                ..
            } => Some(*original_max_position),
            _ => None,
        };
        let regimes: Vec<(Option<usize>, Option<&str>)> = match original {
            Some(o) => vec![(Some(o), Some("short")), (None, Some("long"))],
            None => vec![(None, None)],
        };
        // A window the HF config has and the file lost (Mistral's GGUF).
        let lost_window = loaded.config.block.windows.is_empty()
            && facts["sliding_window"].is_number()
            && facts["model_type"] == "mistral";
        // Against transformers with the window off where the golden has that variant;
        // otherwise only the prompts within the window, without their continuations.
        let variant_golden = lost_window && !g["variant_goldens"]["no_sliding_window"].is_null();
        let window = facts["sliding_window"].as_u64().unwrap_or(0) as usize;
        let want = if variant_golden {
            eprintln!("{what}: the file carries no sliding window: checked against transformers without one");
            variant(&g, "no_sliding_window")
        } else {
            if lost_window {
                eprintln!("{what}: the file carries no sliding window: prompts within {window} tokens only");
            }
            g.clone()
        };
        for (context, regime) in regimes {
            let files = tessera_formats::load_model(&path).unwrap();
            let e = engine(files, context, Precision::Exact);
            let adapter = lora.map(|dir| e.load_adapter(&root().join(dir)).unwrap());
            let within = !lost_window || variant_golden;
            let prompt = |p: &Value| {
                regime.is_none_or(|r| p["rope_regime"].as_str() == Some(r))
                    && (within || ids(&p["ids"]).len() <= window)
            };
            let take = Take {
                prompt: &prompt,
                greedy: within,
            };
            fails.extend(check_prompts(
                &e,
                &want,
                &what,
                Tol(F32_TOL),
                &take,
                adapter.as_ref(),
            ));
            if regime != Some("long") && lora.is_none() {
                fails.extend(check_tokenizer_cases(&e, &g, &what));
            }
        }
    }
    assert!(
        fails.is_empty(),
        "{name}: {} mismatches:\n{}",
        fails.len(),
        fails.join("\n")
    );
}

/// A family's PEFT adapter (all its projections under PEFT's names; Phi-3's fused
/// `qkv_proj` and `gate_up_proj`) on both files against transformers + peft.
fn check_lora(family: &str) {
    let dir = format!("tests/models/lora-{family}");
    check_files(family, &format!("lora-{family}.json"), Some(&dir));
}

macro_rules! tiny_family_tests {
    ($($name:ident => $family:literal),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                check_tiny($family);
            }
        )*
    };
}

tiny_family_tests! {
    llama3_matches_transformers => "llama3",
    qwen3_matches_transformers => "qwen3",
    gemma3_matches_transformers => "gemma3",
    gemma2_matches_transformers => "gemma2",
    phi3_matches_transformers => "phi3",
    mistral_matches_transformers => "mistral",
}

macro_rules! lora_family_tests {
    ($($name:ident => $family:literal),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                check_lora($family);
            }
        )*
    };
}

lora_family_tests! {
    llama3_lora_matches_peft => "llama3",
    qwen3_lora_matches_peft => "qwen3",
    gemma3_lora_matches_peft => "gemma3",
    gemma2_lora_matches_peft => "gemma2",
    phi3_lora_matches_peft => "phi3",
    mistral_lora_matches_peft => "mistral",
}

/// The real Gemma 3 270M Q4_K_M file, when cached.
#[test]
fn gemma_3_270m_q4_k_m_matches_transformers() {
    let g = golden("gemma-3-270m-q4_k_m.json");
    let file = g["model_file"].as_str().unwrap();
    let path = store::cache_dir()
        .join("models")
        .join(Path::new(file).file_name().unwrap());
    if !path.is_file() {
        let required = std::env::var("TESSERA_REQUIRE_REAL_MODELS").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "TESSERA_REQUIRE_REAL_MODELS=1 but {} is missing",
            path.display()
        );
        eprintln!(
            "SKIPPED: {} is not cached (python3 tools/fetch_model.py gemma3-270m)",
            path.display()
        );
        return;
    }
    let e = Engine::load(&path, THREADS).unwrap();
    let all = |_: &Value| true;
    let take = Take {
        prompt: &all,
        greedy: true,
    };
    let mut fails = check_prompts(&e, &g, "gemma-3-270m", Tol(QUANT_REL_TOL), &take, None);
    fails.extend(check_tokenizer_cases(&e, &g, "gemma-3-270m"));
    assert!(
        fails.is_empty(),
        "gemma-3-270m: {} mismatches:\n{}",
        fails.len(),
        fails.join("\n")
    );
}

fn tiny_gguf(family: &str) -> PathBuf {
    root().join(format!("tests/models/tiny-{family}.gguf"))
}

/// A prompt of `n` ids below the tiny vocabulary, with repeats.
fn prompt(n: usize, vocab: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 37 + 11) % (vocab - 8) + 4) as u32)
        .collect()
}

/// Two tensor-parallel ranks (head groups split, windows and norms replicated) give one
/// rank's logits, for every family.
#[test]
fn every_family_on_two_ranks_matches_one_rank() {
    for family in FAMILIES {
        let path = tiny_gguf(family);
        let one = Engine::load(&path, THREADS).unwrap();
        let t = prompt(40, one.model.config.vocab_size);
        let want = one.logits_all(&t, None).unwrap().data;
        let two = Engine::load_tp(
            &path,
            THREADS,
            Precision::Exact,
            tessera_engine::tuning::load_planner(),
            2,
            std::time::Duration::from_secs(10),
        )
        .unwrap();
        let got = two.logits_all(&t, None).unwrap().data;
        // The ranks' sums round differently from one rank's products: f32 rounding only.
        let d = common::tiny::max_abs_diff(&got, &want) / common::tiny::max_abs(&want).max(1.0);
        eprintln!("{family}: tp 2 vs 1 max |Δlogit| / max |logit| {d:.2e}");
        assert!(
            d < 1e-4,
            "{family}: two ranks differ from one by {d} of the largest logit"
        );
    }
}

/// Rows are bitwise the same batched with another sequence as alone, and a prefill in
/// chunks gives the one-shot logits, for every family (sliding windows included).
#[test]
fn every_family_is_batch_and_chunk_invariant() {
    for family in FAMILIES {
        let e = Engine::load(&tiny_gguf(family), THREADS).unwrap();
        let v = e.model.config.vocab_size;
        // Longer than the tiny models' windows (8 and 16 keys).
        let (a, b) = (prompt(19, v), prompt(15, v)[3..].to_vec());
        common::tiny::assert_batched_matches_alone(&e, &a, &b, 5, 7);
        let table: Vec<u32> = (0..8).rev().collect();
        common::tiny::assert_chunked_prefill_matches_one_shot(
            &e,
            &a,
            &table,
            &[&[1, 18], &[7, 5, 7], &[9, 9, 1]],
        );
        eprintln!("{family}: batch and chunk invariant");
    }
}

/// An f16 KV cache runs every family (windowed layers included) and stays near f32: the
/// argmax agrees at nearly every position. (Its arithmetic is exactly f32's on the rounded
/// values, `kv_dtype.rs`; how far the logits move is the model's sensitivity, large in the
/// random soft-capped Gemma 2.)
#[test]
fn every_family_runs_on_an_f16_kv_cache() {
    for family in FAMILIES {
        let path = tiny_gguf(family);
        let e = Engine::load(&path, THREADS).unwrap();
        let v = e.model.config.vocab_size;
        let t = prompt(40, v);
        let want = e.logits_all(&t, None).unwrap().data;
        let mut h = Engine::load(&path, THREADS).unwrap();
        h.kv_dtype = tessera_model::KvDtype::F16;
        let got = h.logits_all(&t, None).unwrap().data;
        let d = common::tiny::max_abs_diff(&got, &want) / common::tiny::max_abs(&want).max(1.0);
        let same = (0..t.len())
            .filter(|&i| argmax(&got[i * v..(i + 1) * v]) == argmax(&want[i * v..(i + 1) * v]))
            .count();
        eprintln!("{family}: f16 KV vs f32: max |Δlogit| / max |logit| {d:.2e}, argmax equal at {same}/{}", t.len());
        assert!(
            same * 20 >= t.len() * 19 && d < 0.1,
            "{family}: f16 KV off ({d}, {same} argmax equal)"
        );
    }
}

/// A prompt sharing two full KV blocks with an earlier one is served from the prefix cache
/// (windowed layers included) and gets the tokens it gets with the cache off.
#[test]
fn every_family_serves_from_the_prefix_cache() {
    use tessera_engine::KV_BLOCK_SIZE;
    for family in FAMILIES {
        let e = Engine::load(&tiny_gguf(family), THREADS).unwrap();
        let v = e.model.config.vocab_size;
        let first = prompt(40, v);
        let mut second = first[..2 * KV_BLOCK_SIZE].to_vec();
        second.extend((0..7).map(|i| i * 11 + 3));
        let prompts = [first, second];
        let (cached, hits) = common::one_after_another(&e, &prompts, true, 256);
        assert!(
            hits >= 2 * KV_BLOCK_SIZE as u64,
            "{family}: {hits} prompt tokens from the cache"
        );
        let (fresh, none) = common::one_after_another(&e, &prompts[1..], false, 256);
        assert_eq!(none, 0);
        assert_eq!(
            cached[1], fresh[0],
            "{family}: the cached prefix changed the tokens"
        );
        eprintln!("{family}: {hits} prompt tokens from the prefix cache, same tokens");
    }
}

/// `family`'s tiny GGUF rewritten without the tensors `drop`, with the metadata `set`
/// replaced (or removed where `None`), into `dir`.
fn rewritten(
    family: &str,
    dir: &common::tiny::TempDir,
    drop: &[&str],
    set: &[(&str, Option<tessera_formats::gguf::MetaValue>)],
) -> PathBuf {
    use tessera_formats::gguf::{writer, GgufFile};
    let f = GgufFile::open(&tiny_gguf(family)).unwrap();
    let mut meta: Vec<(String, tessera_formats::gguf::MetaValue)> = f
        .metadata
        .iter()
        .filter(|(k, _)| !set.iter().any(|(s, _)| s == k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    meta.extend(
        set.iter()
            .filter_map(|(k, v)| v.clone().map(|v| (k.to_string(), v))),
    );
    let data: Vec<(&tessera_formats::gguf::TensorInfo, Vec<u8>)> = f
        .tensors
        .iter()
        .filter(|t| !drop.contains(&t.name.as_str()))
        .map(|t| (t, f.tensor(t).unwrap().data().to_vec()))
        .collect();
    let specs: Vec<writer::TensorSpec> = data
        .iter()
        .map(|(t, d)| writer::TensorSpec {
            name: &t.name,
            dims: &t.dims,
            ggml_type: t.ggml_type,
            data: d,
        })
        .collect();
    let meta_refs: Vec<(&str, tessera_formats::gguf::MetaValue)> =
        meta.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(&format!("{family}-{n}.gguf"));
    std::fs::write(&path, writer::write(&meta_refs, &specs)).unwrap();
    path
}

/// A family's file missing what its block needs, or carrying bad values, is refused at load
/// with an error naming the tensor or key, never a panic.
#[test]
fn broken_family_files_are_refused_by_name() {
    use tessera_formats::gguf::MetaValue;
    let dir = common::tiny::TempDir::new("families-bad");
    let load_err = |p: &Path| match Engine::load(p, 1) {
        Ok(_) => panic!("{} loaded", p.display()),
        Err(e) => e.to_string(),
    };
    let cases: Vec<(PathBuf, &str)> = vec![
        (
            rewritten("gemma3", &dir, &["blk.1.attn_q_norm.weight"], &[]),
            "blk.1.attn_q_norm.weight",
        ),
        (
            rewritten("gemma2", &dir, &["blk.0.post_ffw_norm.weight"], &[]),
            "blk.0.post_ffw_norm.weight",
        ),
        (
            rewritten(
                "gemma3",
                &dir,
                &[],
                &[("gemma3.attention.sliding_window", None)],
            ),
            "gemma3.attention.sliding_window",
        ),
        (
            rewritten(
                "gemma2",
                &dir,
                &[],
                &[("gemma2.attn_logit_softcapping", Some(MetaValue::F32(-3.0)))],
            ),
            "soft-cap",
        ),
        (
            rewritten("phi3", &dir, &["blk.0.attn_qkv.weight"], &[]),
            "blk.0.attn_q.weight",
        ),
        (
            rewritten("qwen3", &dir, &["blk.0.attn_k_norm.weight"], &[]),
            "blk.0.attn_k_norm.weight",
        ),
    ];
    for (path, want) in cases {
        let e = load_err(&path);
        assert!(e.contains(want), "{}: {e}", path.display());
    }
}

/// Served by a step engine with few sequences, a model's sliding-window layers keep only
/// their window (a window group a fraction of the full cache) and give the tokens of the
/// full cache; a repeated prompt is served from the prefix cache, window blocks included.
#[test]
fn windowed_layers_keep_only_their_window() {
    use tessera_engine::{RequestEvent, StepEngine, KV_BLOCK_SIZE};
    use tessera_scheduler::SchedulerConfig;
    let cases = [
        ("gemma3", tiny_gguf("gemma3")),
        ("gemma2", tiny_gguf("gemma2")),
        ("mistral", root().join("tests/models/tiny-mistral")),
    ];
    for (family, path) in cases {
        let e = Engine::load(&path, THREADS).unwrap();
        let v = e.model.config.vocab_size;
        let prompts: Vec<Vec<u32>> =
            vec![prompt(70, v), prompt(70, v), prompt(45, v)[5..].to_vec()];
        // The full cache's answers, one request at a time.
        let want: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| {
                let req = GenerateRequest {
                    prompt_ids: p.clone(),
                    max_tokens: 12,
                    params: SamplingParams::greedy(),
                    ignore_eos: true,
                    ..Default::default()
                };
                generate(&e, &req, &mut |_| {}).unwrap().tokens
            })
            .collect();
        let mut cfg = SchedulerConfig::new(64, KV_BLOCK_SIZE);
        cfg.max_num_seqs = 2;
        cfg.max_model_len = 256;
        cfg.max_prefill_chunk = 16;
        cfg.max_num_batched_tokens = 16;
        let mut steps = StepEngine::new(&e, cfg).unwrap();
        let group = steps.config().window.expect("a window group");
        let full = e.kv_bytes_per_block(KV_BLOCK_SIZE) * 64;
        eprintln!(
            "{family}: window {} in {} blocks: KV {} of {} bytes",
            group.window,
            group.num_blocks,
            steps.kv_bytes(),
            full
        );
        assert!(steps.kv_bytes() < full);
        // Two at once, then the first prompt again (from the prefix cache).
        let mut got = vec![vec![]; prompts.len()];
        for wave in [&[0usize, 2][..], &[1][..]] {
            for &id in wave {
                let req = GenerateRequest {
                    prompt_ids: prompts[id].clone(),
                    max_tokens: 12,
                    params: SamplingParams::greedy(),
                    ignore_eos: true,
                    ..Default::default()
                };
                steps.submit(id as u64, &req).unwrap();
            }
            let mut done = 0;
            while done < wave.len() {
                for (id, ev) in steps.step().events {
                    match ev {
                        RequestEvent::Text { tokens, .. } => got[id as usize].extend(tokens),
                        RequestEvent::Finished { .. } => done += 1,
                        RequestEvent::Failed { message } => {
                            panic!("{family} request {id}: {message}")
                        }
                    }
                }
                steps.check().unwrap();
            }
        }
        assert_eq!(got, want, "{family}: the window group changed the tokens");
        let hits = steps.kv_metrics().prefix_hit_tokens;
        assert!(
            hits >= 64,
            "{family}: {hits} prompt tokens from the prefix cache"
        );
    }
}
