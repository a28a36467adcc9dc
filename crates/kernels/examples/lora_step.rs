//! One decode step's LoRA work against the memory floor: 16 rank-16 all-module adapters
//! (q, k, v, o, gate, up, down) at SmolLM2-135M's shapes over its 30 layers, one row per
//! adapter (16 sequences, each its own adapter), factors in bf16 (~156 MB a step, more than
//! the last-level cache holds, so they come from memory as when serving).
//!
//! Per step, each layer's four linears call `lora_apply` in order (q/k/v and gate/up as
//! fused linears with a task per part) on a pool of `--units` (default: all cores). The
//! floor reads the same bytes in the same order on the same pool, doing nothing else. Prints
//! the median ms per step of each, the effective GB/s, and the kernel's time over the floor.
//!
//! ```sh
//! cargo run --release -p tessera-kernels --example lora_step [-- UNITS [STEPS]]
//! ```

use std::time::Instant;

use half::bf16;
use tessera_kernels::lora::{lora_apply, plan_lora, FactorView, LoraTask};
use tessera_runtime::{split_range, ThreadPool};

const ADAPTERS: usize = 16;
const RANK: usize = 16;
const LAYERS: usize = 30;
const HIDDEN: usize = 576;
const KV: usize = 192;
const FFN: usize = 1536;

/// One linear: its input width and its parts' output widths (fused parts side by side).
const LINEARS: [(usize, &[usize]); 4] = [
    (HIDDEN, &[HIDDEN, KV, KV]),
    (HIDDEN, &[HIDDEN]),
    (HIDDEN, &[FFN, FFN]),
    (FFN, &[HIDDEN]),
];

fn values(n: usize, seed: u64) -> Vec<bf16> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            bf16::from_f32(((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1)
        })
        .collect()
}

/// A part's factors: A (`rank × k`) and Bᵀ (`rank × n`).
type Factors = (Vec<bf16>, Vec<bf16>);

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Sums `v`'s bits as u64 words (a read the compiler can't drop; no arithmetic to wait on).
fn touch(v: &[bf16]) -> u64 {
    // SAFETY: bf16 is 2 plain bytes; the u64 view covers whole words inside the slice.
    let (_, words, _) = unsafe { v.align_to::<u64>() };
    words.iter().fold(0u64, |a, &w| a.wrapping_add(w))
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let units = args
        .first()
        .copied()
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let steps = args.get(1).copied().unwrap_or(15);
    let pool = ThreadPool::new(units);
    // factors[layer][linear][adapter][part]
    let factors: Vec<Vec<Vec<Vec<Factors>>>> = (0..LAYERS)
        .map(|l| {
            LINEARS
                .iter()
                .enumerate()
                .map(|(li, &(k, parts))| {
                    (0..ADAPTERS)
                        .map(|ad| {
                            parts
                                .iter()
                                .enumerate()
                                .map(|(p, &n)| {
                                    let seed = ((l * 4 + li) * ADAPTERS + ad) * 4 + p;
                                    let s = 2 * seed as u64;
                                    (values(RANK * k, s), values(RANK * n, s + 1))
                                })
                                .collect()
                        })
                        .collect()
                })
                .collect()
        })
        .collect();
    let bytes: usize = factors
        .iter()
        .flatten()
        .flatten()
        .flatten()
        .map(|(a, b)| 2 * (a.len() + b.len()))
        .sum();
    let x: Vec<f32> = values(ADAPTERS * FFN, 7)
        .iter()
        .map(|v| v.to_f32())
        .collect();
    let mut outs: Vec<Vec<f32>> = LINEARS
        .iter()
        .map(|(_, p)| vec![0f32; ADAPTERS * p.iter().sum::<usize>()])
        .collect();
    let mut scratch = Vec::new();
    let mut sink = 0u64;
    let mut kernel = vec![];
    let mut floor = vec![];
    println!(
        "isa {}, {units} units, {:.1} MB of bf16 factors a step",
        tessera_kernels::Isa::active().name(),
        bytes as f64 / 1e6
    );
    for rep in 0..steps + 1 {
        let t0 = Instant::now();
        for layer in &factors {
            for (li, (&(k, parts), adapters)) in LINEARS.iter().zip(layer).enumerate() {
                let n_out: usize = parts.iter().sum();
                let mut tasks = Vec::new();
                for (ad, fs) in adapters.iter().enumerate() {
                    let mut col0 = 0;
                    for (&n, (a, b)) in parts.iter().zip(fs) {
                        tasks.push(LoraTask {
                            rows: ad..ad + 1,
                            rank: RANK,
                            a: FactorView::BF16(a),
                            b_t: FactorView::BF16(b),
                            scale: 2.0,
                            col0,
                            n,
                        });
                        col0 += n;
                    }
                }
                let plan = plan_lora(&tasks, k, pool.units());
                let x = &x[..ADAPTERS * k];
                lora_apply(
                    &pool,
                    &plan,
                    x,
                    k,
                    &tasks,
                    &mut outs[li],
                    n_out,
                    &mut scratch,
                );
            }
        }
        let t_kernel = t0.elapsed().as_secs_f64() * 1e3;
        let t0 = Instant::now();
        for layer in &factors {
            for adapters in layer {
                let all: Vec<&Factors> = adapters.iter().flatten().collect();
                let sums: Vec<std::sync::atomic::AtomicU64> =
                    (0..units).map(|_| Default::default()).collect();
                pool.run(|u| {
                    let mut s = 0u64;
                    for (a, b) in &all[split_range(all.len(), units, u)] {
                        s = s.wrapping_add(touch(a)).wrapping_add(touch(b));
                    }
                    sums[u].store(s, std::sync::atomic::Ordering::Relaxed);
                });
                sink ^= sums
                    .iter()
                    .map(|s| s.load(std::sync::atomic::Ordering::Relaxed))
                    .sum::<u64>();
            }
        }
        let t_floor = t0.elapsed().as_secs_f64() * 1e3;
        if rep > 0 {
            kernel.push(t_kernel);
            floor.push(t_floor);
        }
    }
    let (k, f) = (median(kernel), median(floor));
    let gbs = |ms: f64| bytes as f64 / ms / 1e6;
    println!("kernel: {k:.2} ms a step ({:.1} GB/s)", gbs(k));
    println!(
        "floor:  {f:.2} ms a step ({:.1} GB/s; reading the same bytes)",
        gbs(f)
    );
    println!("kernel / floor: {:.2}x   (sink {:x})", k / f, sink & 0xf);
}
