//! PEFT LoRA folders: `adapter_config.json` and `adapter_model.safetensors`, tensors named
//! `base_model.model.model.layers.{i}.{self_attn|mlp}.{q,k,v,o,gate,up,down}_proj.lora_{A,B}.weight`
//! with `A` `[r, in]` and `B` `[out, r]` in Hugging Face layout. Scale per module:
//! `lora_alpha / r` (`/ √r` with `use_rslora`), with `rank_pattern` and `alpha_pattern`
//! overriding `r` and `lora_alpha` for the modules whose name ends with a pattern key.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use safetensors::{Dtype, SafeTensors};
use serde_json::Value;
use tessera_core::untrusted::quote;
use tessera_core::{DType, Error, Result};
use tessera_formats::ModelConfig;

use crate::{permutes_qk, AdapterFormat, Factors, LoraAdapter, LoraModule, Target};

/// A tensor read from the adapter file: its shape and its values as the file stores them.
type Tensor = (Vec<usize>, Factors);

fn bad(path: &Path, msg: impl Into<String>) -> Error {
    Error::Config(format!("adapter {}: {}", path.display(), msg.into()))
}

/// The parts of `adapter_config.json` Tessera honours, after refusing what it does not
/// support.
#[derive(Debug, Clone, PartialEq)]
pub struct PeftConfig {
    pub r: usize,
    pub alpha: f64,
    pub use_rslora: bool,
    pub rank_pattern: BTreeMap<String, usize>,
    pub alpha_pattern: BTreeMap<String, f64>,
}

impl PeftConfig {
    pub fn parse(v: &Value, path: &Path) -> Result<Self> {
        let field = |k: &str| v.get(k).filter(|x| !x.is_null());
        let peft_type = field("peft_type").and_then(Value::as_str).unwrap_or("LORA");
        if peft_type != "LORA" {
            return Err(bad(
                path,
                format!(
                    "peft_type {} is not supported (only LORA)",
                    quote(peft_type)
                ),
            ));
        }
        let truthy = |k: &str| field(k).and_then(Value::as_bool).unwrap_or(false);
        for (k, what) in [
            ("use_dora", "DoRA"),
            ("fan_in_fan_out", "fan_in_fan_out (transposed weights)"),
            ("lora_bias", "LoRA biases"),
            ("use_qalora", "QALoRA"),
        ] {
            if truthy(k) {
                return Err(bad(path, format!("{what} ({k}) is not supported")));
            }
        }
        if let Some(b) = field("bias").and_then(Value::as_str) {
            if b != "none" {
                return Err(bad(
                    path,
                    format!("bias {} is not supported (only \"none\")", quote(b)),
                ));
            }
        }
        for k in [
            "modules_to_save",
            "layer_replication",
            "trainable_token_indices",
        ] {
            if let Some(x) = field(k) {
                let empty = x.as_array().is_some_and(|a| a.is_empty())
                    || x.as_object().is_some_and(|o| o.is_empty());
                if !empty {
                    return Err(bad(path, format!("{k} is not supported")));
                }
            }
        }
        if let Some(t) = field("target_modules") {
            let names: Vec<&str> = match t {
                Value::String(s) => {
                    return Err(bad(
                        path,
                        format!(
                            "target_modules as a pattern ({}) is not supported; list the modules",
                            quote(s)
                        ),
                    ))
                }
                Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
                _ => return Err(bad(path, "target_modules must be a list of module names")),
            };
            if let Some(n) = names.iter().find(|n| targets_of(n).is_none()) {
                return Err(bad(
                    path,
                    format!(
                        "target module {} is not a projection of this architecture \
                         (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; \
                         Phi-3's fused qkv_proj, gate_up_proj)",
                        quote(n)
                    ),
                ));
            }
        }
        let r = field("r")
            .and_then(Value::as_u64)
            .filter(|&r| r > 0)
            .ok_or_else(|| bad(path, "adapter_config.json needs a positive integer r"))?
            as usize;
        let alpha = field("lora_alpha")
            .and_then(Value::as_f64)
            .unwrap_or(r as f64);
        let map = |k: &str| -> Result<BTreeMap<String, f64>> {
            match field(k) {
                None => Ok(BTreeMap::new()),
                Some(Value::Object(o)) => o
                    .iter()
                    .map(|(key, val)| {
                        val.as_f64().map(|x| (key.clone(), x)).ok_or_else(|| {
                            bad(path, format!("{k}[{}] must be a number", quote(key)))
                        })
                    })
                    .collect(),
                Some(_) => Err(bad(path, format!("{k} must be an object"))),
            }
        };
        let rank_pattern = map("rank_pattern")?
            .into_iter()
            .map(|(k, v)| {
                if v >= 1.0 && v.fract() == 0.0 {
                    Ok((k, v as usize))
                } else {
                    Err(bad(
                        path,
                        format!(
                            "rank_pattern[{}] = {v} is not a positive integer",
                            quote(&k)
                        ),
                    ))
                }
            })
            .collect::<Result<_>>()?;
        Ok(PeftConfig {
            r,
            alpha,
            use_rslora: truthy("use_rslora"),
            rank_pattern,
            alpha_pattern: map("alpha_pattern")?,
        })
    }

    /// `(rank, scale)` of the module named `full` (e.g. `model.layers.3.mlp.down_proj`).
    pub fn rank_and_scale(&self, full: &str) -> (usize, f32) {
        let r = pattern(&self.rank_pattern, full).copied().unwrap_or(self.r);
        let alpha = pattern(&self.alpha_pattern, full)
            .copied()
            .unwrap_or(self.alpha);
        let denom = if self.use_rslora {
            (r as f64).sqrt()
        } else {
            r as f64
        };
        (r, (alpha / denom) as f32)
    }
}

/// The value of the longest pattern key that `full` ends with at a dot boundary (PEFT keys
/// are module names or dotted suffixes of them).
fn pattern<'a, T>(map: &'a BTreeMap<String, T>, full: &str) -> Option<&'a T> {
    map.iter()
        .filter(|(k, _)| full == k.as_str() || full.ends_with(&format!(".{k}")))
        .max_by_key(|(k, _)| k.len())
        .map(|(_, v)| v)
}

/// The projections a PEFT module adapts, in its output rows' order: one, or the parts of a
/// fused module (Phi-3's `qkv_proj`, `gate_up_proj`), whose `B` rows are split among them
/// (their `A` shared: `B·A` of the fused module is exactly the parts' deltas stacked).
fn targets_of(short: &str) -> Option<Vec<Target>> {
    match short {
        "qkv_proj" => Some(vec![Target::Q, Target::K, Target::V]),
        "gate_up_proj" => Some(vec![Target::Gate, Target::Up]),
        s => Target::from_hf(s).map(|t| vec![t]),
    }
}

/// `(layer, targets, is_b, module)` of a PEFT tensor name.
fn parse_name(name: &str) -> Option<(usize, Vec<Target>, bool, String)> {
    let rest = name.strip_prefix("base_model.model.")?;
    // A multimodal base's text model (Gemma 3): `model.language_model.layers.`.
    let rest = rest
        .strip_prefix("model.layers.")
        .or_else(|| rest.strip_prefix("model.language_model.layers."))?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (module, tail) = rest.split_once(".lora_")?;
    let short = module
        .strip_prefix("self_attn.")
        .or_else(|| module.strip_prefix("mlp."))?;
    let targets = targets_of(short)?;
    let is_b = match tail
        .trim_end_matches(".weight")
        .trim_end_matches(".default")
    {
        "A" => false,
        "B" => true,
        _ => return None,
    };
    Some((
        layer,
        targets,
        is_b,
        format!("model.layers.{layer}.{module}"),
    ))
}

/// A tensor's values in its own element type (f32, f16 or bf16).
fn factors(t: &safetensors::tensor::TensorView, name: &str, path: &Path) -> Result<Factors> {
    let dtype = match t.dtype() {
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        d => {
            return Err(bad(
                path,
                format!("tensor {} has unsupported dtype {d:?}", quote(name)),
            ))
        }
    };
    Factors::from_le_bytes(t.data(), dtype)
        .ok_or_else(|| bad(path, format!("tensor {} has a partial value", quote(name))))
}

pub fn load(dir: &Path, base: &ModelConfig) -> Result<LoraAdapter> {
    let cfg_path = dir.join(crate::PEFT_CONFIG);
    let text = std::fs::read_to_string(&cfg_path).map_err(|e| Error::io(&cfg_path, e))?;
    let v: Value = serde_json::from_str(&text)
        .map_err(|e| Error::malformed("JSON", format!("{}: {e}", cfg_path.display())))?;
    let cfg = PeftConfig::parse(&v, dir)?;
    let st_path = dir.join(crate::PEFT_WEIGHTS);
    if !st_path.exists() && dir.join("adapter_model.bin").exists() {
        return Err(crate::pickle_refused(&dir.join("adapter_model.bin")));
    }
    let bytes = std::fs::read(&st_path).map_err(|e| Error::io(&st_path, e))?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| Error::malformed("safetensors", format!("{}: {e}", st_path.display())))?;
    // (layer, module) -> the projections it adapts, and its (A, B).
    type Pair = (Vec<Target>, [Option<Tensor>; 2]);
    let mut pairs: HashMap<(usize, String), Pair> = HashMap::new();
    for (name, t) in st.tensors() {
        let Some((layer, targets, is_b, full)) = parse_name(&name) else {
            return Err(bad(
                dir,
                format!(
                    "tensor {} is not a LoRA factor of a q/k/v/o/gate/up/down projection",
                    quote(&name)
                ),
            ));
        };
        let values = factors(&t, &name, dir)?;
        let e = pairs
            .entry((layer, full))
            .or_insert_with(|| (targets, [None, None]));
        e.1[is_b as usize] = Some((t.shape().to_vec(), values));
    }
    let permute = permutes_qk(base);
    let mut modules = Vec::with_capacity(pairs.len());
    for ((layer, full), (targets, [a, b])) in pairs {
        let (Some((sa, a)), Some((sb, b))) = (a, b) else {
            return Err(bad(
                dir,
                format!("{full} has only one of lora_A and lora_B"),
            ));
        };
        let inp = targets[0].shape(base).0;
        let outs: Vec<usize> = targets.iter().map(|t| t.shape(base).1).collect();
        let out: usize = outs.iter().sum();
        let (rank, scale) = cfg.rank_and_scale(&full);
        if sa != [rank, inp] || sb != [out, rank] {
            return Err(bad(
                dir,
                format!(
                    "{full}: lora_A {sa:?} and lora_B {sb:?} do not fit the base model \
                     (expected [{rank}, {inp}] and [{out}, {rank}])"
                ),
            ));
        }
        let mut row = 0;
        for (&target, &o) in targets.iter().zip(&outs) {
            let part = b.slice(row * rank..(row + o) * rank);
            row += o;
            let part = match (permute, target) {
                (true, Target::Q) => part.rows_permuted(base.n_heads, rank),
                (true, Target::K) => part.rows_permuted(base.n_kv_heads, rank),
                _ => part,
            };
            modules.push((
                layer,
                target,
                LoraModule {
                    rank,
                    scale,
                    a: a.clone(),
                    b_t: part.transposed(o, rank),
                },
            ));
        }
    }
    modules.sort_by_key(|m| (m.0, m.1));
    LoraAdapter::from_modules(dir, AdapterFormat::Peft, base, modules)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn patterns_and_rslora_set_each_modules_scale() {
        let p = Path::new("x");
        let c = PeftConfig::parse(
            &json!({"r": 4, "lora_alpha": 8, "rank_pattern": {"down_proj": 6},
                    "alpha_pattern": {"layers.2.mlp.gate_proj": 3}}),
            p,
        )
        .unwrap();
        assert_eq!(
            c.rank_and_scale("model.layers.0.self_attn.q_proj"),
            (4, 2.0)
        );
        assert_eq!(
            c.rank_and_scale("model.layers.1.mlp.down_proj"),
            (6, 8.0 / 6.0)
        );
        assert_eq!(c.rank_and_scale("model.layers.2.mlp.gate_proj"), (4, 0.75));
        assert_eq!(c.rank_and_scale("model.layers.12.mlp.gate_proj"), (4, 2.0));
        let rs =
            PeftConfig::parse(&json!({"r": 8, "lora_alpha": 16, "use_rslora": true}), p).unwrap();
        assert!((rs.rank_and_scale("a.q_proj").1 - 16.0 / 8f32.sqrt()).abs() < 1e-6);
    }

    #[test]
    fn unsupported_configs_are_refused_by_name() {
        let p = Path::new("x");
        for (cfg, want) in [
            (json!({"r": 4, "use_dora": true}), "DoRA"),
            (json!({"r": 4, "peft_type": "IA3"}), "IA3"),
            (json!({"r": 4, "bias": "all"}), "bias"),
            (
                json!({"r": 4, "target_modules": ["q_proj", "embed_tokens"]}),
                "embed_tokens",
            ),
            (json!({"r": 4, "target_modules": ".*proj"}), "pattern"),
            (
                json!({"r": 4, "modules_to_save": ["lm_head"]}),
                "modules_to_save",
            ),
            (json!({"r": 0}), "positive integer r"),
        ] {
            let e = PeftConfig::parse(&cfg, p).unwrap_err().to_string();
            assert!(e.contains(want), "{cfg}: {e}");
        }
    }

    #[test]
    fn tensor_names() {
        assert_eq!(
            parse_name("base_model.model.model.layers.3.self_attn.k_proj.lora_B.weight")
                .map(|x| (x.0, x.1, x.2)),
            Some((3, vec![Target::K], true))
        );
        assert_eq!(
            parse_name("base_model.model.model.layers.0.self_attn.qkv_proj.lora_A.weight")
                .map(|x| (x.0, x.1, x.2)),
            Some((0, vec![Target::Q, Target::K, Target::V], false))
        );
        assert_eq!(
            parse_name(
                "base_model.model.model.language_model.layers.2.mlp.gate_up_proj.lora_B.weight"
            )
            .map(|x| (x.1, x.3)),
            Some((
                vec![Target::Gate, Target::Up],
                "model.layers.2.mlp.gate_up_proj".into()
            ))
        );
        assert!(parse_name("base_model.model.model.embed_tokens.lora_embedding_A").is_none());
        assert!(parse_name("base_model.model.lm_head.lora_A.weight").is_none());
    }
}
