//! A tiny random Llama written to disk in both formats Tessera reads, with its dimensions as
//! parameters: a Hugging Face folder (safetensors, "rotate half" q/k rows) and a GGUF file
//! (q/k rows permuted the way llama.cpp's `convert_hf_to_gguf.py` does, for interleaved-pair
//! RoPE), matrices in any [`DType`] (vectors F32, as llama.cpp keeps them); and the helpers
//! that load and run it.

use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use serde_json::json;
use tessera_core::tensor::quantize_row;
use tessera_core::DType;
use tessera_engine::Engine;
use tessera_formats::gguf::writer::{write, TensorSpec};
use tessera_formats::gguf::MetaValue;
use tessera_formats::TokenizerSource;
use tessera_model::{BatchMeta, LogitsFor, SeqChunk};

pub const EPS: f32 = 1e-5;
pub const THETA: f32 = 10000.0;

/// The shape of a tiny model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ff: usize,
    pub ctx: usize,
    /// Whether the output head is the embedding (else an `output.weight` of its own, drawn
    /// after every other weight).
    pub tied: bool,
}

impl Dims {
    /// The model of `model_files.rs`: 64 wide, 2 layers of 4 heads in 2 KV groups, an MLP
    /// of 96.
    pub const SMALL: Dims = Dims {
        hidden: 64,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        ff: 96,
        ctx: 64,
        tied: true,
    };

    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

// ---------------------------------------------------------------------------------------------
// The tiny model.

/// Deterministic uniform values in [-1, 1) (splitmix64).
pub struct Rng(pub u64);
impl Rng {
    pub fn next_f32(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32, offset: f32) -> Vec<f32> {
        (0..n).map(|_| offset + scale * self.next_f32()).collect()
    }
}

/// A byte-level BPE vocabulary: three control tokens, the 256 byte symbols, a few merges.
pub fn tiny_vocab() -> TokenizerSource {
    let mut tokens: Vec<String> = vec![
        "<|endoftext|>".into(),
        "<|im_start|>".into(),
        "<|im_end|>".into(),
    ];
    tokens.extend(tessera_tokenizer::gguf::byte_level_symbols());
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

pub fn vocab_size() -> usize {
    match tiny_vocab() {
        TokenizerSource::GgufBpe { tokens, .. } => tokens.len(),
        _ => unreachable!(),
    }
}

/// One weight in Hugging Face layout (`[out, in]` row-major, or a vector).
pub struct Weight {
    pub hf: String,
    pub gguf: String,
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
    /// Heads whose rows llama.cpp permutes in GGUF (q: heads, k: KV heads).
    pub permute_heads: Option<usize>,
}

/// The model's weights, drawn in file order from one seeded generator.
pub fn tiny_weights(d: &Dims) -> Vec<Weight> {
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
        vec![v, d.hidden],
        None,
        &mut rng,
    );
    for l in 0..d.layers {
        let hf = |s: &str| format!("model.layers.{l}.{s}.weight");
        let gg = |s: &str| format!("blk.{l}.{s}.weight");
        let (q, kv, h, ff) = (d.q_dim(), d.kv_dim(), d.hidden, d.ff);
        for (hn, g, shape, perm) in [
            ("input_layernorm", "attn_norm", vec![h], None),
            ("self_attn.q_proj", "attn_q", vec![q, h], Some(d.heads)),
            ("self_attn.k_proj", "attn_k", vec![kv, h], Some(d.kv_heads)),
            ("self_attn.v_proj", "attn_v", vec![kv, h], None),
            ("self_attn.o_proj", "attn_output", vec![h, q], None),
            ("post_attention_layernorm", "ffn_norm", vec![h], None),
            ("mlp.gate_proj", "ffn_gate", vec![ff, h], None),
            ("mlp.up_proj", "ffn_up", vec![ff, h], None),
            ("mlp.down_proj", "ffn_down", vec![h, ff], None),
        ] {
            add(hf(hn), gg(g), shape, perm, &mut rng);
        }
    }
    add(
        "model.norm.weight".into(),
        "output_norm.weight".into(),
        vec![d.hidden],
        None,
        &mut rng,
    );
    if !d.tied {
        add(
            "lm_head.weight".into(),
            "output.weight".into(),
            vec![v, d.hidden],
            None,
            &mut rng,
        );
    }
    w
}

/// llama.cpp's q/k permutation: within each head, new row 2i = old row i and new row 2i+1 =
/// old row i + head_dim/2.
pub fn permute_rows(values: &[f32], heads: usize, cols: usize) -> Vec<f32> {
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
pub struct TempDir(pub PathBuf);
impl TempDir {
    pub fn new(name: &str) -> Self {
        let p =
            std::env::temp_dir().join(format!("tessera-model-files-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn join(&self, s: &str) -> PathBuf {
        self.0.join(s)
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn hf_config(d: &Dims) -> serde_json::Value {
    let mut c = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size(),
        "hidden_size": d.hidden,
        "intermediate_size": d.ff,
        "num_hidden_layers": d.layers,
        "num_attention_heads": d.heads,
        "num_key_value_heads": d.kv_heads,
        "rms_norm_eps": EPS,
        "rope_theta": THETA,
        "max_position_embeddings": d.ctx,
        "tie_word_embeddings": d.tied,
        "bos_token_id": 1,
        "eos_token_id": 0,
        "torch_dtype": "float32"
    });
    if d.q_dim() != d.hidden {
        c["head_dim"] = json!(d.head_dim);
    }
    c
}

pub fn safetensors_bytes(weights: &[Weight]) -> Vec<u8> {
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

/// Writes the Hugging Face folder of `d` (config.json, model.safetensors, tokenizer.json).
pub fn write_hf(dir: &Path, d: &Dims, config: &serde_json::Value) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(config).unwrap(),
    )
    .unwrap();
    std::fs::write(
        dir.join("model.safetensors"),
        safetensors_bytes(&tiny_weights(d)),
    )
    .unwrap();
    let tok = tessera_tokenizer::gguf::tokenizer_json(&tiny_vocab()).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
}

/// An owned GGUF tensor, ggml dims (innermost first).
pub struct GTensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: u32,
    pub data: Vec<u8>,
}

/// Metadata and tensors of the GGUF file, before serialisation (tests edit them).
pub struct GgufParts {
    pub meta: Vec<(String, MetaValue)>,
    pub tensors: Vec<GTensor>,
}

impl GgufParts {
    /// The tiny model with matrices stored as `dtype` (vectors stay F32, as llama.cpp keeps
    /// them), q/k rows permuted when `permute` is set (as a correct converter does).
    pub fn new(d: &Dims, dtype: DType, permute: bool) -> Self {
        Self::new_with(d, permute, |_| dtype)
    }

    /// [`Self::new`] with each matrix stored as `dtype_of(its GGUF name)`.
    pub fn new_with(d: &Dims, permute: bool, dtype_of: impl Fn(&str) -> DType) -> Self {
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
        let mut meta: Vec<(&str, MetaValue)> = vec![
            ("general.architecture", s("llama")),
            ("general.name", s("tiny-llama")),
            ("llama.context_length", u(d.ctx)),
            ("llama.embedding_length", u(d.hidden)),
            ("llama.block_count", u(d.layers)),
            ("llama.feed_forward_length", u(d.ff)),
            ("llama.attention.head_count", u(d.heads)),
            ("llama.attention.head_count_kv", u(d.kv_heads)),
            (
                "llama.attention.layer_norm_rms_epsilon",
                MetaValue::F32(EPS),
            ),
            ("llama.rope.freq_base", MetaValue::F32(THETA)),
            ("llama.rope.dimension_count", u(d.head_dim)),
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
        if d.q_dim() != d.hidden {
            meta.push(("llama.attention.key_length", u(d.head_dim)));
            meta.push(("llama.attention.value_length", u(d.head_dim)));
        }
        let tensors = tiny_weights(d)
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
                    dtype_of(&w.gguf)
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

    pub fn set_meta(&mut self, key: &str, v: MetaValue) {
        let slot = self.meta.iter_mut().find(|(k, _)| k == key).unwrap();
        slot.1 = v;
    }

    pub fn tensor_mut(&mut self, name: &str) -> &mut GTensor {
        self.tensors.iter_mut().find(|t| t.name == name).unwrap()
    }

    pub fn bytes(&self) -> Vec<u8> {
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

    pub fn write_to(&self, path: &Path) -> PathBuf {
        std::fs::write(path, self.bytes()).unwrap();
        path.to_path_buf()
    }
}

// ---------------------------------------------------------------------------------------------
// Running it.

pub fn load(path: &Path, threads: usize) -> Engine {
    match Engine::load(path, threads) {
        Ok(e) => e,
        Err(e) => panic!("loading {}: {e}", path.display()),
    }
}

pub fn load_err(path: &Path) -> String {
    match Engine::load(path, 1) {
        Ok(_) => panic!("{} loaded, expected an error", path.display()),
        Err(e) => e.to_string(),
    }
}

pub fn assert_err_contains(err: &str, want: &str) {
    assert!(
        err.contains(want),
        "error {err:?} does not mention {want:?}"
    );
}

/// Positions per KV block of the helpers below.
pub const BLOCK: usize = 4;

/// Logits at every position of a one-sequence prefill on an f32 KV cache, `[n, vocab]`
/// row-major.
pub fn logits_all(e: &Engine, tokens: &[u32]) -> Vec<f32> {
    let blocks = tokens.len().div_ceil(BLOCK);
    let mut kv = e.model.new_kv_storage(BLOCK, blocks).unwrap();
    let seq = SeqChunk {
        tokens: tokens.to_vec(),
        start_pos: 0,
        block_table: (0..blocks as u32).collect(),
        logits: LogitsFor::All,
        adapter: None,
        window_table: None,
    };
    let l = e.forward(&BatchMeta { seqs: vec![seq] }, &mut kv).unwrap();
    assert_eq!(
        l.rows,
        (0..tokens.len()).map(|p| (0, p)).collect::<Vec<_>>()
    );
    l.data
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Largest |value|.
pub fn max_abs(a: &[f32]) -> f32 {
    a.iter().fold(0f32, |m, x| m.max(x.abs()))
}

/// Token ids covering specials, bytes and merged tokens.
pub fn prompt(n: usize) -> Vec<u32> {
    let v = vocab_size() as u32;
    (0..n as u32).map(|i| (i * 37 + 5) % v).collect()
}

// ---------------------------------------------------------------------------------------------
// Batch and chunk invariance.

/// Logits of sequences `a` and `b` run together (prefill in one batch, then one decode token
/// each, `next_a` and `next_b`, in a second batch listing `b` first), over one storage with
/// scattered, interleaved block tables, asserted bitwise equal to each run alone. Returns
/// the alone runs' `(prefill a, prefill b, decode a, decode b)` logits.
pub fn assert_batched_matches_alone(
    e: &Engine,
    a: &[u32],
    b: &[u32],
    next_a: u32,
    next_b: u32,
) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
    assert!(a.len() < 5 * BLOCK && b.len() < 4 * BLOCK);
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
            window_table: None,
        };
        let l1 = e.forward(&BatchMeta { seqs: vec![pre] }, &mut kv).unwrap();
        let dec = SeqChunk {
            tokens: vec![next],
            start_pos: tokens.len(),
            block_table: table,
            logits: LogitsFor::Last,
            adapter: None,
            window_table: None,
        };
        let l2 = e.forward(&BatchMeta { seqs: vec![dec] }, &mut kv).unwrap();
        (l1.data, l2.data)
    };
    let (pa, da) = alone(a, next_a);
    let (pb, db) = alone(b, next_b);

    // Together, in one storage with scattered, interleaved block tables.
    let mut kv = e.model.new_kv_storage(BLOCK, 10).unwrap();
    let (ta, tb) = (vec![7u32, 0, 5, 2, 9], vec![3u32, 8, 1, 6]);
    let batch = BatchMeta {
        seqs: vec![
            SeqChunk {
                tokens: a.to_vec(),
                start_pos: 0,
                block_table: ta.clone(),
                logits: LogitsFor::All,
                adapter: None,
                window_table: None,
            },
            SeqChunk {
                tokens: b.to_vec(),
                start_pos: 0,
                block_table: tb.clone(),
                logits: LogitsFor::All,
                adapter: None,
                window_table: None,
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
                window_table: None,
            },
            SeqChunk {
                tokens: vec![next_a],
                start_pos: a.len(),
                block_table: ta,
                logits: LogitsFor::Last,
                adapter: None,
                window_table: None,
            },
        ],
    };
    let l = e.forward(&batch, &mut kv).unwrap();
    assert_eq!(l.rows, vec![(0, b.len()), (1, a.len())]);
    assert_eq!(l.last_of(0).unwrap(), &db[..]);
    assert_eq!(l.last_of(1).unwrap(), &da[..]);
    (pa, pb, da, db)
}

/// A prefill of `tokens` over the blocks `table` in each of `splits` (chunk lengths summing
/// to the prompt) gives bitwise the one-shot prefill's logits: intermediate chunks alternate
/// between no logits and all of them, the last asks for its last position's.
pub fn assert_chunked_prefill_matches_one_shot(
    e: &Engine,
    tokens: &[u32],
    table: &[u32],
    splits: &[&[usize]],
) {
    let v = e.model.config.vocab_size;
    let one_shot = {
        let mut kv = e.model.new_kv_storage(BLOCK, table.len()).unwrap();
        let seq = SeqChunk {
            tokens: tokens.to_vec(),
            start_pos: 0,
            block_table: table.to_vec(),
            logits: LogitsFor::All,
            adapter: None,
            window_table: None,
        };
        e.forward(&BatchMeta { seqs: vec![seq] }, &mut kv).unwrap()
    };
    for &chunks in splits {
        assert_eq!(chunks.iter().sum::<usize>(), tokens.len());
        let mut kv = e.model.new_kv_storage(BLOCK, table.len()).unwrap();
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
                block_table: table.to_vec(),
                logits: want,
                adapter: None,
                window_table: None,
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
