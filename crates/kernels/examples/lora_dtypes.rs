//! Micro-timing of `lora_apply` with factors held in f32, f16 and bf16: 16 rank-16 adapters
//! (one task each) at SmolLM2-135M's shapes, 1 and 16 rows per task, on one unit.
//!
//! "hot": the same 16 adapters every call (they stay in cache); "cold": 30 sets of them
//! (one per layer, as a step walks the layers) taken in turn, so the factors come from
//! memory as they do when serving. Prints the median µs per call of each element type and
//! its ratio to f32.
//!
//! ```sh
//! cargo run --release -p tessera-kernels --example lora_dtypes
//! ```

use std::time::Instant;

use half::{bf16, f16};
use tessera_kernels::lora::{lora_apply, plan_lora, FactorView, LoraTask};
use tessera_runtime::ThreadPool;

const ADAPTERS: usize = 16;
const RANK: usize = 16;
const LAYERS: usize = 30;

/// One adapter's factors in the three element types (the same values).
struct Held {
    a: (Vec<f32>, Vec<f16>, Vec<bf16>),
    b: (Vec<f32>, Vec<f16>, Vec<bf16>),
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            // Rounded to bf16 so all three types hold the same values.
            bf16::from_f32((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5).to_f32()
        })
        .collect()
}

fn three(v: Vec<f32>) -> (Vec<f32>, Vec<f16>, Vec<bf16>) {
    let h = v.iter().map(|&x| f16::from_f32(x)).collect();
    let b = v.iter().map(|&x| bf16::from_f32(x)).collect();
    (v, h, b)
}

fn view(v: &(Vec<f32>, Vec<f16>, Vec<bf16>), which: usize) -> FactorView<'_> {
    match which {
        0 => FactorView::F32(&v.0),
        1 => FactorView::F16(&v.1),
        _ => FactorView::BF16(&v.2),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let pool = ThreadPool::new(1);
    println!("isa {}", tessera_kernels::Isa::active().name());
    println!("k     n     rows/task  set   f32 µs   f16 µs (×)      bf16 µs (×)");
    for (k, n) in [(576, 576), (576, 1536), (1536, 576)] {
        let sets: Vec<Vec<Held>> = (0..LAYERS)
            .map(|l| {
                (0..ADAPTERS)
                    .map(|i| {
                        let seed = (l * ADAPTERS + i) as u64;
                        Held {
                            a: three(values(RANK * k, 2 * seed)),
                            b: three(values(RANK * n, 2 * seed + 1)),
                        }
                    })
                    .collect()
            })
            .collect();
        for rows in [1, 16] {
            let m = rows * ADAPTERS;
            let x = values(m * k, 7);
            let mut out = vec![0f32; m * n];
            let mut scratch = Vec::new();
            for (set_name, n_sets) in [("hot", 1), ("cold", LAYERS)] {
                let tasks = |l: usize, which: usize| -> Vec<LoraTask> {
                    (0..ADAPTERS)
                        .map(|i| LoraTask {
                            rows: i * rows..(i + 1) * rows,
                            rank: RANK,
                            a: view(&sets[l][i].a, which),
                            b_t: view(&sets[l][i].b, which),
                            scale: 2.0,
                            col0: 0,
                            n,
                        })
                        .collect()
                };
                let all: Vec<[Vec<LoraTask>; 3]> = (0..n_sets)
                    .map(|l| [0, 1, 2].map(|w| tasks(l, w)))
                    .collect();
                let plan = plan_lora(&all[0][0], k, 1);
                // Bitwise the same result from each element type (same values).
                let results: Vec<Vec<f32>> = (0..3)
                    .map(|w| {
                        let mut o = vec![0f32; m * n];
                        lora_apply(&pool, &plan, &x, k, &all[0][w], &mut o, n, &mut scratch);
                        o
                    })
                    .collect();
                assert!(results[1] == results[0] && results[2] == results[0]);
                let calls = (200_000_000 / (m * RANK * (k + n))).clamp(30, 3000);
                let mut times = [vec![], vec![], vec![]];
                for rep in 0..15 {
                    for w in [rep % 3, (rep + 1) % 3, (rep + 2) % 3] {
                        let t0 = Instant::now();
                        for c in 0..calls {
                            let tasks = &all[c % n_sets][w];
                            lora_apply(&pool, &plan, &x, k, tasks, &mut out, n, &mut scratch);
                        }
                        times[w].push(t0.elapsed().as_secs_f64() * 1e6 / calls as f64);
                    }
                }
                let [f, h, b] = times.map(median);
                println!(
                    "{k:<5} {n:<5} {rows:<10} {set_name:<5} {f:>7.1}  {h:>7.1} ({:.2})  {b:>7.1} ({:.2})",
                    h / f,
                    b / f
                );
            }
        }
    }
}
