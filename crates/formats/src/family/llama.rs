//! Llama (1 to 3.x, SmolLM) and Mistral: the reference block. Llama 3's RoPE scaling comes
//! with the common keys (`rope_freqs.weight` in GGUF, `rope_scaling` in config.json).

use std::collections::HashMap;

use tessera_core::{Result, WeightTensor};

use super::{Family, GgufMeta, HfMeta};
use crate::config::{Arch, ModelConfig, RopeStyle};

pub static LLAMA: Family = Family {
    arch: Arch::Llama,
    name: "Llama",
    gguf_archs: &["llama"],
    hf_types: &["llama"],
    gguf_rope: RopeStyle::Interleaved,
    gguf: uniform_window_gguf,
    hf: uniform_window_hf,
    hf_modules: &[],
    hf_norm_shift: 0.0,
    chat_template: None,
    stop_tokens: &["<|eot_id|>", "<|eom_id|>"],
};

pub static MISTRAL: Family = Family {
    arch: Arch::Mistral,
    name: "Mistral",
    gguf_archs: &["mistral"],
    hf_types: &["mistral"],
    gguf_rope: RopeStyle::Interleaved,
    gguf: uniform_window_gguf,
    hf: uniform_window_hf,
    hf_modules: &[],
    hf_norm_shift: 0.0,
    chat_template: None,
    stop_tokens: &[],
};

/// One window on every layer where the file gives one (`{arch}.attention.sliding_window`).
pub(super) fn uniform_window_gguf(
    m: &GgufMeta,
    _: &HashMap<String, WeightTensor>,
    c: &mut ModelConfig,
) -> Result<()> {
    if let Some(w) = m.usize("attention.sliding_window")?.filter(|&w| w > 0) {
        c.block.windows = vec![Some(w); c.n_layers];
    }
    Ok(())
}

/// `sliding_window` on every layer where config.json sets one (Mistral 7B v0.1, Phi-3).
pub(super) fn uniform_window_hf(m: &HfMeta, c: &mut ModelConfig) -> Result<()> {
    if m.get("use_sliding_window").and_then(|v| v.as_bool()) == Some(false) {
        return Ok(());
    }
    if let Some(w) = m.usize("sliding_window")?.filter(|&w| w > 0) {
        c.block.windows = if m.get("layer_types").is_some() {
            m.windows(c.n_layers, w, 1)?
        } else {
            vec![Some(w); c.n_layers]
        };
    }
    Ok(())
}
