//! The decoder every family runs: pre-norm blocks of grouped-query attention with RoPE and
//! a gated MLP, RMSNorm, tied or separate output embedding; and where the config's
//! [`tessera_formats::BlockSpec`] says so, q/k/v biases (Qwen2), per-head q/k norms (Qwen3,
//! Gemma 3), post-norms and GeGLU (Gemma), sliding-window layers with their own RoPE, and
//! soft-capping (Gemma 2). Activations are f32. This module builds the model from its
//! files; the forward, as layer stages over a prepared batch, is in [`crate::stages`].

use tessera_core::{Error, Result, WeightTensor};
use tessera_formats::{ModelConfig, ModelFiles};
use tessera_kernels::plan::Precision;

use tessera_lora::Target;

use crate::adapted::AdaptedLinear;
use crate::kv::{KvDtype, KvStorage};
use crate::linear::{DenseLinear, Linear};
use crate::rope::Rope;

pub(crate) struct Layer {
    pub(crate) attn_norm: Vec<f32>,
    pub(crate) ffn_norm: Vec<f32>,
    /// Per-head RMSNorm weights of q and k (one head wide), where the family has them.
    pub(crate) qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    /// Norms of the attention and MLP outputs before the residual add (Gemma).
    pub(crate) post_norms: Option<(Vec<f32>, Vec<f32>)>,
    /// q, k and v projections stacked: one product per layer instead of three.
    pub(crate) qkv: Box<dyn Linear>,
    pub(crate) o: Box<dyn Linear>,
    /// gate and up projections stacked.
    pub(crate) gate_up: Box<dyn Linear>,
    pub(crate) down: Box<dyn Linear>,
}

pub struct LlamaModel {
    pub config: ModelConfig,
    pub(crate) embed: WeightTensor,
    pub(crate) layers: Vec<Layer>,
    pub(crate) norm: Vec<f32>,
    pub(crate) output: Box<dyn Linear>,
    pub(crate) rope: Rope,
    /// The windowed layers' RoPE, where it differs from the global layers' (Gemma 3).
    pub(crate) local_rope: Option<Rope>,
    /// The vocabulary rows this model holds (all of them, or a tensor-parallel rank's share):
    /// its embedding rows and its output head's logits.
    pub vocab: std::ops::Range<usize>,
}

fn vector(files: &ModelFiles, name: &str, len: usize) -> Result<Vec<f32>> {
    let t = files.tensor(name)?;
    if t.numel() != len {
        return Err(Error::ShapeMismatch {
            name: name.into(),
            got: t.shape.clone(),
            expected: vec![len],
        });
    }
    Ok(t.to_f32_vec())
}

fn linear(
    files: &ModelFiles,
    name: &str,
    out: usize,
    inp: usize,
    repack: bool,
) -> Result<Box<dyn Linear>> {
    Ok(Box::new(dense(files, &[(name, out)], inp, repack)?))
}

/// Projections of one input fused into one product; every part must exist with the
/// expected shape.
fn dense(
    files: &ModelFiles,
    parts: &[(&str, usize)],
    inp: usize,
    repack: bool,
) -> Result<DenseLinear> {
    let mut v = Vec::with_capacity(parts.len());
    for &(name, out) in parts {
        let w = files.tensor(&format!("{name}.weight"))?.clone();
        v.push((w, files.tensors.get(&format!("{name}.bias")), out));
    }
    DenseLinear::stacked(v, inp, repack)
}

/// Layer `layer`'s projections `parts` (each with the adapter target it answers to), fused
/// into one product that also applies the step's LoRA deltas.
fn adapted(
    files: &ModelFiles,
    layer: usize,
    parts: &[(Target, usize)],
    inp: usize,
    repack: bool,
) -> Result<Box<dyn Linear>> {
    let names: Vec<(String, usize)> = parts
        .iter()
        .map(|&(t, out)| (format!("blk.{layer}.{}", t.gguf_name()), out))
        .collect();
    let named: Vec<(&str, usize)> = names.iter().map(|(n, o)| (n.as_str(), *o)).collect();
    let base = dense(files, &named, inp, repack)?;
    let targets = parts.iter().map(|p| p.0).collect();
    Ok(Box::new(AdaptedLinear::new(
        Box::new(base),
        layer,
        targets,
    )?))
}

impl LlamaModel {
    /// Builds the model from loaded files, checking every tensor's presence and shape.
    /// Block-quantized weights are also repacked (once, here) when the precision's kernels
    /// read the repack: always for `Precision::Fast` (the integer-dot kernels), and for
    /// `Precision::Exact` wherever AVX2 runs (its stream kernels read the repack, and its
    /// packed kernel dequantizes panels from it; `tessera_kernels::wants_repack`).
    pub fn new(files: &ModelFiles, precision: Precision) -> Result<Self> {
        Self::new_shard(files, precision, 0..files.config.vocab_size)
    }

    /// A model holding only the vocabulary rows `vocab` of its embedding and output head
    /// (a tensor-parallel rank's files, see [`crate::shard`]).
    pub fn new_shard(
        files: &ModelFiles,
        precision: Precision,
        vocab: std::ops::Range<usize>,
    ) -> Result<Self> {
        let rp = tessera_kernels::wants_repack(precision);
        let c = files.config.clone();
        let (h, q, kv, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        let nv = vocab.len();
        let embed = files.tensor("token_embd.weight")?.clone();
        if embed.shape != [nv, h] || vocab.end > c.vocab_size {
            return Err(Error::ShapeMismatch {
                name: embed.name.clone(),
                got: embed.shape.clone(),
                expected: vec![nv, h],
            });
        }
        let mut layers = Vec::with_capacity(c.n_layers);
        for i in 0..c.n_layers {
            let p = |s: &str| format!("blk.{i}.{s}");
            let qk_norm = match c.block.qk_norm {
                true => Some((
                    vector(files, &p("attn_q_norm.weight"), c.head_dim)?,
                    vector(files, &p("attn_k_norm.weight"), c.head_dim)?,
                )),
                false => None,
            };
            let post_norms = match c.block.post_norms {
                true => Some((
                    vector(files, &p("post_attention_norm.weight"), h)?,
                    vector(files, &p("post_ffw_norm.weight"), h)?,
                )),
                false => None,
            };
            layers.push(Layer {
                attn_norm: vector(files, &p("attn_norm.weight"), h)?,
                ffn_norm: vector(files, &p("ffn_norm.weight"), h)?,
                qk_norm,
                post_norms,
                qkv: adapted(
                    files,
                    i,
                    &[(Target::Q, q), (Target::K, kv), (Target::V, kv)],
                    h,
                    rp,
                )?,
                o: adapted(files, i, &[(Target::O, h)], q, rp)?,
                gate_up: adapted(files, i, &[(Target::Gate, ff), (Target::Up, ff)], h, rp)?,
                down: adapted(files, i, &[(Target::Down, h)], ff, rp)?,
            });
        }
        let output: Box<dyn Linear> =
            if files.tensors.contains_key("output.weight") && !c.tie_embeddings {
                linear(files, "output", nv, h, rp)?
            } else {
                Box::new(DenseLinear::new(embed.clone(), None, nv, h, rp)?)
            };
        Ok(LlamaModel {
            rope: Rope::new(&c),
            local_rope: c
                .block
                .local_rope
                .as_ref()
                .map(|(theta, scaling)| Rope::with(&c, *theta, scaling)),
            norm: vector(files, "output_norm.weight", h)?,
            config: c,
            embed,
            layers,
            output,
            vocab,
        })
    }

    /// An f32 KV storage shaped for this model.
    pub fn new_kv_storage(&self, block_size: usize, num_blocks: usize) -> Result<KvStorage> {
        self.new_kv_storage_of(block_size, num_blocks, KvDtype::F32)
    }

    /// A KV storage of `dtype` values shaped for this model.
    pub fn new_kv_storage_of(
        &self,
        block_size: usize,
        num_blocks: usize,
        dtype: KvDtype,
    ) -> Result<KvStorage> {
        KvStorage::with_dtype(
            self.config.n_layers,
            self.config.kv_dim(),
            block_size,
            num_blocks,
            dtype,
        )
    }

    /// The largest window of this model's windowed layers, if it has any.
    pub fn window(&self) -> Option<usize> {
        self.config.block.windows.iter().flatten().copied().max()
    }

    /// [`LlamaModel::new_kv_storage_of`] with the windowed layers kept apart in
    /// `window_blocks` blocks (addressed by the sequences' window tables); a model without
    /// windowed layers gets the plain storage.
    pub fn new_kv_storage_windowed(
        &self,
        block_size: usize,
        num_blocks: usize,
        window_blocks: usize,
        dtype: KvDtype,
    ) -> Result<KvStorage> {
        let Some(window) = self.window() else {
            return self.new_kv_storage_of(block_size, num_blocks, dtype);
        };
        let layers: Vec<bool> = (0..self.config.n_layers)
            .map(|l| self.config.window(l).is_some())
            .collect();
        KvStorage::with_window_group(
            self.config.n_layers,
            self.config.kv_dim(),
            block_size,
            num_blocks,
            &layers,
            window_blocks,
            window,
            dtype,
        )
    }
}
