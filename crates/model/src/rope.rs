//! Rotary position embeddings: per-frequency inverse wavelengths (with the configured
//! scaling), applied in either pair layout.
//!
//! Frequencies follow Hugging Face's `rope_init_fn`s: `inv_freq[i] = 1 / theta^(2i/d)` in
//! f32, the angle `pos · inv_freq[i]` rounded to f32 as transformers does, its cos/sin
//! evaluated accurately.

use tessera_formats::{ModelConfig, RopeScaling, RopeStyle};

pub struct Rope {
    inv_freq: Vec<f32>,
    /// Multiplies cos and sin (YaRN's attention temperature; 1 otherwise).
    mscale: f32,
    style: RopeStyle,
    dim: usize,
}

impl Rope {
    /// The global layers' RoPE.
    pub fn new(cfg: &ModelConfig) -> Self {
        Self::with(cfg, cfg.rope_theta, &cfg.rope_scaling)
    }

    /// RoPE of base `theta` and `scaling` over the config's rotated dimensions and style.
    /// LongRoPE takes its long factors when the context (`max_position`) exceeds the
    /// original one, as llama.cpp does.
    pub fn with(cfg: &ModelConfig, theta: f32, scaling: &RopeScaling) -> Self {
        let d = cfg.rope_dim;
        let base = theta as f64;
        let mut inv_freq: Vec<f32> = (0..d / 2)
            .map(|i| (1.0 / base.powf((2 * i) as f64 / d as f64)) as f32)
            .collect();
        let mut mscale = 1.0f32;
        match scaling {
            RopeScaling::None => {}
            RopeScaling::LongRope {
                short,
                long,
                original_max_position,
                attn_factor,
            } => {
                let ext = if cfg.max_position > *original_max_position {
                    long
                } else {
                    short
                };
                inv_freq.iter_mut().zip(ext).for_each(|(f, s)| *f /= s);
                mscale = *attn_factor;
            }
            RopeScaling::Linear { factor } => inv_freq.iter_mut().for_each(|f| *f /= factor),
            RopeScaling::FreqFactors(ff) => inv_freq.iter_mut().zip(ff).for_each(|(f, s)| *f /= s),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position,
            } => {
                let old = *original_max_position as f32;
                let low_wavelen = old / low_freq_factor;
                let high_wavelen = old / high_freq_factor;
                for f in inv_freq.iter_mut() {
                    let wavelen = 2.0 * std::f32::consts::PI / *f;
                    if wavelen > low_wavelen {
                        *f /= factor;
                    } else if wavelen >= high_wavelen {
                        let smooth = (old / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        *f = (1.0 - smooth) * *f / factor + smooth * *f;
                    }
                }
            }
            RopeScaling::Yarn {
                factor,
                original_max_position,
                beta_fast,
                beta_slow,
            } => {
                let dim_for = |rot: f32| {
                    d as f32
                        * ((*original_max_position as f32) / (rot * 2.0 * std::f32::consts::PI))
                            .ln()
                        / (2.0 * base.ln() as f32)
                };
                let low = dim_for(*beta_fast).floor().max(0.0);
                let high = dim_for(*beta_slow).ceil().min(d as f32 - 1.0);
                let span = if high == low {
                    high + 0.001 - low
                } else {
                    high - low
                };
                for (i, f) in inv_freq.iter_mut().enumerate() {
                    let ramp = ((i as f32 - low) / span).clamp(0.0, 1.0);
                    let extrapolation = 1.0 - ramp;
                    *f = (*f / factor) * (1.0 - extrapolation) + *f * extrapolation;
                }
                if *factor > 1.0 {
                    mscale = 0.1 * factor.ln() + 1.0;
                }
            }
        }
        Rope {
            inv_freq,
            mscale,
            style: cfg.rope_style,
            dim: d,
        }
    }

    /// The inverse wavelength of each rotated pair (`rope_dim / 2` of them), scaling
    /// applied: what a device kernel needs to rotate as [`Rope::apply`] does.
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }
    /// The factor on cos and sin (YaRN's attention temperature; 1 otherwise).
    pub fn mscale(&self) -> f32 {
        self.mscale
    }
    pub fn style(&self) -> RopeStyle {
        self.style
    }

    /// Rotates every head of `x` (`n_heads` heads of `head_dim`) for position `pos`.
    pub fn apply(&self, x: &mut [f32], head_dim: usize, pos: usize, cs: &mut Vec<(f32, f32)>) {
        cs.clear();
        cs.extend(self.inv_freq.iter().map(|&f| {
            let angle = ((pos as f32) * f) as f64;
            (
                (angle.cos() as f32) * self.mscale,
                (angle.sin() as f32) * self.mscale,
            )
        }));
        let half = self.dim / 2;
        for head in x.chunks_exact_mut(head_dim) {
            for (i, &(c, s)) in cs.iter().enumerate() {
                let (a, b) = match self.style {
                    RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                    RopeStyle::Neox => (i, i + half),
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * c - x1 * s;
                head[b] = x1 * c + x0 * s;
            }
        }
    }
}
