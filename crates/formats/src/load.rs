//! Opens a model (a GGUF file or a Hugging Face folder) into [`ModelFiles`]. Strings from
//! the file that reach messages or logs (the model's name, unknown values) are escaped and
//! cut short ([`tessera_core::untrusted`]).

use std::collections::HashMap;
use std::path::Path;

use tessera_core::untrusted::{quote, sanitize};
use tessera_core::{Error, Result, WeightTensor};

/// Longest model name kept from a file (`general.name`).
const NAME_CHARS: usize = 128;

use crate::config::{BlockSpec, ModelConfig, RopeScaling};
use crate::family::{self, Family, GgufMeta};
use crate::gguf::{GgufFile, MetaValue};

/// Everything the tokenizer crate needs, as plain data.
#[derive(Debug, Clone)]
pub enum TokenizerSource {
    /// A Hugging Face `tokenizer.json`, verbatim.
    HfJson(String),
    /// GGUF `tokenizer.ggml.model = gpt2`: byte-level BPE.
    GgufBpe {
        tokens: Vec<String>,
        token_types: Vec<i32>,
        merges: Vec<String>,
        /// `tokenizer.ggml.pre`: which pre-tokenizer regex the model was trained with.
        pre: String,
    },
    /// GGUF `tokenizer.ggml.model = llama`: SentencePiece-style BPE with scores.
    GgufSpm {
        tokens: Vec<String>,
        token_types: Vec<i32>,
        scores: Vec<f32>,
        add_space_prefix: bool,
        /// `general.architecture`, which picks the family's pipeline (Gemma's, Phi-3's,
        /// Llama's); `None`: guessed from the vocabulary.
        arch: Option<String>,
    },
}

#[derive(Debug, Clone)]
pub struct TokenizerSpec {
    pub source: TokenizerSource,
    pub bos_id: Option<u32>,
    pub eos_ids: Vec<u32>,
    pub add_bos: bool,
    pub chat_template: Option<String>,
}

/// A loaded model: configuration, tensors under canonical GGUF-style names, tokenizer data.
pub struct ModelFiles {
    pub name: String,
    pub config: ModelConfig,
    pub tensors: HashMap<String, WeightTensor>,
    pub tokenizer: TokenizerSpec,
}

impl ModelFiles {
    pub fn tensor(&self, name: &str) -> Result<&WeightTensor> {
        self.tensors.get(name).ok_or_else(|| Error::MissingTensor {
            name: name.to_string(),
        })
    }

    /// Bytes of all tensors (what the weights occupy, mapped or owned).
    pub fn weight_bytes(&self) -> usize {
        self.tensors.values().map(|t| t.data().len()).sum()
    }

    /// Bytes of the weights one decode step reads: all of them but an embedding table that
    /// is not also the output head (a token reads one row of it).
    pub fn step_weight_bytes(&self) -> usize {
        let embed = match self.tensors.get("token_embd.weight") {
            Some(t) if !self.config.tie_embeddings => t.data().len(),
            _ => 0,
        };
        self.weight_bytes() - embed
    }
}

/// Opens a GGUF file or a Hugging Face model folder.
pub fn load_model(path: &Path) -> Result<ModelFiles> {
    if !path.exists() {
        return Err(Error::Io {
            path: path.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no such model file or folder",
            ),
        });
    }
    if path.is_dir() {
        return crate::hf::load_hf_folder(path);
    }
    let f = GgufFile::open(path)?;
    from_gguf(&f, path)
}

fn meta_err(key: &str, what: &str) -> Error {
    Error::Config(format!("GGUF metadata {key}: {what}"))
}

fn get_usize(f: &GgufFile, key: &str) -> Result<usize> {
    f.get(key)
        .ok_or_else(|| meta_err(key, "missing"))?
        .as_u64()
        .map(|v| v as usize)
        .ok_or_else(|| meta_err(key, "not an unsigned integer"))
}

fn get_f32(f: &GgufFile, key: &str) -> Result<Option<f32>> {
    match f.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_f64()
            .map(|x| Some(x as f32))
            .ok_or_else(|| meta_err(key, "not a number")),
    }
}

fn string_array(f: &GgufFile, key: &str) -> Result<Vec<String>> {
    let arr = f
        .get(key)
        .and_then(MetaValue::as_array)
        .ok_or_else(|| meta_err(key, "missing or not an array"))?;
    arr.iter()
        .map(|v| {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| meta_err(key, "holds a non-string"))
        })
        .collect()
}

/// Builds [`ModelFiles`] from a parsed GGUF file.
pub fn from_gguf(f: &GgufFile, path: &Path) -> Result<ModelFiles> {
    let arch_name = f
        .get("general.architecture")
        .and_then(MetaValue::as_str)
        .ok_or_else(|| meta_err("general.architecture", "missing"))?
        .to_string();
    let known = family::by_gguf_arch(&arch_name);
    // Every tensor of a supported file is used, so any unsupported type is fatal
    // (`rope_freqs.weight` aside, which is read as f32 factors when present). All of them
    // and an unknown architecture are named in one error.
    let unsupported = tessera_core::group_unsupported(
        f.tensors
            .iter()
            .filter(|info| {
                tessera_core::DType::from_ggml_type(info.ggml_type).is_none()
                    && info.name != "rope_freqs.weight"
            })
            .map(|info| {
                (
                    tessera_core::DType::ggml_type_name(info.ggml_type),
                    info.name.clone(),
                )
            }),
    );
    let fam: &Family = match known {
        Some(k) if unsupported.is_empty() => k,
        Some(_) => {
            return Err(Error::UnsupportedModel {
                arch: None,
                types: unsupported,
            })
        }
        None if unsupported.is_empty() => {
            return Err(Error::UnknownArchitecture { arch: arch_name })
        }
        None => {
            return Err(Error::UnsupportedModel {
                arch: Some(arch_name),
                types: unsupported,
            })
        }
    };
    let a = |k: &str| format!("{arch_name}.{k}");
    let hidden_size = get_usize(f, &a("embedding_length"))?;
    let n_heads = get_usize(f, &a("attention.head_count"))?;
    let n_kv_heads = match f.get(&a("attention.head_count_kv")) {
        Some(_) => get_usize(f, &a("attention.head_count_kv"))?,
        None => n_heads,
    };
    let head_dim = match f.get(&a("attention.key_length")) {
        Some(_) => get_usize(f, &a("attention.key_length"))?,
        None if n_heads > 0 => hidden_size / n_heads,
        None => 0,
    };
    let rope_dim = match f.get(&a("rope.dimension_count")) {
        Some(_) => get_usize(f, &a("rope.dimension_count"))?,
        None => head_dim,
    };
    let max_position = get_usize(f, &a("context_length"))?;
    let mut tensors: HashMap<String, WeightTensor> = f
        .tensors
        .iter()
        .filter_map(|info| match f.tensor(info) {
            Ok(t) => Some(Ok((info.name.clone(), t))),
            // Only `rope_freqs.weight` can be left (the rest were reported above).
            Err(Error::UnsupportedTensorType { .. }) => None,
            Err(e) => Some(Err(e)),
        })
        .collect::<Result<_>>()?;
    let vocab_size = match f.get(&a("vocab_size")) {
        Some(_) => get_usize(f, &a("vocab_size"))?,
        None => f
            .get("tokenizer.ggml.tokens")
            .and_then(MetaValue::as_array)
            .map(|t| t.len())
            .ok_or_else(|| meta_err("tokenizer.ggml.tokens", "missing"))?,
    };
    let rope_scaling = match tensors.get("rope_freqs.weight") {
        Some(t) => RopeScaling::FreqFactors(t.to_f32_vec()),
        None => match f.get(&a("rope.scaling.type")).and_then(MetaValue::as_str) {
            // LongRoPE's factors are tensors the family reads.
            None | Some("none") | Some("longrope") | Some("su") => RopeScaling::None,
            Some("linear") => RopeScaling::Linear {
                factor: get_f32(f, &a("rope.scaling.factor"))?.unwrap_or(1.0),
            },
            Some("yarn") => RopeScaling::Yarn {
                factor: get_f32(f, &a("rope.scaling.factor"))?.unwrap_or(1.0),
                original_max_position: get_usize(f, &a("rope.scaling.original_context_length"))?,
                beta_fast: 32.0,
                beta_slow: 1.0,
            },
            Some(other) => {
                return Err(Error::Config(format!(
                    "unsupported rope scaling type {}",
                    quote(other)
                )))
            }
        },
    };
    let mut config = ModelConfig {
        arch: fam.arch,
        vocab_size,
        hidden_size,
        intermediate_size: get_usize(f, &a("feed_forward_length"))?,
        n_layers: get_usize(f, &a("block_count"))?,
        n_heads,
        n_kv_heads,
        head_dim,
        rms_eps: get_f32(f, &a("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5),
        rope_theta: get_f32(f, &a("rope.freq_base"))?.unwrap_or(10000.0),
        rope_dim,
        rope_style: fam.gguf_rope,
        rope_scaling,
        max_position,
        tie_embeddings: !tensors.contains_key("output.weight"),
        block: BlockSpec::default(),
    };
    let meta = GgufMeta {
        file: f,
        arch: &arch_name,
    };
    (fam.gguf)(&meta, &tensors, &mut config)?;
    config.validate()?;
    family::split_fused(&mut tensors, &config)?;
    let tokenizer = gguf_tokenizer(f, fam)?;
    let name = f
        .get("general.name")
        .and_then(MetaValue::as_str)
        .map(|n| sanitize(n, NAME_CHARS))
        .unwrap_or_else(|| {
            path.file_stem()
                .map(|s| sanitize(&s.to_string_lossy(), NAME_CHARS))
                .unwrap_or_default()
        });
    Ok(ModelFiles {
        name,
        config,
        tensors,
        tokenizer,
    })
}

fn gguf_tokenizer(f: &GgufFile, fam: &Family) -> Result<TokenizerSpec> {
    let model = f
        .get("tokenizer.ggml.model")
        .and_then(MetaValue::as_str)
        .ok_or_else(|| meta_err("tokenizer.ggml.model", "missing"))?;
    let tokens = string_array(f, "tokenizer.ggml.tokens")?;
    // The family's end-of-turn tokens, found by their text (as llama.cpp finds EOT).
    let stops: Vec<u32> = fam
        .stop_tokens
        .iter()
        .filter_map(|s| tokens.iter().position(|t| t == s))
        .map(|i| i as u32)
        .collect();
    let token_types: Vec<i32> = match f
        .get("tokenizer.ggml.token_type")
        .and_then(MetaValue::as_array)
    {
        Some(arr) => arr.iter().map(|v| v.as_i64().unwrap_or(1) as i32).collect(),
        None => vec![1; tokens.len()],
    };
    if token_types.len() != tokens.len() {
        return Err(meta_err(
            "tokenizer.ggml.token_type",
            "length differs from tokenizer.ggml.tokens",
        ));
    }
    let id =
        |key: &str| -> Option<u32> { f.get(key).and_then(MetaValue::as_u64).map(|v| v as u32) };
    let source = match model {
        "gpt2" => TokenizerSource::GgufBpe {
            tokens,
            token_types,
            merges: string_array(f, "tokenizer.ggml.merges")?,
            pre: f
                .get("tokenizer.ggml.pre")
                .and_then(MetaValue::as_str)
                .unwrap_or("default")
                .to_string(),
        },
        "llama" => {
            let scores: Vec<f32> =
                match f.get("tokenizer.ggml.scores").and_then(MetaValue::as_array) {
                    Some(arr) => arr
                        .iter()
                        .map(|v| v.as_f64().unwrap_or(0.0) as f32)
                        .collect(),
                    None => vec![0.0; tokens.len()],
                };
            if scores.len() != tokens.len() {
                return Err(meta_err(
                    "tokenizer.ggml.scores",
                    "length differs from tokenizer.ggml.tokens",
                ));
            }
            TokenizerSource::GgufSpm {
                tokens,
                token_types,
                scores,
                add_space_prefix: f
                    .get("tokenizer.ggml.add_space_prefix")
                    .and_then(MetaValue::as_bool)
                    .unwrap_or(true),
                arch: f
                    .get("general.architecture")
                    .and_then(MetaValue::as_str)
                    .map(str::to_string),
            }
        }
        other => {
            return Err(Error::Tokenizer(format!(
                "unsupported GGUF tokenizer model {} (supported: gpt2, llama)",
                quote(other)
            )))
        }
    };
    let default_add_bos = matches!(source, TokenizerSource::GgufSpm { .. });
    let mut eos_ids: Vec<u32> = id("tokenizer.ggml.eos_token_id").into_iter().collect();
    for eot in id("tokenizer.ggml.eot_token_id").into_iter().chain(stops) {
        if !eos_ids.contains(&eot) {
            eos_ids.push(eot);
        }
    }
    Ok(TokenizerSpec {
        source,
        bos_id: id("tokenizer.ggml.bos_token_id"),
        eos_ids,
        add_bos: f
            .get("tokenizer.ggml.add_bos_token")
            .and_then(MetaValue::as_bool)
            .unwrap_or(default_add_bos),
        chat_template: f
            .get("tokenizer.chat_template")
            .and_then(MetaValue::as_str)
            .or(fam.chat_template)
            .map(str::to_string),
    })
}
