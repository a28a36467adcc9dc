//! What the first GPU milestone runs: the Llama-family decoder of the exact path (Llama,
//! SmolLM, Mistral, Qwen2 with its q/k/v biases), one GPU, f32 KV cache. Everything else is
//! refused up front, naming what is missing, before the driver is touched.

use tessera_formats::{Activation, ModelConfig, ModelFiles};

use crate::formats::{check_matrix, Format};
use crate::{kernels, CudaError};

fn unsupported(what: impl Into<String>) -> CudaError {
    CudaError::Unsupported { what: what.into() }
}

/// Refuses model features the GPU forward does not have yet.
pub fn check_config(c: &ModelConfig) -> Result<(), CudaError> {
    let b = &c.block;
    let missing = [
        (b.qk_norm, "per-head q/k norms (Qwen3, Gemma 3)"),
        (b.post_norms, "post-norms (Gemma)"),
        (b.activation != Activation::Silu, "GeGLU (Gemma)"),
        (
            b.windows.iter().any(Option::is_some),
            "sliding-window layers",
        ),
        (b.local_rope.is_some(), "a second RoPE for local layers"),
        (b.attn_softcap.is_some(), "attention soft-capping (Gemma 2)"),
        (b.final_softcap.is_some(), "logit soft-capping (Gemma 2)"),
    ];
    if let Some((_, what)) = missing.iter().find(|m| m.0) {
        return Err(unsupported(format!(
            "{what}: the GPU forward runs the Llama family (Llama, SmolLM, Mistral, Qwen2) so far"
        )));
    }
    if kernels::attention(c.head_dim).is_none() {
        return Err(unsupported(format!(
            "heads of {} dimensions (attention kernels exist for {:?})",
            c.head_dim,
            kernels::HEAD_DIMS
        )));
    }
    if c.n_kv_heads == 0 || !c.n_heads.is_multiple_of(c.n_kv_heads) {
        return Err(unsupported(format!(
            "{} query heads over {} KV heads",
            c.n_heads, c.n_kv_heads
        )));
    }
    if c.rope_dim > c.head_dim || !c.rope_dim.is_multiple_of(2) {
        return Err(unsupported(format!(
            "RoPE over {} of {} dimensions",
            c.rope_dim, c.head_dim
        )));
    }
    let widths = [c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size];
    if widths.iter().any(|w| w % 32 != 0 || *w > i32::MAX as usize)
        || c.vocab_size > i32::MAX as usize
    {
        return Err(unsupported(format!(
            "widths {widths:?}: the kernels need multiples of 32"
        )));
    }
    Ok(())
}

/// Every matrix the forward reads, with its GPU format: the embedding, each layer's seven
/// projections, and the output head when it is not the embedding. Errors name the tensor.
pub fn matrices(files: &ModelFiles) -> Result<Vec<(String, &'static Format)>, CudaError> {
    let c = &files.config;
    let mut names = vec!["token_embd.weight".to_string()];
    for l in 0..c.n_layers {
        for p in [
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        ] {
            names.push(format!("blk.{l}.{p}.weight"));
        }
    }
    if files.tensors.contains_key("output.weight") && !c.tie_embeddings {
        names.push("output.weight".into());
    }
    names
        .into_iter()
        .map(|n| {
            let t = files.tensor(&n).map_err(|e| unsupported(e.to_string()))?;
            Ok((n, check_matrix(t)?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-135M's shape.
    fn llama() -> ModelConfig {
        ModelConfig {
            arch: tessera_formats::Arch::Llama,
            vocab_size: 49152,
            hidden_size: 576,
            intermediate_size: 1536,
            n_layers: 30,
            n_heads: 9,
            n_kv_heads: 3,
            head_dim: 64,
            rms_eps: 1e-5,
            rope_theta: 1e5,
            rope_dim: 64,
            rope_style: tessera_formats::RopeStyle::Interleaved,
            rope_scaling: tessera_formats::RopeScaling::None,
            max_position: 8192,
            tie_embeddings: true,
            block: Default::default(),
        }
    }

    #[test]
    fn the_llama_family_passes_and_the_rest_is_named() {
        assert!(check_config(&llama()).is_ok());
        let mut c = llama();
        c.block.qk_norm = true;
        let e = check_config(&c).unwrap_err().to_string();
        assert!(e.contains("q/k norms"), "{e}");
        let mut c = llama();
        c.block.windows = vec![Some(512), None];
        assert!(check_config(&c)
            .unwrap_err()
            .to_string()
            .contains("sliding-window"));
        let mut c = llama();
        c.head_dim = 80;
        c.rope_dim = 80;
        let e = check_config(&c).unwrap_err().to_string();
        assert!(e.contains("80 dimensions"), "{e}");
        let mut c = llama();
        c.intermediate_size = 1000;
        assert!(check_config(&c)
            .unwrap_err()
            .to_string()
            .contains("multiples of 32"));
    }
}
