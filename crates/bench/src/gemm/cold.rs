//! Cold rows of the GEMM sweep: a product whose weight comes from DRAM, not from a cache
//! that the previous run warmed, and the bound it is held to, measured beside it.
//!
//! The weight is copied until the copies together exceed the last-level cache twice, and a
//! pass runs the product once over each copy in turn ([`tessera_engine::cold_weights`], as
//! `tessera tune` times small M). The bound is a plain read of the same bytes the kernel
//! streams (the repacked records where the model repacks them), split over the same
//! compute units. Passes of the product and of the read alternate, so a slow spell
//! of the host's memory falls on both. A single DRAM figure taken at the start of a sweep
//! that lasts minutes would let the host's drift decide the fraction instead.

pub(super) use tessera_engine::cold_weights::cold_copies;
use tessera_engine::cold_weights::product_pass;
use tessera_kernels::gemm::GemmWeight;
use tessera_kernels::plan::Plan;
use tessera_runtime::{split_range, ThreadPool};

use crate::stats::{gflops, median};

/// The largest M measured cold (where the weights' streaming bounds the product).
pub const COLD_MAX_M: usize = 4;

/// The largest M whose oracle is also judged cold ([`planned_over_oracle`]): as a model's
/// step reads its weights (see [`tessera_engine::cold_weights`]).
pub const COLD_ORACLE_MAX_M: usize = tessera_engine::cold_weights::STEP_COLD_MAX_M;

/// Alternating passes of the product and of the read, or of the planned plan and the
/// oracle (medians of each). Nine, not five: on a host whose DRAM read swings 28-56 GB/s
/// within one sweep, five passes judged 4 × 576 × 576 f32 at 0.89 of its oracle cold where
/// three direct interleaved timings put it at 1.00-1.06.
const PASSES: usize = 9;

/// One cold measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cold {
    /// GFLOP/s of the product with its weight read from DRAM.
    pub gflops: f64,
    /// GB/s of a plain read of the same bytes by the same units, in the same passes.
    pub read_gbs: f64,
    /// GFLOP/s the product would reach if it took as long as that read: the bound.
    pub bound_gflops: f64,
}

impl Cold {
    /// The product's throughput as a fraction of the bound.
    pub fn frac_bound(&self) -> f64 {
        self.gflops / self.bound_gflops
    }
}

/// Runs `plan` once over each of `copies` in turn, alternating with a plain read of the
/// copies' bytes; the median of [`PASSES`] passes of each, after one untimed pass of each
/// (which warms the code and the pool and evicts the cache).
#[allow(clippy::too_many_arguments)]
pub(super) fn measure_cold(
    pool: &ThreadPool,
    plan: &Plan,
    x: &[f32],
    m: usize,
    k: usize,
    n: usize,
    copies: &[GemmWeight],
    out: &mut [f32],
) -> Cold {
    let streams: Vec<Vec<&[u8]>> = copies.iter().map(streamed).collect();
    let bytes: usize = streams.iter().flatten().map(|s| s.len()).sum();
    let mut product = || product_pass(pool, plan, x, m, copies, out);
    let read = || {
        let t = std::time::Instant::now();
        for s in &streams {
            read_split(pool, s);
        }
        t.elapsed().as_secs_f64()
    };
    product();
    read();
    let (mut tp, mut tr) = (Vec::new(), Vec::new());
    for _ in 0..PASSES {
        tp.push(product());
        tr.push(read());
    }
    let copies = copies.len() as f64;
    Cold {
        gflops: gflops(m, k, n, median(&tp) / copies),
        read_gbs: bytes as f64 / median(&tr) / 1e9,
        bound_gflops: gflops(m, k, n, median(&tr) / copies),
    }
}

/// The planned plan's throughput over the oracle's with the weights from DRAM: each run once
/// over every copy in turn, the two alternating, medians of [`PASSES`] passes each after one
/// untimed pass of each (as [`measure_cold`]).
pub(super) fn planned_over_oracle(
    pool: &ThreadPool,
    planned: &Plan,
    oracle: &Plan,
    x: &[f32],
    m: usize,
    copies: &[GemmWeight],
    out: &mut [f32],
) -> f64 {
    let mut pass = |plan: &Plan| product_pass(pool, plan, x, m, copies, out);
    pass(planned);
    pass(oracle);
    let (mut tp, mut to) = (Vec::new(), Vec::new());
    for _ in 0..PASSES {
        tp.push(pass(planned));
        to.push(pass(oracle));
    }
    median(&to) / median(&tp)
}

/// The bytes a product streams from `w`: its repacked records where it has them (the
/// stored rows' pages are then released), else its stored tensors.
fn streamed(w: &GemmWeight) -> Vec<&[u8]> {
    match &w.packed {
        Some(p) => vec![&p.data[..]],
        None => w.parts.iter().map(|p| p.bytes.as_slice()).collect(),
    }
}

/// Reads `slices` once, each split evenly over the pool's units (as a product splits its
/// weight rows over N), each unit's part as [`STREAMS`] interleaved streams.
fn read_split(pool: &ThreadPool, slices: &[&[u8]]) {
    let units = pool.units();
    pool.run(|u| {
        for s in slices {
            std::hint::black_box(sum_streams(&s[split_range(s.len(), units, u)]));
        }
    });
}

/// Sequential streams one unit reads at once. A single stream leaves most of the memory
/// system idle: the hardware prefetchers follow a stream one 4 KiB page at a time, so
/// reading as the GEMV does (one stream per weight row of its tile, 16 of them) keeps more
/// misses in flight. Measured on an Emerald Rapids Xeon, 2 units, 512 MiB (`time_reads`):
/// 16 streams 20.6 GB/s against one 18.5 (medians of 5 alternating).
const STREAMS: usize = 16;

/// [`sum_words`] over `b` cut into [`STREAMS`] equal parts read 64 bytes at a time in
/// turn (then the rest).
fn sum_streams(b: &[u8]) -> u64 {
    let part = b.len() / STREAMS / 64 * 64;
    let mut sum = sum_words(&b[STREAMS * part..]);
    if part == 0 {
        return sum;
    }
    let parts: [&[u8]; STREAMS] = std::array::from_fn(|i| &b[i * part..(i + 1) * part]);
    for at in (0..part).step_by(64) {
        for p in &parts {
            sum = sum.wrapping_add(sum_words(&p[at..at + 64]));
        }
    }
    sum
}

/// A wrapping sum of `b`'s whole 8-byte words (a last partial word ignored): every byte
/// is loaded once, and the sum keeps the loads from being optimized away.
fn sum_words(b: &[u8]) -> u64 {
    let word = |w: &[u8]| u64::from_ne_bytes(w.try_into().expect("8 bytes"));
    let mut acc = [0u64; 8];
    let chunks = b.chunks_exact(64);
    let rest = chunks.remainder();
    for c in chunks {
        for (i, a) in acc.iter_mut().enumerate() {
            *a = a.wrapping_add(word(&c[8 * i..8 * i + 8]));
        }
    }
    let sum = acc.iter().fold(0u64, |s, &a| s.wrapping_add(a));
    rest.chunks_exact(8)
        .fold(sum, |s, w| s.wrapping_add(word(w)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_reads_sum_every_whole_word_once() {
        // (Lengths that are multiples of 8, so the streams' parts and the rest hold whole
        // words; a last partial word is ignored, as `sum_words` says.)
        for len in [
            0,
            8,
            56,
            64,
            1024,
            16 * 64,
            16 * 64 + 8,
            5000 * 8,
            12_345 * 8,
        ] {
            let b: Vec<u8> = (0..len).map(|i| (i * 7 % 253) as u8).collect();
            assert_eq!(sum_words(&b), sum_words_exact(&b), "len {len}");
            assert_eq!(sum_streams(&b), sum_words_exact(&b), "len {len}");
        }
        assert_eq!(sum_words(&[1u8; 7]), 0);
    }

    /// One stream against [`STREAMS`] per unit over 512 MiB, 2 units, alternating
    /// (`--ignored --nocapture time_reads`; the figure [`STREAMS`]' comment quotes).
    #[test]
    #[ignore]
    fn time_reads() {
        let pool = ThreadPool::new(2);
        let b = vec![1u8; 512 << 20];
        let gbs = |f: &(dyn Fn(&[u8]) -> u64 + Sync)| {
            let t = std::time::Instant::now();
            pool.run(|u| {
                std::hint::black_box(f(&b[split_range(b.len(), 2, u)]));
            });
            b.len() as f64 / t.elapsed().as_secs_f64() / 1e9
        };
        for _ in 0..5 {
            let (one, many) = (gbs(&sum_words), gbs(&sum_streams));
            println!("one stream {one:.1} GB/s, {STREAMS} streams {many:.1} GB/s");
        }
    }

    /// Every whole word, one at a time.
    fn sum_words_exact(b: &[u8]) -> u64 {
        b.chunks_exact(8).fold(0u64, |s, w| {
            s.wrapping_add(u64::from_ne_bytes(w.try_into().unwrap()))
        })
    }
}
