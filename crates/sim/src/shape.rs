//! Model shapes the step-time model needs: presets for models this machine cannot hold, any
//! Hugging Face `config.json`, or a loaded model's configuration.

use serde_json::Value;
use tessera_formats::ModelConfig;

#[derive(Debug, Clone, PartialEq)]
pub struct ModelShape {
    pub name: String,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
}

impl ModelShape {
    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// `llama-2-70b` or `llama-3-8b` (their published configurations).
    pub fn preset(name: &str) -> Option<ModelShape> {
        let shape = |name: &str, hidden, intermediate, layers, heads, kv_heads, vocab| ModelShape {
            name: name.to_string(),
            hidden,
            intermediate,
            layers,
            heads,
            kv_heads,
            head_dim: hidden / heads,
            vocab,
        };
        match name.to_ascii_lowercase().as_str() {
            "llama-2-70b" => Some(shape("Llama-2-70B", 8192, 28672, 80, 64, 8, 32000)),
            "llama-3-8b" => Some(shape("Llama-3-8B", 4096, 14336, 32, 32, 8, 128256)),
            _ => None,
        }
    }

    /// From a Hugging Face `config.json`'s text.
    pub fn from_config_json(name: &str, text: &str) -> Result<ModelShape, String> {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("config.json: {e}"))?;
        let get = |k: &str| -> Result<usize, String> {
            v.get(k)
                .and_then(Value::as_u64)
                .filter(|&x| x > 0 && x < (1 << 32))
                .map(|x| x as usize)
                .ok_or_else(|| format!("config.json: `{k}` is missing or not a positive integer"))
        };
        let hidden = get("hidden_size")?;
        let heads = get("num_attention_heads")?;
        let head_dim = match v.get("head_dim") {
            Some(Value::Null) | None => hidden / heads,
            Some(_) => get("head_dim")?,
        };
        Ok(ModelShape {
            name: name.to_string(),
            hidden,
            intermediate: get("intermediate_size")?,
            layers: get("num_hidden_layers")?,
            heads,
            kv_heads: if v.get("num_key_value_heads").is_some() {
                get("num_key_value_heads")?
            } else {
                heads
            },
            head_dim,
            vocab: get("vocab_size")?,
        })
    }

    pub fn from_model(name: &str, c: &ModelConfig) -> ModelShape {
        ModelShape {
            name: name.to_string(),
            hidden: c.hidden_size,
            intermediate: c.intermediate_size,
            layers: c.n_layers,
            heads: c.n_heads,
            kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            vocab: c.vocab_size,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_json_gives_the_preset_shape() {
        let text = r#"{"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
            "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 32000,
            "head_dim": null}"#;
        let s = ModelShape::from_config_json("Llama-2-70B", text).unwrap();
        assert_eq!(s, ModelShape::preset("llama-2-70b").unwrap());
    }

    #[test]
    fn bad_config_json_names_the_field() {
        let e = ModelShape::from_config_json("x", r#"{"hidden_size": -1}"#).unwrap_err();
        assert!(e.contains("hidden_size"), "{e}");
        assert!(ModelShape::from_config_json("x", "not json").is_err());
    }
}
