//! End-to-end checks of model loading on a tiny random Llama written to disk in both formats
//! Tessera reads: a Hugging Face folder (safetensors, "rotate half" q/k rows) and a GGUF file
//! (q/k rows permuted the way llama.cpp's `convert_hf_to_gguf.py` does, for interleaved-pair
//! RoPE). Both must give the same logits; the model must be batch- and chunk-invariant; and
//! every kind of bad input must come back as an error naming the problem, never a panic.

use serde_json::json;
use tessera_core::DType;
use tessera_engine::Engine;
use tessera_formats::gguf::MetaValue;
use tessera_kernels::plan::Precision;
use tessera_kernels::planner::Planner;
use tessera_model::{BatchMeta, LogitsFor, SeqChunk};

mod common;

use common::tiny::*;

/// The model every test here writes (`Dims::SMALL`).
const D: Dims = Dims::SMALL;
const CTX: usize = D.ctx;

// ---------------------------------------------------------------------------------------------
// Same model, two formats.

#[test]
fn hf_folder_and_gguf_give_the_same_logits() {
    let dir = TempDir::new("same-logits");
    let hf = dir.join("tiny-hf");
    write_hf(&hf, &D, &hf_config(&D));
    let gguf = GgufParts::new(&D, DType::F32, true).write_to(&dir.join("tiny.gguf"));
    let tokens = prompt(24);
    for threads in [1, 2] {
        let (a, b) = (load(&hf, threads), load(&gguf, threads));
        assert_eq!(a.model.config.vocab_size, vocab_size());
        assert_eq!(a.model.config.max_position, CTX);
        assert_eq!(b.model.config.max_position, CTX);
        assert!(a.model.config.tie_embeddings && b.model.config.tie_embeddings);
        assert_eq!(b.name, "tiny-llama");
        assert_eq!(a.name, "tiny-hf");
        // Same tokenizer either way.
        let text = "<|im_start|>hello world 12<|im_end|>";
        assert_eq!(
            a.tokenizer.encode(text).unwrap(),
            b.tokenizer.encode(text).unwrap()
        );
        let (la, lb) = (logits_all(&a, &tokens), logits_all(&b, &tokens));
        assert!(la.iter().all(|x| x.is_finite()));
        let scale = la.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(scale > 1e-2, "logits are all near zero ({scale})");
        // Positions differ from each other (RoPE and attention do something).
        let v = vocab_size();
        assert!(max_abs_diff(&la[..v], &la[v..2 * v]) > 1e-3);
        for p in 0..tokens.len() {
            let d = max_abs_diff(&la[p * v..(p + 1) * v], &lb[p * v..(p + 1) * v]);
            assert!(d < 1e-4, "threads {threads}, position {p}: max |Δ| = {d}");
        }
    }
}

/// The comparison above would catch a GGUF whose q/k rows were not permuted: the test is
/// sensitive to the RoPE layout.
#[test]
fn unpermuted_gguf_qk_rows_change_the_logits() {
    let dir = TempDir::new("unpermuted");
    let hf = dir.join("hf");
    write_hf(&hf, &D, &hf_config(&D));
    let gguf = GgufParts::new(&D, DType::F32, false).write_to(&dir.join("unpermuted.gguf"));
    let tokens = prompt(16);
    let (la, lb) = (
        logits_all(&load(&hf, 1), &tokens),
        logits_all(&load(&gguf, 1), &tokens),
    );
    let v = vocab_size();
    // Position 0 has no rotation to get wrong; later ones must differ.
    assert!(max_abs_diff(&la[..v], &lb[..v]) < 1e-4);
    let d = max_abs_diff(&la[v..], &lb[v..]);
    assert!(
        d > 1e-3,
        "unpermuted q/k rows gave the same logits (max |Δ| = {d})"
    );
}

#[test]
fn f16_and_q8_0_gguf_load_and_stay_close_to_f32() {
    let dir = TempDir::new("quantized");
    let tokens = prompt(20);
    let reference = logits_all(
        &load(
            &GgufParts::new(&D, DType::F32, true).write_to(&dir.join("f32.gguf")),
            2,
        ),
        &tokens,
    );
    let scale = reference.iter().fold(0f32, |m, x| m.max(x.abs()));
    for (dtype, tol) in [(DType::F16, 4e-3), (DType::Q8_0, 3e-2)] {
        let path = GgufParts::new(&D, dtype, true).write_to(&dir.join(&format!("{dtype}.gguf")));
        for threads in [1, 2] {
            let e = load(&path, threads);
            // Matrices are stored (mapped) in the smaller format.
            assert!(e.weight_bytes < 3 * 1024 * 1024);
            let l = logits_all(&e, &tokens);
            assert!(l.iter().all(|x| x.is_finite()));
            let d = max_abs_diff(&l, &reference);
            assert!(
                d < tol * scale.max(1.0),
                "{dtype}, threads {threads}: max |Δ| = {d} (logit scale {scale})"
            );
            assert!(d > 0.0, "{dtype} logits are bitwise equal to F32's");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Batch and chunk invariance.

#[test]
fn batched_sequences_match_running_each_alone_bitwise() {
    let dir = TempDir::new("batch");
    let path = GgufParts::new(&D, DType::F32, true).write_to(&dir.join("tiny.gguf"));
    let a: Vec<u32> = prompt(13);
    let b: Vec<u32> = prompt(29)[20..].to_vec(); // 9 tokens, different content
    let per_threads: Vec<_> = [1, 2]
        .map(|threads| assert_batched_matches_alone(&load(&path, threads), &a, &b, 7, 100))
        .into();
    // The number of compute units does not change the results either.
    assert!(per_threads[0] == per_threads[1], "threads 1 and 2 differ");
}

#[test]
fn sub_batches_give_bitwise_the_same_logits() {
    let dir = TempDir::new("subbatch");
    for dtype in [DType::F32, DType::Q8_0] {
        let path =
            GgufParts::new(&D, dtype, true).write_to(&dir.join(&format!("tiny-{dtype}.gguf")));
        for (threads, precision) in [
            (1, Precision::Exact),
            (2, Precision::Exact),
            (2, Precision::Fast),
        ] {
            let mut e = Engine::load_with(&path, threads, precision, Planner::untuned()).unwrap();
            let prompts = vec![prompt(5), prompt(19)[7..].to_vec(), vec![3], prompt(23)];
            common::assert_sub_batch_invariant(&mut e, &prompts);
        }
    }
}

#[test]
fn tensor_parallel_ranks_match_one_rank_on_a_tiny_model() {
    // 4 heads in 2 KV groups and an MLP of 3 blocks: R = 2 splits everything evenly.
    let dir = TempDir::new("tp");
    let path = GgufParts::new(&D, DType::F32, true).write_to(&dir.join("tiny.gguf"));
    let tokens = prompt(21);
    let one = logits_all(&load(&path, 1), &tokens);
    for tp in [2, 3] {
        let e = Engine::load_tp(
            &path,
            2,
            Precision::Exact,
            Planner::untuned(),
            tp,
            std::time::Duration::from_secs(10),
        )
        .unwrap();
        let got = e.logits_all(&tokens, None).unwrap().data;
        let d = max_abs_diff(&got, &one);
        assert!(d < 1e-4, "tp {tp}: logits differ by {d}");
        assert!(
            e.logits_all(&tokens, None).unwrap().data == got,
            "tp {tp}: not reproducible"
        );
    }
}

#[test]
fn chunked_prefill_matches_one_shot_bitwise() {
    let dir = TempDir::new("chunked");
    let path = GgufParts::new(&D, DType::F32, true).write_to(&dir.join("tiny.gguf"));
    let tokens = prompt(23);
    for threads in [1, 2] {
        assert_chunked_prefill_matches_one_shot(
            &load(&path, threads),
            &tokens,
            &[4, 1, 6, 0, 3, 5, 2],
            &[&[3, 4, 16], &[3, 4, 5, 6, 5], &[1; 23], &[22, 1]],
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Bad GGUF files.

fn gguf_err(parts: &GgufParts, name: &str) -> String {
    let dir = TempDir::new(name);
    load_err(&parts.write_to(&dir.join("bad.gguf")))
}

#[test]
fn gguf_missing_tensor_is_named() {
    let mut p = GgufParts::new(&D, DType::F32, true);
    p.tensors.retain(|t| t.name != "blk.1.ffn_up.weight");
    let e = gguf_err(&p, "missing-tensor");
    assert_err_contains(&e, "missing tensor blk.1.ffn_up.weight");

    let mut p = GgufParts::new(&D, DType::F32, true);
    p.tensors.retain(|t| t.name != "output_norm.weight");
    assert_err_contains(&gguf_err(&p, "missing-norm"), "output_norm.weight");
}

#[test]
fn gguf_wrong_shape_is_named() {
    // k is [kv_dim, hidden] = [32, 64]; store it transposed, same byte count.
    let mut p = GgufParts::new(&D, DType::F32, true);
    p.tensor_mut("blk.0.attn_k.weight").dims = vec![32, 64];
    let e = gguf_err(&p, "wrong-shape");
    assert_err_contains(&e, "blk.0.attn_k.weight");
    assert_err_contains(&e, "[64, 32]");
    assert_err_contains(&e, "expected [32, 64]");

    // A norm vector of the wrong length.
    let mut p = GgufParts::new(&D, DType::F32, true);
    let t = p.tensor_mut("blk.1.ffn_norm.weight");
    t.dims = vec![32];
    t.data.truncate(32 * 4);
    let e = gguf_err(&p, "wrong-norm");
    assert_err_contains(&e, "blk.1.ffn_norm.weight");

    // An embedding whose rows do not match the vocabulary.
    let mut p = GgufParts::new(&D, DType::F32, true);
    p.set_meta("llama.vocab_size", MetaValue::U32(300));
    let e = gguf_err(&p, "wrong-vocab");
    assert_err_contains(&e, "token_embd.weight");
}

#[test]
fn gguf_unknown_architecture() {
    let mut p = GgufParts::new(&D, DType::F32, true);
    p.set_meta("general.architecture", MetaValue::String("gptj".into()));
    let e = gguf_err(&p, "gptj");
    assert_err_contains(&e, "unsupported architecture \"gptj\"");
}

/// ggml types Tessera does not load, with their bytes per 256 weights (`ggml-common.h`).
const IQ2_XXS: (u32, usize) = (16, 66);
const IQ3_S: (u32, usize) = (21, 110);
const TQ1_0: (u32, usize) = (34, 54);

/// Stores `name` as one 256-weight row of the unsupported ggml type `ty`.
fn set_unsupported(p: &mut GgufParts, name: &str, (ty, bytes): (u32, usize)) {
    assert_eq!(
        DType::from_ggml_type(ty),
        None,
        "ggml type {ty} is supported"
    );
    let t = p.tensor_mut(name);
    t.ty = ty;
    t.dims = vec![256, 1];
    t.data = vec![0u8; bytes];
}

#[test]
fn gguf_unsupported_tensor_type_is_named() {
    let mut p = GgufParts::new(&D, DType::F32, true);
    set_unsupported(&mut p, "blk.1.ffn_down.weight", IQ2_XXS);
    let e = gguf_err(&p, "iq2xxs");
    assert_eq!(
        e,
        "unsupported tensor type: IQ2_XXS (1 tensor: blk.1.ffn_down.weight)"
    );
}

/// An unknown architecture and every unsupported tensor type, with counts, in one error.
#[test]
fn gguf_every_unsupported_type_and_the_architecture_are_named_at_once() {
    let mut p = GgufParts::new(&D, DType::F32, true);
    p.set_meta("general.architecture", MetaValue::String("gptj".into()));
    for (name, ty) in [
        ("blk.0.ffn_down.weight", IQ2_XXS),
        ("blk.1.ffn_down.weight", IQ2_XXS),
        ("blk.0.ffn_up.weight", IQ3_S),
        ("blk.1.attn_q.weight", TQ1_0),
    ] {
        set_unsupported(&mut p, name, ty);
    }
    let e = gguf_err(&p, "gptj-iquants");
    assert_eq!(
        e,
        "unsupported architecture \"gptj\" (supported: llama, mistral, qwen2, smollm); \
         unsupported tensor types: IQ3_S (1 tensor: blk.0.ffn_up.weight), \
         IQ2_XXS (2 tensors, first blk.0.ffn_down.weight), \
         TQ1_0 (1 tensor: blk.1.attn_q.weight)"
    );
}

#[test]
fn gguf_bad_metadata_is_named() {
    let mut p = GgufParts::new(&D, DType::F32, true);
    p.meta.retain(|(k, _)| k != "llama.embedding_length");
    assert_err_contains(&gguf_err(&p, "no-hidden"), "llama.embedding_length");

    let mut p = GgufParts::new(&D, DType::F32, true);
    p.set_meta("llama.attention.head_count_kv", MetaValue::U32(3));
    assert_err_contains(
        &gguf_err(&p, "kv-heads"),
        "n_heads 4 is not a multiple of n_kv_heads 3",
    );

    let mut p = GgufParts::new(&D, DType::F32, true);
    p.set_meta("llama.attention.head_count", MetaValue::U32(0));
    assert_err_contains(&gguf_err(&p, "zero-heads"), "n_heads");

    let mut p = GgufParts::new(&D, DType::F32, true);
    p.set_meta("llama.context_length", MetaValue::String("long".into()));
    assert_err_contains(&gguf_err(&p, "ctx-string"), "llama.context_length");

    let mut p = GgufParts::new(&D, DType::F32, true);
    p.meta.retain(|(k, _)| k != "tokenizer.ggml.merges");
    assert_err_contains(&gguf_err(&p, "no-merges"), "tokenizer.ggml.merges");

    let mut p = GgufParts::new(&D, DType::F32, true);
    p.set_meta("tokenizer.ggml.model", MetaValue::String("rwkv".into()));
    assert_err_contains(
        &gguf_err(&p, "rwkv-tok"),
        "unsupported GGUF tokenizer model",
    );
}

#[test]
fn missing_model_path() {
    let dir = TempDir::new("missing");
    let e = load_err(&dir.join("no-such-model.gguf"));
    assert_err_contains(&e, "no-such-model.gguf");
    assert_err_contains(&e, "no such model file or folder");
}

#[test]
fn truncated_gguf_files() {
    let dir = TempDir::new("truncated");
    let good = GgufParts::new(&D, DType::F32, true).bytes();
    let path = dir.join("cut.gguf");
    // Inside the magic, the header, the metadata, the tensor infos, the data.
    let infos = tensor_offset_field(&good, "token_embd.weight", 2);
    let last_info = tensor_offset_field(&good, "output_norm.weight", 1);
    let mut cuts = vec![
        0,
        3,
        10,
        20,
        100,
        3000,
        infos - 30,
        infos + 4,
        last_info + 3,
    ];
    cuts.extend([6000, good.len() / 2, good.len() - 1]);
    for cut in cuts {
        std::fs::write(&path, &good[..cut]).unwrap();
        let e = load_err(&path);
        assert!(
            [
                "shorter than",
                "truncated",
                "outside",
                "cannot fit",
                "more than"
            ]
            .iter()
            .any(|w| e.contains(w)),
            "cut at {cut}: {e}"
        );
        assert_err_contains(&e, "GGUF");
    }
}

/// Byte offset of a tensor info's `offset` field.
fn tensor_offset_field(file: &[u8], name: &str, n_dims: usize) -> usize {
    let mut key = (name.len() as u64).to_le_bytes().to_vec();
    key.extend(name.as_bytes());
    let pos = file
        .windows(key.len())
        .position(|w| w == key)
        .expect("tensor info not found");
    pos + key.len() + 4 + 8 * n_dims + 4
}

#[test]
fn gguf_tensor_data_past_the_end() {
    let good = GgufParts::new(&D, DType::F32, true).bytes();
    let dir = TempDir::new("past-end");
    let path = dir.join("past.gguf");
    for (name, off) in [
        ("blk.1.attn_v.weight", 1u64 << 20),
        ("output_norm.weight", good.len() as u64 / 32 * 32),
        ("token_embd.weight", u64::MAX / 32 * 32),
    ] {
        let mut b = good.clone();
        let at = tensor_offset_field(&b, name, if name.contains("norm") { 1 } else { 2 });
        b[at..at + 8].copy_from_slice(&off.to_le_bytes());
        std::fs::write(&path, &b).unwrap();
        let e = load_err(&path);
        assert_err_contains(&e, name);
        assert_err_contains(&e, "outside");
    }
}

// ---------------------------------------------------------------------------------------------
// Bad Hugging Face folders.

#[test]
fn hf_corrupt_safetensors() {
    let dir = TempDir::new("corrupt-st");
    let hf = dir.join("m");
    write_hf(&hf, &D, &hf_config(&D));
    let st = hf.join("model.safetensors");
    let good = std::fs::read(&st).unwrap();
    let header_len = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", vec![0xAB; 200]),
        ("empty", vec![]),
        ("short", good[..5].to_vec()),
        ("header cut", good[..8 + header_len / 2].to_vec()),
        ("data cut", good[..good.len() - 100].to_vec()),
        ("header not JSON", {
            let mut b = good.clone();
            b[8..8 + 10].fill(b'#');
            b
        }),
    ];
    for (what, bytes) in cases {
        std::fs::write(&st, &bytes).unwrap();
        let e = load_err(&hf);
        assert_err_contains(&e, "safetensors");
        assert!(e.contains("model.safetensors"), "{what}: {e}");
    }
}

#[test]
fn hf_missing_files() {
    let dir = TempDir::new("hf-missing");
    let hf = dir.join("m");
    write_hf(&hf, &D, &hf_config(&D));
    std::fs::remove_file(hf.join("config.json")).unwrap();
    assert_err_contains(&load_err(&hf), "config.json");

    write_hf(&hf, &D, &hf_config(&D));
    std::fs::remove_file(hf.join("model.safetensors")).unwrap();
    assert_err_contains(&load_err(&hf), "model.safetensors");

    write_hf(&hf, &D, &hf_config(&D));
    std::fs::remove_file(hf.join("tokenizer.json")).unwrap();
    assert_err_contains(&load_err(&hf), "tokenizer.json");

    // A shard index naming a shard that is not there, and one without a weight map.
    write_hf(&hf, &D, &hf_config(&D));
    std::fs::write(
        hf.join("model.safetensors.index.json"),
        json!({"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}})
            .to_string(),
    )
    .unwrap();
    assert_err_contains(&load_err(&hf), "model-00002-of-00002.safetensors");
    std::fs::write(hf.join("model.safetensors.index.json"), "{}").unwrap();
    assert_err_contains(&load_err(&hf), "weight_map");
    std::fs::remove_file(hf.join("model.safetensors.index.json")).unwrap();

    write_hf(&hf, &D, &hf_config(&D));
    std::fs::write(hf.join("config.json"), "{\"model_type\": \"llama\",").unwrap();
    let e = load_err(&hf);
    assert_err_contains(&e, "JSON");
    assert_err_contains(&e, "config.json");
}

#[test]
fn hf_bad_config() {
    let dir = TempDir::new("hf-config");
    let hf = dir.join("m");

    let mut c = hf_config(&D);
    c["model_type"] = json!("gptj");
    write_hf(&hf, &D, &c);
    assert_err_contains(&load_err(&hf), "unsupported architecture \"gptj\"");

    let mut c = hf_config(&D);
    c["num_key_value_heads"] = json!(3);
    write_hf(&hf, &D, &c);
    assert_err_contains(
        &load_err(&hf),
        "n_heads 4 is not a multiple of n_kv_heads 3",
    );

    let mut c = hf_config(&D);
    c["num_key_value_heads"] = json!(0);
    write_hf(&hf, &D, &c);
    assert_err_contains(&load_err(&hf), "n_kv_heads");

    let mut c = hf_config(&D);
    c["num_attention_heads"] = json!(0);
    write_hf(&hf, &D, &c);
    assert_err_contains(&load_err(&hf), "n_heads");

    // Config and tensors disagree.
    let mut c = hf_config(&D);
    c["intermediate_size"] = json!(128);
    write_hf(&hf, &D, &c);
    let e = load_err(&hf);
    assert_err_contains(&e, "blk.0.ffn_gate.weight");
    assert_err_contains(&e, "expected [128, 64]");

    let mut c = hf_config(&D);
    c.as_object_mut().unwrap().remove("hidden_size");
    write_hf(&hf, &D, &c);
    assert_err_contains(&load_err(&hf), "hidden_size");
}

// ---------------------------------------------------------------------------------------------
// Bad forward inputs.

#[test]
fn forward_rejects_bad_tokens_and_positions() {
    let dir = TempDir::new("forward");
    let e = load(
        &GgufParts::new(&D, DType::F32, true).write_to(&dir.join("tiny.gguf")),
        2,
    );
    let v = vocab_size();
    let run = |tokens: Vec<u32>, start_pos: usize, blocks: usize| -> String {
        let mut kv = e.model.new_kv_storage(BLOCK, blocks).unwrap();
        let seq = SeqChunk {
            tokens,
            start_pos,
            block_table: (0..blocks as u32).collect(),
            logits: LogitsFor::Last,
            adapter: None,
            window_table: None,
        };
        match e.forward(&BatchMeta { seqs: vec![seq] }, &mut kv) {
            Ok(_) => panic!("forward succeeded, expected an error"),
            Err(err) => err.to_string(),
        }
    };
    let err = run(vec![1, 2, v as u32, 3], 0, 1);
    assert_err_contains(
        &err,
        &format!("token id {v} is outside the vocabulary of {v}"),
    );
    assert_err_contains(&run(vec![u32::MAX], 0, 1), "outside the vocabulary");

    // One past the context, from the start and after a prefix.
    let blocks = (CTX + 8).div_ceil(BLOCK);
    let err = run(prompt(CTX + 1), 0, blocks);
    assert_err_contains(&err, &format!("reaches position {}", CTX + 1));
    assert_err_contains(&err, &format!("context of {CTX}"));
    assert_err_contains(&run(vec![5, 6], CTX - 1, blocks), "context");
    // Exactly the context is fine.
    let mut kv = e.model.new_kv_storage(BLOCK, blocks).unwrap();
    let seq = SeqChunk {
        tokens: prompt(CTX),
        start_pos: 0,
        block_table: (0..blocks as u32).collect(),
        logits: LogitsFor::Last,
        adapter: None,
        window_table: None,
    };
    e.forward(&BatchMeta { seqs: vec![seq] }, &mut kv).unwrap();

    // A block table too short for the sequence, or naming blocks that don't exist.
    assert_err_contains(&run(prompt(9), 0, 2), "block table");
    let mut kv = e.model.new_kv_storage(BLOCK, 2).unwrap();
    let seq = SeqChunk {
        tokens: prompt(5),
        start_pos: 0,
        block_table: vec![0, 9],
        logits: LogitsFor::Last,
        adapter: None,
        window_table: None,
    };
    let err = e
        .forward(&BatchMeta { seqs: vec![seq] }, &mut kv)
        .err()
        .unwrap()
        .to_string();
    assert_err_contains(&err, "block 9 does not exist");
}

#[test]
fn forward_edge_cases_do_not_panic() {
    let dir = TempDir::new("forward-edges");
    let e = load(
        &GgufParts::new(&D, DType::F32, true).write_to(&dir.join("tiny.gguf")),
        2,
    );
    let c = &e.model.config;
    // A KV storage shaped for another model: an error, not an out-of-bounds panic.
    for (layers, kv_dim) in [(1, c.kv_dim()), (3, c.kv_dim()), (2, c.kv_dim() * 2)] {
        let mut kv = tessera_model::KvStorage::new(layers, kv_dim, BLOCK, 2).unwrap();
        let seq = SeqChunk {
            tokens: prompt(5),
            start_pos: 0,
            block_table: vec![0, 1],
            logits: LogitsFor::Last,
            adapter: None,
            window_table: None,
        };
        let err = e
            .forward(&BatchMeta { seqs: vec![seq] }, &mut kv)
            .err()
            .unwrap()
            .to_string();
        assert_err_contains(&err, "KV storage has");
    }
    // An empty chunk asking for its last logits, next to a real one: no row for it, and the
    // other sequence's logits are unchanged.
    let tokens = prompt(6);
    let alone = logits_all(&e, &tokens);
    let mut kv = e.model.new_kv_storage(BLOCK, 4).unwrap();
    let batch = BatchMeta {
        seqs: vec![
            SeqChunk {
                tokens: vec![],
                start_pos: 0,
                block_table: vec![3],
                logits: LogitsFor::Last,
                adapter: None,
                window_table: None,
            },
            SeqChunk {
                tokens: tokens.clone(),
                start_pos: 0,
                block_table: vec![0, 1],
                logits: LogitsFor::All,
                adapter: None,
                window_table: None,
            },
        ],
    };
    let l = e.forward(&batch, &mut kv).unwrap();
    assert_eq!(l.rows, (0..6).map(|p| (1, p)).collect::<Vec<_>>());
    assert_eq!(l.data, alone);
    assert!(l.last_of(0).is_none());
}
