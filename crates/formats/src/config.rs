//! Hyper-parameters of a Llama-family decoder, whatever file they came from.

use tessera_core::{Error, Result};

/// Decoder families Tessera runs; how each differs from Llama is described in
/// [`crate::family`] and carried by [`BlockSpec`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arch {
    /// Llama 1-3.x, SmolLM, and the files that call themselves `llama`.
    Llama,
    /// Llama with a sliding window where the config has one.
    Mistral,
    /// Llama plus biases on the q/k/v projections.
    Qwen2,
    /// Qwen2 without the biases, with RMSNorm on each head of q and k.
    Qwen3,
    Gemma2,
    Gemma3,
    /// Phi-3, 3.5 and 4-mini: fused q/k/v and gate/up in the files, LongRoPE.
    Phi3,
}

/// The activation of the gated MLP: `down(act(gate) * up)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU: `silu(x) = x / (1 + e^-x)`.
    Silu,
    /// GeGLU with the tanh approximation of GELU (PyTorch's `gelu(approximate="tanh")`).
    GeluTanh,
}

/// How a family's decoder block departs from Llama's; `Default` is Llama's block.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockSpec {
    pub activation: Activation,
    /// RMSNorm over each head of q and of k (weights `attn_q_norm`/`attn_k_norm`, one
    /// head wide), before RoPE.
    pub qk_norm: bool,
    /// RMSNorm on the attention and MLP outputs before the residual add
    /// (`post_attention_norm`, `post_ffw_norm`).
    pub post_norms: bool,
    /// Multiplies the embedding rows (Gemma: √hidden).
    pub embed_scale: f32,
    /// Multiplies attention scores; `None`: 1/√head_dim.
    pub attn_scale: Option<f32>,
    /// Scores become `c · tanh(score / c)` (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// Logits become `c · tanh(logit / c)` (Gemma 2).
    pub final_softcap: Option<f32>,
    /// Per layer, the window of a local layer: position `p` attends keys
    /// `p - w + 1 ..= p`. Empty: every layer attends all earlier keys.
    pub windows: Vec<Option<usize>>,
    /// The RoPE base and scaling of the windowed layers, where it differs from the global
    /// layers' (Gemma 3: base 10 000, unscaled).
    pub local_rope: Option<(f32, RopeScaling)>,
}

impl Default for BlockSpec {
    fn default() -> Self {
        BlockSpec {
            activation: Activation::Silu,
            qk_norm: false,
            post_norms: false,
            embed_scale: 1.0,
            attn_scale: None,
            attn_softcap: None,
            final_softcap: None,
            windows: Vec::new(),
            local_rope: None,
        }
    }
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
    /// Phi-3's LongRoPE: per-frequency divisors `short` while the context fits the original
    /// one, `long` beyond it (chosen once, by the engine's context length, as llama.cpp
    /// does), and cos/sin multiplied by `attn_factor`.
    LongRope {
        short: Vec<f32>,
        long: Vec<f32>,
        original_max_position: usize,
        attn_factor: f32,
    },
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
    /// Where the block departs from Llama's.
    pub block: BlockSpec,
}

impl ModelConfig {
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Layer `layer`'s attention window (`None`: global).
    pub fn window(&self, layer: usize) -> Option<usize> {
        self.block.windows.get(layer).copied().flatten()
    }

    /// What attention scores are multiplied by.
    pub fn attn_scale(&self) -> f32 {
        self.block
            .attn_scale
            .unwrap_or(1.0 / (self.head_dim as f32).sqrt())
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
        let half = self.rope_dim / 2;
        let factors = |name: &str, f: &[f32]| -> Result<()> {
            if f.len() != half {
                return bad(format!("{name} has {} entries, expected {half}", f.len()));
            }
            if !f.iter().all(|x| x.is_finite() && *x > 0.0) {
                return bad(format!("{name} holds a factor that is not positive"));
            }
            Ok(())
        };
        match &self.rope_scaling {
            RopeScaling::FreqFactors(f) => factors("rope_freqs", f)?,
            RopeScaling::LongRope { short, long, .. } => {
                factors("rope short factors", short)?;
                factors("rope long factors", long)?;
            }
            _ => {}
        }
        let b = &self.block;
        if !b.windows.is_empty() && b.windows.len() != self.n_layers {
            return bad(format!(
                "{} attention windows for {} layers",
                b.windows.len(),
                self.n_layers
            ));
        }
        if b.windows.iter().flatten().any(|&w| w == 0) {
            return bad("an attention window of 0 tokens".into());
        }
        let positive = |name: &str, v: Option<f32>| match v {
            Some(x) if !(x.is_finite() && x > 0.0) => {
                bad(format!("{name} {x} is not a positive number"))
            }
            _ => Ok(()),
        };
        positive("attention scale", b.attn_scale)?;
        positive("attention soft-cap", b.attn_softcap)?;
        positive("final logit soft-cap", b.final_softcap)?;
        positive("embedding scale", Some(b.embed_scale))?;
        if let Some((theta, _)) = &b.local_rope {
            positive("local rope base", Some(*theta))?;
        }
        Ok(())
    }
}
