//! A step's batch prepared once into flat per-row arrays, and its cut into sub-batches.
//!
//! [`PreparedBatch::prepare`] validates a [`BatchMeta`] against the model and the KV storage
//! (so a step cannot fail half-way for bad input) and lays it out as rows: token, position,
//! KV slot (element offset of the row's K/V in a layer buffer), sequence and adapter slot of
//! each row, each sequence's row range and block table, and the rows that want logits.
//! Stages then run on any contiguous range of rows ([`SubBatch`]). The arrays are reused
//! across steps.

use std::ops::Range;

use tessera_core::{Error, Result};
use tessera_runtime::split_range;

use crate::batch::{BatchMeta, LogitsFor, RowSegment, SplitBy, SubBatching};
use crate::kv::KvStorage;

/// One sequence of the prepared batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedSeq {
    /// Its rows in the step.
    pub rows: Range<usize>,
    /// Its block table: `PreparedBatch::tables[table]`.
    pub table: Range<usize>,
    /// Its window table (with a window group): `PreparedBatch::window_tables[window]`.
    pub window: Range<usize>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PreparedBatch {
    pub tokens: Vec<u32>,
    pub positions: Vec<usize>,
    /// Element offset of each row's K/V slot within one layer's K (or V) buffer.
    pub kv_slots: Vec<usize>,
    /// The same within a window-group layer's buffers (empty without a window group).
    pub window_slots: Vec<usize>,
    /// Batch index of each row's sequence.
    pub row_seq: Vec<u32>,
    /// Adapter slot of each row (`None`: base model).
    pub row_adapter: Vec<Option<u32>>,
    pub seqs: Vec<PreparedSeq>,
    /// Block tables of all sequences, concatenated.
    pub tables: Vec<u32>,
    /// Window tables of all sequences, concatenated, dropped entries as block 0 (only keys
    /// below a row's window, masked, read them).
    pub window_tables: Vec<u32>,
    /// Rows that want logits, in batch order, with their `(sequence, position)`.
    pub logit_rows: Vec<usize>,
    pub logit_ids: Vec<(usize, usize)>,
    /// KV positions per block of the storage prepared for.
    pub block_size: usize,
}

/// A contiguous range of a step's rows that every stage runs on in one go, with the runs of
/// rows per adapter inside it (relative to `rows.start`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubBatch {
    pub rows: Range<usize>,
    pub segments: Vec<RowSegment>,
}

impl SubBatch {
    pub fn len(&self) -> usize {
        self.rows.len()
    }
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

impl PreparedBatch {
    /// Rows in the step.
    pub fn num_rows(&self) -> usize {
        self.tokens.len()
    }

    /// The block table of sequence `seq`.
    pub fn table(&self, seq: usize) -> &[u32] {
        &self.tables[self.seqs[seq].table.clone()]
    }

    /// The table of sequence `seq` for a layer in the window group (`window`) or not.
    pub fn table_for(&self, seq: usize, window: bool) -> &[u32] {
        match window {
            true => &self.window_tables[self.seqs[seq].window.clone()],
            false => self.table(seq),
        }
    }

    /// Refills `self` from `batch` (an empty chunk contributes no rows), checking every
    /// sequence: positions inside `max_position`,
    /// a block table covering them with existing blocks, token ids inside `vocab`, and an
    /// adapter slot below `adapters`. Errors name the sequence.
    pub fn prepare(
        &mut self,
        batch: &BatchMeta,
        kv: &KvStorage,
        max_position: usize,
        vocab: usize,
        adapters: usize,
    ) -> Result<()> {
        self.clear();
        self.block_size = kv.block_size();
        for (s, chunk) in batch.seqs.iter().enumerate() {
            let end = chunk.start_pos + chunk.tokens.len();
            if end > max_position {
                return Err(Error::sequence(
                    s,
                    format!("reaches position {end}, beyond the model's context of {max_position}"),
                ));
            }
            kv.check_table(&chunk.block_table, end)
                .map_err(|e| Error::sequence(s, e.to_string()))?;
            let window =
                match (&chunk.window_table, kv.has_window_group()) {
                    (Some(t), true) => {
                        kv.check_window_table(t, chunk.start_pos, end)
                            .map_err(|e| Error::sequence(s, e.to_string()))?;
                        Some(t)
                    }
                    (None, false) => None,
                    (Some(_), false) => {
                        return Err(Error::sequence(
                            s,
                            "a window table, but the KV storage keeps no window group",
                        ))
                    }
                    (None, true) => return Err(Error::sequence(
                        s,
                        "the KV storage keeps a window group: the sequence needs a window table",
                    )),
                };
            if let Some(&t) = chunk.tokens.iter().find(|&&t| t as usize >= vocab) {
                return Err(Error::sequence(
                    s,
                    format!("token id {t} is outside the vocabulary of {vocab}"),
                ));
            }
            if let Some(a) = chunk.adapter.filter(|&a| a as usize >= adapters) {
                return Err(Error::sequence(
                    s,
                    format!("adapter slot {a} is not loaded ({adapters} in this step)"),
                ));
            }
            let first = self.tokens.len();
            let t0 = self.tables.len();
            self.tables.extend_from_slice(&chunk.block_table);
            let w0 = self.window_tables.len();
            if let Some(t) = window {
                let valid = |b: u32| {
                    if b as usize >= kv.window_blocks() {
                        0
                    } else {
                        b
                    }
                };
                self.window_tables.extend(t.iter().map(|&b| valid(b)));
            }
            for (i, &tok) in chunk.tokens.iter().enumerate() {
                let pos = chunk.start_pos + i;
                self.tokens.push(tok);
                self.positions.push(pos);
                self.kv_slots.push(kv.offset(&chunk.block_table, pos));
                if let Some(t) = window {
                    self.window_slots.push(kv.offset(t, pos));
                }
                self.row_seq.push(s as u32);
                self.row_adapter.push(chunk.adapter);
            }
            let n = chunk.tokens.len();
            let want = match chunk.logits {
                LogitsFor::None => 0..0,
                LogitsFor::Last => n.saturating_sub(1)..n,
                LogitsFor::All => 0..n,
            };
            for i in want {
                self.logit_rows.push(first + i);
                self.logit_ids.push((s, chunk.start_pos + i));
            }
            self.seqs.push(PreparedSeq {
                rows: first..first + n,
                table: t0..self.tables.len(),
                window: w0..self.window_tables.len(),
            });
        }
        Ok(())
    }

    fn clear(&mut self) {
        self.tokens.clear();
        self.positions.clear();
        self.kv_slots.clear();
        self.window_slots.clear();
        self.window_tables.clear();
        self.row_seq.clear();
        self.row_adapter.clear();
        self.seqs.clear();
        self.tables.clear();
        self.logit_rows.clear();
        self.logit_ids.clear();
    }

    /// Row ranges of the sub-batches: at most `spec.count`, never empty, covering every row
    /// once in order. `Sequence` cuts only between sequences, as near as possible to equal
    /// token counts; `Tokens` cuts into near-equal token counts anywhere between rows.
    pub fn split(&self, spec: SubBatching) -> Vec<Range<usize>> {
        let lens: Vec<usize> = self.seqs.iter().map(|s| s.rows.len()).collect();
        split_rows(&lens, spec)
    }

    /// The sub-batches of `spec`, each with its adapter segments.
    pub fn sub_batches(&self, spec: SubBatching) -> Vec<SubBatch> {
        self.split(spec)
            .into_iter()
            .map(|rows| SubBatch {
                segments: self.segments(rows.clone()),
                rows,
            })
            .collect()
    }

    /// Runs of equal adapter within `rows`, relative to `rows.start`.
    pub fn segments(&self, rows: Range<usize>) -> Vec<RowSegment> {
        let mut out: Vec<RowSegment> = Vec::new();
        for r in rows.clone() {
            let a = self.row_adapter[r];
            match out.last_mut() {
                Some(seg) if seg.adapter == a => seg.rows.end = r - rows.start + 1,
                _ => out.push(RowSegment {
                    rows: r - rows.start..r - rows.start + 1,
                    adapter: a,
                }),
            }
        }
        out
    }
}

/// Row ranges of the sub-batches of a step whose sequences have `seq_rows` rows each, in
/// order: at most `spec.count`, never empty, covering every row once in order. `Sequence`
/// cuts only between sequences, as near as possible to equal token counts; `Tokens` cuts
/// into near-equal token counts anywhere between rows. (The engine's overlap planner calls
/// this on a step before it is prepared, so its predictions are of the real cuts.)
pub fn split_rows(seq_rows: &[usize], spec: SubBatching) -> Vec<Range<usize>> {
    let m: usize = seq_rows.iter().sum();
    let count = spec.count.max(1);
    if m == 0 {
        return vec![];
    }
    let mut cuts = vec![0];
    match spec.split {
        SplitBy::Tokens => {
            for u in 0..count {
                let r = split_range(m, count, u);
                if !r.is_empty() {
                    cuts.push(r.end);
                }
            }
        }
        SplitBy::Sequence => {
            // Cut at the sequence boundary nearest each ideal cut k·m/count, keeping the
            // cuts increasing.
            let bounds: Vec<usize> = seq_rows
                .iter()
                .scan(0, |end, &n| {
                    *end += n;
                    Some(*end)
                })
                .collect();
            for k in 1..count {
                let ideal = k * m / count;
                let last = *cuts.last().expect("starts with 0");
                let best = bounds
                    .iter()
                    .copied()
                    .filter(|&b| b > last && b < m)
                    .min_by_key(|&b| b.abs_diff(ideal));
                if let Some(b) = best {
                    cuts.push(b);
                }
            }
            cuts.push(m);
        }
    }
    cuts.dedup();
    cuts.windows(2).map(|w| w[0]..w[1]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::SeqChunk;
    use proptest::prelude::*;

    fn batch(lens: &[usize], adapters: &[Option<u32>]) -> (BatchMeta, KvStorage) {
        // Room for the largest batch the tests make (8 sequences of up to 39 positions).
        let kv = KvStorage::new(1, 4, 4, 128).unwrap();
        let mut next = 0u32;
        let seqs = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let blocks = n.div_ceil(4) as u32;
                let table = (next..next + blocks).collect();
                next += blocks;
                SeqChunk {
                    tokens: vec![1; n],
                    start_pos: 0,
                    block_table: table,
                    logits: LogitsFor::Last,
                    adapter: adapters[i % adapters.len()],
                    window_table: None,
                }
            })
            .collect();
        (BatchMeta { seqs }, kv)
    }

    /// With a window group, a sequence's window table addresses its window layers: slots
    /// from it, dropped entries (before the window) read as block 0, and a table missing
    /// where the chunk attends, or absent, is an error naming the sequence.
    #[test]
    fn window_tables_give_the_window_layers_slots() {
        // tessera_kv's entry for a dropped block.
        const DROPPED: u32 = u32::MAX;
        let kv =
            KvStorage::with_window_group(2, 4, 4, 16, &[true, false], 6, 5, Default::default())
                .unwrap();
        let chunk = |window_table: Option<Vec<u32>>| SeqChunk {
            tokens: vec![1; 2],
            start_pos: 12,
            block_table: vec![0, 1, 2, 3],
            logits: LogitsFor::Last,
            adapter: None,
            window_table,
        };
        let mut p = PreparedBatch::default();
        // Positions 12 and 13 attend keys from 8 (window 5): indices 2 and 3.
        let ok = chunk(Some(vec![DROPPED, DROPPED, 4, 5]));
        p.prepare(&BatchMeta { seqs: vec![ok] }, &kv, 64, 8, 0)
            .unwrap();
        assert_eq!(p.window_slots, [(5 * 4) * 4, (5 * 4 + 1) * 4]);
        assert_eq!(p.table_for(0, true), [0, 0, 4, 5]);
        assert_eq!(p.table_for(0, false), [0, 1, 2, 3]);
        for bad in [chunk(Some(vec![DROPPED, DROPPED, DROPPED, 5])), chunk(None)] {
            let e = p
                .prepare(&BatchMeta { seqs: vec![bad] }, &kv, 64, 8, 0)
                .unwrap_err();
            assert!(e.to_string().contains("sequence 0"), "{e}");
        }
    }

    #[test]
    fn prepare_lays_out_rows_and_names_the_bad_sequence() {
        let (mut b, kv) = batch(&[3, 1, 5], &[None, Some(0)]);
        let mut p = PreparedBatch::default();
        p.prepare(&b, &kv, 100, 10, 1).unwrap();
        assert_eq!(p.num_rows(), 9);
        assert_eq!(p.positions, vec![0, 1, 2, 0, 0, 1, 2, 3, 4]);
        assert_eq!(p.logit_rows, vec![2, 3, 8]);
        assert_eq!(p.row_seq, vec![0, 0, 0, 1, 2, 2, 2, 2, 2]);
        assert_eq!(p.kv_slots[3], kv.offset(&b.seqs[1].block_table, 0));
        b.seqs[1].tokens[0] = 99;
        let e = p.prepare(&b, &kv, 100, 10, 1).unwrap_err();
        assert!(matches!(e, Error::Sequence { seq: 1, .. }), "{e}");
        b.seqs[1].tokens[0] = 1;
        b.seqs[2].adapter = Some(3);
        let e = p.prepare(&b, &kv, 100, 10, 1).unwrap_err();
        assert!(matches!(e, Error::Sequence { seq: 2, .. }), "{e}");
    }

    #[test]
    fn segments_follow_adapters() {
        let (b, kv) = batch(&[2, 2, 3], &[None, Some(0), Some(0)]);
        let mut p = PreparedBatch::default();
        p.prepare(&b, &kv, 100, 10, 1).unwrap();
        assert_eq!(
            p.segments(1..7),
            vec![
                RowSegment {
                    rows: 0..1,
                    adapter: None
                },
                RowSegment {
                    rows: 1..6,
                    adapter: Some(0)
                }
            ]
        );
    }

    proptest! {
        #[test]
        fn splits_cover_every_row_once(
            lens in proptest::collection::vec(1usize..40, 1..9),
            count in 1usize..6,
            by_tokens in any::<bool>(),
        ) {
            let (b, kv) = batch(&lens, &[None]);
            let mut p = PreparedBatch::default();
            p.prepare(&b, &kv, 1000, 10, 0).unwrap();
            let split = if by_tokens { SplitBy::Tokens } else { SplitBy::Sequence };
            let parts = p.split(SubBatching { count, split });
            prop_assert!(!parts.is_empty() && parts.len() <= count);
            let mut next = 0;
            for r in &parts {
                prop_assert_eq!(r.start, next);
                prop_assert!(!r.is_empty());
                next = r.end;
                if !by_tokens {
                    prop_assert!(p.seqs.iter().any(|s| s.rows.start == r.start));
                }
            }
            prop_assert_eq!(next, p.num_rows());
            if by_tokens {
                prop_assert_eq!(parts.len(), count.min(p.num_rows()));
            }
        }
    }
}
