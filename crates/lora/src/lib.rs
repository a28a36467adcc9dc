//! LoRA adapters as plain data, owned outside the model: per layer and target module, the
//! low-rank factors `A` (`rank × in`) and `Bᵀ` (`rank × out`, stored transposed so that the
//! expand step reads contiguous rows) and the scale `alpha / rank` (`alpha / √rank` with
//! rsLoRA). Loaded from PEFT folders ([`peft`]) or llama.cpp GGUF LoRA files ([`gguf`]), and
//! checked against the base model's configuration: an adapter that does not fit is refused
//! with an error naming the mismatch.
//!
//! Rows of `B` for q and k are stored in the base model's order: PEFT tensors are in Hugging
//! Face layout, so on a GGUF base whose q/k rows are permuted for interleaved-pair RoPE the
//! same permutation is applied here; llama.cpp's GGUF LoRA files already carry it.

pub mod gguf;
pub mod peft;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use tessera_core::{Error, Result};
use tessera_formats::{ModelConfig, RopeStyle};

/// The seven projections of a Llama-family layer an adapter may target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Target {
    pub const ALL: [Target; 7] = [
        Target::Q,
        Target::K,
        Target::V,
        Target::O,
        Target::Gate,
        Target::Up,
        Target::Down,
    ];

    pub fn index(self) -> usize {
        self as usize
    }

    /// PEFT's (Hugging Face) module name.
    pub fn hf_name(self) -> &'static str {
        match self {
            Target::Q => "q_proj",
            Target::K => "k_proj",
            Target::V => "v_proj",
            Target::O => "o_proj",
            Target::Gate => "gate_proj",
            Target::Up => "up_proj",
            Target::Down => "down_proj",
        }
    }

    /// llama.cpp's (GGUF) tensor name stem.
    pub fn gguf_name(self) -> &'static str {
        match self {
            Target::Q => "attn_q",
            Target::K => "attn_k",
            Target::V => "attn_v",
            Target::O => "attn_output",
            Target::Gate => "ffn_gate",
            Target::Up => "ffn_up",
            Target::Down => "ffn_down",
        }
    }

    pub fn from_hf(name: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.hf_name() == name)
    }

    pub fn from_gguf(name: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.gguf_name() == name)
    }

    /// `(in, out)` features of this projection in `cfg`.
    pub fn shape(self, cfg: &ModelConfig) -> (usize, usize) {
        let (h, q, kv, ff) = (
            cfg.hidden_size,
            cfg.q_dim(),
            cfg.kv_dim(),
            cfg.intermediate_size,
        );
        match self {
            Target::Q => (h, q),
            Target::K | Target::V => (h, kv),
            Target::O => (q, h),
            Target::Gate | Target::Up => (h, ff),
            Target::Down => (ff, h),
        }
    }
}

/// One adapted projection: `delta(x) = scale · B (A x)`.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraModule {
    pub rank: usize,
    pub scale: f32,
    /// `rank × in`, row-major.
    pub a: Vec<f32>,
    /// `rank × out`, row-major (B transposed).
    pub b_t: Vec<f32>,
}

impl LoraModule {
    /// The module restricted to input features `r` (A's columns): a row-parallel shard's
    /// part, whose delta `scale · B (A[:, r] x[r])` is that rank's share of the whole.
    pub fn slice_in(&self, r: std::ops::Range<usize>) -> LoraModule {
        let inp = self.a.len() / self.rank;
        LoraModule {
            rank: self.rank,
            scale: self.scale,
            a: self
                .a
                .chunks(inp)
                .flat_map(|row| &row[r.clone()])
                .copied()
                .collect(),
            b_t: self.b_t.clone(),
        }
    }

    /// The module restricted to output features `r` (B's rows): a column-parallel shard's
    /// part.
    pub fn slice_out(&self, r: std::ops::Range<usize>) -> LoraModule {
        let out = self.b_t.len() / self.rank;
        LoraModule {
            rank: self.rank,
            scale: self.scale,
            a: self.a.clone(),
            b_t: self
                .b_t
                .chunks(out)
                .flat_map(|row| &row[r.clone()])
                .copied()
                .collect(),
        }
    }
}

/// Where an adapter came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdapterFormat {
    Peft,
    Gguf,
}

/// A loaded adapter. `id` is unique per load in this process (the prefix cache's namespace).
#[derive(Debug)]
pub struct LoraAdapter {
    pub id: u64,
    pub path: PathBuf,
    pub format: AdapterFormat,
    /// `layers[l][target.index()]`.
    layers: Vec<[Option<LoraModule>; 7]>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl LoraAdapter {
    /// Loads a PEFT folder (`adapter_config.json` + `adapter_model.safetensors`) or a
    /// llama.cpp GGUF LoRA file, checked against `base`.
    pub fn load(path: &Path, base: &ModelConfig) -> Result<Self> {
        if path.is_dir() {
            peft::load(path, base)
        } else if path.is_file() {
            gguf::load(path, base)
        } else {
            Err(Error::Io {
                path: path.to_path_buf(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or folder"),
            })
        }
    }

    /// Builds an adapter from its modules, checking every shape against `base`.
    pub fn from_modules(
        path: &Path,
        format: AdapterFormat,
        base: &ModelConfig,
        modules: Vec<(usize, Target, LoraModule)>,
    ) -> Result<Self> {
        let mut layers: Vec<[Option<LoraModule>; 7]> =
            (0..base.n_layers).map(|_| Default::default()).collect();
        if modules.is_empty() {
            return Err(Error::Config(format!(
                "adapter {} has no LoRA tensors",
                path.display()
            )));
        }
        for (layer, target, m) in modules {
            let (inp, out) = target.shape(base);
            let name = format!("layer {layer} {}", target.hf_name());
            if layer >= base.n_layers {
                return Err(Error::Config(format!(
                    "adapter targets layer {layer}; the base model has {} layers",
                    base.n_layers
                )));
            }
            if m.rank == 0 || m.a.len() != m.rank * inp || m.b_t.len() != m.rank * out {
                return Err(Error::Config(format!(
                    "adapter {name}: rank {} with {} A and {} B values does not fit the base \
                     projection {inp} -> {out}",
                    m.rank,
                    m.a.len(),
                    m.b_t.len()
                )));
            }
            if !m.scale.is_finite() || m.a.iter().chain(&m.b_t).any(|v| !v.is_finite()) {
                return Err(Error::Config(format!("adapter {name}: non-finite values")));
            }
            let slot = &mut layers[layer][target.index()];
            if slot.is_some() {
                return Err(Error::Config(format!("adapter {name}: given twice")));
            }
            *slot = Some(m);
        }
        Ok(LoraAdapter {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            path: path.to_path_buf(),
            format,
            layers,
        })
    }

    /// This adapter's part for a tensor-parallel rank whose configuration is `rank_cfg`:
    /// every module replaced by `f(layer, target, module)` (a slice of its factors), checked
    /// against `rank_cfg`, under the same id (the step's adapter table and the prefix cache
    /// name adapters by id on every rank).
    pub fn map_modules(
        &self,
        rank_cfg: &ModelConfig,
        f: impl Fn(usize, Target, &LoraModule) -> LoraModule,
    ) -> Result<Self> {
        let modules = self
            .layers
            .iter()
            .enumerate()
            .flat_map(|(l, slots)| {
                Target::ALL
                    .into_iter()
                    .filter_map(move |t| slots[t.index()].as_ref().map(|m| (l, t, m)))
            })
            .map(|(l, t, m)| (l, t, f(l, t, m)))
            .collect();
        let mut part = Self::from_modules(&self.path, self.format, rank_cfg, modules)?;
        part.id = self.id;
        Ok(part)
    }

    pub fn module(&self, layer: usize, target: Target) -> Option<&LoraModule> {
        self.layers.get(layer)?[target.index()].as_ref()
    }

    /// Targets adapted in at least one layer.
    pub fn targets(&self) -> Vec<Target> {
        Target::ALL
            .into_iter()
            .filter(|t| self.layers.iter().any(|l| l[t.index()].is_some()))
            .collect()
    }

    /// Bytes of the factors held.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .flatten()
            .map(|m| 4 * (m.a.len() + m.b_t.len()))
            .sum()
    }

    /// The largest rank of any module.
    pub fn max_rank(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .flatten()
            .map(|m| m.rank)
            .max()
            .unwrap_or(0)
    }
}

/// Whether PEFT (Hugging Face layout) q/k rows must be permuted to the base's row order.
pub fn permutes_qk(base: &ModelConfig) -> bool {
    base.rope_style == RopeStyle::Interleaved
}

/// Rows of an `[heads · d, cols]` matrix in Hugging Face ("rotate half") order, rearranged to
/// the interleaved-pair order of llama GGUF files: GGUF row `h·d + 2j + s` is HF row
/// `h·d + s·d/2 + j`.
pub fn permute_rows(values: &[f32], heads: usize, cols: usize) -> Vec<f32> {
    let rows = values.len() / cols.max(1);
    let d = rows / heads.max(1);
    let mut out = vec![0f32; values.len()];
    for h in 0..heads {
        for j in 0..d / 2 {
            for s in 0..2 {
                let dst = h * d + 2 * j + s;
                let src = h * d + s * (d / 2) + j;
                out[dst * cols..(dst + 1) * cols]
                    .copy_from_slice(&values[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

/// `m` (`rows × cols`, row-major) transposed.
pub(crate) fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; m.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = m[r * cols + c];
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_interleaves_halves() {
        // One head of d = 4 with 1 column: HF rows [0 1 2 3] -> GGUF [0 2 1 3].
        assert_eq!(permute_rows(&[0., 1., 2., 3.], 1, 1), vec![0., 2., 1., 3.]);
        let two = permute_rows(&[0., 1., 2., 3., 4., 5., 6., 7.], 2, 1);
        assert_eq!(two, vec![0., 2., 1., 3., 4., 6., 5., 7.]);
    }

    #[test]
    fn transpose_roundtrip() {
        let m: Vec<f32> = (0..6).map(|x| x as f32).collect();
        let t = transpose(&m, 2, 3);
        assert_eq!(t, vec![0., 3., 1., 4., 2., 5.]);
        assert_eq!(transpose(&t, 3, 2), m);
    }
}
