//! Timing of the layer stages on this rank's compute units, for the step-time model: one
//! layer's attention and MLP stages on fresh prefills of a ladder of row counts, and the head
//! on a few logits rows. Uses a scratch one-layer KV storage and workspace of its own.

use std::time::Instant;

use tessera_core::Result;

use crate::batch::{BatchMeta, LogitsFor, SeqChunk};
use crate::kv::KvStorage;
use crate::linear::ExecCtx;
use crate::llama::LlamaModel;
use crate::prepared::SubBatch;
use crate::workspace::{take, Workspace};

/// Median seconds of one layer's stages on `rows` rows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StageTiming {
    pub rows: usize,
    pub attn_s: f64,
    pub mlp_s: f64,
}

const BLOCK: usize = 16;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

impl LlamaModel {
    /// A workspace prepared for fresh sequences of `seqs` rows, and their one-layer KV
    /// storage.
    fn scratch_step(
        &self,
        ctx: &ExecCtx,
        seqs: &[usize],
        logits: LogitsFor,
    ) -> Result<(Workspace, KvStorage)> {
        let c = &self.config;
        let mut next = 0u32;
        let seqs = seqs
            .iter()
            .map(|&n| {
                let blocks = n.div_ceil(BLOCK) as u32;
                let table = (next..next + blocks).collect();
                next += blocks;
                let tokens = (0..n)
                    .map(|i| ((i * 7919 + 13) % c.vocab_size) as u32)
                    .collect();
                SeqChunk::new(tokens, 0, table, logits)
            })
            .collect();
        let kv = KvStorage::new(1, c.kv_dim(), BLOCK, next.max(1) as usize)?;
        let mut ws = Workspace::new();
        let batch = BatchMeta { seqs };
        ws.batch.prepare(
            &batch,
            &kv,
            c.max_position,
            c.vocab_size,
            ctx.adapters.len(),
        )?;
        Ok((ws, kv))
    }

    /// Layer 0's attention and MLP stage times on fresh prefills of sequences of `seqs` rows
    /// each (median of `reps` after a warm-up).
    pub fn time_stages(&self, ctx: &ExecCtx, seqs: &[usize], reps: usize) -> Result<StageTiming> {
        let c = &self.config;
        let h = c.hidden_size;
        let seqs: Vec<usize> = seqs.iter().map(|&n| n.max(1)).collect();
        let (mut ws, mut kv) = self.scratch_step(ctx, &seqs, LogitsFor::None)?;
        let m = ws.batch.num_rows();
        for (i, v) in take(&mut ws.x, m * h).iter_mut().enumerate() {
            *v = ((i % 97) as f32 - 48.0) * 1e-2;
        }
        take(&mut ws.delta, m * h);
        let sb = SubBatch {
            rows: 0..m,
            segments: ws.batch.segments(0..m),
        };
        let (mut attn, mut mlp) = (Vec::new(), Vec::new());
        for i in 0..reps.max(1) + 1 {
            let t0 = Instant::now();
            let out = &mut ws.delta[..m * h];
            self.attention_stage(0, &ws.batch, &sb, &ws.x, &mut kv, &mut ws.scratch, ctx, out)?;
            let t1 = Instant::now();
            let out = &mut ws.delta[..m * h];
            self.mlp_stage(0, &sb, &ws.x, &mut ws.scratch, ctx, out)?;
            if i > 0 {
                attn.push((t1 - t0).as_secs_f64());
                mlp.push(t1.elapsed().as_secs_f64());
            }
        }
        Ok(StageTiming {
            rows: m,
            attn_s: median(attn),
            mlp_s: median(mlp),
        })
    }

    /// Seconds of the final norm and head (this rank's vocabulary rows) on `rows` logits
    /// rows, and of embedding them (medians of `reps`).
    pub fn time_head(&self, ctx: &ExecCtx, rows: usize, reps: usize) -> Result<(f64, f64)> {
        let c = &self.config;
        let (mut ws, _kv) = self.scratch_step(ctx, &vec![1; rows.max(1)], LogitsFor::Last)?;
        let m = ws.batch.num_rows();
        let (mut head, mut embed) = (Vec::new(), Vec::new());
        for i in 0..reps.max(1) + 1 {
            let t0 = Instant::now();
            let tokens = ws.batch.tokens.clone();
            self.embed_stage(ctx, &tokens, take(&mut ws.x, m * c.hidden_size));
            let t1 = Instant::now();
            self.logits_stage(ctx, &mut ws)?;
            if i > 0 {
                embed.push((t1 - t0).as_secs_f64());
                head.push(t1.elapsed().as_secs_f64());
            }
        }
        Ok((median(head), median(embed)))
    }
}
