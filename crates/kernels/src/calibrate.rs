//! Measures the machine figures the cost model and the benchmarks need: peak FMA
//! throughput, streaming read bandwidth, pool dispatch overhead, and the throughput of each
//! kernel family on cache-resident data. Each figure is the best of a few short runs (the
//! machine is noisy; the best run is the least disturbed one).

use std::time::Instant;

use tessera_core::tensor::quantize_row;
use tessera_core::{DType, TensorBytes, WeightTensor};
use tessera_runtime::{split_range, ThreadPool};

use crate::cost::MachineProfile;
use crate::gemm::{execute, GemmWeight};
use crate::isa::Isa;
use crate::plan::{F32Kernel, KernelFamily, ParallelPlan, ParallelSplit, Plan, Precision};
use crate::planner::{cpu_model, Planner, ShapeKey};

fn best_of<F: FnMut() -> f64>(runs: usize, mut f: F) -> f64 {
    (0..runs).map(|_| f()).fold(f64::INFINITY, f64::min)
}

/// Peak f32 FMA throughput of all units together, GFLOP/s, at the widest vectors the exact
/// kernels use in this process: 512 bits where the AVX-512 exact kernels run, else 256
/// (0 without FMA hardware).
pub fn peak_fma_gflops(pool: &ThreadPool) -> f64 {
    if Isa::active() != Isa::Avx2Fma {
        return 0.0;
    }
    let wide = crate::isa::avx512_exact();
    const ITERS: usize = 2_000_000;
    let secs = best_of(3, || {
        let t = Instant::now();
        pool.run(|_| {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: Avx2Fma checked above; `avx512_exact` only holds where the CPU has
            // AVX-512F.
            unsafe {
                if wide {
                    std::hint::black_box(fma_loop_512(ITERS));
                } else {
                    std::hint::black_box(fma_loop(ITERS));
                }
            }
        });
        t.elapsed().as_secs_f64()
    });
    // 10 chains × 8 (or 16) lanes × 2 FLOP per iteration per unit.
    let lanes = if wide { 16 } else { 8 };
    (ITERS * 10 * 2 * lanes * pool.units()) as f64 / secs / 1e9
}

/// [`fma_loop`] on 512-bit vectors.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma_loop_512(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    let a = _mm512_set1_ps(0.999_999);
    let b = _mm512_set1_ps(1e-7);
    let (mut v0, mut v1, mut v2, mut v3, mut v4) = (
        _mm512_set1_ps(1.0),
        _mm512_set1_ps(1.1),
        _mm512_set1_ps(1.2),
        _mm512_set1_ps(1.3),
        _mm512_set1_ps(1.4),
    );
    let (mut v5, mut v6, mut v7, mut v8, mut v9) = (
        _mm512_set1_ps(1.5),
        _mm512_set1_ps(1.6),
        _mm512_set1_ps(1.7),
        _mm512_set1_ps(1.8),
        _mm512_set1_ps(1.9),
    );
    for _ in 0..iters {
        v0 = _mm512_fmadd_ps(v0, a, b);
        v1 = _mm512_fmadd_ps(v1, a, b);
        v2 = _mm512_fmadd_ps(v2, a, b);
        v3 = _mm512_fmadd_ps(v3, a, b);
        v4 = _mm512_fmadd_ps(v4, a, b);
        v5 = _mm512_fmadd_ps(v5, a, b);
        v6 = _mm512_fmadd_ps(v6, a, b);
        v7 = _mm512_fmadd_ps(v7, a, b);
        v8 = _mm512_fmadd_ps(v8, a, b);
        v9 = _mm512_fmadd_ps(v9, a, b);
    }
    let s = [v0, v1, v2, v3, v4, v5, v6, v7, v8, v9];
    s.iter().map(|v| _mm512_reduce_add_ps(*v)).sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_loop(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    let a = _mm256_set1_ps(0.999_999);
    let b = _mm256_set1_ps(1e-7);
    // Ten independent chains in named registers (an array may be kept in memory, which adds
    // store-forwarding latency to every chain).
    let (mut v0, mut v1, mut v2, mut v3, mut v4) = (
        _mm256_set1_ps(1.0),
        _mm256_set1_ps(1.1),
        _mm256_set1_ps(1.2),
        _mm256_set1_ps(1.3),
        _mm256_set1_ps(1.4),
    );
    let (mut v5, mut v6, mut v7, mut v8, mut v9) = (
        _mm256_set1_ps(1.5),
        _mm256_set1_ps(1.6),
        _mm256_set1_ps(1.7),
        _mm256_set1_ps(1.8),
        _mm256_set1_ps(1.9),
    );
    for _ in 0..iters {
        v0 = _mm256_fmadd_ps(v0, a, b);
        v1 = _mm256_fmadd_ps(v1, a, b);
        v2 = _mm256_fmadd_ps(v2, a, b);
        v3 = _mm256_fmadd_ps(v3, a, b);
        v4 = _mm256_fmadd_ps(v4, a, b);
        v5 = _mm256_fmadd_ps(v5, a, b);
        v6 = _mm256_fmadd_ps(v6, a, b);
        v7 = _mm256_fmadd_ps(v7, a, b);
        v8 = _mm256_fmadd_ps(v8, a, b);
        v9 = _mm256_fmadd_ps(v9, a, b);
    }
    let s = [v0, v1, v2, v3, v4, v5, v6, v7, v8, v9];
    s.iter().map(|v| _mm256_cvtss_f32(*v)).sum()
}

/// Streaming read bandwidth of all units over a buffer much larger than the caches (256 MiB,
/// or twice the last-level cache up to 2 GiB), GB/s.
pub fn dram_read_gbs(pool: &ThreadPool) -> f64 {
    let bytes = (2 * last_level_cache_bytes()).clamp(256 << 20, 2 << 30);
    let n = bytes / 4;
    let buf = vec![1.0f32; n];
    let units = pool.units();
    let secs = best_of(3, || {
        let t = Instant::now();
        pool.run(|u| {
            let r = split_range(n, units, u);
            std::hint::black_box(sum_f32(&buf[r]));
        });
        t.elapsed().as_secs_f64()
    });
    (n * 4) as f64 / secs / 1e9
}

fn sum_f32(x: &[f32]) -> f32 {
    let mut acc = [0f32; 32];
    for c in x.chunks_exact(32) {
        for i in 0..32 {
            acc[i] += c[i];
        }
    }
    acc.iter().sum()
}

/// Microseconds per parallel operation (dispatch and join of an empty job).
pub fn dispatch_us(pool: &ThreadPool) -> f64 {
    let n = 5000;
    best_of(3, || {
        let t = Instant::now();
        for _ in 0..n {
            pool.run(|u| {
                std::hint::black_box(u);
            });
        }
        t.elapsed().as_secs_f64() * 1e6 / n as f64
    })
}

fn weight(dtype: DType, n: usize, k: usize, repack: bool) -> GemmWeight {
    let bytes: Vec<u8> = (0..n)
        .flat_map(|r| {
            let row: Vec<f32> = (0..k)
                .map(|i| ((r * 31 + i * 17) % 97) as f32 / 97.0 - 0.5)
                .collect();
            quantize_row(dtype, &row)
        })
        .collect();
    GemmWeight::new(
        WeightTensor::new("calibration", dtype, vec![n, k], TensorBytes::owned(&bytes)).unwrap(),
        repack,
    )
}

/// GFLOP/s of one unit running the family's usual tile on cache-resident data.
fn family_gflops(family: KernelFamily) -> f64 {
    match family {
        KernelFamily::F32Dot => tile_gflops(family, F32Kernel::Panel, 3, 4),
        KernelFamily::Q8Interleaved => tile_gflops(family, F32Kernel::Panel, 2, 8),
        KernelFamily::QkDot => tile_gflops(family, F32Kernel::Panel, 2, 8),
    }
}

/// The (family, kernel) pairs whose tiles the profile rates.
const RATED: [(KernelFamily, F32Kernel); 5] = [
    (KernelFamily::F32Dot, F32Kernel::Panel),
    (KernelFamily::F32Dot, F32Kernel::Stream),
    (KernelFamily::F32Dot, F32Kernel::Packed),
    (KernelFamily::Q8Interleaved, F32Kernel::Panel),
    (KernelFamily::QkDot, F32Kernel::Panel),
];

/// Measured throughput of every register tile of every kernel.
pub fn tile_rates() -> Vec<crate::cost::TileRate> {
    let mut v = vec![];
    for (family, kernel) in RATED {
        let tiles = match (family, kernel) {
            // Measured on Q4_1, so on the repack where that is what runs.
            (KernelFamily::F32Dot, F32Kernel::Stream) => crate::exact::stream_tiles(DType::Q4_1),
            (KernelFamily::F32Dot, F32Kernel::Packed) => crate::exact::packed_tiles(),
            (KernelFamily::F32Dot, _) => kernel.tiles(),
            (KernelFamily::Q8Interleaved | KernelFamily::QkDot, _) => family.tiles(),
        };
        for &(mr, nr) in tiles {
            v.push(crate::cost::TileRate {
                family: crate::cost::tile_rate_name(family, kernel, nr).into(),
                mr,
                nr,
                gflops: tile_gflops(family, kernel, mr, nr),
            });
        }
    }
    // The stream kernel's rate depends on what it decodes in registers: rated again on the
    // other weight formats whose decode differs most from Q4_1's.
    for dtype in STREAM_RATED {
        for &(mr, nr) in crate::exact::stream_tiles(dtype) {
            v.push(crate::cost::TileRate {
                family: crate::cost::stream_rate_name(dtype, nr),
                mr,
                nr,
                gflops: tile_gflops_on(KernelFamily::F32Dot, F32Kernel::Stream, dtype, mr, nr),
            });
        }
    }
    v
}

/// Weight formats the stream kernel is rated on besides Q4_1.
pub const STREAM_RATED: [DType; 2] = [DType::F32, DType::Q8_0];

/// GFLOP/s of one unit running an `mr × nr` tile of a kernel on cache-resident data (f32
/// weights for the panel and packed kernels, Q4_1 for the stream kernel, whose rate then
/// includes the in-register dequantization, and for the integer-dot family).
pub fn tile_gflops(family: KernelFamily, kernel: F32Kernel, mr: usize, nr: usize) -> f64 {
    let dtype = match (family, kernel) {
        (KernelFamily::F32Dot, F32Kernel::Stream) => DType::Q4_1,
        (KernelFamily::F32Dot, _) => DType::F32,
        (KernelFamily::Q8Interleaved, _) => DType::Q4_1,
        (KernelFamily::QkDot, _) => DType::Q4_K,
    };
    tile_gflops_on(family, kernel, dtype, mr, nr)
}

/// [`tile_gflops`] on weights of `dtype`.
pub fn tile_gflops_on(
    family: KernelFamily,
    kernel: F32Kernel,
    dtype: DType,
    mr: usize,
    nr: usize,
) -> f64 {
    // The packed kernel runs at large M: enough rows to amortize its panel as it would, and
    // enough weight rows that a tile runs over many groups of its panel.
    let (m, k, n) = if kernel == F32Kernel::Packed {
        (96, 512, 256)
    } else {
        (48, 512, 64)
    };
    let pool = ThreadPool::new(1);
    let precision = match family {
        KernelFamily::F32Dot => Precision::Exact,
        KernelFamily::Q8Interleaved | KernelFamily::QkDot => Precision::Fast,
    };
    // As the model loads them (the exact stream kernel reads the repack wherever AVX2 runs).
    let w = weight(dtype, n, k, crate::wants_repack(precision));
    let x: Vec<f32> = (0..m * k).map(|i| (i % 13) as f32 * 0.1 - 0.6).collect();
    let mut out = vec![0f32; m * n];
    // A base plan to override: from the nearest built-in profile, since this may run while
    // this class's own profile is being measured (`cost::measured`).
    let planner = Planner::new(
        MachineProfile::nearest_builtin(&cpu_model()),
        crate::planner::TuningCache::default(),
    );
    let mut plan: Plan = planner.candidates(&ShapeKey::new(m, k, n, dtype, precision, 1))[0];
    plan.tile.family = family;
    plan.tile.kernel = kernel;
    plan.tile.mr = mr;
    plan.tile.nr = nr;
    plan.tile.mc = m;
    plan.tile.nc = if kernel == F32Kernel::Packed { 128 } else { n };
    plan.tile.kc = k;
    plan.parallel = ParallelPlan {
        split: ParallelSplit::N,
        units: 1,
    };
    let reps = if m > 48 { 12 } else { 50 };
    let secs = best_of(3, || {
        let t = Instant::now();
        for _ in 0..reps {
            execute(&pool, &plan, &x, m, &w, None, &mut out);
        }
        t.elapsed().as_secs_f64() / reps as f64
    });
    2.0 * (m * k * n) as f64 / secs / 1e9
}

/// Elements per ns of Q4_1 dequantization and of activation quantization, one unit.
fn convert_rates() -> (f64, f64) {
    let k = 4096;
    let w = weight(DType::Q4_1, 8, k, false);
    let mut row = vec![0f32; k];
    let reps = 200;
    let deq = best_of(3, || {
        let t = Instant::now();
        for r in 0..reps {
            let i = r % 8;
            match Isa::active() {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: Avx2Fma means AVX2, FMA and F16C are present; sizes match.
                Isa::Avx2Fma => unsafe {
                    crate::x86::avx2::dequantize(DType::Q4_1, w.row(i), &mut row)
                },
                _ => w.parts[0].dequantize_row(i, &mut row),
            }
            std::hint::black_box(&row);
        }
        t.elapsed().as_secs_f64()
    });
    let x: Vec<f32> = (0..16 * k).map(|i| (i % 29) as f32 * 0.01).collect();
    let q = best_of(3, || {
        let t = Instant::now();
        for _ in 0..10 {
            std::hint::black_box(crate::quant_acts::QuantizedActs::quantize(&x, 16, k));
        }
        t.elapsed().as_secs_f64()
    });
    (
        (reps * k) as f64 / deq / 1e9,
        (10 * 16 * k) as f64 / q / 1e9,
    )
}

/// Bytes of the last-level cache (L3; 32 MiB when the system does not say).
pub fn last_level_cache_bytes() -> usize {
    cache_bytes("L3", 32 << 20)
}

/// The size of the L2 or L3 cache sysfs reports, else `default`.
pub(crate) fn cache_bytes(level: &str, default: usize) -> usize {
    // sysfs: index0 is L1 data, index2 is L2, index3 is L3 on x86 Linux.
    let idx = match level {
        "L1" => 0,
        "L2" => 2,
        _ => 3,
    };
    std::fs::read_to_string(format!(
        "/sys/devices/system/cpu/cpu0/cache/index{idx}/size"
    ))
    .ok()
    .and_then(|s| {
        let s = s.trim();
        let (num, mul) = match s.strip_suffix('K') {
            Some(n) => (n, 1024),
            None => match s.strip_suffix('M') {
                Some(n) => (n, 1 << 20),
                None => (s, 1),
            },
        };
        num.parse::<usize>().ok().map(|v| v * mul)
    })
    .unwrap_or(default)
}

/// Measures a full profile (about two seconds). `progress` names each step as it starts.
/// What a built-in class profile (`cost::profiles`) starts from, through the
/// `print_profile` test, and what a CPU class without one is planned with
/// (`cost::measured`). Its tile rates come from small products and can mis-rank kernels
/// against whole products, so no planner ranks with them directly: a measured class
/// profile keeps the built-in table's relative rates within each kernel family, at the
/// measured level (`cost::measured::anchor`).
pub fn measure_profile(pool: &ThreadPool, progress: &mut dyn FnMut(&str)) -> MachineProfile {
    let mut p = MachineProfile::nearest_builtin(&cpu_model());
    progress("f32 dot tiles");
    p.f32_gflops_per_core = family_gflops(KernelFamily::F32Dot);
    progress("integer dot tiles");
    p.q8_gflops_per_core = family_gflops(KernelFamily::Q8Interleaved);
    progress("memory bandwidth");
    p.dram_gbs = dram_read_gbs(pool);
    progress("register tiles");
    p.tiles = tile_rates();
    progress("dispatch overhead");
    p.dispatch_us = dispatch_us(pool);
    progress("dequantization");
    let (deq, q) = convert_rates();
    p.dequant_elems_per_ns = deq;
    p.quant_elems_per_ns = q;
    p.l1_bytes = cache_bytes("L1", p.l1_bytes);
    p.l2_bytes = cache_bytes("L2", p.l2_bytes);
    p.l3_bytes = cache_bytes("L3", p.l3_bytes);
    p
}

#[cfg(test)]
mod tests {
    /// Prints every tile's rate on this machine (`cargo test --release -p tessera-kernels
    /// -- --ignored --nocapture print_tile_rates`).
    #[test]
    #[ignore]
    fn print_peak() {
        for u in [1, 2] {
            let pool = tessera_runtime::ThreadPool::new(u);
            let peaks: Vec<String> = (0..5)
                .map(|_| format!("{:.1}", super::peak_fma_gflops(&pool)))
                .collect();
            println!(
                "units {u}: peak FMA {} GFLOP/s; DRAM {:.1} GB/s",
                peaks.join(" "),
                super::dram_read_gbs(&pool)
            );
        }
    }

    /// Prints this machine's whole measured profile as JSON (`cargo test --release -p
    /// tessera-kernels -- --ignored --nocapture print_profile`): what a built-in default
    /// table for a CPU class is made from.
    #[test]
    #[ignore]
    fn print_profile() {
        let units = std::thread::available_parallelism().map_or(1, |n| n.get());
        let pool = tessera_runtime::ThreadPool::new(units);
        let p = super::measure_profile(&pool, &mut |_| {});
        println!("{}", serde_json::to_string_pretty(&p).unwrap());
    }

    #[test]
    #[ignore]
    fn print_tile_rates() {
        for t in super::tile_rates() {
            println!(
                "{:<10} {}x{} {:6.1} GFLOP/s",
                t.family, t.mr, t.nr, t.gflops
            );
        }
    }
}
