//! Qwen2 (q/k/v biases) and Qwen3 (no biases; RMSNorm on each head of q and k).

use std::collections::HashMap;

use tessera_core::{Result, WeightTensor};

use super::{Family, GgufMeta, HfMeta};
use crate::config::{Arch, ModelConfig, RopeStyle};

pub static QWEN2: Family = Family {
    arch: Arch::Qwen2,
    name: "Qwen2",
    gguf_archs: &["qwen2"],
    hf_types: &["qwen2"],
    gguf_rope: RopeStyle::Neox,
    gguf: no_keys,
    hf: qwen_window,
    hf_modules: &[],
    hf_norm_shift: 0.0,
    chat_template: None,
    stop_tokens: &["<|im_end|>"],
};

pub static QWEN3: Family = Family {
    arch: Arch::Qwen3,
    name: "Qwen3",
    gguf_archs: &["qwen3"],
    hf_types: &["qwen3"],
    gguf_rope: RopeStyle::Neox,
    gguf: qwen3_gguf,
    hf: qwen3_hf,
    hf_modules: &[],
    hf_norm_shift: 0.0,
    chat_template: None,
    stop_tokens: &["<|im_end|>"],
};

fn no_keys(_: &GgufMeta, _: &HashMap<String, WeightTensor>, _: &mut ModelConfig) -> Result<()> {
    Ok(())
}

/// Qwen's window applies only with `use_sliding_window`, from layer `max_window_layers` on
/// (the released models leave it off).
fn qwen_window(m: &HfMeta, c: &mut ModelConfig) -> Result<()> {
    if m.get("use_sliding_window").and_then(|v| v.as_bool()) != Some(true) {
        return Ok(());
    }
    let Some(w) = m.usize("sliding_window")?.filter(|&w| w > 0) else {
        return Ok(());
    };
    if m.get("layer_types").is_some() {
        c.block.windows = m.windows(c.n_layers, w, 1)?;
    } else {
        let first = m.usize("max_window_layers")?.unwrap_or(0);
        c.block.windows = (0..c.n_layers).map(|i| (i >= first).then_some(w)).collect();
    }
    Ok(())
}

fn qwen3_gguf(_: &GgufMeta, _: &HashMap<String, WeightTensor>, c: &mut ModelConfig) -> Result<()> {
    c.block.qk_norm = true;
    Ok(())
}

fn qwen3_hf(m: &HfMeta, c: &mut ModelConfig) -> Result<()> {
    c.block.qk_norm = true;
    qwen_window(m, c)
}
