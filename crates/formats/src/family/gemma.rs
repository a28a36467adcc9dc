//! Gemma 2 and Gemma 3: `(1 + w)` RMSNorms (stored as `1 + w` in GGUF) before and after
//! attention and the MLP, GeGLU with tanh GELU, the embedding scaled by √hidden, local
//! (sliding-window) layers between global ones. Gemma 2 soft-caps attention scores and
//! logits; Gemma 3 normalizes each head of q and k instead, and gives its local layers
//! their own RoPE base.

use std::collections::HashMap;

use tessera_core::{Error, Result, WeightTensor};

use super::{pattern, Family, GgufMeta, HfMeta};
use crate::config::{Activation, Arch, ModelConfig, RopeScaling, RopeStyle};

/// Gemma's Hugging Face module names (its `post_attention_layernorm` is a post-norm, not
/// Llama's pre-MLP norm).
const MODULES: &[(&str, &str)] = &[
    ("post_attention_layernorm", "post_attention_norm"),
    ("pre_feedforward_layernorm", "ffn_norm"),
    ("post_feedforward_layernorm", "post_ffw_norm"),
];

/// Gemma's chat format, for files that carry no template (the Gemma 3 270M GGUF): a
/// system message joins the first user turn, `assistant` is `model`.
pub const CHAT_TEMPLATE: &str = include_str!("templates/gemma.jinja");

pub static GEMMA2: Family = Family {
    arch: Arch::Gemma2,
    name: "Gemma 2",
    gguf_archs: &["gemma2"],
    hf_types: &["gemma2"],
    gguf_rope: RopeStyle::Neox,
    gguf: gemma2_gguf,
    hf: gemma2_hf,
    hf_modules: MODULES,
    hf_norm_shift: 1.0,
    chat_template: Some(CHAT_TEMPLATE),
    stop_tokens: &["<end_of_turn>"],
};

pub static GEMMA3: Family = Family {
    arch: Arch::Gemma3,
    name: "Gemma 3",
    gguf_archs: &["gemma3"],
    hf_types: &["gemma3_text", "gemma3"],
    gguf_rope: RopeStyle::Neox,
    gguf: gemma3_gguf,
    hf: gemma3_hf,
    hf_modules: MODULES,
    hf_norm_shift: 1.0,
    chat_template: Some(CHAT_TEMPLATE),
    stop_tokens: &["<end_of_turn>"],
};

/// What both generations share.
fn common(c: &mut ModelConfig) {
    c.block.activation = Activation::GeluTanh;
    c.block.post_norms = true;
    c.block.embed_scale = (c.hidden_size as f32).sqrt();
}

/// GGUF files carry no query scale: llama.cpp scales by 1/√head_dim, except for the 27B
/// models (`layers_27b` layers), whose `query_pre_attn_scalar` is hidden / heads.
fn gguf_attn_scale(c: &mut ModelConfig, layers_27b: usize) {
    if c.n_layers == layers_27b {
        c.block.attn_scale = Some(1.0 / ((c.hidden_size / c.n_heads) as f32).sqrt());
    }
}

fn window_gguf(m: &GgufMeta, c: &ModelConfig, period: usize) -> Result<Vec<Option<usize>>> {
    let w = m.usize("attention.sliding_window")?.ok_or_else(|| {
        Error::Config(format!(
            "GGUF metadata {}.attention.sliding_window: missing",
            m.arch
        ))
    })?;
    Ok(pattern(c.n_layers, w, period))
}

fn hf_common(m: &HfMeta, c: &mut ModelConfig, period: usize) -> Result<()> {
    common(c);
    if let Some(s) = m.f32("query_pre_attn_scalar")? {
        c.block.attn_scale = Some(1.0 / s.sqrt());
    }
    c.block.attn_softcap = m.f32("attn_logit_softcapping")?;
    c.block.final_softcap = m.f32("final_logit_softcapping")?;
    if let Some(w) = m.usize("sliding_window")? {
        let period = m.usize("sliding_window_pattern")?.unwrap_or(period);
        c.block.windows = m.windows(c.n_layers, w, period)?;
    }
    match m.str("hidden_activation").or(m.str("hidden_act")) {
        None | Some("gelu_pytorch_tanh") | Some("gelu_tanh") => Ok(()),
        Some(other) => Err(Error::Config(format!(
            "Gemma with activation {} is not supported (expected gelu_pytorch_tanh)",
            tessera_core::untrusted::quote(other)
        ))),
    }
}

fn gemma2_gguf(m: &GgufMeta, _: &HashMap<String, WeightTensor>, c: &mut ModelConfig) -> Result<()> {
    common(c);
    gguf_attn_scale(c, 46);
    c.block.attn_softcap = m.f32("attn_logit_softcapping")?;
    c.block.final_softcap = m.f32("final_logit_softcapping")?;
    c.block.windows = window_gguf(m, c, 2)?;
    Ok(())
}

fn gemma2_hf(m: &HfMeta, c: &mut ModelConfig) -> Result<()> {
    hf_common(m, c, 2)
}

/// Gemma 3's local layers use base 10 000, unscaled (llama.cpp's fixed values; the GGUF
/// does not carry them).
const LOCAL_BASE: f32 = 10_000.0;

fn gemma3_gguf(m: &GgufMeta, _: &HashMap<String, WeightTensor>, c: &mut ModelConfig) -> Result<()> {
    common(c);
    gguf_attn_scale(c, 62);
    c.block.qk_norm = true;
    c.block.windows = window_gguf(m, c, 6)?;
    c.block.local_rope = Some((LOCAL_BASE, RopeScaling::None));
    Ok(())
}

fn gemma3_hf(m: &HfMeta, c: &mut ModelConfig) -> Result<()> {
    hf_common(m, c, 6)?;
    c.block.qk_norm = true;
    let (theta, scaling) = m.rope("full_attention")?;
    if let Some(t) = theta {
        c.rope_theta = t;
    }
    c.rope_scaling = scaling;
    let local = if m.get("rope_parameters").is_some() {
        let (t, s) = m.rope("sliding_attention")?;
        (t.unwrap_or(LOCAL_BASE), s)
    } else {
        (
            m.f32("rope_local_base_freq")?.unwrap_or(LOCAL_BASE),
            RopeScaling::None,
        )
    };
    c.block.local_rope = Some(local);
    Ok(())
}
