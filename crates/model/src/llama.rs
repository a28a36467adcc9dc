//! The Llama-family decoder: pre-norm blocks of grouped-query attention with RoPE and a
//! SwiGLU MLP, RMSNorm, optional q/k/v biases (Qwen2), tied or separate output embedding.
//! Activations are f32.

use tessera_core::{Error, Result, WeightTensor};
use tessera_formats::{ModelConfig, ModelFiles};
use tessera_kernels::ops;
use tessera_kernels::plan::Precision;
use tessera_runtime::{split_range, DisjointMut};

use crate::attention::{attention, AttnShape};
use crate::batch::{BatchMeta, Logits, LogitsFor};
use crate::kv::KvStorage;
use crate::linear::{DenseLinear, ExecCtx, Linear};
use crate::rope::Rope;

struct Layer {
    attn_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    /// q, k and v projections stacked: one product per layer instead of three.
    qkv: Box<dyn Linear>,
    o: Box<dyn Linear>,
    /// gate and up projections stacked.
    gate_up: Box<dyn Linear>,
    down: Box<dyn Linear>,
}

pub struct LlamaModel {
    pub config: ModelConfig,
    embed: WeightTensor,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    output: Box<dyn Linear>,
    rope: Rope,
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
    stacked(files, &[(name, out)], inp, repack)
}

/// Projections of one input fused into one product; every part must exist with the
/// expected shape.
fn stacked(
    files: &ModelFiles,
    parts: &[(&str, usize)],
    inp: usize,
    repack: bool,
) -> Result<Box<dyn Linear>> {
    let mut v = Vec::with_capacity(parts.len());
    for &(name, out) in parts {
        let w = files.tensor(&format!("{name}.weight"))?.clone();
        v.push((w, files.tensors.get(&format!("{name}.bias")), out));
    }
    Ok(Box::new(DenseLinear::stacked(v, inp, repack)?))
}

impl LlamaModel {
    /// Builds the model from loaded files, checking every tensor's presence and shape.
    /// With `Precision::Fast`, block-quantized weights are also repacked for the
    /// integer-dot kernels (once, here).
    pub fn new(files: &ModelFiles, precision: Precision) -> Result<Self> {
        let rp = precision == Precision::Fast;
        let c = files.config.clone();
        let (h, q, kv, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        let embed = files.tensor("token_embd.weight")?.clone();
        if embed.shape != [c.vocab_size, h] {
            return Err(Error::ShapeMismatch {
                name: embed.name.clone(),
                got: embed.shape.clone(),
                expected: vec![c.vocab_size, h],
            });
        }
        let mut layers = Vec::with_capacity(c.n_layers);
        for i in 0..c.n_layers {
            let p = |s: &str| format!("blk.{i}.{s}");
            layers.push(Layer {
                attn_norm: vector(files, &p("attn_norm.weight"), h)?,
                ffn_norm: vector(files, &p("ffn_norm.weight"), h)?,
                qkv: stacked(
                    files,
                    &[(&p("attn_q"), q), (&p("attn_k"), kv), (&p("attn_v"), kv)],
                    h,
                    rp,
                )?,
                o: linear(files, &p("attn_output"), h, q, rp)?,
                gate_up: stacked(files, &[(&p("ffn_gate"), ff), (&p("ffn_up"), ff)], h, rp)?,
                down: linear(files, &p("ffn_down"), h, ff, rp)?,
            });
        }
        let output: Box<dyn Linear> =
            if files.tensors.contains_key("output.weight") && !c.tie_embeddings {
                linear(files, "output", c.vocab_size, h, rp)?
            } else {
                Box::new(DenseLinear::new(embed.clone(), None, c.vocab_size, h, rp)?)
            };
        Ok(LlamaModel {
            rope: Rope::new(&c),
            norm: vector(files, "output_norm.weight", h)?,
            config: c,
            embed,
            layers,
            output,
        })
    }

    /// A KV storage shaped for this model.
    pub fn new_kv_storage(&self, block_size: usize, num_blocks: usize) -> Result<KvStorage> {
        KvStorage::new(
            self.config.n_layers,
            self.config.kv_dim(),
            block_size,
            num_blocks,
        )
    }

    /// Runs one step: stores the new tokens' K/V and returns the requested logits.
    pub fn forward(&self, batch: &BatchMeta, kv: &mut KvStorage, ctx: &ExecCtx) -> Result<Logits> {
        let c = &self.config;
        let (h, qd, kvd, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        let m = batch.num_tokens();
        if m == 0 {
            return Ok(Logits {
                vocab: c.vocab_size,
                data: vec![],
                rows: vec![],
            });
        }
        if kv.kv_dim() != kvd || kv.layers() != c.n_layers {
            return Err(Error::Other(format!(
                "KV storage has {} layers of kv_dim {}, model needs {} of {kvd}",
                kv.layers(),
                kv.kv_dim(),
                c.n_layers
            )));
        }
        // Positions of every token, validated up front so the step cannot fail half-way.
        let mut positions = Vec::with_capacity(m);
        for (s, chunk) in batch.seqs.iter().enumerate() {
            let end = chunk.start_pos + chunk.tokens.len();
            if end > c.max_position {
                return Err(Error::Other(format!(
                    "sequence {s} reaches position {end}, beyond the model's context of {}",
                    c.max_position
                )));
            }
            kv.check_table(&chunk.block_table, end)?;
            if let Some(&t) = chunk.tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
                return Err(Error::Other(format!(
                    "token id {t} is outside the vocabulary of {}",
                    c.vocab_size
                )));
            }
            positions.extend(chunk.start_pos..end);
        }
        let pool = ctx.pool;
        let units = pool.units();
        let kv_block = kv.block_size();

        // Embedding rows.
        let mut x = vec![0f32; m * h];
        let tokens: Vec<u32> = batch
            .seqs
            .iter()
            .flat_map(|s| s.tokens.iter().copied())
            .collect();
        let xp = DisjointMut::new(&mut x);
        // SAFETY (every `slice` below): unit `u` touches only the rows of
        // `split_range(m, units, u)`, disjoint from the other units' rows.
        pool.run(|u| {
            for t in split_range(m, units, u) {
                self.embed
                    .dequantize_row(tokens[t] as usize, unsafe { xp.slice(t * h, h) });
            }
        });

        let qkvd = qd + 2 * kvd;
        let mut hbuf = vec![0f32; m * h];
        let mut qkv = vec![0f32; m * qkvd];
        let mut att = vec![0f32; m * qd];
        let mut gu = vec![0f32; m * 2 * ff];
        let mut act = vec![0f32; m * ff];
        let mut tmp = vec![0f32; m * h];
        let shape = AttnShape {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
        };

        for (li, layer) in self.layers.iter().enumerate() {
            rms_rows(ctx, &x, &layer.attn_norm, c.rms_eps, h, &mut hbuf);
            layer.qkv.forward(ctx, &hbuf, m, &mut qkv);
            // RoPE on each row's q and k parts.
            let qp = DisjointMut::new(&mut qkv);
            pool.run(|u| {
                let mut cs = Vec::new();
                for t in split_range(m, units, u) {
                    let row = unsafe { qp.slice(t * qkvd, qd + kvd) };
                    let (qr, kr) = row.split_at_mut(qd);
                    self.rope.apply(qr, c.head_dim, positions[t], &mut cs);
                    self.rope.apply(kr, c.head_dim, positions[t], &mut cs);
                }
            });
            {
                let (kb, vb) = kv.layer_mut(li);
                let mut t = 0;
                for chunk in &batch.seqs {
                    for i in 0..chunk.tokens.len() {
                        let off = offset_in(&chunk.block_table, chunk.start_pos + i, kv_block, kvd);
                        let row = &qkv[t * qkvd..(t + 1) * qkvd];
                        kb[off..off + kvd].copy_from_slice(&row[qd..qd + kvd]);
                        vb[off..off + kvd].copy_from_slice(&row[qd + kvd..]);
                        t += 1;
                    }
                }
            }
            attention(pool, batch, kv, li, &shape, &qkv, qkvd, &mut att);
            layer.o.forward(ctx, &att, m, &mut tmp);
            ops::add_assign(&mut x, &tmp);

            rms_rows(ctx, &x, &layer.ffn_norm, c.rms_eps, h, &mut hbuf);
            layer.gate_up.forward(ctx, &hbuf, m, &mut gu);
            let ap = DisjointMut::new(&mut act);
            let gur = &gu;
            pool.run(|u| {
                for t in split_range(m, units, u) {
                    let row = &gur[t * 2 * ff..(t + 1) * 2 * ff];
                    ops::swiglu_into(&row[..ff], &row[ff..], unsafe { ap.slice(t * ff, ff) });
                }
            });
            layer.down.forward(ctx, &act, m, &mut tmp);
            ops::add_assign(&mut x, &tmp);
        }

        // Final norm and output projection, only for the rows that want logits.
        let mut rows = Vec::new();
        let mut picked = Vec::new();
        let mut t = 0;
        for (s, chunk) in batch.seqs.iter().enumerate() {
            let n = chunk.tokens.len();
            let want: Box<dyn Iterator<Item = usize>> = match chunk.logits {
                LogitsFor::None => Box::new(0..0),
                LogitsFor::Last => Box::new(n.saturating_sub(1)..n),
                LogitsFor::All => Box::new(0..n),
            };
            for i in want {
                rows.push((s, chunk.start_pos + i));
                picked.extend_from_slice(&x[(t + i) * h..(t + i + 1) * h]);
            }
            t += n;
        }
        let r = rows.len();
        let mut normed = vec![0f32; r * h];
        rms_rows(ctx, &picked, &self.norm, c.rms_eps, h, &mut normed);
        let mut data = vec![0f32; r * c.vocab_size];
        if r > 0 {
            self.output.forward(ctx, &normed, r, &mut data);
        }
        Ok(Logits {
            vocab: c.vocab_size,
            data,
            rows,
        })
    }
}

/// Element offset of `pos` in a layer's KV buffer (see `KvStorage::offset`).
fn offset_in(table: &[u32], pos: usize, block: usize, kvd: usize) -> usize {
    (table[pos / block] as usize * block + pos % block) * kvd
}

/// RMSNorm of every `h`-wide row of `x` into `out`, parallel over rows.
fn rms_rows(ctx: &ExecCtx, x: &[f32], w: &[f32], eps: f32, h: usize, out: &mut [f32]) {
    let m = x.len() / h;
    let units = ctx.pool.units();
    let op = DisjointMut::new(out);
    ctx.pool.run(|u| {
        for t in split_range(m, units, u) {
            ops::rms_norm(&x[t * h..(t + 1) * h], w, eps, unsafe {
                op.slice(t * h, h)
            });
        }
    });
}
