//! Hyper-parameters of a Llama-family decoder, whatever file they came from.

use tessera_core::{Error, Result};

/// Decoder families Tessera runs. Llama covers Llama 2/3, SmolLM and Mistral (same graph).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    /// Llama plus biases on the q/k/v projections.
    Qwen2,
}

/// Which pairs of a head's dimensions RoPE rotates together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs (2i, 2i+1). llama-architecture GGUF files store q/k rows permuted for this
    /// (llama.cpp's convention).
    Interleaved,
    /// Pairs (i, i + d/2), "rotate half" (Hugging Face, GPT-NeoX, and qwen2 GGUF files).
    Neox,
}

/// How RoPE frequencies are stretched for long contexts.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor`.
    Linear {
        factor: f32,
    },
    /// Llama 3.x: per-frequency interpolation between low and high wavelengths.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position: usize,
    },
    /// YaRN (Peng et al. 2023), with its attention temperature `mscale`.
    Yarn {
        factor: f32,
        original_max_position: usize,
        beta_fast: f32,
        beta_slow: f32,
    },
    /// Explicit per-frequency divisors (GGUF `rope_freqs.weight`, how Llama 3 files carry it).
    FreqFactors(Vec<f32>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub rms_eps: f32,
    pub rope_theta: f32,
    /// Leading dimensions of each head that RoPE rotates (usually all of them).
    pub rope_dim: usize,
    pub rope_style: RopeStyle,
    pub rope_scaling: RopeScaling,
    pub max_position: usize,
    pub tie_embeddings: bool,
}

impl ModelConfig {
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Checks the numbers are usable together; errors name the field.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(m));
        let sane = |name: &str, v: usize, max: usize| -> Result<()> {
            if v == 0 || v > max {
                return Err(Error::Config(format!(
                    "{name} = {v} is out of range 1..={max}"
                )));
            }
            Ok(())
        };
        sane("vocab_size", self.vocab_size, 1 << 22)?;
        sane("hidden_size", self.hidden_size, 1 << 17)?;
        sane("intermediate_size", self.intermediate_size, 1 << 19)?;
        sane("n_layers", self.n_layers, 1024)?;
        sane("n_heads", self.n_heads, 1024)?;
        sane("n_kv_heads", self.n_kv_heads, 1024)?;
        sane("head_dim", self.head_dim, 1024)?;
        sane("max_position", self.max_position, 1 << 24)?;
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad(format!(
                "n_heads {} is not a multiple of n_kv_heads {}",
                self.n_heads, self.n_kv_heads
            ));
        }
        if self.rope_dim == 0 || self.rope_dim > self.head_dim || !self.rope_dim.is_multiple_of(2) {
            return bad(format!(
                "rope dimension {} must be even and at most head_dim {}",
                self.rope_dim, self.head_dim
            ));
        }
        if !(self.rms_eps > 0.0 && self.rms_eps < 1.0) {
            return bad(format!("rms_norm_eps {} is out of range", self.rms_eps));
        }
        if !(self.rope_theta > 0.0 && self.rope_theta.is_finite()) {
            return bad(format!("rope_theta {} is out of range", self.rope_theta));
        }
        if let RopeScaling::FreqFactors(f) = &self.rope_scaling {
            if f.len() != self.rope_dim / 2 {
                return bad(format!(
                    "rope_freqs has {} entries, expected {}",
                    f.len(),
                    self.rope_dim / 2
                ));
            }
        }
        Ok(())
    }
}
