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
use serde_json::Value;
use tessera_core::untrusted::{quote, sanitize};
use tessera_core::{DType, Error, Result, TensorBytes, WeightTensor};

use crate::config::{BlockSpec, ModelConfig, RopeStyle};
use crate::family::{self, HfMeta};
use crate::load::{ModelFiles, TokenizerSource, TokenizerSpec};

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::io(path, e))
}

fn json_err(path: &Path, e: serde_json::Error) -> Error {
    Error::malformed("JSON", format!("{}: {e}", path.display()))
}

/// Canonical (GGUF) name of a Hugging Face tensor name, or `None` for tensors we don't use.
/// `modules`: the family's module names that differ from Llama's (checked first).
pub fn canonical_name(hf: &str, modules: &[(&str, &str)]) -> Option<String> {
    // A multimodal checkpoint's text model (Gemma 3): `language_model.model.…` or
    // `model.language_model.…`.
    let hf = hf
        .strip_prefix("language_model.")
        .map(str::to_string)
        .or_else(|| {
            hf.strip_prefix("model.language_model.")
                .map(|r| format!("model.{r}"))
        })
        .unwrap_or_else(|| hf.to_string());
    let direct = match hf.as_str() {
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
    let short = match modules.iter().find(|(m, _)| *m == module) {
        Some((_, s)) => s,
        None => match module {
            "input_layernorm" => "attn_norm",
            "post_attention_layernorm" => "ffn_norm",
            "self_attn.q_proj" => "attn_q",
            "self_attn.k_proj" => "attn_k",
            "self_attn.v_proj" => "attn_v",
            "self_attn.o_proj" => "attn_output",
            "self_attn.q_norm" => "attn_q_norm",
            "self_attn.k_norm" => "attn_k_norm",
            "mlp.gate_proj" => "ffn_gate",
            "mlp.up_proj" => "ffn_up",
            "mlp.down_proj" => "ffn_down",
            _ => return None,
        },
    };
    Some(format!("blk.{layer}.{short}.{suffix}"))
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
    modules: &[(&str, &str)],
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
        let Some(name) = canonical_name(&hf_name, modules) else {
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

/// A required `config.json` number.
fn need(m: &HfMeta, k: &str) -> Result<usize> {
    m.usize(k)?
        .ok_or_else(|| Error::Config(format!("config.json {k}: missing")))
}

/// Loads a Hugging Face model folder.
pub fn load_hf_folder(dir: &Path) -> Result<ModelFiles> {
    let cfg_path = dir.join("config.json");
    let top: Value = serde_json::from_str(&read(&cfg_path)?).map_err(|e| json_err(&cfg_path, e))?;
    if !top.is_object() {
        return Err(Error::malformed(
            "JSON",
            format!("{}: not an object", cfg_path.display()),
        ));
    }
    let model_type = top
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let known = family::by_hf_type(&model_type);
    // A multimodal config keeps the text model's numbers in `text_config`.
    let json = top
        .get("text_config")
        .filter(|v| v.is_object())
        .unwrap_or(&top);
    let m = HfMeta { json };
    let modules = known.map(|f| f.hf_modules).unwrap_or(&[]);
    let mut tensors = HashMap::new();
    let mut unsupported = Vec::new();
    for f in safetensor_files(dir)? {
        load_safetensors(&f, modules, &mut tensors, &mut unsupported)?;
    }
    // An unknown architecture and every unsupported tensor type in one error.
    let unsupported = tessera_core::group_unsupported(unsupported);
    let fam = match known {
        Some(a) if unsupported.is_empty() => a,
        None if unsupported.is_empty() => {
            return Err(Error::UnknownArchitecture {
                arch: sanitize(&model_type, 64),
            })
        }
        _ => {
            return Err(Error::UnsupportedModel {
                arch: known.is_none().then(|| sanitize(&model_type, 64)),
                types: unsupported,
            })
        }
    };
    let hidden_size = need(&m, "hidden_size")?;
    let n_heads = need(&m, "num_attention_heads")?;
    let head_dim = m.usize("head_dim")?.unwrap_or(hidden_size / n_heads.max(1));
    let (theta, rope_scaling) = m.rope("full_attention")?;
    let partial = match m.f32("partial_rotary_factor")? {
        Some(p) => Some(p),
        None => m
            .get("rope_parameters")
            .and_then(|p| p.get("partial_rotary_factor"))
            .and_then(Value::as_f64)
            .map(|x| x as f32),
    };
    let rope_dim = match partial {
        Some(p) if p > 0.0 && p <= 1.0 => (head_dim as f32 * p) as usize,
        Some(p) => {
            return Err(Error::Config(format!(
                "config.json partial_rotary_factor {p} is out of range"
            )))
        }
        None => head_dim,
    };
    let tie_flag = top
        .get("tie_word_embeddings")
        .or_else(|| json.get("tie_word_embeddings"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let tie = tie_flag || !tensors.contains_key("output.weight");
    let mut config = ModelConfig {
        arch: fam.arch,
        vocab_size: need(&m, "vocab_size")?,
        hidden_size,
        intermediate_size: need(&m, "intermediate_size")?,
        n_layers: need(&m, "num_hidden_layers")?,
        n_heads,
        n_kv_heads: m.usize("num_key_value_heads")?.unwrap_or(n_heads),
        head_dim,
        rms_eps: m.f32("rms_norm_eps")?.unwrap_or(1e-6),
        rope_theta: theta.unwrap_or(10000.0),
        rope_dim,
        rope_style: RopeStyle::Neox,
        rope_scaling,
        max_position: m.usize("max_position_embeddings")?.unwrap_or(4096),
        tie_embeddings: tie,
        block: BlockSpec::default(),
    };
    (fam.hf)(&m, &mut config)?;
    config.validate()?;
    family::split_fused(&mut tensors, &config)?;
    family::shift_norms(&mut tensors, fam.hf_norm_shift);
    let cfg_ids = |k: &str| ids(&top.get(k).or_else(|| json.get(k)).cloned());

    let tok_path = dir.join("tokenizer.json");
    let tokenizer_json = read(&tok_path)?;
    let tc_path = dir.join("tokenizer_config.json");
    let tc: Value = if tc_path.exists() {
        serde_json::from_str(&read(&tc_path)?).map_err(|e| json_err(&tc_path, e))?
    } else {
        Value::Null
    };
    let mut eos_ids = cfg_ids("eos_token_id");
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
        _ => fam.chat_template.map(str::to_string),
    };
    let tokenizer = TokenizerSpec {
        source: TokenizerSource::HfJson(tokenizer_json),
        bos_id: cfg_ids("bos_token_id").first().copied(),
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
            canonical_name("model.layers.12.self_attn.q_proj.bias", &[]).unwrap(),
            "blk.12.attn_q.bias"
        );
        assert_eq!(
            canonical_name("model.layers.0.mlp.down_proj.weight", &[]).unwrap(),
            "blk.0.ffn_down.weight"
        );
        assert_eq!(
            canonical_name("lm_head.weight", &[]).unwrap(),
            "output.weight"
        );
        assert_eq!(
            canonical_name("model.layers.0.self_attn.rotary_emb.inv_freq", &[]),
            None
        );
    }

    #[test]
    fn family_module_names_come_first() {
        let gemma = crate::family::by_hf_type("gemma3_text").unwrap().hf_modules;
        assert_eq!(
            canonical_name("model.layers.3.post_attention_layernorm.weight", gemma).unwrap(),
            "blk.3.post_attention_norm.weight"
        );
        assert_eq!(
            canonical_name(
                "model.language_model.layers.0.pre_feedforward_layernorm.weight",
                gemma
            )
            .unwrap(),
            "blk.0.ffn_norm.weight"
        );
        assert_eq!(
            canonical_name("model.layers.3.post_attention_layernorm.weight", &[]).unwrap(),
            "blk.3.ffn_norm.weight"
        );
    }

    #[test]
    fn rope_scaling_kinds() {
        use crate::family::rope_scaling;
        use crate::RopeScaling;
        let v: Value = serde_json::json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        assert!(matches!(
            rope_scaling(Some(&v)).unwrap(),
            RopeScaling::Llama3 { .. }
        ));
        let v: Value = serde_json::json!({"type": "linear", "factor": 2.0});
        assert_eq!(
            rope_scaling(Some(&v)).unwrap(),
            RopeScaling::Linear { factor: 2.0 }
        );
        let v: Value = serde_json::json!({"type": "longrope"});
        assert!(rope_scaling(Some(&v))
            .unwrap_err()
            .to_string()
            .contains("short_factor"));
        let v: Value = serde_json::json!({"type": "dynamic"});
        assert!(rope_scaling(Some(&v))
            .unwrap_err()
            .to_string()
            .contains("dynamic"));
    }
}
