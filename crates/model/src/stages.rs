//! The forward as layer stages over a prepared batch.
//!
//! A step is prepared once ([`PreparedBatch`]), embedded, and then every layer runs an
//! attention stage and an MLP stage. Each stage runs on any contiguous range of the step's
//! rows (a [`SubBatch`]) and writes its output *before* the residual add, which the driver
//! applies: exactly the points where tensor parallelism all-reduces. [`LlamaModel::forward`]
//! runs every layer's stages over the sub-batches in turn; the arithmetic of each row does
//! not depend on which rows share its sub-batch (every kernel is row-invariant), so logits
//! are bitwise the same for every sub-batching.

use tessera_core::{Error, Result};
use tessera_formats::Activation;
use tessera_kernels::ops;
use tessera_runtime::{split_range, DisjointMut};

use crate::attention::{attention, AttnShape};
use crate::batch::{BatchMeta, LogitsView, RowSegment, SubBatching};
use crate::kv::KvStorage;
use crate::linear::ExecCtx;
use crate::llama::LlamaModel;
use crate::prepared::{PreparedBatch, SubBatch};
use crate::workspace::{take, StageScratch, Workspace};

/// The ranks' communication as a pipelined forward uses it: sums it can start now and
/// collect later (a communication thread, a DMA engine, a NIC).
pub trait StageReduce {
    /// Starts summing a copy of `buf` over the ranks; returns a ticket.
    fn start(&mut self, buf: &[f32]) -> Result<u64>;
    /// Waits for ticket `t`'s sum and writes it into `out`.
    fn finish(&mut self, t: u64, out: &mut [f32]) -> Result<()>;
}

/// A reduction in flight: its ticket and the post-norm weights its sum takes.
type Inflight<'a> = (u64, Option<&'a [f32]>);

/// One rank holding everything: there is nothing to sum, each stage's output is final.
struct NoReduce;

impl StageReduce for NoReduce {
    fn start(&mut self, _: &[f32]) -> Result<u64> {
        Ok(0)
    }
    fn finish(&mut self, _: u64, _: &mut [f32]) -> Result<()> {
        Ok(())
    }
}

impl LlamaModel {
    /// Runs one step: stores the new tokens' K/V and returns the requested logits, with every
    /// layer's stages run over the sub-batches of `split` in turn.
    pub fn forward<'w>(
        &self,
        batch: &BatchMeta,
        kv: &mut KvStorage,
        ws: &'w mut Workspace,
        ctx: &ExecCtx,
        split: SubBatching,
    ) -> Result<LogitsView<'w>> {
        self.forward_pipelined(batch, kv, ws, ctx, split, &mut NoReduce)
    }

    /// [`LlamaModel::forward`] for one rank of a tensor-parallel group, the all-reduces
    /// overlapped with compute: the embedding rows and the output of stage k on sub-batch i
    /// (before the residual add) are handed to `comm`, which sums them over the ranks on its
    /// own resource while the rank computes stage k on sub-batch i + 1; stage k + 1 of
    /// sub-batch i starts as soon as its sum has landed, chained through attention, MLP and
    /// the next layer without a barrier per layer. Each sum is the same whatever the order,
    /// so the logits (this rank's vocabulary rows) are bitwise the same for every
    /// sub-batching.
    pub fn forward_pipelined<'w>(
        &self,
        batch: &BatchMeta,
        kv: &mut KvStorage,
        ws: &'w mut Workspace,
        ctx: &ExecCtx,
        split: SubBatching,
        comm: &mut dyn StageReduce,
    ) -> Result<LogitsView<'w>> {
        self.prepare(batch, kv, ws, ctx.adapters.len())?;
        let m = ws.batch.num_rows();
        let h = self.config.hidden_size;
        if m == 0 {
            return Ok(self.logits_view(ws, 0));
        }
        self.embed_stage(ctx, &ws.batch.tokens, take(&mut ws.x, m * h));
        if self.vocab.len() != self.config.vocab_size {
            let t = comm.start(&ws.x[..m * h])?;
            comm.finish(t, &mut ws.x[..m * h])?;
        }
        take(&mut ws.delta, m * h);
        let subs = ws.batch.sub_batches(split);
        // The ticket of each sub-batch's reduction in flight, and the post-norm its sum
        // takes before the residual add (Gemma's; after the sum, so a rank's partial output
        // is never normalized alone).
        let mut inflight: Vec<Option<Inflight>> = vec![None; subs.len()];
        let eps = self.config.rms_eps;
        let land = |comm: &mut dyn StageReduce,
                    t: Option<Inflight>,
                    ws: &mut Workspace,
                    rows: std::ops::Range<usize>|
         -> Result<()> {
            if let Some((t, post)) = t {
                comm.finish(t, &mut ws.delta[rows.clone()])?;
                if let Some(w) = post {
                    norm_rows_in_place(ctx, &mut ws.delta[rows.clone()], w, eps, h);
                }
                ops::add_assign(&mut ws.x[rows.clone()], &ws.delta[rows]);
            }
            Ok(())
        };
        for layer in 0..self.layers.len() {
            let post = self.layers[layer].post_norms.as_ref();
            for (i, sb) in subs.iter().enumerate() {
                let rows = sb.rows.start * h..sb.rows.end * h;
                // The previous layer's MLP sum of this sub-batch.
                land(comm, inflight[i].take(), ws, rows.clone())?;
                let out = &mut ws.delta[rows.clone()];
                self.attention_stage(layer, &ws.batch, sb, &ws.x, kv, &mut ws.scratch, ctx, out)?;
                let t = comm.start(&ws.delta[rows])?;
                inflight[i] = Some((t, post.map(|p| p.0.as_slice())));
            }
            for (i, sb) in subs.iter().enumerate() {
                let rows = sb.rows.start * h..sb.rows.end * h;
                land(comm, inflight[i].take(), ws, rows.clone())?;
                let out = &mut ws.delta[rows.clone()];
                self.mlp_stage(layer, sb, &ws.x, &mut ws.scratch, ctx, out)?;
                let t = comm.start(&ws.delta[rows])?;
                inflight[i] = Some((t, post.map(|p| p.1.as_slice())));
            }
        }
        for (i, sb) in subs.iter().enumerate() {
            let rows = sb.rows.start * h..sb.rows.end * h;
            land(comm, inflight[i].take(), ws, rows)?;
        }
        let r = self.logits_stage(ctx, ws)?;
        Ok(self.logits_view(ws, r))
    }

    /// Validates `batch` and lays it out in `ws.batch`.
    pub fn prepare(
        &self,
        batch: &BatchMeta,
        kv: &KvStorage,
        ws: &mut Workspace,
        adapters: usize,
    ) -> Result<()> {
        let c = &self.config;
        if kv.kv_dim() != c.kv_dim() || kv.layers() != c.n_layers {
            return Err(Error::Other(format!(
                "KV storage has {} layers of kv_dim {}, model needs {} of {}",
                kv.layers(),
                kv.kv_dim(),
                c.n_layers,
                c.kv_dim()
            )));
        }
        ws.batch
            .prepare(batch, kv, c.max_position, c.vocab_size, adapters)
    }

    /// Embedding rows of `tokens` into `x` (zeros for tokens outside this model's vocabulary
    /// rows, which other ranks hold).
    pub fn embed_stage(&self, ctx: &ExecCtx, tokens: &[u32], x: &mut [f32]) {
        let vocab = self.vocab.clone();
        let h = self.config.hidden_size;
        let scale = self.config.block.embed_scale;
        let (m, units) = (tokens.len(), ctx.pool.units());
        let xp = DisjointMut::new(x);
        // SAFETY: unit `u` writes only the rows of `split_range(m, units, u)`, disjoint from
        // the other units' rows.
        ctx.pool.run(|u| {
            for t in split_range(m, units, u) {
                let row = unsafe { xp.slice(t * h, h) };
                let id = tokens[t] as usize;
                if vocab.contains(&id) {
                    self.embed.dequantize_row(id - vocab.start, row);
                    if scale != 1.0 {
                        row.iter_mut().for_each(|v| *v *= scale);
                    }
                } else {
                    row.fill(0.0);
                }
            }
        });
    }

    /// Layer `layer`'s attention on the rows of `sb`: norm, fused q/k/v product, RoPE, K/V
    /// stored in their slots, attention, output product into `out` (`sb.len()` rows of
    /// hidden), before the residual add. `x` is the whole step's residual stream.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_stage(
        &self,
        layer: usize,
        batch: &PreparedBatch,
        sb: &SubBatch,
        x: &[f32],
        kv: &mut KvStorage,
        scratch: &mut StageScratch,
        ctx: &ExecCtx,
        out: &mut [f32],
    ) -> Result<()> {
        let c = &self.config;
        let l = &self.layers[layer];
        let (h, qd, kvd) = (c.hidden_size, c.q_dim(), c.kv_dim());
        let qkvd = qd + 2 * kvd;
        let (n, r0) = (sb.len(), sb.rows.start);
        let units = ctx.pool.units();
        let normed = take(&mut scratch.normed, n * h);
        rms_rows(
            ctx,
            &x[r0 * h..sb.rows.end * h],
            &l.attn_norm,
            c.rms_eps,
            h,
            normed,
        );
        let qkv = take(&mut scratch.qkv, n * qkvd);
        l.qkv.forward(ctx, normed, n, &sb.segments, qkv)?;
        // Per-head q/k norms (where the family has them), then RoPE, on each row's q and k.
        let positions = &batch.positions[sb.rows.clone()];
        let window = c.window(layer);
        let rope = match (window, &self.local_rope) {
            (Some(_), Some(local)) => local,
            _ => &self.rope,
        };
        let hd = c.head_dim;
        let qp = DisjointMut::new(qkv);
        ctx.pool.run(|u| {
            let mut cs = Vec::new();
            for t in split_range(n, units, u) {
                // SAFETY: unit `u` touches only rows of its own range.
                let row = unsafe { qp.slice(t * qkvd, qd + kvd) };
                let (qr, kr) = row.split_at_mut(qd);
                if let Some((qw, kw)) = &l.qk_norm {
                    qr.chunks_exact_mut(hd)
                        .for_each(|x| ops::rms_norm_in_place(x, qw, c.rms_eps));
                    kr.chunks_exact_mut(hd)
                        .for_each(|x| ops::rms_norm_in_place(x, kw, c.rms_eps));
                }
                rope.apply(qr, hd, positions[t], &mut cs);
                rope.apply(kr, hd, positions[t], &mut cs);
            }
        });
        let slots = match kv.in_window_group(layer) {
            true => &batch.window_slots,
            false => &batch.kv_slots,
        };
        for (t, &off) in slots[sb.rows.clone()].iter().enumerate() {
            let row = &qkv[t * qkvd..(t + 1) * qkvd];
            kv.write(layer, off, &row[qd..qd + kvd], &row[qd + kvd..]);
        }
        let shape = AttnShape {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            scale: c.attn_scale(),
            softcap: c.block.attn_softcap,
            window,
        };
        let att = take(&mut scratch.att, n * qd);
        attention(
            ctx.pool,
            batch,
            sb.rows.clone(),
            kv,
            layer,
            &shape,
            qkv,
            qkvd,
            att,
        );
        l.o.forward(ctx, att, n, &sb.segments, out)
    }

    /// Layer `layer`'s MLP on the rows of `sb`: norm, fused gate/up product, SwiGLU or
    /// GeGLU, down product into `out`, before the residual add (and its post-norm, which
    /// the driver applies after the ranks' sum).
    pub fn mlp_stage(
        &self,
        layer: usize,
        sb: &SubBatch,
        x: &[f32],
        scratch: &mut StageScratch,
        ctx: &ExecCtx,
        out: &mut [f32],
    ) -> Result<()> {
        let c = &self.config;
        let l = &self.layers[layer];
        let (h, ff) = (c.hidden_size, c.intermediate_size);
        let n = sb.len();
        let units = ctx.pool.units();
        let normed = take(&mut scratch.normed, n * h);
        let xs = &x[sb.rows.start * h..sb.rows.end * h];
        rms_rows(ctx, xs, &l.ffn_norm, c.rms_eps, h, normed);
        let gu = take(&mut scratch.gate_up, n * 2 * ff);
        l.gate_up.forward(ctx, normed, n, &sb.segments, gu)?;
        let act = take(&mut scratch.act, n * ff);
        let ap = DisjointMut::new(act);
        let gur = &*gu;
        let act_fn = match c.block.activation {
            Activation::Silu => ops::swiglu_into,
            Activation::GeluTanh => ops::geglu_into,
        };
        ctx.pool.run(|u| {
            for t in split_range(n, units, u) {
                let row = &gur[t * 2 * ff..(t + 1) * 2 * ff];
                // SAFETY: unit `u` writes only rows of its own range.
                act_fn(&row[..ff], &row[ff..], unsafe { ap.slice(t * ff, ff) });
            }
        });
        l.down.forward(ctx, act, n, &sb.segments, out)
    }

    /// Final norm and output projection of the rows that want logits; returns their count.
    pub(crate) fn logits_stage(&self, ctx: &ExecCtx, ws: &mut Workspace) -> Result<usize> {
        let c = &self.config;
        let h = c.hidden_size;
        let r = ws.batch.logit_rows.len();
        if r == 0 {
            return Ok(0);
        }
        let picked = take(&mut ws.picked, r * h);
        for (i, &row) in ws.batch.logit_rows.iter().enumerate() {
            picked[i * h..(i + 1) * h].copy_from_slice(&ws.x[row * h..(row + 1) * h]);
        }
        let head_in = take(&mut ws.head_in, r * h);
        rms_rows(ctx, picked, &self.norm, c.rms_eps, h, head_in);
        let logits = take(&mut ws.logits, r * self.vocab.len());
        let base = [RowSegment {
            rows: 0..r,
            adapter: None,
        }];
        self.output.forward(ctx, head_in, r, &base, logits)?;
        if let Some(cap) = c.block.final_softcap {
            ops::softcap(logits, cap);
        }
        Ok(r)
    }

    fn logits_view<'w>(&self, ws: &'w Workspace, r: usize) -> LogitsView<'w> {
        let vocab = self.vocab.len();
        LogitsView {
            vocab,
            data: ws.logits.get(..r * vocab).unwrap_or(&[]),
            rows: &ws.batch.logit_ids[..r],
        }
    }
}

/// RMSNorm of every `h`-wide row of `x`, in place, parallel over rows.
fn norm_rows_in_place(ctx: &ExecCtx, x: &mut [f32], w: &[f32], eps: f32, h: usize) {
    let m = x.len() / h;
    let units = ctx.pool.units();
    let xp = DisjointMut::new(x);
    ctx.pool.run(|u| {
        for t in split_range(m, units, u) {
            // SAFETY: unit `u` touches only rows of its own range.
            ops::rms_norm_in_place(unsafe { xp.slice(t * h, h) }, w, eps);
        }
    });
}

/// RMSNorm of every `h`-wide row of `x` into `out`, parallel over rows.
fn rms_rows(ctx: &ExecCtx, x: &[f32], w: &[f32], eps: f32, h: usize, out: &mut [f32]) {
    let m = x.len() / h;
    let units = ctx.pool.units();
    let op = DisjointMut::new(out);
    ctx.pool.run(|u| {
        for t in split_range(m, units, u) {
            // SAFETY: unit `u` writes only rows of its own range.
            ops::rms_norm(&x[t * h..(t + 1) * h], w, eps, unsafe {
                op.slice(t * h, h)
            });
        }
    });
}
