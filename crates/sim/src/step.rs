//! A step's predicted time for each sub-batching, and the choice among them.

use std::ops::Range;
use std::sync::Arc;

use tessera_model::prepared::split_rows;
use tessera_model::{BatchMeta, LogitsFor, SplitBy, SubBatching};
use tessera_parallel::link::CommCost;

use crate::compute::StageCost;
use crate::pipeline::{pipelined, StepEstimate, SubCost};

/// What the model needs to know of a step: each sequence's new rows and start position, and
/// how many logits rows it wants.
#[derive(Debug, Clone, PartialEq)]
pub struct StepShape {
    pub seq_rows: Vec<usize>,
    pub seq_start: Vec<usize>,
    pub logit_rows: usize,
}

impl StepShape {
    /// Fresh prefills of `seq_rows` rows each, one logits row per sequence.
    pub fn prefill(seq_rows: Vec<usize>) -> StepShape {
        StepShape {
            seq_start: vec![0; seq_rows.len()],
            logit_rows: seq_rows.len(),
            seq_rows,
        }
    }

    pub fn of_batch(batch: &BatchMeta) -> StepShape {
        StepShape {
            seq_rows: batch.seqs.iter().map(|s| s.tokens.len()).collect(),
            seq_start: batch.seqs.iter().map(|s| s.start_pos).collect(),
            logit_rows: batch
                .seqs
                .iter()
                .map(|s| match s.logits {
                    LogitsFor::None => 0,
                    LogitsFor::Last => usize::from(!s.tokens.is_empty()),
                    LogitsFor::All => s.tokens.len(),
                })
                .sum(),
        }
    }

    pub fn rows(&self) -> usize {
        self.seq_rows.iter().sum()
    }

    /// Keys attended by the rows of `range` (row j of a sequence starting at p attends p+j+1).
    fn keys(&self, range: &Range<usize>) -> usize {
        let mut at = 0;
        let mut keys = 0;
        for (&n, &p) in self.seq_rows.iter().zip(&self.seq_start) {
            let lo = range.start.max(at);
            let hi = range.end.min(at + n);
            if lo < hi {
                // Rows lo..hi of this sequence are its rows lo-at..hi-at.
                let (a, b) = (lo - at, hi - at);
                keys += (a..b).map(|j| p + j + 1).sum::<usize>();
            }
            at += n;
        }
        keys
    }
}

/// Everything that sets a tensor-parallel step's time on one rank.
#[derive(Clone)]
pub struct StepModel {
    pub layers: usize,
    pub hidden: usize,
    pub vocab: usize,
    pub ranks: usize,
    /// Bytes of one activation element on the wire.
    pub act_bytes: usize,
    pub compute: Arc<dyn StageCost>,
    pub comm: CommCost,
    /// Whether the embedding is split over ranks (its rows are then all-reduced, not
    /// overlapped).
    pub embed_reduced: bool,
    /// Share of each all-reduce's time the communication takes from the rank's compute
    /// resource: 0 with a core of its own (or a DMA engine, a NIC), up to 1 when the sum
    /// itself runs on the core the rank computes on.
    pub comm_cpu_share: f64,
}

/// The sub-batchings the engine chooses among: one, and 2..=`max` of either split.
pub fn candidates(max: usize) -> Vec<SubBatching> {
    let mut out = vec![SubBatching::WHOLE];
    for count in 2..=max.max(1) {
        for split in [SplitBy::Sequence, SplitBy::Tokens] {
            out.push(SubBatching { count, split });
        }
    }
    out
}

impl StepModel {
    /// The predicted time of a step of `shape` cut by `spec`.
    pub fn predict(&self, shape: &StepShape, spec: SubBatching) -> StepEstimate {
        let m = shape.rows();
        let row_bytes = self.hidden * self.act_bytes;
        let subs: Vec<SubCost> = split_rows(&shape.seq_rows, spec)
            .iter()
            .map(|r| {
                let reduce = if self.ranks > 1 {
                    self.comm.secs(r.len() * row_bytes)
                } else {
                    0.0
                };
                SubCost {
                    attn: self.compute.attn(r.len(), shape.keys(r)),
                    mlp: self.compute.mlp(r.len()),
                    reduce,
                    reduce_cpu: reduce * self.comm_cpu_share,
                }
            })
            .collect();
        let multi = self.ranks > 1;
        let pre_comm = if multi && self.embed_reduced {
            self.comm.secs(m * row_bytes)
        } else {
            0.0
        };
        // The logits gather: each rank sends its vocabulary slice of every logits row.
        let post_comm = if multi {
            self.comm
                .secs(shape.logit_rows * self.vocab.div_ceil(self.ranks) * self.act_bytes)
        } else {
            0.0
        };
        pipelined(
            self.layers,
            &subs,
            self.compute.embed(m),
            pre_comm,
            self.compute.head(shape.logit_rows),
            post_comm,
        )
    }

    /// The best of `options` for `shape` (the first, normally one sub-batch, unless another
    /// is predicted at least 1% faster; among options giving the same cuts, the first).
    pub fn choose(
        &self,
        shape: &StepShape,
        options: &[SubBatching],
    ) -> (SubBatching, StepEstimate) {
        let first = options.first().copied().unwrap_or(SubBatching::WHOLE);
        let base = self.predict(shape, first);
        let mut best = (first, base);
        let mut seen = vec![split_rows(&shape.seq_rows, first)];
        for &o in options.iter().skip(1) {
            let cuts = split_rows(&shape.seq_rows, o);
            if seen.contains(&cuts) {
                continue;
            }
            seen.push(cuts);
            let e = self.predict(shape, o);
            if e.step < best.1.step && e.step < base.step * 0.99 {
                best = (o, e);
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::{MeasuredProfile, StagePoint};

    fn model(latency_us: f64, gbs: f64) -> StepModel {
        // Linear stages: 10 µs fixed + 1 µs per row each.
        let points = [1, 1024]
            .iter()
            .map(|&r| StagePoint {
                rows: r,
                attn_s: 10e-6 + r as f64 * 1e-6,
                mlp_s: 10e-6 + r as f64 * 1e-6,
            })
            .collect();
        StepModel {
            layers: 4,
            hidden: 512,
            vocab: 1000,
            ranks: 2,
            act_bytes: 4,
            compute: Arc::new(MeasuredProfile {
                points,
                attn_s_per_key: 0.0,
                head: vec![(1, 1e-6), (64, 64e-6)],
                embed_s_per_row: 0.0,
            }),
            comm: CommCost::from_figures(latency_us, gbs),
            embed_reduced: true,
            comm_cpu_share: 0.0,
        }
    }

    #[test]
    fn keys_count_each_rows_context() {
        let s = StepShape {
            seq_rows: vec![2, 1],
            seq_start: vec![0, 9],
            logit_rows: 2,
        };
        assert_eq!(s.keys(&(0..3)), 1 + 2 + 10);
        assert_eq!(s.keys(&(1..3)), 2 + 10);
    }

    #[test]
    fn overlap_is_chosen_only_when_it_pays() {
        let shape = StepShape::prefill(vec![256, 256, 256, 256]);
        // A slow link with transfers about as long as compute: sub-batches pay.
        let slow = model(50.0, 0.5);
        let (spec, e) = slow.choose(&shape, &candidates(4));
        assert!(spec.count > 1, "{spec:?}");
        assert!(e.step < slow.predict(&shape, SubBatching::WHOLE).step);
        // A free link: nothing to hide, so one sub-batch (each split costs fixed overhead).
        let free = model(0.0, 1e9);
        assert_eq!(free.choose(&shape, &candidates(4)).0, SubBatching::WHOLE);
        // Latency-bound reductions of one decode row: splitting only adds latencies.
        let one = StepShape::prefill(vec![1]);
        assert_eq!(slow.choose(&one, &candidates(4)).0, SubBatching::WHOLE);
    }
}
