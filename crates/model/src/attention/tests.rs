//! The model's attention over a whole prepared batch: several sequences with their own
//! cached lengths, new rows and shuffled block tables, f32 and f16 storage, against the f64
//! definition; and bitwise invariance of every row to the batch around it (alone as a
//! decode step, other pool sizes, other sub-batch cuts).

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use tessera_kernels::attn::{KvRows, SEGMENT};

use super::*;
use crate::batch::{BatchMeta, LogitsFor, SeqChunk};
use crate::kv::KvDtype;
use tessera_kernels::attn::partial_len;

struct Setup {
    kv: KvStorage,
    chunks: Vec<SeqChunk>,
    /// Query rows of the whole batch, `q_stride` apart.
    q: Vec<f32>,
    q_stride: usize,
    shape: AttnShape,
}

/// Sequences with `(cached, new)` positions, their K/V (all positions) written at random
/// through shuffled block tables of `block` positions.
#[allow(clippy::too_many_arguments)]
fn setup(
    seqs: &[(usize, usize)],
    hd: usize,
    nkv: usize,
    group: usize,
    block: usize,
    dtype: KvDtype,
    seed: u64,
) -> Setup {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let kv_dim = nkv * hd;
    let need: usize = seqs.iter().map(|&(c, n)| (c + n).div_ceil(block)).sum();
    let num_blocks = need + 3;
    let mut free: Vec<u32> = (0..num_blocks as u32).collect();
    for i in (1..free.len()).rev() {
        free.swap(i, rng.gen_range(0..=i));
    }
    let mut kv = KvStorage::with_dtype(1, kv_dim, block, num_blocks, dtype).unwrap();
    let mut chunks = Vec::new();
    for &(cached, new) in seqs {
        let len = cached + new;
        let table: Vec<u32> = free.drain(..len.div_ceil(block)).collect();
        for p in 0..len {
            let k: Vec<f32> = (0..kv_dim).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let v: Vec<f32> = (0..kv_dim).map(|_| rng.gen_range(-1.0..1.0)).collect();
            kv.write(0, kv.offset(&table, p), &k, &v);
        }
        chunks.push(SeqChunk::new(vec![0; new], cached, table, LogitsFor::None));
    }
    let rows: usize = seqs.iter().map(|s| s.1).sum();
    let q_dim = nkv * group * hd;
    let q_stride = q_dim + 3;
    let q = (0..rows * q_stride)
        .map(|_| rng.gen_range(-1.0..1.0))
        .collect();
    Setup {
        kv,
        chunks,
        q,
        q_stride,
        shape: AttnShape {
            n_heads: nkv * group,
            n_kv_heads: nkv,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            softcap: None,
            window: None,
        },
    }
}

impl Setup {
    fn prepared(&self, chunks: Vec<SeqChunk>) -> PreparedBatch {
        let mut p = PreparedBatch::default();
        p.prepare(&BatchMeta { seqs: chunks }, &self.kv, 1 << 20, 1, 0)
            .unwrap();
        p
    }

    /// Attention of `rows` of `batch` on `units` units, with `q` holding those rows.
    fn run(&self, batch: &PreparedBatch, rows: Range<usize>, q: &[f32], units: usize) -> Vec<f32> {
        let q_dim = self.shape.n_heads * self.shape.head_dim;
        let mut out = vec![f32::NAN; rows.len() * q_dim];
        let pool = ThreadPool::new(units);
        attention(
            &pool,
            batch,
            rows,
            &self.kv,
            0,
            &self.shape,
            q,
            self.q_stride,
            &mut out,
        );
        out
    }

    /// The f64 definition for row `row` of the whole batch (all heads).
    fn reference(&self, batch: &PreparedBatch, row: usize) -> Vec<f64> {
        let (hd, nh) = (self.shape.head_dim, self.shape.n_heads);
        let group = nh / self.shape.n_kv_heads;
        let (kb, vb) = self.kv.layer(0);
        let val = |b: KvRows, i: usize| match b {
            KvRows::F32(x) => x[i] as f64,
            KvRows::F16(x) => x[i].to_f64(),
        };
        let table = batch.table(batch.row_seq[row] as usize);
        let n = batch.positions[row] + 1;
        let keys = self.shape.window.map_or(0, |w| n.saturating_sub(w))..n;
        let mut out = Vec::new();
        for h in 0..nh {
            let q = &self.q[row * self.q_stride + h * hd..][..hd];
            let off = |p: usize| self.kv.offset(table, p) + (h / group) * hd;
            let s: Vec<f64> = keys
                .clone()
                .map(|p| {
                    let s = (0..hd)
                        .map(|d| q[d] as f64 * val(kb, off(p) + d))
                        .sum::<f64>()
                        * self.shape.scale as f64;
                    match self.shape.softcap {
                        Some(c) => (s / c as f64).tanh() * c as f64,
                        None => s,
                    }
                })
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for d in 0..hd {
                let num: f64 = keys
                    .clone()
                    .zip(&e)
                    .map(|(p, e)| e * val(vb, off(p) + d))
                    .sum();
                out.push(num / z);
            }
        }
        out
    }
}

fn seqs() -> impl Strategy<Value = Vec<(usize, usize)>> {
    proptest::collection::vec(
        (
            prop_oneof![
                Just(0usize),
                0usize..80,
                Just(31),
                Just(97),
                Just(SEGMENT - 1),
                SEGMENT..3 * SEGMENT,
            ],
            prop_oneof![Just(1usize), 1usize..20, Just(13)],
        ),
        1..4,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Every row of a mixed batch matches the f64 definition (global, or in a sliding
    /// window, scores soft-capped or not), and is bitwise the same computed alone as a
    /// decode step (its keys split in segments over the units when
    /// they are many), on 1 or 3 units, and in either half of a cut of the rows.
    #[test]
    fn batch_matches_reference_and_each_row_alone(
        seqs in seqs(),
        hd in prop_oneof![Just(1usize), Just(7), Just(64), 2usize..40],
        nkv in 1usize..4,
        group in prop_oneof![Just(1usize), Just(3), 1usize..5],
        block in prop_oneof![Just(1usize), Just(16), 2usize..20],
        f16 in any::<bool>(),
        window in prop_oneof![
            3 => Just(None),
            1 => Just(Some(1usize)),
            1 => (2usize..40).prop_map(Some),
            1 => Just(Some(SEGMENT + 5)),
        ],
        softcap in prop_oneof![3 => Just(None), 1 => Just(Some(0.7f32))],
        cut in 0usize..1000,
        seed in 0u64..1000,
    ) {
        let dtype = if f16 { KvDtype::F16 } else { KvDtype::F32 };
        let mut s = setup(&seqs, hd, nkv, group, block, dtype, seed);
        s.shape.window = window;
        s.shape.softcap = softcap;
        let batch = s.prepared(s.chunks.clone());
        let m = batch.num_rows();
        let q_dim = nkv * group * hd;
        let all = s.run(&batch, 0..m, &s.q, 2);
        for row in 0..m {
            let got = &all[row * q_dim..(row + 1) * q_dim];
            let want = s.reference(&batch, row);
            for (d, (&g, &w)) in got.iter().zip(&want).enumerate() {
                prop_assert!((g as f64 - w).abs() < 1e-5, "row {} element {}: {} vs {}", row, d, g, w);
            }
            // The same row alone, as a decode step of its sequence.
            let seq = batch.row_seq[row] as usize;
            let mut one = s.chunks[seq].clone();
            one.start_pos = batch.positions[row];
            one.tokens = vec![0];
            let alone = s.prepared(vec![one]);
            let q = &s.q[row * s.q_stride..(row + 1) * s.q_stride];
            prop_assert_eq!(s.run(&alone, 0..1, q, 1), got.to_vec(), "row {} alone", row);
        }
        prop_assert_eq!(s.run(&batch, 0..m, &s.q, 1), all.clone());
        prop_assert_eq!(s.run(&batch, 0..m, &s.q, 3), all.clone());
        let c = cut % (m + 1);
        let mut halves = s.run(&batch, 0..c, &s.q[..c * s.q_stride], 2);
        halves.extend(s.run(&batch, c..m, &s.q[c * s.q_stride..], 2));
        prop_assert_eq!(halves, all);
    }
}

#[test]
fn work_is_balanced_by_keys() {
    // One 64-row prefill from position 1000 and 4 decodes: the units get near the same
    // number of keys, and every (row, KV head) pair exactly once.
    let s = setup(
        &[(1000, 64), (5, 1), (9, 1), (0, 1), (40, 1)],
        2,
        3,
        1,
        16,
        KvDtype::F32,
        1,
    );
    let batch = s.prepared(s.chunks.clone());
    let work = assign(&batch, 0..batch.num_rows(), 3, 1, 2, None, 2).per_unit;
    let loads: Vec<usize> = work
        .iter()
        .map(|w| w.iter().map(|i| i.cost).sum())
        .collect();
    // Longest first onto the least loaded unit: the units differ by at most one item.
    let biggest = work.iter().flatten().map(|i| i.cost).max().unwrap();
    let (lo, hi) = (loads[0].min(loads[1]), loads[0].max(loads[1]));
    assert!(
        hi - lo <= biggest,
        "loads {loads:?}, largest item {biggest}"
    );
    assert!(work.iter().flatten().all(|i| i.rows.len() <= TILE_TOKENS));
    let mut seen: Vec<(usize, usize)> = work
        .iter()
        .flatten()
        .flat_map(|i| i.rows.clone().map(move |r| (r, i.kvh)))
        .collect();
    seen.sort();
    let want: Vec<(usize, usize)> = (0..batch.num_rows())
        .flat_map(|r| (0..3).map(move |h| (r, h)))
        .collect();
    assert_eq!(seen, want);
}

#[test]
fn a_long_decode_is_split_into_segments() {
    // One decode at position 1000 (4 segments) with 3 KV heads on 2 units: 12 segment
    // items, 6 per unit, and 3 splits to merge; on 1 unit, 3 whole items.
    let s = setup(&[(1000, 1)], 4, 3, 2, 16, KvDtype::F32, 2);
    let batch = s.prepared(s.chunks.clone());
    let work = assign(&batch, 0..1, 3, 2, 4, None, 2);
    assert_eq!(work.splits.len(), 3);
    assert!(work.splits.iter().all(|sp| sp.segments == 4));
    assert_eq!(work.partial_floats, 3 * 4 * 2 * partial_len(4));
    assert_eq!(
        work.per_unit.iter().map(Vec::len).collect::<Vec<_>>(),
        [6, 6]
    );
    let one = assign(&batch, 0..1, 3, 2, 4, None, 1);
    assert!(one.splits.is_empty());
    assert_eq!(one.per_unit[0].len(), 3);
    // And a prefill chunk is not split: its tiles are many.
    let s = setup(&[(1000, 64)], 4, 3, 2, 16, KvDtype::F32, 3);
    let batch = s.prepared(s.chunks.clone());
    assert!(assign(&batch, 0..64, 3, 2, 4, None, 2).splits.is_empty());
}

#[test]
fn a_window_walks_only_its_segments() {
    // A decode at position 1000 in a window of 300 keys attends keys 701..=1000: segments
    // 2 and 3 only, costing 300 keys; without the window, 4 segments and 1001 keys.
    let s = setup(&[(1000, 1)], 4, 1, 1, 16, KvDtype::F32, 4);
    let batch = s.prepared(s.chunks.clone());
    let work = assign(&batch, 0..1, 1, 1, 4, Some(300), 2);
    assert_eq!(work.splits.len(), 1);
    assert_eq!((work.splits[0].first, work.splits[0].segments), (2, 2));
    let cost: usize = work.per_unit.iter().flatten().map(|i| i.cost).sum();
    assert_eq!(cost, 300);
    let full = assign(&batch, 0..1, 1, 1, 4, None, 2);
    assert_eq!(full.splits[0].segments, 4);
}
