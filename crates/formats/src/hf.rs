//! Hugging Face model folders: `config.json`, `*.safetensors` (one file, or shards listed in
//! `model.safetensors.index.json`), `tokenizer.json`, and optionally `tokenizer_config.json`
//! (chat template, BOS handling) and `generation_config.json` (extra EOS ids).
//!
//! Tensor names are mapped to GGUF's canonical names so the model code sees one naming.
//! Safetensors q/k rows are in "rotate half" order, hence [`RopeStyle::Neox`]. Shards named
//! by the index must be plain file names inside the folder; values quoted in errors are
//! escaped and cut short ([`tessera_core::untrusted`]).

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;
use serde_json::Value;
use tessera_core::untrusted::{quote, sanitize};
use tessera_core::{DType, Error, Result, TensorBytes, WeightTensor};

use crate::config::{Arch, ModelConfig, RopeScaling, RopeStyle};
use crate::load::{ModelFiles, TokenizerSource, TokenizerSpec};

#[derive(Deserialize)]
struct HfConfig {
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: Option<f32>,
    rope_theta: Option<f32>,
    rope_scaling: Option<Value>,
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
    bos_token_id: Option<Value>,
    eos_token_id: Option<Value>,
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::io(path, e))
}

fn json_err(path: &Path, e: serde_json::Error) -> Error {
    Error::malformed("JSON", format!("{}: {e}", path.display()))
}

/// Canonical (GGUF) name of a Hugging Face tensor name, or `None` for tensors we don't use.
pub fn canonical_name(hf: &str) -> Option<String> {
    let direct = match hf {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(n) = direct {
        return Some(n.to_string());
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (module, suffix) = rest.rsplit_once('.')?;
    let short = match module {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "ffn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{layer}.{short}.{suffix}"))
}

fn rope_scaling(v: &Option<Value>) -> Result<RopeScaling> {
    let Some(Value::Object(o)) = v else {
        return Ok(RopeScaling::None);
    };
    let kind = o
        .get("rope_type")
        .or_else(|| o.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let f = |k: &str, d: f64| o.get(k).and_then(Value::as_f64).unwrap_or(d) as f32;
    let u = |k: &str| o.get(k).and_then(Value::as_u64).map(|v| v as usize);
    Ok(match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear {
            factor: f("factor", 1.0),
        },
        "llama3" => RopeScaling::Llama3 {
            factor: f("factor", 8.0),
            low_freq_factor: f("low_freq_factor", 1.0),
            high_freq_factor: f("high_freq_factor", 4.0),
            original_max_position: u("original_max_position_embeddings").unwrap_or(8192),
        },
        "yarn" => RopeScaling::Yarn {
            factor: f("factor", 1.0),
            original_max_position: u("original_max_position_embeddings").ok_or_else(|| {
                Error::Config("rope_scaling yarn needs original_max_position_embeddings".into())
            })?,
            beta_fast: f("beta_fast", 32.0),
            beta_slow: f("beta_slow", 1.0),
        },
        other => {
            return Err(Error::Config(format!(
                "unsupported rope_scaling type {}",
                quote(other)
            )))
        }
    })
}

fn ids(v: &Option<Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_u64)
            .map(|x| x as u32)
            .collect(),
        _ => vec![],
    }
}

fn safetensor_files(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let v: Value = serde_json::from_str(&read(&index)?).map_err(|e| json_err(&index, e))?;
        let map = v
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| {
                Error::malformed(
                    "safetensors index",
                    format!("{}: no weight_map", index.display()),
                )
            })?;
        let files: BTreeSet<&str> = map.values().filter_map(Value::as_str).collect();
        // A shard outside the folder (`../x`, `/dev/...`) is not the model's.
        if let Some(f) = files.iter().find(|f| {
            let p = Path::new(f);
            p.file_name().and_then(|n| n.to_str()) != Some(**f) || p.components().count() != 1
        }) {
            return Err(Error::malformed(
                "safetensors index",
                format!(
                    "{}: shard {} is not a file name in the model folder",
                    index.display(),
                    quote(f)
                ),
            ));
        }
        return Ok(files.into_iter().map(|f| dir.join(f)).collect());
    }
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    Err(Error::Io {
        path: single,
        source: std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no model.safetensors or model.safetensors.index.json",
        ),
    })
}

/// Maps one safetensors file's tensors into `out`; tensors of a type Tessera lacks go to
/// `unsupported` as `(type, name)`, for one error naming them all.
fn load_safetensors(
    path: &Path,
    out: &mut HashMap<String, WeightTensor>,
    unsupported: &mut Vec<(String, String)>,
) -> Result<()> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    // SAFETY: read-only map; the file must not change while the model is loaded.
    let map = Arc::new(unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?);
    let st = SafeTensors::deserialize(&map)
        .map_err(|e| Error::malformed("safetensors", format!("{}: {e}", path.display())))?;
    let base = map.as_ptr() as usize;
    for (hf_name, view) in st.tensors() {
        let Some(name) = canonical_name(&hf_name) else {
            continue;
        };
        let dtype = match view.dtype() {
            Dtype::F32 => DType::F32,
            Dtype::F16 => DType::F16,
            Dtype::BF16 => DType::BF16,
            other => {
                unsupported.push((format!("{other:?}"), hf_name));
                continue;
            }
        };
        let offset = view.data().as_ptr() as usize - base;
        let bytes = TensorBytes::Mapped {
            map: map.clone(),
            offset,
            len: view.data().len(),
        };
        let shape = view.shape().to_vec();
        out.insert(name.clone(), WeightTensor::new(name, dtype, shape, bytes)?);
    }
    Ok(())
}

/// Loads a Hugging Face model folder.
pub fn load_hf_folder(dir: &Path) -> Result<ModelFiles> {
    let cfg_path = dir.join("config.json");
    let cfg: HfConfig =
        serde_json::from_str(&read(&cfg_path)?).map_err(|e| json_err(&cfg_path, e))?;
    let model_type = cfg.model_type.clone().unwrap_or_default();
    let known = match model_type.as_str() {
        "llama" | "mistral" => Some(Arch::Llama),
        "qwen2" => Some(Arch::Qwen2),
        _ => None,
    };
    let mut tensors = HashMap::new();
    let mut unsupported = Vec::new();
    for f in safetensor_files(dir)? {
        load_safetensors(&f, &mut tensors, &mut unsupported)?;
    }
    // An unknown architecture and every unsupported tensor type in one error.
    let unsupported = tessera_core::group_unsupported(unsupported);
    let arch = match known {
        Some(a) if unsupported.is_empty() => a,
        None if unsupported.is_empty() => {
            return Err(Error::UnknownArchitecture { arch: model_type })
        }
        _ => {
            return Err(Error::UnsupportedModel {
                arch: known.is_none().then_some(model_type),
                types: unsupported,
            })
        }
    };
    let head_dim = cfg
        .head_dim
        .unwrap_or(cfg.hidden_size / cfg.num_attention_heads.max(1));
    let tie = cfg.tie_word_embeddings.unwrap_or(false) || !tensors.contains_key("output.weight");
    let config = ModelConfig {
        arch,
        vocab_size: cfg.vocab_size,
        hidden_size: cfg.hidden_size,
        intermediate_size: cfg.intermediate_size,
        n_layers: cfg.num_hidden_layers,
        n_heads: cfg.num_attention_heads,
        n_kv_heads: cfg.num_key_value_heads.unwrap_or(cfg.num_attention_heads),
        head_dim,
        rms_eps: cfg.rms_norm_eps.unwrap_or(1e-6),
        rope_theta: cfg.rope_theta.unwrap_or(10000.0),
        rope_dim: head_dim,
        rope_style: RopeStyle::Neox,
        rope_scaling: rope_scaling(&cfg.rope_scaling)?,
        max_position: cfg.max_position_embeddings.unwrap_or(4096),
        tie_embeddings: tie,
    };
    config.validate()?;

    let tok_path = dir.join("tokenizer.json");
    let tokenizer_json = read(&tok_path)?;
    let tc_path = dir.join("tokenizer_config.json");
    let tc: Value = if tc_path.exists() {
        serde_json::from_str(&read(&tc_path)?).map_err(|e| json_err(&tc_path, e))?
    } else {
        Value::Null
    };
    let mut eos_ids = ids(&cfg.eos_token_id);
    let gen_path = dir.join("generation_config.json");
    if gen_path.exists() {
        let g: Value =
            serde_json::from_str(&read(&gen_path)?).map_err(|e| json_err(&gen_path, e))?;
        for id in ids(&g.get("eos_token_id").cloned()) {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
    }
    let chat_template = match tc.get("chat_template") {
        Some(Value::String(s)) => Some(s.clone()),
        // A list of named templates: take "default".
        Some(Value::Array(a)) => a
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template"))
            .and_then(Value::as_str)
            .map(str::to_string),
        _ => None,
    };
    let tokenizer = TokenizerSpec {
        source: TokenizerSource::HfJson(tokenizer_json),
        bos_id: ids(&cfg.bos_token_id).first().copied(),
        eos_ids,
        // tokenizer.json's post-processor already adds BOS where the model wants it.
        add_bos: false,
        chat_template,
    };
    let name = dir
        .file_name()
        .map(|s| sanitize(&s.to_string_lossy(), 128))
        .unwrap_or_default();
    Ok(ModelFiles {
        name,
        config,
        tensors,
        tokenizer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_hf_names() {
        assert_eq!(
            canonical_name("model.layers.12.self_attn.q_proj.bias").unwrap(),
            "blk.12.attn_q.bias"
        );
        assert_eq!(
            canonical_name("model.layers.0.mlp.down_proj.weight").unwrap(),
            "blk.0.ffn_down.weight"
        );
        assert_eq!(canonical_name("lm_head.weight").unwrap(), "output.weight");
        assert_eq!(
            canonical_name("model.layers.0.self_attn.rotary_emb.inv_freq"),
            None
        );
    }

    #[test]
    fn rope_scaling_kinds() {
        let v: Value = serde_json::json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        assert!(matches!(
            rope_scaling(&Some(v)).unwrap(),
            RopeScaling::Llama3 { .. }
        ));
        let v: Value = serde_json::json!({"type": "linear", "factor": 2.0});
        assert_eq!(
            rope_scaling(&Some(v)).unwrap(),
            RopeScaling::Linear { factor: 2.0 }
        );
        let v: Value = serde_json::json!({"type": "longrope"});
        assert!(rope_scaling(&Some(v))
            .unwrap_err()
            .to_string()
            .contains("longrope"));
    }
}
