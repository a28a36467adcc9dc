//! A draft model for speculative decoding: a smaller model with the target's vocabulary,
//! decoding greedily, its KV cache kept beside the target's.
//!
//! The draft's cache holds, per sequence, the KV of a prefix of that sequence's tokens
//! (`DraftSeq::tokens`). Before drafting, the prefix that still agrees with the target's
//! tokens is kept and the rest released (drafts the target rejected, or a sequence that was
//! preempted and recomputed), so no explicit rollback is needed. Drafting `k` tokens for
//! several sequences is `k` batched forwards: the first carries each sequence's catch-up
//! (the target tokens the draft has not seen, at most `max_catch_up` of them per step, so a
//! long prompt is prefilled over several steps without drafts) and yields the first draft,
//! each later one feeds the previous draft.
//!
//! The step engine also feeds it each prompt chunk the target prefills ([`DraftModel::prefill`]),
//! so its catch-up falls in the prompt's processing, as the target's does.
//!
//! Its blocks come from a pool of its own; a sequence that cannot get blocks is not drafted
//! for, and a sequence's blocks are freed when it finishes ([`DraftModel::forget`]). A draft
//! model's failure never fails a request: the step goes on without drafts.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use tessera_core::{Error, Result};
use tessera_model::{BatchMeta, KvStorage, LogitsFor, SeqChunk, Workspace};

use crate::sampling::argmax;
use crate::Engine;

/// Positions per block of the draft's cache.
const BLOCK: usize = 16;

#[derive(Default)]
struct DraftSeq {
    blocks: Vec<u32>,
    /// The tokens whose KV the draft holds, from position 0.
    tokens: Vec<u32>,
}

impl DraftSeq {
    /// How many of its tokens agree with `tokens` from the start.
    fn agree(&self, tokens: &[u32]) -> usize {
        self.tokens
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count()
    }

    /// Keeps the KV of its first `n` tokens at most, giving the blocks past them to `free`.
    fn keep(&mut self, n: usize, free: &mut Vec<u32>) {
        self.tokens.truncate(n);
        let keep = self.tokens.len().div_ceil(BLOCK);
        free.extend(self.blocks.drain(keep..));
    }
}

pub struct DraftModel {
    engine: Engine,
    kv: Vec<KvStorage>,
    ws: Vec<Workspace>,
    free: Vec<u32>,
    seqs: HashMap<u64, DraftSeq>,
    /// Most target tokens one sequence catches up per step.
    max_catch_up: usize,
    /// Its forwards' time per row, fitted online.
    cost: crate::spec::RowCost,
}

impl DraftModel {
    /// Loads the draft model at `path` on `threads` compute units, with a cache of
    /// `positions` positions; its vocabulary must be `target`'s. It runs the fast path
    /// (8-bit activations against the block-quantized weights): drafts are only proposals,
    /// which the target verifies on its own path, so their numerics change no output, and
    /// a cheaper draft pays more often.
    pub fn load(path: &Path, threads: usize, target: &Engine, positions: usize) -> Result<Self> {
        let engine = Engine::load_with(
            path,
            threads,
            tessera_kernels::plan::Precision::Fast,
            crate::tuning::load_planner(),
        )?;
        Self::new(engine, target, positions)
    }

    /// A draft model over a loaded engine (see [`DraftModel::load`]).
    pub fn new(engine: Engine, target: &Engine, positions: usize) -> Result<Self> {
        let (dv, tv) = (engine.config.vocab_size, target.config.vocab_size);
        let (dt, tt) = (engine.tokenizer.vocab_size(), target.tokenizer.vocab_size());
        if dt != tt || engine.tokenizer.eos_ids() != target.tokenizer.eos_ids() {
            return Err(Error::Config(format!(
                "the draft model {:?} has another tokenizer than the target {:?} \
                 ({dt} tokens against {tt}): speculative decoding needs the same vocabulary",
                engine.name, target.name
            )));
        }
        if dv.min(tv) < tt {
            return Err(Error::Config(format!(
                "the draft model's output rows ({dv}) do not cover the vocabulary ({tt})"
            )));
        }
        let blocks = positions.div_ceil(BLOCK).max(1);
        let kv = engine.new_kv(BLOCK, blocks)?;
        Ok(DraftModel {
            kv,
            ws: vec![Workspace::new()],
            free: (0..blocks as u32).rev().collect(),
            seqs: HashMap::new(),
            max_catch_up: 256,
            cost: crate::spec::RowCost::new(),
            engine,
        })
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Bytes of the draft's KV cache.
    pub fn kv_bytes(&self) -> usize {
        self.kv.iter().map(KvStorage::bytes).sum()
    }

    /// Frees sequence `id`'s blocks.
    pub fn forget(&mut self, id: u64) {
        if let Some(s) = self.seqs.remove(&id) {
            self.free.extend(s.blocks);
        }
    }

    /// Frees every sequence's blocks (after a failed forward, whose KV is unknown).
    pub fn reset(&mut self) {
        let ids: Vec<u64> = self.seqs.keys().copied().collect();
        for id in ids {
            self.forget(id);
        }
    }

    /// Seconds of its forwards against their rows, fitted to those run.
    pub fn cost(&self) -> &crate::spec::RowCost {
        &self.cost
    }

    /// How many of `tokens` (a sequence's known tokens) the draft would feed before its
    /// first draft: those past the prefix whose KV it holds.
    pub fn lag(&self, id: u64, tokens: &[u32]) -> usize {
        let have = self.seqs.get(&id).map_or(0, |s| s.agree(tokens));
        tokens.len() - have.min(tokens.len().saturating_sub(1))
    }

    /// Sequences the draft holds KV for.
    pub fn num_seqs(&self) -> usize {
        self.seqs.len()
    }

    /// Feeds the draft each `(id, tokens)`'s tokens it does not hold yet (no logits): its
    /// prompt, alongside the target's prefill, so that drafting for the sequence later
    /// needs no catch-up. A sequence the pool has no blocks for is skipped.
    pub fn prefill(&mut self, reqs: &[(u64, &[u32])]) -> Result<()> {
        let mut chunks = Vec::new();
        for &(id, tokens) in reqs {
            let seq = self.seqs.entry(id).or_default();
            seq.keep(seq.agree(tokens), &mut self.free);
            let start = seq.tokens.len();
            if start >= tokens.len() {
                continue;
            }
            let need = tokens
                .len()
                .div_ceil(BLOCK)
                .saturating_sub(seq.blocks.len());
            if need > self.free.len() {
                continue;
            }
            let at = self.free.len() - need;
            seq.blocks.extend(self.free.drain(at..));
            seq.tokens.extend_from_slice(&tokens[start..]);
            chunks.push(SeqChunk::new(
                tokens[start..].to_vec(),
                start,
                seq.blocks.clone(),
                LogitsFor::None,
            ));
        }
        if chunks.is_empty() {
            return Ok(());
        }
        let batch = BatchMeta { seqs: chunks };
        let t = Instant::now();
        self.engine
            .forward_ranks(&batch, &mut self.kv, &mut self.ws, &[])?;
        self.cost
            .observe(batch.num_tokens() as f64, t.elapsed().as_secs_f64());
        Ok(())
    }

    /// Drafts up to `k` tokens for each `(id, tokens, k)`: the target's known tokens of the
    /// sequence. Returns the drafts (possibly fewer tokens, or none for a sequence still
    /// catching up or out of blocks) and the seconds it took.
    pub fn draft(
        &mut self,
        reqs: &[(u64, &[u32], usize)],
    ) -> Result<(HashMap<u64, Vec<u32>>, f64)> {
        let t0 = Instant::now();
        let mut out: HashMap<u64, Vec<u32>> = HashMap::new();
        // Per sequence: (id, k, the chunk to feed next, its start position).
        let mut live: Vec<(u64, usize, Vec<u32>, usize)> = Vec::new();
        for &(id, tokens, k) in reqs {
            if k == 0 || tokens.is_empty() {
                continue;
            }
            let seq = self.seqs.entry(id).or_default();
            // Keep the KV of the prefix that still agrees with the target (the last known
            // token is fed again, for its logits).
            seq.keep(seq.agree(tokens).min(tokens.len() - 1), &mut self.free);
            let start = seq.tokens.len();
            let behind = tokens.len() - start;
            let feed = behind.min(self.max_catch_up);
            // Blocks for the catch-up and the k - 1 drafts fed back.
            let caught_up = feed == behind;
            let need_pos = start + feed + if caught_up { k - 1 } else { 0 };
            let need = need_pos.div_ceil(BLOCK).saturating_sub(seq.blocks.len());
            if need > self.free.len() {
                continue;
            }
            let at = self.free.len() - need;
            seq.blocks.extend(self.free.drain(at..));
            let chunk = tokens[start..start + feed].to_vec();
            seq.tokens.extend_from_slice(&chunk);
            live.push((id, if caught_up { k } else { 0 }, chunk, start));
        }
        let mut round = 0;
        while !live.is_empty() {
            let batch = BatchMeta {
                seqs: live
                    .iter()
                    .map(|(id, _, chunk, start)| {
                        let table = self.seqs[id].blocks.clone();
                        SeqChunk::new(chunk.clone(), *start, table, LogitsFor::Last)
                    })
                    .collect(),
            };
            let t = Instant::now();
            let logits = self
                .engine
                .forward_ranks(&batch, &mut self.kv, &mut self.ws, &[])?;
            self.cost
                .observe(batch.num_tokens() as f64, t.elapsed().as_secs_f64());
            let mut next = Vec::new();
            for (i, (id, k, chunk, start)) in live.into_iter().enumerate() {
                let Some(row) = logits.last_of(i) else {
                    continue;
                };
                if k == 0 {
                    continue;
                }
                let t = argmax(&row[..self.engine.tokenizer.vocab_size().min(row.len())]);
                let d = out.entry(id).or_default();
                d.push(t);
                if d.len() < k {
                    let seq = self.seqs.get_mut(&id).expect("drafting");
                    seq.tokens.push(t);
                    next.push((id, k, vec![t], start + chunk.len()));
                }
            }
            live = next;
            round += 1;
            debug_assert!(round <= 65);
        }
        Ok((out, t0.elapsed().as_secs_f64()))
    }
}
