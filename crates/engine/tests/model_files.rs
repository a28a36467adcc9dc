//! End-to-end checks of model loading on a tiny random Llama written to disk in both formats
//! Tessera reads: a Hugging Face folder (safetensors, "rotate half" q/k rows) and a GGUF file
//! (q/k rows permuted the way llama.cpp's `convert_hf_to_gguf.py` does, for interleaved-pair
//! RoPE). Both must give the same logits; the model must be batch- and chunk-invariant; and
//! every kind of bad input must come back as an error naming the problem, never a panic.

use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use serde_json::json;
use tessera_core::tensor::quantize_row;
use tessera_core::DType;
use tessera_engine::Engine;
use tessera_formats::gguf::writer::{write, TensorSpec};
use tessera_formats::gguf::MetaValue;
use tessera_formats::TokenizerSource;
use tessera_kernels::plan::Precision;
use tessera_kernels::planner::Planner;
use tessera_model::{BatchMeta, LogitsFor, SeqChunk};

const HIDDEN: usize = 64;
const LAYERS: usize = 2;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 16;
const FF: usize = 96;
const CTX: usize = 64;
const EPS: f32 = 1e-5;
const THETA: f32 = 10000.0;

// ---------------------------------------------------------------------------------------------
// The tiny model.

/// Deterministic uniform values in [-1, 1) (splitmix64).
mod common;

struct Rng(u64);
impl Rng {
    fn next_f32(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32, offset: f32) -> Vec<f32> {
        (0..n).map(|_| offset + scale * self.next_f32()).collect()
    }
}

/// A byte-level BPE vocabulary: three control tokens, the 256 byte symbols, a few merges.
fn tiny_vocab() -> TokenizerSource {
    let mut tokens: Vec<String> = vec![
        "<|endoftext|>".into(),
        "<|im_start|>".into(),
        "<|im_end|>".into(),
    ];
    // GPT-2 byte-to-unicode table.
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut pairs: Vec<(u32, u32)> = bs.into_iter().zip(cs).collect();
    pairs.sort();
    tokens.extend(
        pairs
            .iter()
            .map(|&(_, c)| char::from_u32(c).unwrap().to_string()),
    );
    tokens.extend(["he", "ll", "hell", "hello", "Ġw", "12"].map(String::from));
    let merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "1 2"]
        .map(String::from)
        .to_vec();
    let mut token_types = vec![1; tokens.len()];
    token_types[..3].fill(3);
    TokenizerSource::GgufBpe {
        tokens,
        token_types,
        merges,
        pre: "gpt2".into(),
    }
}

fn vocab_size() -> usize {
    match tiny_vocab() {
        TokenizerSource::GgufBpe { tokens, .. } => tokens.len(),
        _ => unreachable!(),
    }
}

/// One weight in Hugging Face layout (`[out, in]` row-major, or a vector).
struct Weight {
    hf: String,
    gguf: String,
    shape: Vec<usize>,
    values: Vec<f32>,
    /// Heads whose rows llama.cpp permutes in GGUF (q: heads, k: KV heads).
    permute_heads: Option<usize>,
}

fn tiny_weights() -> Vec<Weight> {
    let mut rng = Rng(0x07E5_5E8A);
    let v = vocab_size();
    let mut w = vec![];
    let mut add =
        |hf: String, gguf: String, shape: Vec<usize>, perm: Option<usize>, rng: &mut Rng| {
            let n = shape.iter().product();
            // Norm weights around 1, everything else around 0.
            let values = if shape.len() == 1 {
                rng.vec(n, 0.1, 1.0)
            } else {
                rng.vec(n, 0.1, 0.0)
            };
            w.push(Weight {
                hf,
                gguf,
                shape,
                values,
                permute_heads: perm,
            });
        };
    add(
        "model.embed_tokens.weight".into(),
        "token_embd.weight".into(),
        vec![v, HIDDEN],
        None,
        &mut rng,
    );
    for l in 0..LAYERS {
        let hf = |s: &str| format!("model.layers.{l}.{s}.weight");
        let gg = |s: &str| format!("blk.{l}.{s}.weight");
        let (q, kv) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
        for (h, g, shape, perm) in [
            ("input_layernorm", "attn_norm", vec![HIDDEN], None),
            ("self_attn.q_proj", "attn_q", vec![q, HIDDEN], Some(HEADS)),
            (
                "self_attn.k_proj",
                "attn_k",
                vec![kv, HIDDEN],
                Some(KV_HEADS),
            ),
            ("self_attn.v_proj", "attn_v", vec![kv, HIDDEN], None),
            ("self_attn.o_proj", "attn_output", vec![HIDDEN, q], None),
            ("post_attention_layernorm", "ffn_norm", vec![HIDDEN], None),
            ("mlp.gate_proj", "ffn_gate", vec![FF, HIDDEN], None),
            ("mlp.up_proj", "ffn_up", vec![FF, HIDDEN], None),
            ("mlp.down_proj", "ffn_down", vec![HIDDEN, FF], None),
        ] {
            add(hf(h), gg(g), shape, perm, &mut rng);
        }
    }
    add(
        "model.norm.weight".into(),
        "output_norm.weight".into(),
        vec![HIDDEN],
        None,
        &mut rng,
    );
    w
}

/// llama.cpp's q/k permutation: within each head, new row 2i = old row i and new row 2i+1 =
/// old row i + head_dim/2.
fn permute_rows(values: &[f32], heads: usize, cols: usize) -> Vec<f32> {
    let rows = values.len() / cols;
    let hd = rows / heads;
    let mut out = vec![0f32; values.len()];
    for h in 0..heads {
        for i in 0..hd / 2 {
            for (j, old) in [(2 * i, i), (2 * i + 1, i + hd / 2)] {
                let (dst, src) = ((h * hd + j) * cols, (h * hd + old) * cols);
                out[dst..dst + cols].copy_from_slice(&values[src..src + cols]);
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Writing it to disk.

/// A fresh, empty folder under the system temp dir, removed when dropped.
struct TempDir(PathBuf);
impl TempDir {
    fn new(name: &str) -> Self {
        let p =
            std::env::temp_dir().join(format!("tessera-model-files-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn join(&self, s: &str) -> PathBuf {
        self.0.join(s)
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn hf_config() -> serde_json::Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size(),
        "hidden_size": HIDDEN,
        "intermediate_size": FF,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "rms_norm_eps": EPS,
        "rope_theta": THETA,
        "max_position_embeddings": CTX,
        "tie_word_embeddings": true,
        "bos_token_id": 1,
        "eos_token_id": 0,
        "torch_dtype": "float32"
    })
}

fn safetensors_bytes(weights: &[Weight]) -> Vec<u8> {
    let bytes: Vec<Vec<u8>> = weights
        .iter()
        .map(|w| w.values.iter().flat_map(|v| v.to_le_bytes()).collect())
        .collect();
    let views: Vec<(String, TensorView)> = weights
        .iter()
        .zip(&bytes)
        .map(|(w, b)| {
            let view = TensorView::new(safetensors::Dtype::F32, w.shape.clone(), b).unwrap();
            (w.hf.clone(), view)
        })
        .collect();
    safetensors::serialize(views, None).unwrap()
}

/// Writes the Hugging Face folder (config.json, model.safetensors, tokenizer.json).
fn write_hf(dir: &Path, config: &serde_json::Value) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(config).unwrap(),
    )
    .unwrap();
    std::fs::write(
        dir.join("model.safetensors"),
        safetensors_bytes(&tiny_weights()),
    )
    .unwrap();
    let tok = tessera_tokenizer::gguf::tokenizer_json(&tiny_vocab()).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
}

/// An owned GGUF tensor, ggml dims (innermost first).
struct GTensor {
    name: String,
    dims: Vec<u64>,
    ty: u32,
    data: Vec<u8>,
}

/// Metadata and tensors of the GGUF file, before serialisation (tests edit them).
struct GgufParts {
    meta: Vec<(String, MetaValue)>,
    tensors: Vec<GTensor>,
}

impl GgufParts {
    /// The tiny model with matrices stored as `dtype` (vectors stay F32, as llama.cpp keeps
    /// them), q/k rows permuted when `permute` is set (as a correct converter does).
    fn new(dtype: DType, permute: bool) -> Self {
        let TokenizerSource::GgufBpe {
            tokens,
            token_types,
            merges,
            pre,
        } = tiny_vocab()
        else {
            unreachable!()
        };
        let s = |x: &str| MetaValue::String(x.into());
        let u = |x: usize| MetaValue::U32(x as u32);
        let strings =
            |v: Vec<String>| MetaValue::Array(v.into_iter().map(MetaValue::String).collect());
        let meta: Vec<(&str, MetaValue)> = vec![
            ("general.architecture", s("llama")),
            ("general.name", s("tiny-llama")),
            ("llama.context_length", u(CTX)),
            ("llama.embedding_length", u(HIDDEN)),
            ("llama.block_count", u(LAYERS)),
            ("llama.feed_forward_length", u(FF)),
            ("llama.attention.head_count", u(HEADS)),
            ("llama.attention.head_count_kv", u(KV_HEADS)),
            (
                "llama.attention.layer_norm_rms_epsilon",
                MetaValue::F32(EPS),
            ),
            ("llama.rope.freq_base", MetaValue::F32(THETA)),
            ("llama.rope.dimension_count", u(HEAD_DIM)),
            ("llama.vocab_size", u(tokens.len())),
            ("tokenizer.ggml.model", s("gpt2")),
            ("tokenizer.ggml.pre", s(&pre)),
            ("tokenizer.ggml.tokens", strings(tokens)),
            (
                "tokenizer.ggml.token_type",
                MetaValue::Array(token_types.into_iter().map(MetaValue::I32).collect()),
            ),
            ("tokenizer.ggml.merges", strings(merges)),
            ("tokenizer.ggml.bos_token_id", u(1)),
            ("tokenizer.ggml.eos_token_id", u(0)),
        ];
        let tensors = tiny_weights()
            .into_iter()
            .map(|w| {
                let cols = *w.shape.last().unwrap();
                let values = match w.permute_heads {
                    Some(heads) if permute => permute_rows(&w.values, heads, cols),
                    _ => w.values,
                };
                let dt = if w.shape.len() == 1 {
                    DType::F32
                } else {
                    dtype
                };
                GTensor {
                    name: w.gguf,
                    dims: w.shape.iter().rev().map(|&d| d as u64).collect(),
                    ty: dt.ggml_type(),
                    data: quantize_row(dt, &values),
                }
            })
            .collect();
        GgufParts {
            meta: meta.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            tensors,
        }
    }

    fn set_meta(&mut self, key: &str, v: MetaValue) {
        let slot = self.meta.iter_mut().find(|(k, _)| k == key).unwrap();
        slot.1 = v;
    }

    fn tensor_mut(&mut self, name: &str) -> &mut GTensor {
        self.tensors.iter_mut().find(|t| t.name == name).unwrap()
    }

    fn bytes(&self) -> Vec<u8> {
        let meta: Vec<(&str, MetaValue)> = self
            .meta
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        let specs: Vec<TensorSpec> = self
            .tensors
            .iter()
            .map(|t| TensorSpec {
                name: &t.name,
                dims: &t.dims,
                ggml_type: t.ty,
                data: &t.data,
            })
            .collect();
        write(&meta, &specs)
    }

    fn write_to(&self, path: &Path) -> PathBuf {
        std::fs::write(path, self.bytes()).unwrap();
        path.to_path_buf()
    }
}

// ---------------------------------------------------------------------------------------------
// Running it.

fn load(path: &Path, threads: usize) -> Engine {
    match Engine::load(path, threads) {
        Ok(e) => e,
        Err(e) => panic!("loading {}: {e}", path.display()),
    }
}

fn load_err(path: &Path) -> String {
    match Engine::load(path, 1) {
        Ok(_) => panic!("{} loaded, expected an error", path.display()),
        Err(e) => e.to_string(),
    }
}

fn assert_err_contains(err: &str, want: &str) {
    assert!(
        err.contains(want),
        "error {err:?} does not mention {want:?}"
    );
}

const BLOCK: usize = 4;

/// Logits at every position of a one-sequence prefill, `[n, vocab]` row-major.
fn logits_all(e: &Engine, tokens: &[u32]) -> Vec<f32> {
    let blocks = tokens.len().div_ceil(BLOCK);
    let mut kv = e.model.new_kv_storage(BLOCK, blocks).unwrap();
    let seq = SeqChunk {
        tokens: tokens.to_vec(),
        start_pos: 0,
        block_table: (0..blocks as u32).collect(),
        logits: LogitsFor::All,
        adapter: None,
    };
    let l = e.forward(&BatchMeta { seqs: vec![seq] }, &mut kv).unwrap();
    assert_eq!(
        l.rows,
        (0..tokens.len()).map(|p| (0, p)).collect::<Vec<_>>()
    );
    l.data
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Token ids covering specials, bytes and merged tokens.
fn prompt(n: usize) -> Vec<u32> {
    let v = vocab_size() as u32;
    (0..n as u32).map(|i| (i * 37 + 5) % v).collect()
}

// ---------------------------------------------------------------------------------------------
// Same model, two formats.

#[test]
fn hf_folder_and_gguf_give_the_same_logits() {
    let dir = TempDir::new("same-logits");
    let hf = dir.join("tiny-hf");
    write_hf(&hf, &hf_config());
    let gguf = GgufParts::new(DType::F32, true).write_to(&dir.join("tiny.gguf"));
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
    write_hf(&hf, &hf_config());
    let gguf = GgufParts::new(DType::F32, false).write_to(&dir.join("unpermuted.gguf"));
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
            &GgufParts::new(DType::F32, true).write_to(&dir.join("f32.gguf")),
            2,
        ),
        &tokens,
    );
    let scale = reference.iter().fold(0f32, |m, x| m.max(x.abs()));
    for (dtype, tol) in [(DType::F16, 4e-3), (DType::Q8_0, 3e-2)] {
        let path = GgufParts::new(dtype, true).write_to(&dir.join(&format!("{dtype}.gguf")));
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
    let path = GgufParts::new(DType::F32, true).write_to(&dir.join("tiny.gguf"));
    let a: Vec<u32> = prompt(13);
    let b: Vec<u32> = prompt(29)[20..].to_vec(); // 9 tokens, different content
    let (next_a, next_b) = (7u32, 100u32);
    let mut per_threads = vec![];
    for threads in [1, 2] {
        let e = load(&path, threads);
        let v = e.model.config.vocab_size;
        // Alone: prefill (all logits) then one decode step.
        let alone = |tokens: &[u32], next: u32| -> (Vec<f32>, Vec<f32>) {
            let mut kv = e.model.new_kv_storage(BLOCK, 8).unwrap();
            let table: Vec<u32> = (0..8).collect();
            let pre = SeqChunk {
                tokens: tokens.to_vec(),
                start_pos: 0,
                block_table: table.clone(),
                logits: LogitsFor::All,
                adapter: None,
            };
            let l1 = e.forward(&BatchMeta { seqs: vec![pre] }, &mut kv).unwrap();
            let dec = SeqChunk {
                tokens: vec![next],
                start_pos: tokens.len(),
                block_table: table,
                logits: LogitsFor::Last,
                adapter: None,
            };
            let l2 = e.forward(&BatchMeta { seqs: vec![dec] }, &mut kv).unwrap();
            (l1.data, l2.data)
        };
        let (pa, da) = alone(&a, next_a);
        let (pb, db) = alone(&b, next_b);

        // Together, in one storage with scattered, interleaved block tables.
        let mut kv = e.model.new_kv_storage(BLOCK, 10).unwrap();
        let (ta, tb) = (vec![7u32, 0, 5, 2, 9], vec![3u32, 8, 1, 6]);
        let batch = BatchMeta {
            seqs: vec![
                SeqChunk {
                    tokens: a.clone(),
                    start_pos: 0,
                    block_table: ta.clone(),
                    logits: LogitsFor::All,
                    adapter: None,
                },
                SeqChunk {
                    tokens: b.clone(),
                    start_pos: 0,
                    block_table: tb.clone(),
                    logits: LogitsFor::All,
                    adapter: None,
                },
            ],
        };
        let l = e.forward(&batch, &mut kv).unwrap();
        assert_eq!(l.rows.len(), a.len() + b.len());
        assert_eq!(l.rows[a.len()], (1, 0));
        assert_eq!(&l.data[..a.len() * v], &pa[..]);
        assert_eq!(&l.data[a.len() * v..], &pb[..]);
        // Decode step for both, batched (b listed first this time).
        let batch = BatchMeta {
            seqs: vec![
                SeqChunk {
                    tokens: vec![next_b],
                    start_pos: b.len(),
                    block_table: tb,
                    logits: LogitsFor::Last,
                    adapter: None,
                },
                SeqChunk {
                    tokens: vec![next_a],
                    start_pos: a.len(),
                    block_table: ta,
                    logits: LogitsFor::Last,
                    adapter: None,
                },
            ],
        };
        let l = e.forward(&batch, &mut kv).unwrap();
        assert_eq!(l.rows, vec![(0, b.len()), (1, a.len())]);
        assert_eq!(l.last_of(0).unwrap(), &db[..]);
        assert_eq!(l.last_of(1).unwrap(), &da[..]);
        per_threads.push((pa, pb, da, db));
    }
    // The number of compute units does not change the results either.
    assert!(per_threads[0] == per_threads[1], "threads 1 and 2 differ");
}

#[test]
fn sub_batches_give_bitwise_the_same_logits() {
    let dir = TempDir::new("subbatch");
    for dtype in [DType::F32, DType::Q8_0] {
        let path = GgufParts::new(dtype, true).write_to(&dir.join(&format!("tiny-{dtype}.gguf")));
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
    let path = GgufParts::new(DType::F32, true).write_to(&dir.join("tiny.gguf"));
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
    let path = GgufParts::new(DType::F32, true).write_to(&dir.join("tiny.gguf"));
    let tokens = prompt(23);
    for threads in [1, 2] {
        let e = load(&path, threads);
        let v = e.model.config.vocab_size;
        let table: Vec<u32> = vec![4, 1, 6, 0, 3, 5, 2];
        let one_shot = {
            let mut kv = e.model.new_kv_storage(BLOCK, 7).unwrap();
            let seq = SeqChunk {
                tokens: tokens.clone(),
                start_pos: 0,
                block_table: table.clone(),
                logits: LogitsFor::All,
                adapter: None,
            };
            e.forward(&BatchMeta { seqs: vec![seq] }, &mut kv).unwrap()
        };
        for chunks in [&[3usize, 4, 16][..], &[3, 4, 5, 6, 5], &[1; 23], &[22, 1]] {
            assert_eq!(chunks.iter().sum::<usize>(), tokens.len());
            let mut kv = e.model.new_kv_storage(BLOCK, 7).unwrap();
            let mut start = 0;
            for (i, &n) in chunks.iter().enumerate() {
                let last = i + 1 == chunks.len();
                // Intermediate chunks alternate between no logits and all of them.
                let want = if last {
                    LogitsFor::Last
                } else if i % 2 == 0 {
                    LogitsFor::None
                } else {
                    LogitsFor::All
                };
                let seq = SeqChunk {
                    tokens: tokens[start..start + n].to_vec(),
                    start_pos: start,
                    block_table: table.clone(),
                    logits: want,
                    adapter: None,
                };
                let l = e.forward(&BatchMeta { seqs: vec![seq] }, &mut kv).unwrap();
                match want {
                    LogitsFor::None => assert!(l.rows.is_empty() && l.data.is_empty()),
                    LogitsFor::All => {
                        assert_eq!(l.data, one_shot.data[start * v..(start + n) * v]);
                    }
                    LogitsFor::Last => {
                        assert_eq!(l.rows, vec![(0, tokens.len() - 1)]);
                        assert_eq!(l.data, one_shot.row(tokens.len() - 1), "chunks {chunks:?}");
                    }
                }
                start += n;
            }
        }
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
    let mut p = GgufParts::new(DType::F32, true);
    p.tensors.retain(|t| t.name != "blk.1.ffn_up.weight");
    let e = gguf_err(&p, "missing-tensor");
    assert_err_contains(&e, "missing tensor blk.1.ffn_up.weight");

    let mut p = GgufParts::new(DType::F32, true);
    p.tensors.retain(|t| t.name != "output_norm.weight");
    assert_err_contains(&gguf_err(&p, "missing-norm"), "output_norm.weight");
}

#[test]
fn gguf_wrong_shape_is_named() {
    // k is [kv_dim, hidden] = [32, 64]; store it transposed, same byte count.
    let mut p = GgufParts::new(DType::F32, true);
    p.tensor_mut("blk.0.attn_k.weight").dims = vec![32, 64];
    let e = gguf_err(&p, "wrong-shape");
    assert_err_contains(&e, "blk.0.attn_k.weight");
    assert_err_contains(&e, "[64, 32]");
    assert_err_contains(&e, "expected [32, 64]");

    // A norm vector of the wrong length.
    let mut p = GgufParts::new(DType::F32, true);
    let t = p.tensor_mut("blk.1.ffn_norm.weight");
    t.dims = vec![32];
    t.data.truncate(32 * 4);
    let e = gguf_err(&p, "wrong-norm");
    assert_err_contains(&e, "blk.1.ffn_norm.weight");

    // An embedding whose rows do not match the vocabulary.
    let mut p = GgufParts::new(DType::F32, true);
    p.set_meta("llama.vocab_size", MetaValue::U32(300));
    let e = gguf_err(&p, "wrong-vocab");
    assert_err_contains(&e, "token_embd.weight");
}

#[test]
fn gguf_unknown_architecture() {
    let mut p = GgufParts::new(DType::F32, true);
    p.set_meta("general.architecture", MetaValue::String("gptj".into()));
    let e = gguf_err(&p, "gptj");
    assert_err_contains(&e, "unsupported architecture \"gptj\"");
}

#[test]
fn gguf_unsupported_tensor_type_is_named() {
    let mut p = GgufParts::new(DType::F32, true);
    let t = p.tensor_mut("blk.1.ffn_down.weight");
    t.ty = 12; // Q4_K: 144 bytes per 256 elements
    t.dims = vec![256, 1];
    t.data = vec![0u8; 144];
    let e = gguf_err(&p, "q4k");
    assert_eq!(
        e,
        "unsupported tensor type: Q4_K (1 tensor: blk.1.ffn_down.weight)"
    );
}

/// An unknown architecture and every unsupported tensor type, with counts, in one error.
#[test]
fn gguf_every_unsupported_type_and_the_architecture_are_named_at_once() {
    let mut p = GgufParts::new(DType::F32, true);
    p.set_meta("general.architecture", MetaValue::String("gptj".into()));
    for (name, ty, bytes) in [
        ("blk.0.ffn_down.weight", 12, 144), // Q4_K
        ("blk.1.ffn_down.weight", 12, 144),
        ("blk.0.ffn_up.weight", 14, 210), // Q6_K
    ] {
        let t = p.tensor_mut(name);
        t.ty = ty;
        t.dims = vec![256, 1];
        t.data = vec![0u8; bytes];
    }
    let e = gguf_err(&p, "gptj-kquants");
    assert_eq!(
        e,
        "unsupported architecture \"gptj\" (supported: llama, mistral, qwen2, smollm); \
         unsupported tensor types: Q6_K (1 tensor: blk.0.ffn_up.weight), \
         Q4_K (2 tensors, first blk.0.ffn_down.weight)"
    );
}

#[test]
fn gguf_bad_metadata_is_named() {
    let mut p = GgufParts::new(DType::F32, true);
    p.meta.retain(|(k, _)| k != "llama.embedding_length");
    assert_err_contains(&gguf_err(&p, "no-hidden"), "llama.embedding_length");

    let mut p = GgufParts::new(DType::F32, true);
    p.set_meta("llama.attention.head_count_kv", MetaValue::U32(3));
    assert_err_contains(
        &gguf_err(&p, "kv-heads"),
        "n_heads 4 is not a multiple of n_kv_heads 3",
    );

    let mut p = GgufParts::new(DType::F32, true);
    p.set_meta("llama.attention.head_count", MetaValue::U32(0));
    assert_err_contains(&gguf_err(&p, "zero-heads"), "n_heads");

    let mut p = GgufParts::new(DType::F32, true);
    p.set_meta("llama.context_length", MetaValue::String("long".into()));
    assert_err_contains(&gguf_err(&p, "ctx-string"), "llama.context_length");

    let mut p = GgufParts::new(DType::F32, true);
    p.meta.retain(|(k, _)| k != "tokenizer.ggml.merges");
    assert_err_contains(&gguf_err(&p, "no-merges"), "tokenizer.ggml.merges");

    let mut p = GgufParts::new(DType::F32, true);
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
    let good = GgufParts::new(DType::F32, true).bytes();
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
    let good = GgufParts::new(DType::F32, true).bytes();
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
    write_hf(&hf, &hf_config());
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
    write_hf(&hf, &hf_config());
    std::fs::remove_file(hf.join("config.json")).unwrap();
    assert_err_contains(&load_err(&hf), "config.json");

    write_hf(&hf, &hf_config());
    std::fs::remove_file(hf.join("model.safetensors")).unwrap();
    assert_err_contains(&load_err(&hf), "model.safetensors");

    write_hf(&hf, &hf_config());
    std::fs::remove_file(hf.join("tokenizer.json")).unwrap();
    assert_err_contains(&load_err(&hf), "tokenizer.json");

    // A shard index naming a shard that is not there, and one without a weight map.
    write_hf(&hf, &hf_config());
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

    write_hf(&hf, &hf_config());
    std::fs::write(hf.join("config.json"), "{\"model_type\": \"llama\",").unwrap();
    let e = load_err(&hf);
    assert_err_contains(&e, "JSON");
    assert_err_contains(&e, "config.json");
}

#[test]
fn hf_bad_config() {
    let dir = TempDir::new("hf-config");
    let hf = dir.join("m");

    let mut c = hf_config();
    c["model_type"] = json!("gptj");
    write_hf(&hf, &c);
    assert_err_contains(&load_err(&hf), "unsupported architecture \"gptj\"");

    let mut c = hf_config();
    c["num_key_value_heads"] = json!(3);
    write_hf(&hf, &c);
    assert_err_contains(
        &load_err(&hf),
        "n_heads 4 is not a multiple of n_kv_heads 3",
    );

    let mut c = hf_config();
    c["num_key_value_heads"] = json!(0);
    write_hf(&hf, &c);
    assert_err_contains(&load_err(&hf), "n_kv_heads");

    let mut c = hf_config();
    c["num_attention_heads"] = json!(0);
    write_hf(&hf, &c);
    assert_err_contains(&load_err(&hf), "n_heads");

    // Config and tensors disagree.
    let mut c = hf_config();
    c["intermediate_size"] = json!(128);
    write_hf(&hf, &c);
    let e = load_err(&hf);
    assert_err_contains(&e, "blk.0.ffn_gate.weight");
    assert_err_contains(&e, "expected [128, 64]");

    let mut c = hf_config();
    c.as_object_mut().unwrap().remove("hidden_size");
    write_hf(&hf, &c);
    assert_err_contains(&load_err(&hf), "hidden_size");
}

// ---------------------------------------------------------------------------------------------
// Bad forward inputs.

#[test]
fn forward_rejects_bad_tokens_and_positions() {
    let dir = TempDir::new("forward");
    let e = load(
        &GgufParts::new(DType::F32, true).write_to(&dir.join("tiny.gguf")),
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
        &GgufParts::new(DType::F32, true).write_to(&dir.join("tiny.gguf")),
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
            },
            SeqChunk {
                tokens: tokens.clone(),
                start_pos: 0,
                block_table: vec![0, 1],
                logits: LogitsFor::All,
                adapter: None,
            },
        ],
    };
    let l = e.forward(&batch, &mut kv).unwrap();
    assert_eq!(l.rows, (0..6).map(|p| (1, p)).collect::<Vec<_>>());
    assert_eq!(l.data, alone);
    assert!(l.last_of(0).is_none());
}
