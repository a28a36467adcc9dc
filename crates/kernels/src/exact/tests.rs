//! The stream and packed kernels against the panel kernel (bitwise, same ISA) and against
//! the portable dot of the reference dequantization, over awkward shapes: 1, primes, and
//! non-multiples of every tile, block and chunk.

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use tessera_core::tensor::quantize_row;
use tessera_core::{DType, TensorBytes, WeightTensor};
use tessera_runtime::ThreadPool;

use super::*;
use crate::gemm::execute;
use crate::plan::{F32Kernel, KernelFamily, ParallelPlan, ParallelSplit, Plan, Precision};
use crate::planner::{Planner, ShapeKey};

pub(super) const DTYPES: [DType; 16] = DType::ALL;

pub(super) fn weight(dtype: DType, n: usize, k: usize, seed: u64, parts: usize) -> GemmWeight {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // Stacked parts (as fused q/k/v), so rows come from several tensors.
    let sizes: Vec<usize> = (0..parts)
        .map(|p| tessera_runtime::split_range(n, parts, p).len())
        .filter(|&s| s > 0)
        .collect();
    let tensors = sizes
        .iter()
        .map(|&rows| {
            let bytes: Vec<u8> = (0..rows)
                .flat_map(|_| {
                    let row: Vec<f32> = (0..k).map(|_| rng.gen_range(-1.0..1.0)).collect();
                    quantize_row(dtype, &row)
                })
                .collect();
            WeightTensor::new("w", dtype, vec![rows, k], TensorBytes::owned(&bytes)).unwrap()
        })
        .collect();
    GemmWeight::stacked(tensors, false).unwrap()
}

pub(super) fn acts(m: usize, k: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..m * k).map(|_| rng.gen_range(-2.0..2.0)).collect()
}

pub(super) fn k_for(dtype: DType, units: usize, odd: usize) -> usize {
    if dtype.is_super_block() {
        units.div_ceil(3) * 256
    } else if dtype.is_quantized() {
        units * 32
    } else {
        units * 32 + odd
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn plan(
    kernel: F32Kernel,
    mr: usize,
    nr: usize,
    mc: usize,
    nc: usize,
    kc: usize,
    parts: (usize, usize),
) -> Plan {
    let key = ShapeKey::new(1, 32, 8, DType::F32, Precision::Exact, 1);
    let mut p = Planner::untuned().candidates(&key)[0];
    p.tile.family = KernelFamily::F32Dot;
    p.tile.kernel = kernel;
    (p.tile.mr, p.tile.nr, p.tile.mc, p.tile.nc, p.tile.kc) = (mr, nr, mc, nc, kc);
    let (m_parts, n_parts) = parts;
    p.parallel = match parts {
        (1, u) => ParallelPlan {
            split: ParallelSplit::N,
            units: u,
        },
        (u, 1) => ParallelPlan {
            split: ParallelSplit::M,
            units: u,
        },
        _ => ParallelPlan {
            split: ParallelSplit::Grid { m_parts, n_parts },
            units: m_parts * n_parts,
        },
    };
    p
}

pub(super) fn run(
    p: &Plan,
    pool: &ThreadPool,
    x: &[f32],
    m: usize,
    w: &GemmWeight,
    bias: Option<&[f32]>,
) -> Vec<f32> {
    let mut out = vec![f32::NAN; m * w.n()];
    execute(pool, p, x, m, w, bias, &mut out);
    out
}

/// What every exact kernel must produce: the panel kernel with 1 × 1 tiles on one unit
/// (itself `avx2::dot_f32`'s arithmetic on AVX2, `generic::dot_f32` elsewhere).
pub(super) fn reference(
    pool: &ThreadPool,
    x: &[f32],
    m: usize,
    w: &GemmWeight,
    bias: Option<&[f32]>,
) -> Vec<f32> {
    run(
        &plan(F32Kernel::Panel, 1, 1, 1, 8, 0, (1, 1)),
        pool,
        x,
        m,
        w,
        bias,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(60))]
    #[test]
    fn stream_equals_panel_bitwise(
        m in 1usize..7, n in 1usize..37, kb in 1usize..6, odd in 0usize..8, d in 0usize..16,
        tile in 0usize..9, nc in 1usize..40, units in 1usize..4, parts in 1usize..4,
    ) {
        let dtype = DTYPES[d];
        let k = k_for(dtype, kb, odd);
        let w = weight(dtype, n, k, (n * 131 + k) as u64, parts);
        let x = acts(m, k, (m * 7 + d) as u64);
        let bias: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 - 1.0).collect();
        let pool = ThreadPool::new(units);
        let want = reference(&pool, &x, m, &w, Some(&bias));
        let tiles = [(1, 8), (1, 4), (1, 2), (1, 1), (2, 2), (2, 1), (3, 2), (3, 1), (4, 1)];
        let (mr, nr) = tiles[tile];
        for par in [(1, units), (units.min(m), 1)] {
            let p = plan(F32Kernel::Stream, mr, nr, m, nc, k, par);
            prop_assert_eq!(run(&p, &pool, &x, m, &w, Some(&bias)), want.clone(), "{} {}x{} nc={} {:?}", dtype, mr, nr, nc, par);
        }
    }

    #[test]
    fn packed_equals_panel_bitwise(
        m in 1usize..23, n in 1usize..30, kb in 1usize..7, odd in 0usize..8, d in 0usize..16,
        mr in 1usize..10, nr in 2usize..5, mc in 1usize..12, nc in 1usize..20, kcb in 0usize..4,
        units in 1usize..4,
    ) {
        let dtype = DTYPES[d];
        let k = k_for(dtype, kb, odd);
        let w = weight(dtype, n, k, (n * 17 + k) as u64, 1 + d % 3);
        let x = acts(m, k, (m * 3 + d) as u64);
        let pool = ThreadPool::new(units);
        let want = reference(&pool, &x, m, &w, None);
        // kc: all of K, or blocks of 32..96 so the lane accumulators cross K blocks.
        let kc = if kcb == 0 { 0 } else { 32 * kcb };
        for par in [(1, units), (units.min(m), 1), (2.min(m), 2)] {
            if par.0 * par.1 > units {
                continue;
            }
            let p = plan(F32Kernel::Packed, mr, nr, mc, nc, kc, par);
            prop_assert_eq!(run(&p, &pool, &x, m, &w, None), want.clone(), "{} {}x{} mc={} nc={} kc={} {:?}", dtype, mr, nr, mc, nc, kc, par);
        }
    }

    /// K a multiple of 1024, where the AVX-512 packed kernel packs its activation tiles
    /// (rows 4 KiB apart would alias in L1): still bitwise the reference, with bias, K blocks
    /// and every tile height.
    #[test]
    fn packed_with_packed_activations_equals_panel_bitwise(
        m in 1usize..20, n in 1usize..24, kk in 1usize..3, d in 0usize..16, mr in 1usize..10,
        mc in 1usize..24, nc in 4usize..20, kcb in 0usize..3, units in 1usize..3,
    ) {
        let dtype = DTYPES[d];
        let k = 1024 * kk;
        let w = weight(dtype, n, k, (n * 5 + k) as u64, 1 + d % 2);
        let x = acts(m, k, (m * 7 + d) as u64);
        let bias = acts(1, n, 9);
        let pool = ThreadPool::new(units);
        let want = reference(&pool, &x, m, &w, Some(&bias));
        let kc = [0, 256, 512][kcb];
        for par in [(1, units), (units.min(m), 1)] {
            let p = plan(F32Kernel::Packed, mr, 4, mc, nc, kc, par);
            prop_assert_eq!(run(&p, &pool, &x, m, &w, Some(&bias)), want.clone(), "{} {}x4 mc={} nc={} kc={} {:?}", dtype, mr, mc, nc, kc, par);
        }
    }

    /// A row's result is the same at M = 1 (stream kernel) and inside a batch (packed).
    #[test]
    fn stream_and_packed_rows_agree(m in 2usize..40, n in 1usize..25, kb in 1usize..5, d in 0usize..16, pick in 0usize..1000) {
        let dtype = DTYPES[d];
        let k = k_for(dtype, kb, pick % 8);
        let w = weight(dtype, n, k, 11, 2);
        let x = acts(m, k, pick as u64);
        let row = pick % m;
        let pool = ThreadPool::new(2);
        let all = run(&plan(F32Kernel::Packed, 3, 4, 16, 8, 32, (1, 2)), &pool, &x, m, &w, None);
        let one = run(&plan(F32Kernel::Stream, 1, 8, 1, 16, k, (1, 2)), &pool, &x[row * k..(row + 1) * k], 1, &w, None);
        prop_assert_eq!(&all[row * n..(row + 1) * n], &one[..]);
    }
}

/// `k` rounded up to whole blocks of `dtype`.
pub(super) fn k_fit(dtype: DType, k: usize) -> usize {
    let bl = dtype.block_len();
    k.div_ceil(bl) * bl
}

/// Against the f64 reference of the reference dequantization.
#[test]
fn close_to_f64_reference() {
    let pool = ThreadPool::new(2);
    for dtype in DTYPES {
        for (m, n, k) in [
            (1, 1, 32),
            (5, 13, 96 + 7 * (!dtype.is_quantized()) as usize),
            (17, 9, 320),
        ] {
            let k = k_fit(dtype, k);
            let w = weight(dtype, n, k, 5, 1);
            let x = acts(m, k, 6);
            let want = crate::matmul::matmul_reference(&x, m, &w.parts[0], None);
            for p in [
                plan(F32Kernel::Stream, 1, 8, m, 32, k, (1, 2)),
                plan(F32Kernel::Packed, 3, 4, 8, 16, 64, (1, 2)),
            ] {
                let got = run(&p, &pool, &x, m, &w, None);
                for (a, b) in got.iter().zip(&want) {
                    assert!(
                        (*a as f64 - b).abs() <= 1e-5 * k as f64 + 1e-5,
                        "{dtype} {}: {a} vs {b}",
                        p.tile
                    );
                }
            }
        }
    }
}

/// The portable stream dot equals `generic::dot_f32` of the dequantized row.
#[test]
fn portable_stream_dot_is_the_canonical_dot() {
    for dtype in DTYPES {
        for k in [32, 64, 33, 39, 40, 71, 8, 1, 7] {
            let k = if dtype.is_super_block() { k * 8 } else { k };
            if k % dtype.block_len() != 0 {
                continue;
            }
            let w = weight(dtype, 1, k, k as u64, 1);
            let x = acts(1, k, 3);
            let mut row = vec![0f32; k];
            w.parts[0].dequantize_row(0, &mut row);
            assert_eq!(
                stream_dot_generic(dtype, &x, w.row(0)),
                crate::generic::dot_f32(&x, &row),
                "{dtype} k={k}"
            );
        }
    }
}

/// In-register dequantization is bit-identical to the reference, special values included.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_decode_is_the_reference() {
    if Isa::active() != Isa::Avx2Fma {
        return;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    for dtype in DTYPES {
        for trial in 0..50 {
            let k = k_fit(dtype, 96);
            let mut bytes = vec![0u8; dtype.row_bytes(k).unwrap()];
            rng.fill(&mut bytes[..]);
            if trial % 5 == 0 {
                bytes.iter_mut().step_by(3).for_each(|b| *b = 0);
            }
            let t = WeightTensor::new("w", dtype, vec![1, k], TensorBytes::owned(&bytes)).unwrap();
            let w = GemmWeight::new(t, false);
            let mut want = vec![0f32; k];
            w.parts[0].dequantize_row(0, &mut want);
            let mut panel = vec![f32::NAN; 4 * k];
            packed::pack(Isa::Avx2Fma, dtype, &w, 0, 1, 4, 0, k, &mut panel);
            for (e, &v) in want.iter().enumerate() {
                let got = panel[(e / 8 * 4) * 8 + e % 8];
                // NaNs compare by being NaN (payloads may differ between conversions).
                assert!(
                    got.to_bits() == v.to_bits() || (got.is_nan() && v.is_nan()),
                    "{dtype} element {e}: {got} vs {v}"
                );
            }
        }
    }
}

/// The planner ranks the stream kernel first at M = 1 and the packed kernel at large M.
#[test]
fn planner_picks_stream_for_decode_and_packed_for_prefill() {
    let p = Planner::untuned();
    for (k, n) in [(576, 1536), (1536, 576), (4096, 11008)] {
        for dtype in [DType::F32, DType::Q4_1, DType::Q8_0] {
            let one = p.plan(&ShapeKey::new(1, k, n, dtype, Precision::Exact, 2));
            assert_eq!(
                one.tile.kernel,
                F32Kernel::Stream,
                "m=1 {dtype} {k}x{n}: {one}"
            );
            let big = p.plan(&ShapeKey::new(512, k, n, dtype, Precision::Exact, 2));
            assert_eq!(
                big.tile.kernel,
                F32Kernel::Packed,
                "m=512 {dtype} {k}x{n}: {big}"
            );
        }
    }
}

/// Times kernels on model shapes, one unit (`cargo test --release -p tessera-kernels --
/// --ignored --nocapture time_exact_kernels`; `TESSERA_SHAPES=m,k,n,dtype;...`,
/// `TESSERA_UNITS`, `TESSERA_PLANS` (below), `TESSERA_COLD=1`: weights from DRAM).
#[test]
#[ignore]
fn time_exact_kernels() {
    let shapes = std::env::var("TESSERA_SHAPES")
        .unwrap_or("512,576,1536,f32;1,576,1536,q4_1;4,576,1536,q4_1".into());
    let units: usize = std::env::var("TESSERA_UNITS")
        .ok()
        .and_then(|u| u.parse().ok())
        .unwrap_or(1);
    let pool = ThreadPool::new(units);
    for s in shapes.split(';') {
        let f: Vec<&str> = s.split(',').collect();
        let (m, k, n) = (
            f[0].parse().unwrap(),
            f[1].parse().unwrap(),
            f[2].parse().unwrap(),
        );
        let dtype = DType::parse(f[3]).unwrap();
        // As the model loads it (repacked where the exact stream kernel reads the repack).
        // `TESSERA_COLD=1`: copies of the weight past twice the last-level cache, a product
        // over each in turn, so that the weights come from DRAM as in a model's step.
        let cold = std::env::var("TESSERA_COLD").is_ok_and(|v| v == "1");
        let stored = weight(dtype, n, k, 1, 1).parts[0]
            .bytes
            .as_slice()
            .len()
            .max(1);
        let copies = if cold {
            (2 * crate::calibrate::last_level_cache_bytes()).div_ceil(stored)
        } else {
            1
        };
        let ws: Vec<GemmWeight> = (0..copies)
            .map(|_| {
                let w = weight(dtype, n, k, 1, 1);
                GemmWeight::stacked(w.parts, crate::wants_repack(Precision::Exact)).unwrap()
            })
            .collect();
        let x = acts(m, k, 2);
        let mut out = vec![0f32; m * n];
        // The untuned planner's own profile, kept to print each plan's prediction.
        let profile = crate::cost::MachineProfile::default_for(&crate::planner::cpu_model());
        let planner = Planner::new(profile.clone(), crate::planner::TuningCache::default());
        let key = ShapeKey::new(m, k, n, dtype, Precision::Exact, units);
        let mut plans = vec![planner.plan(&key)];
        let extra = std::env::var("TESSERA_PLANS").unwrap_or_default();
        for e in extra.split(';').filter(|e| !e.is_empty()) {
            // kernel,mr,nr,mc,nc,kc[,m] (`m`: split over M instead of N)
            let v: Vec<&str> = e.split(',').collect();
            let split_m = v.len() > 6 && v[6] == "m";
            let v = &v[..6];
            let kernel = match v[0] {
                "stream" => F32Kernel::Stream,
                "packed" => F32Kernel::Packed,
                _ => F32Kernel::Panel,
            };
            let u: Vec<usize> = v[1..].iter().map(|x| x.parse().unwrap()).collect();
            let par = if split_m { (units, 1) } else { (1, units) };
            plans.push(plan(kernel, u[0], u[1], u[2], u[3], u[4], par));
        }
        // Interleaved rounds (each plan once per round), so a noisy neighbour hits all alike.
        let mut times = vec![vec![]; plans.len()];
        for _ in 0..7 {
            for (p, ts) in plans.iter().zip(times.iter_mut()) {
                let t = std::time::Instant::now();
                let mut reps = 0;
                while t.elapsed().as_secs_f64() < 0.05 || reps < 2 {
                    execute(&pool, p, &x, m, &ws[reps % copies], None, &mut out);
                    reps += 1;
                }
                ts.push(t.elapsed().as_secs_f64() / reps as f64);
            }
        }
        for (p, mut times) in plans.iter().zip(times) {
            times.sort_by(|a, b| a.total_cmp(b));
            let med = times[3];
            let gf = 2.0 * (m * k * n) as f64 / med / 1e9;
            let gbs = (n * k) as f64 * crate::cost::bytes_per_weight(dtype) / med / 1e9;
            let predicted = crate::cost::predict_us(&profile, p, m, k, n, dtype);
            println!("m={m} k={k} n={n} {dtype}: {:<70} {:8.1} us {:6.1} GFLOP/s {:5.1} GB/s (best {:.1} us, predicted {predicted:.1} us)", p.tile.to_string(), med * 1e6, gf, gbs, times[0] * 1e6);
        }
    }
}

/// The packed register tile alone on L1-resident data (`--ignored --nocapture`).
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore]
fn time_packed_microkernel() {
    if Isa::active() != Isa::Avx2Fma {
        return;
    }
    use crate::x86::avx2_exact as ax;
    for len in [128usize, 256, 576, 1024] {
        let x = acts(3, len, 1);
        let panel = acts(1, 4 * len, 2);
        let mut acc = vec![0f32; 96];
        let reps = 200_000_000 / (len * 24);
        let t = std::time::Instant::now();
        let mut sink = 0f32;
        for _ in 0..reps {
            let xp: [*const f32; 3] = std::array::from_fn(|a| x[a * len..].as_ptr());
            // SAFETY: AVX2 checked; 3 rows of len, a panel of 4·len, a slot of 96.
            let r = unsafe {
                ax::packed_tile::<3, 4>(
                    xp,
                    panel.as_ptr(),
                    len / 8,
                    0,
                    acc.as_mut_ptr(),
                    true,
                    true,
                )
            };
            sink += r[0][0];
        }
        let s = t.elapsed().as_secs_f64();
        println!(
            "3x4 len {len}: {:.1} GFLOP/s ({sink})",
            24.0 * (len * reps) as f64 / s / 1e9
        );
        if !crate::isa::avx512_exact() {
            continue;
        }
        let x = acts(8, len, 1);
        let mut acc = vec![0f32; 256];
        let reps = 200_000_000 / (len * 64);
        let t = std::time::Instant::now();
        for _ in 0..reps {
            let xp: [*const f32; 8] = std::array::from_fn(|a| x[a * len..].as_ptr());
            // SAFETY: AVX-512 checked; 8 rows of len, a panel of 4·len, a slot of 256.
            let r = unsafe {
                crate::x86::avx512_packed::packed_tile::<8, 4>(
                    xp,
                    panel.as_ptr(),
                    len / 8,
                    0,
                    acc.as_mut_ptr(),
                    true,
                    true,
                )
            };
            sink += r[0][0];
        }
        let s = t.elapsed().as_secs_f64();
        println!(
            "8x4 (AVX-512) len {len}: {:.1} GFLOP/s ({sink})",
            64.0 * (len * reps) as f64 / s / 1e9
        );
    }
}

/// The macro tile alone (`--ignored --nocapture time_macro_tile`): one packed activation
/// tile (6 rows on AVX-512, 3 on AVX2) against `groups` 4-row groups, panel sizes from L1 to
/// past L2.
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore]
fn time_macro_tile() {
    if Isa::active() != Isa::Avx2Fma {
        return;
    }
    let wide = crate::isa::avx512_exact();
    const MR: usize = 6;
    let mr = if wide { 6 } else { 3 };
    for (len, groups) in [
        (576, 32),
        (1024, 32),
        (512, 32),
        (512, 8),
        (1024, 8),
        (256, 64),
        (2048, 16),
    ] {
        let steps = len / 8;
        let x = acts(MR, len, 1);
        let panel = acts(1, groups * 4 * len, 2);
        let mut slots = vec![0f32; groups * 192];
        let mut out = vec![0f32; MR * groups * 4];
        let op: [*mut f32; MR] = std::array::from_fn(|a| out[a * groups * 4..].as_mut_ptr());
        let reps = (400_000_000 / (len * groups * 8 * mr)).max(1);
        for (first, last) in [(true, true), (false, false)] {
            let t = std::time::Instant::now();
            for _ in 0..reps {
                // SAFETY: AVX2/FMA (and AVX-512 for the wide tile) checked; a packed tile of
                // mr·len, a panel of groups·4·len, slots of groups·192, rows of groups·4.
                unsafe {
                    if wide {
                        crate::x86::avx512_packed::packed_groups::<MR>(
                            std::array::from_fn(|a| x[8 * a..].as_ptr()),
                            8 * MR,
                            [x.as_ptr(); MR],
                            &[],
                            panel.as_ptr(),
                            groups,
                            steps,
                            0,
                            slots.as_mut_ptr(),
                            192,
                            first,
                            last,
                            op,
                            groups * 4,
                            std::ptr::null(),
                        )
                    } else {
                        crate::x86::avx2_packed::packed_groups::<3>(
                            std::array::from_fn(|a| x[8 * a..].as_ptr()),
                            24,
                            [x.as_ptr(); 3],
                            &[],
                            panel.as_ptr(),
                            groups,
                            steps,
                            0,
                            slots.as_mut_ptr(),
                            192,
                            first,
                            last,
                            [op[0], op[1], op[2]],
                            groups * 4,
                            std::ptr::null(),
                        )
                    }
                };
            }
            let s = t.elapsed().as_secs_f64();
            println!(
                "{mr}x4 len {len} groups {groups} ({} KiB panel) first {first} last {last}: {:.1} GFLOP/s ({})",
                groups * 4 * len * 4 / 1024,
                (8 * mr * len * groups * reps) as f64 / s / 1e9,
                out[0]
            );
        }
    }
}

#[test]
fn stored_rows_are_one_parts_rows_or_none() {
    // Two stacked parts of 5 rows (as fused projections).
    let w = weight(DType::Q8_0, 10, 64, 7, 2);
    let rb = w.row(0).len();
    for rows in [0..3, 5..10, 6..7, 0..5] {
        let b = w.stored_rows(rows.clone()).unwrap();
        assert_eq!(b.len(), rows.len() * rb, "{rows:?}");
        for (i, r) in rows.enumerate() {
            assert_eq!(&b[i * rb..(i + 1) * rb], w.row(r), "row {r}");
        }
    }
    // Across the two parts, empty, or past the end: none.
    assert!(w.stored_rows(4..6).is_none());
    assert!(w.stored_rows(3..3).is_none());
    assert!(w.stored_rows(9..11).is_none());
}
