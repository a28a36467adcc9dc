//! Phi-3, 3.5 and 4-mini: q/k/v and gate/up fused in the files (split into the canonical
//! parts at load, see [`super::split_fused`]), partial rotary dimensions (Phi-4-mini), a
//! sliding window where the config has one, and LongRoPE: short and long per-frequency
//! factors with an attention factor on cos/sin.

use std::collections::HashMap;

use tessera_core::{Result, WeightTensor};

use super::llama::{uniform_window_gguf, uniform_window_hf};
use super::{Family, GgufMeta, HfMeta};
use crate::config::{Arch, ModelConfig, RopeScaling, RopeStyle};

pub static PHI3: Family = Family {
    arch: Arch::Phi3,
    name: "Phi-3",
    gguf_archs: &["phi3"],
    hf_types: &["phi3"],
    gguf_rope: RopeStyle::Neox,
    gguf: phi3_gguf,
    hf: phi3_hf,
    hf_modules: &[
        ("self_attn.qkv_proj", "attn_qkv"),
        ("mlp.gate_up_proj", "ffn_gate_up"),
    ],
    hf_norm_shift: 0.0,
    chat_template: None,
    stop_tokens: &["<|end|>"],
};

/// LongRoPE's attention factor when the file gives none: `√(1 + ln s / ln L)` for the
/// context stretch `s = max / L` over the original context `L` (1 when not stretched).
fn default_attn_factor(max_position: usize, original: usize) -> f32 {
    let s = max_position as f64 / original.max(1) as f64;
    if s <= 1.0 {
        1.0
    } else {
        (1.0 + s.ln() / (original as f64).ln()).sqrt() as f32
    }
}

fn phi3_gguf(m: &GgufMeta, t: &HashMap<String, WeightTensor>, c: &mut ModelConfig) -> Result<()> {
    uniform_window_gguf(m, t, c)?;
    if let (Some(long), Some(short)) = (
        t.get("rope_factors_long.weight"),
        t.get("rope_factors_short.weight"),
    ) {
        let original = m
            .usize("rope.scaling.original_context_length")?
            .unwrap_or(c.max_position);
        let attn_factor = match m.f32("rope.scaling.attn_factor")? {
            Some(f) => f,
            None => default_attn_factor(c.max_position, original),
        };
        c.rope_scaling = RopeScaling::LongRope {
            short: short.to_f32_vec(),
            long: long.to_f32_vec(),
            original_max_position: original,
            attn_factor,
        };
    }
    Ok(())
}

fn phi3_hf(m: &HfMeta, c: &mut ModelConfig) -> Result<()> {
    uniform_window_hf(m, c)?;
    if let RopeScaling::LongRope {
        original_max_position,
        attn_factor,
        ..
    } = &mut c.rope_scaling
    {
        if *original_max_position == 0 {
            *original_max_position = m
                .usize("original_max_position_embeddings")?
                .unwrap_or(c.max_position);
        }
        if *attn_factor == 0.0 {
            *attn_factor = default_attn_factor(c.max_position, *original_max_position);
        }
    }
    Ok(())
}
