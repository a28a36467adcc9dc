use super::*;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use tessera_core::ggml_quants::{dequantize_row, GgmlQuant};

/// Every format with kernels here.
const TYPES: [DType; 9] = [
    DType::Q4_K,
    DType::Q6_K,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q5_K,
    DType::IQ4_NL,
    DType::IQ4_XS,
    DType::Q3_K,
    DType::Q2_K,
];

/// The kernel sets this CPU runs.
fn kernels() -> Vec<Kernel> {
    [
        Kernel::Portable,
        Kernel::Avx2,
        Kernel::Avx512,
        Kernel::Avx512Vnni,
    ]
    .into_iter()
    .filter(|k| k.available())
    .collect()
}

/// A random f16 scale: sign, magnitude 2^-12 .. 2^2, or now and then zero.
fn scale(rng: &mut impl Rng) -> [u8; 2] {
    let v = if rng.gen_ratio(1, 20) {
        0.0
    } else {
        let m = 2f32.powf(rng.gen_range(-12.0..2.0));
        if rng.gen_bool(0.5) {
            -m
        } else {
            m
        }
    };
    half::f16::from_f32(v).to_bits().to_le_bytes()
}

/// `n` rows of `nb` random blocks of `dtype` with sane f16 scales.
fn weights(dtype: DType, n: usize, nb: usize, rng: &mut impl Rng) -> Vec<Vec<u8>> {
    let (bb, d_off, m_off, min) = layout(fmt_of(dtype).unwrap());
    (0..n)
        .map(|_| {
            let mut row: Vec<u8> = (0..nb * bb).map(|_| rng.gen()).collect();
            for blk in row.chunks_exact_mut(bb) {
                blk[d_off..d_off + 2].copy_from_slice(&scale(rng));
                if min != MinKind::None {
                    blk[m_off..m_off + 2].copy_from_slice(&scale(rng));
                }
            }
            row
        })
        .collect()
}

/// `m · k` activations: per 32-element stretch zeros, small, ordinary or large values.
fn activations(m: usize, k: usize, rng: &mut impl Rng) -> Vec<f32> {
    let mut x = vec![0f32; m * k];
    for chunk in x.chunks_mut(32) {
        let mag = match rng.gen_range(0..6) {
            0 => 0.0,
            1 => 1e-4,
            2 => 1e3,
            _ => 1.0,
        };
        for v in chunk.iter_mut() {
            *v = if rng.gen_ratio(1, 8) {
                0.0
            } else {
                mag * rng.gen_range(-1.0f32..1.0)
            };
        }
    }
    x
}

/// The whole product on `kernel` in tiles of at most `mr × nr` (edge tiles smaller).
fn product(
    kernel: Kernel,
    dtype: DType,
    acts: &QkActs,
    rows: &[Vec<u8>],
    mr: usize,
    nr: usize,
) -> Vec<f32> {
    let n = rows.len();
    let mut out = vec![f32::NAN; acts.m * n];
    for i0 in (0..acts.m).step_by(mr) {
        let tm = mr.min(acts.m - i0);
        for j0 in (0..n).step_by(nr) {
            let tn = nr.min(n - j0);
            let tile_rows: Vec<&[u8]> = rows[j0..j0 + tn].iter().map(|r| r.as_slice()).collect();
            let mut t = vec![f32::NAN; tm * tn];
            tile_with(kernel, dtype, acts, i0, tm, &tile_rows, &mut t);
            for a in 0..tm {
                for b in 0..tn {
                    out[(i0 + a) * n + j0 + b] = t[a * tn + b];
                }
            }
        }
    }
    out
}

/// Reference: weights by ggml's decoder, activations as the kernels see them, f64 sums;
/// also `Σ |w · x|` per element, the tolerance's scale.
fn reference(dtype: DType, acts: &QkActs, rows: &[Vec<u8>]) -> (Vec<f64>, Vec<f64>) {
    let x = acts.dequantized();
    let (k, n) = (acts.k, rows.len());
    let (mut want, mut mag) = (vec![0f64; acts.m * n], vec![0f64; acts.m * n]);
    let mut wf = vec![0f32; k];
    for (j, row) in rows.iter().enumerate() {
        dequantize_row(dtype.ggml_quant().unwrap(), row, &mut wf).unwrap();
        for i in 0..acts.m {
            let xr = &x[i * k..(i + 1) * k];
            want[i * n + j] = wf.iter().zip(xr).map(|(&w, &v)| w as f64 * v as f64).sum();
            mag[i * n + j] = wf
                .iter()
                .zip(xr)
                .map(|(&w, &v)| (w as f64 * v as f64).abs())
                .sum();
        }
    }
    (want, mag)
}

/// Relative tolerance against the reference, on `Σ |w · x|`: the kernels' float steps
/// (two roundings per block and one per accumulation) and the reference decoder's own
/// roundings of each weight (scale products, `d·q − m` with cancellation).
const REL_TOL: f64 = 1e-5;

fn check(dtype: DType, m: usize, n: usize, nb: usize, seed: u64) -> Result<(), TestCaseError> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let k = nb * dtype.block_len();
    let rows = weights(dtype, n, nb, &mut rng);
    let x = activations(m, k, &mut rng);
    let acts = QkActs::quantize(dtype, &x, m, k);
    let (want, mag) = reference(dtype, &acts, &rows);
    let base = product(Kernel::Portable, dtype, &acts, &rows, MAX_MR, MAX_NR);
    for (i, (&g, (&w, &s))) in base.iter().zip(want.iter().zip(&mag)).enumerate() {
        prop_assert!(
            (g as f64 - w).abs() <= REL_TOL * s + 1e-30,
            "{dtype} element {i}: got {g}, want {w} (scale {s})"
        );
    }
    for kernel in kernels() {
        for &(mr, nr) in TILES.iter().chain(&[(3, 5), (1, 1), (2, 3)]) {
            let got = product(kernel, dtype, &acts, &rows, mr, nr);
            let same = got
                .iter()
                .zip(&base)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            prop_assert!(
                same,
                "{dtype} {kernel:?} tile {mr}x{nr}: {got:?} vs {base:?}"
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Every format, kernel set and tile shape: within tolerance of the reference, and
    /// bitwise equal to the portable kernel in tiles of any shape.
    #[test]
    fn tiles_match_reference_and_each_other(
        t in 0usize..TYPES.len(),
        m in 1usize..8,
        n in 1usize..10,
        nb in prop::sample::select(vec![1usize, 2, 3, 5]),
        seed in any::<u64>(),
    ) {
        check(TYPES[t], m, n, nb, seed)?;
    }
}

/// Each format on a fixed seed over the awkward shapes, so that every one is covered
/// whatever proptest draws.
#[test]
fn every_format_on_awkward_shapes() {
    for (t, &dtype) in TYPES.iter().enumerate() {
        for (s, (m, n, nb)) in [(1, 1, 1), (7, 9, 5), (3, 5, 2), (4, 8, 3)]
            .into_iter()
            .enumerate()
        {
            check(dtype, m, n, nb, (100 * t + s) as u64).unwrap();
        }
    }
}

#[test]
fn q8k_activations_are_ggml_s() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let x = activations(3, 512, &mut rng);
    let acts = QkActs::quantize(DType::Q4_K, &x, 3, 512);
    let raw = tessera_core::ggml_quants::quantize_row_q8_k(&x);
    let zeros = QkActs::quantize(DType::Q6_K, &[0.0; 256], 1, 256);
    assert!(zeros.d == [0.0] && zeros.qs.iter().all(|&q| q == 0));
    let mut want = vec![0f32; x.len()];
    dequantize_row(GgmlQuant::Q8_K, &raw, &mut want).unwrap();
    assert_eq!(acts.dequantized(), want);
    for (i, blk) in raw.chunks_exact(292).enumerate() {
        for g in 0..16 {
            let s = i16::from_le_bytes([blk[260 + 2 * g], blk[261 + 2 * g]]);
            assert_eq!(acts.bsums[16 * i + g], s);
        }
    }
}

proptest! {
    /// The SIMD Q8_K quantizer is ggml's reference bitwise, ties of magnitude included.
    #[test]
    fn q8k_blocks_are_ggml_s(seed in any::<u64>(), ties in 0usize..4, zero in any::<bool>()) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut x = activations(1, 256, &mut rng);
        if zero {
            x[..128].fill(0.0);
        }
        let top = x.iter().fold(0f32, |a, v| a.max(v.abs())).max(1.0);
        for _ in 0..ties {
            let i = rng.gen_range(0..256);
            x[i] = if rng.gen_bool(0.5) { top } else { -top };
        }
        let raw = tessera_core::ggml_quants::quantize_row_q8_k(&x);
        for simd in [false, true] {
            if simd && !Kernel::Avx2.available() {
                continue;
            }
            let (mut qs, mut bsums) = ([0i8; 256], [0i16; 16]);
            let d = q8k_block(simd, &x, &mut qs, &mut bsums);
            let want = f32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]);
            prop_assert_eq!(d.to_bits(), want.to_bits());
            prop_assert!(qs.iter().zip(&raw[4..260]).all(|(&q, &r)| q as u8 == r));
            for g in 0..16 {
                prop_assert_eq!(bsums[g], i16::from_le_bytes([raw[260 + 2 * g], raw[261 + 2 * g]]));
            }
        }
    }
}

#[test]
fn activations_serve_their_layouts_only() {
    let x = vec![0.5f32; 256];
    for &d in &TYPES {
        let acts = QkActs::quantize(d, &x, 1, 256);
        for &e in &TYPES {
            let same = |t: DType| match t {
                DType::Q5_0 | DType::Q5_1 | DType::IQ4_NL => 0,
                DType::Q4_K | DType::Q5_K => 1,
                _ => 2,
            };
            assert_eq!(acts.serves(e), same(d) == same(e), "{d} acts for {e}");
        }
    }
}

#[test]
fn unsupported_types_are_refused() {
    for d in DType::ALL {
        let expect = TYPES.contains(&d);
        assert_eq!(supports(d), expect, "{d}");
    }
}

/// GB/s of weight bytes per format and kernel set, one thread, an L2-resident 256 x 1536
/// weight, M = 1 and 4; then the activation quantizers' ns per element. Run with
/// `cargo test --release -p tessera-kernels qk::tests::bench -- --ignored --nocapture`;
/// `QK_BENCH=Q4_K,Q6_K`, `QK_BENCH_M=1`, `QK_BENCH_KERNEL=Avx2,Avx512Vnni`, `QK_BENCH_N`
/// (rows: 400000 streams from DRAM) and `QK_BENCH_REPS` narrow or widen it.
#[test]
#[ignore]
fn bench() {
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let listed = |list: &str, item: &str| list.is_empty() || list.split(',').any(|t| t == item);
    let n: usize = var("QK_BENCH_N").parse().unwrap_or(256);
    let reps: usize = var("QK_BENCH_REPS").parse().unwrap_or(1000);
    let ms: Vec<usize> = match var("QK_BENCH_M").as_str() {
        "" => vec![1, 4],
        v => v.split(',').filter_map(|m| m.parse().ok()).collect(),
    };
    let (types, ks) = (var("QK_BENCH"), var("QK_BENCH_KERNEL"));
    let k = 1536;
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    for dtype in TYPES.into_iter().filter(|d| listed(&types, &d.to_string())) {
        let rows = weights(dtype, n, k / dtype.block_len(), &mut rng);
        let bytes = (n * dtype.row_bytes(k).unwrap()) as f64;
        let tiles: Vec<Vec<&[u8]>> = rows
            .chunks(MAX_NR)
            .map(|c| c.iter().map(|r| r.as_slice()).collect())
            .collect();
        let mut line = format!("{:7}", dtype.to_string());
        for &m in &ms {
            let x = activations(m, k, &mut rng);
            let acts = QkActs::quantize(dtype, &x, m, k);
            let mut out = vec![0f32; m * MAX_NR];
            for kernel in kernels() {
                if !listed(&ks, &format!("{kernel:?}")) {
                    continue;
                }
                // Each pass over the weight timed on its own; the 10th percentile (a
                // shared machine preempts some passes).
                let passes = if kernel == Kernel::Portable { 2 } else { reps };
                let mut times: Vec<f64> = (0..passes)
                    .map(|_| {
                        let t = std::time::Instant::now();
                        for tr in &tiles {
                            tile_with(kernel, dtype, &acts, 0, m, tr, &mut out);
                            std::hint::black_box(&mut out);
                        }
                        t.elapsed().as_secs_f64()
                    })
                    .collect();
                times.sort_by(f64::total_cmp);
                let best = times[passes / 10];
                line += &format!("  M={m} {kernel:?} {:6.1}", bytes / best / 1e9);
            }
        }
        println!("{line}");
    }
    // Activation quantization, ns per element (one row of 8960: the down projection's).
    let x = activations(4, 8960, &mut rng);
    for dtype in [DType::Q4_K, DType::Q5_0] {
        let mut times: Vec<f64> = (0..200)
            .map(|_| {
                let t = std::time::Instant::now();
                std::hint::black_box(QkActs::quantize(dtype, &x, 4, 8960));
                t.elapsed().as_secs_f64()
            })
            .collect();
        times.sort_by(f64::total_cmp);
        println!(
            "quantize for {dtype}: {:.2} ns/element",
            times[20] / x.len() as f64 * 1e9
        );
    }
}
