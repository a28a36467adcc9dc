//! Seeded synthetic Llama-family GGUF files at real models' shapes, for checks on machines
//! the real files cannot reach (the GPU machines take 64 MiB a call): random weights in any
//! stored format, with the tokenizer of a real file copied from its header
//! ([`tokenizer_header`], a few MB). Same seed, shape and format: the same bytes.

use std::collections::BTreeMap;

use tessera_core::tensor::quantize_row;
use tessera_core::{DType, Error, Result};

use super::writer::{write, TensorSpec};
use super::MetaValue;

/// A decoder's shape (the vocabulary comes from the tokenizer).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    pub name: &'static str,
    /// `llama`, or `qwen2` (q/k/v biases, "rotate half" RoPE).
    pub arch: &'static str,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ff: usize,
    pub ctx: usize,
    pub rope_theta: f32,
}

/// The shapes the device checks run: SmolLM2-135M's and Qwen2.5-0.5B's, and a Llama of
/// whole 256-weight rows everywhere (so the K-quants store every matrix).
pub const SHAPES: [Shape; 3] = [
    Shape {
        name: "smollm2-135m",
        arch: "llama",
        hidden: 576,
        layers: 30,
        heads: 9,
        kv_heads: 3,
        head_dim: 64,
        ff: 1536,
        ctx: 8192,
        rope_theta: 100_000.0,
    },
    Shape {
        name: "qwen2.5-0.5b",
        arch: "qwen2",
        hidden: 896,
        layers: 24,
        heads: 14,
        kv_heads: 2,
        head_dim: 64,
        ff: 4864,
        ctx: 32768,
        rope_theta: 1_000_000.0,
    },
    Shape {
        name: "llama-256",
        arch: "llama",
        hidden: 1024,
        layers: 16,
        heads: 16,
        kv_heads: 4,
        head_dim: 64,
        ff: 2816,
        ctx: 8192,
        rope_theta: 500_000.0,
    },
];

/// The shape called `name`.
pub fn shape(name: &str) -> Result<&'static Shape> {
    SHAPES.iter().find(|s| s.name == name).ok_or_else(|| {
        Error::Config(format!(
            "no synthetic shape {name:?} (known: {})",
            SHAPES.map(|s| s.name).join(", ")
        ))
    })
}

/// Uniform values in [-1, 1) from a seed (splitmix64).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32, offset: f32) -> Vec<f32> {
        (0..n).map(|_| offset + scale * self.next()).collect()
    }
}

/// The `tokenizer.*` metadata of a GGUF file's header, as a GGUF file with no tensors (what
/// [`synthetic_gguf`] copies the tokenizer from).
pub fn tokenizer_header(meta: &BTreeMap<String, MetaValue>) -> Result<Vec<u8>> {
    let keys: Vec<(&str, MetaValue)> = meta
        .iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    if !keys.iter().any(|(k, _)| *k == "tokenizer.ggml.tokens") {
        return Err(Error::Config(
            "the file has no tokenizer.ggml.tokens".into(),
        ));
    }
    Ok(write(&keys, &[]))
}

/// The format a matrix with rows of `cols` weights is stored in when `dtype` is asked for:
/// `dtype` where the rows are whole blocks of it, else Q8_0 (as llama.cpp falls back from
/// the K-quants on rows of partial super-blocks).
pub fn stored_as(dtype: DType, cols: usize) -> DType {
    if cols.is_multiple_of(dtype.block_len()) {
        dtype
    } else {
        DType::Q8_0
    }
}

/// A GGUF file of `shape` with every matrix stored as [`stored_as`]`(dtype, ..)` (vectors and
/// biases F32), weights drawn from `seed`, and the `tokenizer.*` metadata of `tokenizer`
/// (whose vocabulary sets the embedding's rows). The embedding is the output head (tied).
pub fn synthetic_gguf(
    shape: &Shape,
    dtype: DType,
    seed: u64,
    tokenizer: &BTreeMap<String, MetaValue>,
) -> Result<Vec<u8>> {
    let vocab = tokenizer
        .get("tokenizer.ggml.tokens")
        .and_then(MetaValue::as_array)
        .map(|a| a.len())
        .ok_or_else(|| Error::Config("the tokenizer header has no tokenizer.ggml.tokens".into()))?;
    let s = *shape;
    let a = s.arch;
    let u = |x: usize| MetaValue::U32(x as u32);
    let mut meta: Vec<(String, MetaValue)> = vec![
        ("general.architecture".into(), MetaValue::String(a.into())),
        (
            "general.name".into(),
            MetaValue::String(format!("synthetic-{}-{dtype}-seed{seed}", s.name)),
        ),
        (format!("{a}.context_length"), u(s.ctx)),
        (format!("{a}.embedding_length"), u(s.hidden)),
        (format!("{a}.block_count"), u(s.layers)),
        (format!("{a}.feed_forward_length"), u(s.ff)),
        (format!("{a}.attention.head_count"), u(s.heads)),
        (format!("{a}.attention.head_count_kv"), u(s.kv_heads)),
        (
            format!("{a}.attention.layer_norm_rms_epsilon"),
            MetaValue::F32(1e-5),
        ),
        (format!("{a}.rope.freq_base"), MetaValue::F32(s.rope_theta)),
        (format!("{a}.rope.dimension_count"), u(s.head_dim)),
        (format!("{a}.vocab_size"), u(vocab)),
    ];
    if s.heads * s.head_dim != s.hidden {
        meta.push((format!("{a}.attention.key_length"), u(s.head_dim)));
        meta.push((format!("{a}.attention.value_length"), u(s.head_dim)));
    }
    meta.extend(
        tokenizer
            .iter()
            .filter(|(k, _)| k.starts_with("tokenizer."))
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    let mut rng = Rng(seed);
    // (name, [rows, cols] or [len], values, stored as)
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>, DType)> = Vec::new();
    let mut matrix = |name: String, rows: usize, cols: usize, rng: &mut Rng, scale: f32| {
        let dt = stored_as(dtype, cols);
        let v = rng.vec(rows * cols, scale, 0.0);
        tensors.push((name, vec![rows, cols], quantize_row(dt, &v), dt));
    };
    // Uniform weights of variance 1/cols keep each product's outputs near unit scale.
    let w = |cols: usize| (3.0 / cols as f32).sqrt();
    let (h, q, kv, ff) = (
        s.hidden,
        s.heads * s.head_dim,
        s.kv_heads * s.head_dim,
        s.ff,
    );
    matrix("token_embd.weight".into(), vocab, h, &mut rng, 1.0);
    let mut vectors: Vec<(String, Vec<f32>)> = Vec::new();
    for l in 0..s.layers {
        let p = |x: &str| format!("blk.{l}.{x}");
        vectors.push((p("attn_norm.weight"), rng.vec(h, 0.1, 1.0)));
        matrix(p("attn_q.weight"), q, h, &mut rng, w(h));
        matrix(p("attn_k.weight"), kv, h, &mut rng, w(h));
        matrix(p("attn_v.weight"), kv, h, &mut rng, w(h));
        if a == "qwen2" {
            vectors.push((p("attn_q.bias"), rng.vec(q, 0.1, 0.0)));
            vectors.push((p("attn_k.bias"), rng.vec(kv, 0.1, 0.0)));
            vectors.push((p("attn_v.bias"), rng.vec(kv, 0.1, 0.0)));
        }
        matrix(p("attn_output.weight"), h, q, &mut rng, w(q));
        vectors.push((p("ffn_norm.weight"), rng.vec(h, 0.1, 1.0)));
        matrix(p("ffn_gate.weight"), ff, h, &mut rng, w(h));
        matrix(p("ffn_up.weight"), ff, h, &mut rng, w(h));
        matrix(p("ffn_down.weight"), h, ff, &mut rng, w(ff));
    }
    vectors.push(("output_norm.weight".into(), rng.vec(h, 0.1, 1.0)));
    for (name, v) in vectors {
        let len = v.len();
        tensors.push((name, vec![len], quantize_row(DType::F32, &v), DType::F32));
    }
    let dims: Vec<Vec<u64>> = tensors
        .iter()
        .map(|t| t.1.iter().rev().map(|&d| d as u64).collect())
        .collect();
    let specs: Vec<TensorSpec> = tensors
        .iter()
        .zip(&dims)
        .map(|(t, d)| TensorSpec {
            name: &t.0,
            dims: d,
            ggml_type: t.3.ggml_type(),
            data: &t.2,
        })
        .collect();
    let meta: Vec<(&str, MetaValue)> = meta.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    Ok(write(&meta, &specs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufFile;

    fn tokenizer() -> BTreeMap<String, MetaValue> {
        let tokens: Vec<MetaValue> = (0..64)
            .map(|i| MetaValue::String(format!("t{i}")))
            .collect();
        let mut m = BTreeMap::new();
        m.insert(
            "tokenizer.ggml.model".into(),
            MetaValue::String("gpt2".into()),
        );
        m.insert("tokenizer.ggml.tokens".into(), MetaValue::Array(tokens));
        m.insert("general.name".into(), MetaValue::String("real".into()));
        m
    }

    #[test]
    fn files_are_seeded_shaped_and_carry_the_tokenizer() {
        let mut s = *shape("llama-256").unwrap();
        s.layers = 1;
        let a = synthetic_gguf(&s, DType::Q4_K, 7, &tokenizer()).unwrap();
        assert_eq!(a, synthetic_gguf(&s, DType::Q4_K, 7, &tokenizer()).unwrap());
        assert_ne!(a, synthetic_gguf(&s, DType::Q4_K, 8, &tokenizer()).unwrap());
        let f = GgufFile::from_bytes(&a).unwrap();
        let info = f.tensor_info("blk.0.ffn_down.weight").unwrap();
        assert_eq!(info.dims, [2816, 1024]);
        // 2816 is 11 blocks of 256: stored as asked.
        assert_eq!(info.ggml_type, DType::Q4_K.ggml_type());
        assert_eq!(f.tensor_info("token_embd.weight").unwrap().dims, [1024, 64]);
        assert!(f.get("tokenizer.ggml.model").is_some());
        assert!(f
            .get("general.name")
            .unwrap()
            .as_str()
            .unwrap()
            .contains("synthetic"));
        // SmolLM2's rows of 576 are not whole super-blocks: Q8_0 there.
        assert_eq!(stored_as(DType::Q4_K, 576), DType::Q8_0);
        assert_eq!(stored_as(DType::Q4_0, 576), DType::Q4_0);
        let header = tokenizer_header(&tokenizer()).unwrap();
        let h = GgufFile::from_bytes(&header).unwrap();
        assert!(h.tensors.is_empty() && h.get("general.name").is_none());
        assert!(shape("gpt-5")
            .unwrap_err()
            .to_string()
            .contains("smollm2-135m"));
    }
}
