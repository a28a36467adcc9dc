//! The decoder families, each described as data: which files name it, how its q/k rows are
//! laid out in GGUF, how it departs from Llama's block ([`BlockSpec`]), which Hugging Face
//! module names differ from Llama's, and its chat defaults. The loaders ([`crate::load`],
//! [`crate::hf`]) read the common hyper-parameters and then hand each family its own keys;
//! the model reads only the resulting [`ModelConfig`], never the family.
//!
//! Adding a family: a file here with its [`Family`] value, listed in [`FAMILIES`]
//! (CONTRIBUTING.md walks through it).

use std::collections::HashMap;

use serde_json::Value;
use tessera_core::untrusted::quote;
use tessera_core::{Error, Result, WeightTensor};

use crate::config::{Arch, ModelConfig, RopeScaling, RopeStyle};
use crate::gguf::{GgufFile, MetaValue};

mod gemma;
mod llama;
mod phi3;
mod qwen;

/// One decoder family.
pub struct Family {
    pub arch: Arch,
    /// What users call it.
    pub name: &'static str,
    /// `general.architecture` values of its GGUF files.
    pub gguf_archs: &'static [&'static str],
    /// `model_type` values of its Hugging Face `config.json`.
    pub hf_types: &'static [&'static str],
    /// The pair layout RoPE finds in its GGUF q/k rows (llama.cpp permutes Llama's).
    pub gguf_rope: RopeStyle,
    /// Reads the family's own GGUF metadata (and tensors, for RoPE factors) into the
    /// config the common keys made.
    pub gguf: fn(&GgufMeta, &HashMap<String, WeightTensor>, &mut ModelConfig) -> Result<()>,
    /// The same from a Hugging Face `config.json`.
    pub hf: fn(&HfMeta, &mut ModelConfig) -> Result<()>,
    /// Hugging Face module names (after `model.layers.N.`) that differ from Llama's, and
    /// their canonical short names.
    pub hf_modules: &'static [(&'static str, &'static str)],
    /// Added to every norm weight of a Hugging Face checkpoint (Gemma stores `w` of a
    /// `(1 + w)` norm; its GGUF files store `1 + w`).
    pub hf_norm_shift: f32,
    /// The chat template when the file carries none.
    pub chat_template: Option<&'static str>,
    /// Tokens that end a turn besides the file's EOS (found by their text).
    pub stop_tokens: &'static [&'static str],
}

/// Every family Tessera runs.
pub static FAMILIES: &[&Family] = &[
    &llama::LLAMA,
    &llama::MISTRAL,
    &qwen::QWEN2,
    &qwen::QWEN3,
    &gemma::GEMMA2,
    &gemma::GEMMA3,
    &phi3::PHI3,
];

/// The family of a GGUF `general.architecture`.
pub fn by_gguf_arch(name: &str) -> Option<&'static Family> {
    FAMILIES
        .iter()
        .copied()
        .find(|f| f.gguf_archs.contains(&name))
}

/// The family of a Hugging Face `model_type`.
pub fn by_hf_type(name: &str) -> Option<&'static Family> {
    FAMILIES
        .iter()
        .copied()
        .find(|f| f.hf_types.contains(&name))
}

/// The family of a loaded config.
pub fn of(arch: Arch) -> &'static Family {
    FAMILIES
        .iter()
        .copied()
        .find(|f| f.arch == arch)
        .expect("every Arch has a family")
}

/// A GGUF file's metadata under its architecture's prefix.
pub struct GgufMeta<'a> {
    pub file: &'a GgufFile,
    pub arch: &'a str,
}

fn meta_err(key: &str, what: &str) -> Error {
    Error::Config(format!("GGUF metadata {key}: {what}"))
}

impl GgufMeta<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }
    /// `{arch}.{k}` as an unsigned integer, if present.
    pub fn usize(&self, k: &str) -> Result<Option<usize>> {
        let key = self.key(k);
        match self.file.get(&key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(|x| Some(x as usize))
                .ok_or_else(|| meta_err(&key, "not an unsigned integer")),
        }
    }
    /// `{arch}.{k}` as a number, if present.
    pub fn f32(&self, k: &str) -> Result<Option<f32>> {
        let key = self.key(k);
        match self.file.get(&key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|x| Some(x as f32))
                .ok_or_else(|| meta_err(&key, "not a number")),
        }
    }
    /// `{arch}.{k}` as a string, if present.
    pub fn str(&self, k: &str) -> Option<&str> {
        self.file.get(&self.key(k)).and_then(MetaValue::as_str)
    }
}

/// A Hugging Face `config.json` (the text part of a multimodal one).
pub struct HfMeta<'a> {
    pub json: &'a Value,
}

impl HfMeta<'_> {
    pub fn get(&self, k: &str) -> Option<&Value> {
        self.json.get(k).filter(|v| !v.is_null())
    }
    pub fn usize(&self, k: &str) -> Result<Option<usize>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(|x| Some(x as usize))
                .ok_or_else(|| Error::Config(format!("config.json {k}: not an unsigned integer"))),
        }
    }
    pub fn f32(&self, k: &str) -> Result<Option<f32>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|x| Some(x as f32))
                .ok_or_else(|| Error::Config(format!("config.json {k}: not a number"))),
        }
    }
    pub fn str(&self, k: &str) -> Option<&str> {
        self.get(k).and_then(Value::as_str)
    }

    /// The RoPE base and scaling of layers of type `layer_type` ("full_attention",
    /// "sliding_attention"): transformers 5's `rope_parameters` (flat, or per layer type),
    /// or the older `rope_theta` + `rope_scaling`.
    pub fn rope(&self, layer_type: &str) -> Result<(Option<f32>, RopeScaling)> {
        if let Some(p) = self.get("rope_parameters") {
            let p = p.get(layer_type).unwrap_or(p);
            let theta = p
                .get("rope_theta")
                .and_then(Value::as_f64)
                .map(|x| x as f32);
            return Ok((theta, rope_scaling(Some(p))?));
        }
        Ok((
            self.f32("rope_theta")?,
            rope_scaling(self.get("rope_scaling"))?,
        ))
    }

    /// Per-layer windows from `layer_types` ("sliding_attention" layers get `window`), or
    /// from a pattern of `period` (every `period`-th layer global) when the list is absent.
    pub fn windows(
        &self,
        n_layers: usize,
        window: usize,
        period: usize,
    ) -> Result<Vec<Option<usize>>> {
        match self.get("layer_types").and_then(Value::as_array) {
            Some(types) => {
                if types.len() != n_layers {
                    return Err(Error::Config(format!(
                        "config.json layer_types lists {} layers, the model has {n_layers}",
                        types.len()
                    )));
                }
                types
                    .iter()
                    .map(|t| match t.as_str() {
                        Some("sliding_attention") => Ok(Some(window)),
                        Some("full_attention") => Ok(None),
                        other => Err(Error::Config(format!(
                            "config.json layer_types: unsupported layer type {}",
                            quote(other.unwrap_or("(not a string)"))
                        ))),
                    })
                    .collect()
            }
            None => Ok(pattern(n_layers, window, period)),
        }
    }
}

/// Every `period`-th layer global (layer `period - 1` first), the others windowed.
pub fn pattern(n_layers: usize, window: usize, period: usize) -> Vec<Option<usize>> {
    (0..n_layers)
        .map(|i| (!(i + 1).is_multiple_of(period.max(1))).then_some(window))
        .collect()
}

/// A Hugging Face `rope_scaling` / `rope_parameters` object.
pub fn rope_scaling(v: Option<&Value>) -> Result<RopeScaling> {
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
    let list = |k: &str| -> Result<Vec<f32>> {
        o.get(k)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|x| x.as_f64().unwrap_or(f64::NAN) as f32)
                    .collect()
            })
            .ok_or_else(|| Error::Config(format!("rope scaling longrope needs {k}")))
    };
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
        // The original context and the attention factor are the family's to fill in
        // (Phi-3 keeps the former beside `rope_scaling`).
        "longrope" | "su" => RopeScaling::LongRope {
            short: list("short_factor")?,
            long: list("long_factor")?,
            original_max_position: u("original_max_position_embeddings").unwrap_or(0),
            attn_factor: o
                .get("attention_factor")
                .and_then(Value::as_f64)
                .map(|x| x as f32)
                .unwrap_or(0.0),
        },
        other => {
            return Err(Error::Config(format!(
                "unsupported rope scaling type {}",
                quote(other)
            )))
        }
    })
}

/// Splits tensors the files keep fused into the canonical parts the model reads: a fused
/// `attn_qkv` into `attn_q`/`attn_k`/`attn_v` (Phi-3), a fused gate/up (`ffn_gate_up`, or an
/// `ffn_up` of twice the MLP width with no `ffn_gate`: gate first) into `ffn_gate`/`ffn_up`.
/// Row windows into the same bytes: nothing is copied for mapped tensors.
pub fn split_fused(tensors: &mut HashMap<String, WeightTensor>, c: &ModelConfig) -> Result<()> {
    for i in 0..c.n_layers {
        let p = |s: &str| format!("blk.{i}.{s}");
        for suffix in ["weight", "bias"] {
            if let Some(t) = tensors.remove(&p(&format!("attn_qkv.{suffix}"))) {
                let (q, kv) = (c.q_dim(), c.kv_dim());
                let parts = [
                    ("attn_q", 0..q),
                    ("attn_k", q..q + kv),
                    ("attn_v", q + kv..q + 2 * kv),
                ];
                split_rows(tensors, &t, q + 2 * kv, &parts, &p, suffix)?;
            }
            let ff = c.intermediate_size;
            let fused = match tensors.remove(&p(&format!("ffn_gate_up.{suffix}"))) {
                Some(t) => Some(t),
                None if !tensors.contains_key(&p(&format!("ffn_gate.{suffix}")))
                    && tensors
                        .get(&p(&format!("ffn_up.{suffix}")))
                        .is_some_and(|t| t.shape.first() == Some(&(2 * ff))) =>
                {
                    tensors.remove(&p(&format!("ffn_up.{suffix}")))
                }
                None => None,
            };
            if let Some(t) = fused {
                let parts = [("ffn_gate", 0..ff), ("ffn_up", ff..2 * ff)];
                split_rows(tensors, &t, 2 * ff, &parts, &p, suffix)?;
            }
        }
    }
    Ok(())
}

fn split_rows(
    tensors: &mut HashMap<String, WeightTensor>,
    t: &WeightTensor,
    rows: usize,
    parts: &[(&str, std::ops::Range<usize>)],
    p: &dyn Fn(&str) -> String,
    suffix: &str,
) -> Result<()> {
    if t.shape.first() != Some(&rows) {
        return Err(Error::ShapeMismatch {
            name: t.name.clone(),
            got: t.shape.clone(),
            expected: vec![rows],
        });
    }
    for (name, range) in parts {
        let full = p(&format!("{name}.{suffix}"));
        let mut part = if t.shape.len() == 1 {
            let v = t.to_f32_vec();
            WeightTensor::from_f32(full.clone(), vec![range.len()], &v[range.clone()])
        } else {
            t.slice_rows(range.clone())?
        };
        part.name = full.clone();
        tensors.insert(full, part);
    }
    Ok(())
}

/// The Gemma-style norm shift: `shift` added to every norm weight (owned f32 copies).
pub fn shift_norms(tensors: &mut HashMap<String, WeightTensor>, shift: f32) {
    if shift == 0.0 {
        return;
    }
    for (name, t) in tensors.iter_mut() {
        if name.ends_with("norm.weight") {
            let v: Vec<f32> = t.to_f32_vec().iter().map(|x| x + shift).collect();
            *t = WeightTensor::from_f32(name.clone(), t.shape.clone(), &v);
        }
    }
}

#[cfg(test)]
mod tests;
