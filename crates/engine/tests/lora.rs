//! LoRA adapters against peft on the default model. The adapters and golden logits in
//! `tests/golden/lora/` are written by `tools/reference/make_lora*.py` (peft over the same
//! GGUF dequantized by transformers): seeded random adapters on all seven modules (rank and
//! alpha patterns, f16), on q/v with rsLoRA, on k/o with rank 2, and a small adapter trained
//! with peft. Checked on the exact path: argmax at every position, the last position's top-20
//! logits within 1e-2, and 32-token greedy continuations; the GGUF LoRA versions give the same
//! logits as their PEFT folders; a batch mixing the base and several adapters gives every
//! request the tokens it gets alone (exact and fast); adapters that do not fit are refused;
//! factors stored in f16 or bf16 are held so (half the bytes) and give bitwise the logits of
//! the same values stored as f32.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use tessera_core::DType;
use tessera_engine::generate::generate;
use tessera_engine::request::LoraAdapter;
use tessera_engine::sampling::argmax;
use tessera_engine::{store, Engine, GenerateRequest, SamplingParams, KV_BLOCK_SIZE};
use tessera_kernels::plan::Precision;
use tessera_lora::{Factors, Target};

mod common;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn goldens() -> Value {
    let p = root().join("tests/golden/lora/goldens.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn engine(precision: Precision) -> Engine {
    let path = store::resolve_model(None).expect("default model");
    Engine::load_with(&path, 2, precision, tessera_engine::tuning::load_planner()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn adapter(e: &Engine, rel: &str) -> Arc<LoraAdapter> {
    e.load_adapter(&root().join(rel))
        .unwrap_or_else(|err| panic!("loading {rel}: {err}"))
}

/// Checks `prompts` of a golden entry under `lora`.
fn check_prompts(e: &Engine, what: &str, lora: Option<&Arc<LoraAdapter>>, prompts: &Value) {
    for p in prompts.as_array().unwrap() {
        let name = format!("{what}/{}", p["name"].as_str().unwrap());
        let want_ids = ids(&p["ids"]);
        let logits = e.logits_all(&want_ids, lora).unwrap();
        let want_argmax = ids(&p["argmax"]);
        for (i, want) in want_argmax.iter().enumerate() {
            assert_eq!(
                argmax(logits.row(i)),
                *want,
                "{name}: argmax at position {i} (reference margin {})",
                p["margin"][i]
            );
        }
        let last = logits.row(want_ids.len() - 1);
        for pair in p["top20"].as_array().unwrap() {
            let id = pair[0].as_u64().unwrap() as usize;
            let want = pair[1].as_f64().unwrap();
            assert!(
                (last[id] as f64 - want).abs() <= 1e-2,
                "{name}: logit of token {id}: {} vs peft {want}",
                last[id]
            );
        }
        let req = GenerateRequest {
            prompt_ids: want_ids,
            max_tokens: 32,
            params: SamplingParams::greedy(),
            ignore_eos: true,
            adapter: lora.cloned(),
            ..Default::default()
        };
        let stats = generate(e, &req, &mut |_| {}).unwrap();
        assert_eq!(
            stats.tokens,
            ids(&p["greedy32"]),
            "{name}: greedy continuation"
        );
    }
}

#[test]
fn every_adapter_matches_peft_on_the_exact_path() {
    let g = goldens();
    let e = engine(Precision::Exact);
    check_prompts(&e, "base", None, &g["base"]["prompts"]);
    for (name, a) in g["adapters"].as_object().unwrap() {
        let lora = adapter(&e, a["path"].as_str().unwrap());
        check_prompts(&e, name, Some(&lora), &a["prompts"]);
    }
}

#[test]
fn gguf_lora_files_give_the_peft_folders_logits() {
    let g = goldens();
    let e = engine(Precision::Exact);
    let mut checked = 0;
    for (name, a) in g["adapters"].as_object().unwrap() {
        let Some(gguf) = a["gguf"].as_str() else {
            continue;
        };
        let (peft, ggml) = (adapter(&e, a["path"].as_str().unwrap()), adapter(&e, gguf));
        assert_eq!(peft.targets(), ggml.targets(), "{name}");
        for p in a["prompts"].as_array().unwrap() {
            let t = ids(&p["ids"]);
            let (x, y) = (
                e.logits_all(&t, Some(&peft)).unwrap(),
                e.logits_all(&t, Some(&ggml)).unwrap(),
            );
            let d = x
                .data
                .iter()
                .zip(&y.data)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(d < 1e-3, "{name}: GGUF and PEFT logits differ by {d}");
        }
        checked += 1;
    }
    assert!(checked >= 1, "no GGUF LoRA golden");
}

#[test]
fn a_mixed_batch_gives_every_request_its_tokens_alone() {
    let g = goldens();
    for precision in [Precision::Exact, Precision::Fast] {
        let e = engine(precision);
        let loras: Vec<Option<Arc<LoraAdapter>>> = std::iter::once(None)
            .chain(
                ["rand-all7", "rand-qv-rslora", "pirate"]
                    .iter()
                    .map(|n| Some(adapter(&e, g["adapters"][n]["path"].as_str().unwrap()))),
            )
            .collect();
        let prompts: Vec<Vec<u32>> = g["base"]["prompts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| ids(&p["ids"]))
            .collect();
        // Interleaved: request i runs adapter i % 4 on prompt i % prompts.
        let reqs: Vec<GenerateRequest> = (0..8)
            .map(|i| GenerateRequest {
                prompt_ids: prompts[i % prompts.len()].clone(),
                max_tokens: 12,
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
                "{precision}: request {i} changed in a mixed batch"
            );
        }
        // Requests 0 and 6 share a prompt; 6 runs an adapter, which changes its tokens.
        assert_eq!(reqs[0].prompt_ids, reqs[6].prompt_ids);
        assert_ne!(
            together[0], together[6],
            "{precision}: the adapter changed nothing"
        );
    }
}

#[test]
fn the_prefix_cache_never_serves_one_adapters_kv_to_another() {
    let g = goldens();
    let e = engine(Precision::Exact);
    let a = adapter(&e, g["adapters"]["rand-all7"]["path"].as_str().unwrap());
    let b = adapter(&e, g["adapters"]["rand-ko"]["path"].as_str().unwrap());
    // A prompt of several full blocks, run under the base, a, b, then a again.
    let prompt: Vec<u32> = g["base"]["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| ids(&p["ids"]))
        .take(3 * KV_BLOCK_SIZE + 5)
        .collect();
    let req = |lora: &Option<Arc<LoraAdapter>>| GenerateRequest {
        prompt_ids: prompt.clone(),
        max_tokens: 8,
        params: SamplingParams::greedy(),
        ignore_eos: true,
        adapter: lora.clone(),
        ..Default::default()
    };
    let order = [None, Some(a.clone()), Some(b.clone()), Some(a)];
    let reqs: Vec<_> = order.iter().map(req).collect();
    let (cached, hits) = common::requests_one_after_another(&e, &reqs, true, 1024);
    let (fresh, none) = common::requests_one_after_another(&e, &reqs, false, 1024);
    assert_eq!(none, 0);
    assert_eq!(cached, fresh, "a cached prefix changed a request's tokens");
    // Only the second request of adapter a finds its prompt cached.
    assert_eq!(hits as usize, prompt.len() / KV_BLOCK_SIZE * KV_BLOCK_SIZE);
    assert_ne!(fresh[0], fresh[1], "the adapter changed nothing");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for f in std::fs::read_dir(from).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), to.join(f.file_name())).unwrap();
    }
}

#[test]
fn adapters_that_do_not_fit_are_refused_by_name() {
    let e = engine(Precision::Exact);
    let src = root().join("tests/golden/lora/rand-ko");
    let dir = std::env::temp_dir().join(format!("tessera-lora-refuse-{}", std::process::id()));
    let edit = |key: &str, v: Value| -> String {
        let d = dir.join(key);
        copy_dir(&src, &d);
        let p = d.join("adapter_config.json");
        let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        cfg[key] = v;
        std::fs::write(&p, cfg.to_string()).unwrap();
        e.load_adapter(&d).unwrap_err().to_string()
    };
    assert!(edit("use_dora", Value::Bool(true)).contains("DoRA"));
    assert!(edit("peft_type", "PREFIX_TUNING".into()).contains("PREFIX_TUNING"));
    // A rank that does not match the tensors: the shapes are named.
    let e2 = edit("r", 3.into());
    assert!(e2.contains("lora_A") && e2.contains("[3, 576]"), "{e2}");
    // Another architecture's GGUF LoRA, or a model file that is not an adapter.
    let not_adapter = e
        .load_adapter(&store::resolve_model(None).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        not_adapter.contains("not a GGUF LoRA adapter"),
        "{not_adapter}"
    );
    let missing = e.load_adapter(&dir.join("nope")).unwrap_err().to_string();
    assert!(missing.contains("nope"), "{missing}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `values` (of `dtype`'s little-endian `bytes`) rounded to `round` and stored as `store`.
fn restored(bytes: &[u8], dtype: DType, round: DType, store: DType) -> Vec<u8> {
    let v = Factors::from_le_bytes(bytes, dtype).unwrap().to_f32_vec();
    let r = Factors::from_f32(&v, round).unwrap().to_f32_vec();
    Factors::from_f32(&r, store).unwrap().to_le_bytes()
}

/// A copy of PEFT folder `src` in `dir`, every factor rounded to `round`, stored as `store`.
fn peft_copy(src: &Path, dir: &Path, round: DType, store: DType) {
    use safetensors::{tensor::TensorView, Dtype, SafeTensors};
    let ours = |d: Dtype| match d {
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        d => panic!("{d:?}"),
    };
    let theirs = |d: DType| match d {
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        _ => Dtype::BF16,
    };
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(
        src.join("adapter_config.json"),
        dir.join("adapter_config.json"),
    )
    .unwrap();
    let bytes = std::fs::read(src.join("adapter_model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(name, t)| {
            let b = restored(t.data(), ours(t.dtype()), round, store);
            (name, t.shape().to_vec(), b)
        })
        .collect();
    let views = data.iter().map(|(n, shape, b)| {
        (
            n.clone(),
            TensorView::new(theirs(store), shape.clone(), b).unwrap(),
        )
    });
    let path = dir.join("adapter_model.safetensors");
    safetensors::tensor::serialize_to_file(views, None, &path).unwrap();
}

/// A copy of GGUF LoRA file `src` at `dst`, factors rounded to `round`, stored as `store`.
fn gguf_copy(src: &Path, dst: &Path, round: DType, store: DType) {
    use tessera_formats::gguf::writer::{write, TensorSpec};
    use tessera_formats::gguf::GgufFile;
    let f = GgufFile::open(src).unwrap();
    let ggml = |d: DType| match d {
        DType::F32 => 0,
        DType::F16 => 1,
        _ => 30,
    };
    let data: Vec<Vec<u8>> = f
        .tensors
        .iter()
        .map(|info| {
            let t = f.tensor(info).unwrap();
            restored(t.data(), t.dtype, round, store)
        })
        .collect();
    let specs: Vec<TensorSpec> = f
        .tensors
        .iter()
        .zip(&data)
        .map(|(info, b)| TensorSpec {
            name: &info.name,
            dims: &info.dims,
            ggml_type: ggml(store),
            data: b,
        })
        .collect();
    let meta: Vec<(&str, _)> = f
        .metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    std::fs::write(dst, write(&meta, &specs)).unwrap();
}

/// The element types `a`'s modules are held in.
fn held(a: &LoraAdapter) -> Vec<DType> {
    let mut v: Vec<DType> = (0..64)
        .flat_map(|l| Target::ALL.map(|t| a.module(l, t)))
        .flatten()
        .flat_map(|m| [m.a.dtype(), m.b_t.dtype()])
        .collect();
    v.dedup();
    v
}

/// On the exact path (the fast path differs only in the base product), with the golden's
/// first prompt: a debug build runs the model slowly.
#[test]
fn half_factors_give_the_logits_of_their_values_held_as_f32() {
    let g = goldens();
    let dir = std::env::temp_dir().join(format!("tessera-lora-halves-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let prompt = ids(&g["base"]["prompts"][0]["ids"]);
    let all7 = root().join(g["adapters"]["rand-all7"]["path"].as_str().unwrap());
    let ko_gguf = root().join(g["adapters"]["rand-ko"]["gguf"].as_str().unwrap());
    let e = engine(Precision::Exact);
    let base = e.logits_all(&prompt, None).unwrap();
    // rand-all7 is stored in f16: held so as it is.
    let stored = e.load_adapter(&all7).unwrap();
    assert_eq!(held(&stored), [DType::F16]);
    for round in [DType::F16, DType::BF16] {
        let load = |what: &str, store: DType| {
            let d = dir.join(format!("{round:?}-{what}-{store:?}"));
            if what == "peft" {
                peft_copy(&all7, &d, round, store);
                e.load_adapter(&d).unwrap()
            } else {
                let f = d.with_extension("gguf");
                gguf_copy(&ko_gguf, &f, round, store);
                e.load_adapter(&f).unwrap()
            }
        };
        for what in ["peft", "gguf"] {
            let (halves, f32s) = (load(what, round), load(what, DType::F32));
            assert_eq!(held(&halves), [round], "{what}");
            assert_eq!(held(&f32s), [DType::F32], "{what}");
            assert_eq!(2 * halves.bytes(), f32s.bytes(), "{what}");
            if (what, round) == ("peft", DType::F16) {
                assert_eq!(halves.bytes(), stored.bytes());
            }
            let x = e.logits_all(&prompt, Some(&halves)).unwrap();
            let y = e.logits_all(&prompt, Some(&f32s)).unwrap();
            let same = x
                .data
                .iter()
                .zip(&y.data)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{what} {round:?}: logits differ from f32's");
            assert_ne!(x.data, base.data, "{what}: the adapter changed nothing");
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}
