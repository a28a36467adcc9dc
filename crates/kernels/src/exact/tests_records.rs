//! The exact kernels on repacked weights (`records`: the stream kernel, AVX2 or AVX-512,
//! and the packed kernel's panels from records) against the panel kernel on
//! the same weights as stored, bitwise: awkward shapes (rows not multiples of 8 or 16,
//! primes, stacked parts, splits of N and M) and blocks whose scales force either
//! dequantization path (zero, negative, subnormal, huge, infinite and NaN scales).

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use tessera_core::tensor::quantize_row;
use tessera_core::{DType, TensorBytes, WeightTensor};
use tessera_runtime::ThreadPool;

use super::tests::{acts, plan, reference, run};
use super::*;
use crate::plan::F32Kernel;

const BLOCKED: [DType; 3] = [DType::Q4_0, DType::Q4_1, DType::Q8_0];

/// The weight of a record test stored and repacked, activations, a pool and the reference
/// product on the stored weight; `seeds`: the weight rows' and the activations'.
struct Fixture {
    x: Vec<f32>,
    pool: ThreadPool,
    repacked: GemmWeight,
    want: Vec<f32>,
}

impl Fixture {
    #[allow(clippy::too_many_arguments)]
    fn new(
        dtype: DType,
        m: usize,
        n: usize,
        k: usize,
        units: usize,
        awkward: bool,
        seeds: (u64, u64),
        parts: usize,
    ) -> Self {
        let rows = test_rows(dtype, n, k, seeds.0, awkward);
        let (stored, repacked) = pair(dtype, rows, k, parts);
        let x = acts(m, k, seeds.1);
        let pool = ThreadPool::new(units);
        let want = reference(&pool, &x, m, &stored, None);
        Fixture {
            x,
            pool,
            repacked,
            want,
        }
    }
}

/// The same rows as stored (`false`) and repacked (`true`), `parts` tensors stacked.
fn pair(dtype: DType, rows: Vec<Vec<u8>>, k: usize, parts: usize) -> (GemmWeight, GemmWeight) {
    let n = rows.len();
    let make = |repack: bool| {
        let mut tensors = vec![];
        for p in 0..parts {
            let r = tessera_runtime::split_range(n, parts, p);
            if r.is_empty() {
                continue;
            }
            let bytes: Vec<u8> = rows[r.clone()].concat();
            tensors.push(
                WeightTensor::new("w", dtype, vec![r.len(), k], TensorBytes::owned(&bytes))
                    .unwrap(),
            );
        }
        GemmWeight::stacked(tensors, repack).unwrap()
    };
    let (stored, repacked) = (make(false), make(true));
    assert!(repacked.packed.is_some());
    (stored, repacked)
}

fn quantized_rows(dtype: DType, n: usize, k: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let row: Vec<f32> = (0..k).map(|_| rng.gen_range(-1.0..1.0)).collect();
            quantize_row(dtype, &row)
        })
        .collect()
}

/// [`awkward_rows`] or [`quantized_rows`].
fn test_rows(dtype: DType, n: usize, k: usize, seed: u64, awkward: bool) -> Vec<Vec<u8>> {
    if awkward {
        awkward_rows(dtype, n, k, seed)
    } else {
        quantized_rows(dtype, n, k, seed)
    }
}

/// Rows of random quants with awkward f16 scales (and minimums). Each block index gets a
/// class shared by all rows, so both dequantization paths run with every kind of value:
/// positive finite scales of every size (the fast decode below a bound: Q4_1's low field
/// below 1/2, the magic exponent for all of them for Q4_0 and Q8_0), or per-row values
/// that include zero, negative, infinite and NaN scales (the general path for zero and
/// non-finite ones, and for negative ones in Q4_0 and Q8_0; Q4_1's low field takes the
/// negative ones), with Q4_1 minimums of every size and sign.
fn awkward_rows(dtype: DType, n: usize, k: usize, seed: u64) -> Vec<Vec<u8>> {
    const POSITIVE: [u16; 8] = [
        0x2e66, // 0.1
        0x37ff, // the largest below 1/2 (Q4_1's fast decode up to here)
        0x3800, // 1/2
        0x3c00, // 1
        0x0001, // smallest subnormal
        0x03ff, // largest subnormal
        0x7bff, // 65504
        0x1400, // 2^-10
    ];
    const OTHER: [u16; 6] = [
        0x0000, // +0
        0x8000, // -0
        0xae66, // -0.1
        0x7c00, // +inf
        0xfc00, // -inf
        0x7e00, // NaN
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let bb = dtype.block_bytes();
    let blocks = k / 32;
    let class: Vec<bool> = (0..blocks).map(|_| rng.gen_bool(0.7)).collect();
    (0..n)
        .map(|_| {
            let mut row = vec![0u8; blocks * bb];
            rng.fill(&mut row[..]);
            for (b, blk) in row.chunks_exact_mut(bb).enumerate() {
                let d = if class[b] || rng.gen_bool(0.5) {
                    POSITIVE[rng.gen_range(0..POSITIVE.len())]
                } else {
                    OTHER[rng.gen_range(0..OTHER.len())]
                };
                blk[0..2].copy_from_slice(&d.to_le_bytes());
                if dtype == DType::Q4_1 {
                    let m: u16 = match rng.gen_range(0..4) {
                        0 => 0x8000 | (d & 0x7fff), // -d
                        1 => 0x8000 | rng.gen_range(0x0000u16..0x7c00),
                        2 => rng.gen_range(0x0000u16..0x7c00),
                        _ => 0xc800 | rng.gen_range(0u16..0x400), // about -8
                    };
                    let m = if class[b] || rng.gen_bool(0.7) {
                        m
                    } else {
                        OTHER[rng.gen_range(0..6)]
                    };
                    blk[2..4].copy_from_slice(&m.to_le_bytes());
                }
            }
            row
        })
        .collect()
}

/// Bitwise equality, NaNs equal to NaNs (payloads may differ between conversions).
fn same(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(60))]
    #[test]
    fn stream_on_records_equals_panel_bitwise(
        m in 1usize..6, n in 1usize..45, kb in 1usize..6, d in 0usize..3, mr in 1usize..5,
        nc in 1usize..50, units in 1usize..4, parts in 1usize..4, awkward in any::<bool>(),
    ) {
        let dtype = BLOCKED[d];
        let k = 32 * kb;
        let seed = (n * 131 + k + d) as u64;
        let rows = test_rows(dtype, n, k, seed, awkward);
        let (stored, repacked) = pair(dtype, rows, k, parts);
        let x = acts(m, k, (m * 7 + d) as u64);
        let bias: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 - 1.0).collect();
        let pool = ThreadPool::new(units);
        let want = reference(&pool, &x, m, &stored, Some(&bias));
        for par in [(1, units), (units.min(m), 1)] {
            let p = plan(F32Kernel::Stream, mr, 4, m, nc, k, par);
            let got = run(&p, &pool, &x, m, &repacked, Some(&bias));
            prop_assert!(same(&got, &want), "{} mr={} nc={} {:?}\n{:?}\n{:?}", dtype, mr, nc, par, got, want);
        }
    }

    #[test]
    fn packed_on_records_equals_panel_bitwise(
        m in 1usize..20, n in 1usize..30, kb in 1usize..6, d in 0usize..3, mr in 1usize..10,
        nr in 2usize..5, mc in 1usize..12, nc in 1usize..20, kcb in 0usize..3,
        units in 1usize..4, awkward in any::<bool>(),
    ) {
        let (dtype, k) = (BLOCKED[d], 32 * kb);
        let f = Fixture::new(dtype, m, n, k, units, awkward, ((n * 17 + k + d) as u64, (m * 3 + d) as u64), 1 + d % 2);
        let (x, pool, repacked, want) = (&f.x, &f.pool, &f.repacked, &f.want);
        let kc = 32 * kcb;
        let p = plan(F32Kernel::Packed, mr, nr, mc, nc, kc, (1, units));
        let got = run(&p, pool, x, m, repacked, None);
        prop_assert!(same(&got, want), "{} {}x{} mc={} nc={} kc={}", dtype, mr, nr, mc, nc, kc);
    }

    /// The outer-product tile (`nr ≥ 16`) on records, whose strips are decoded straight
    /// from the records on AVX-512 (`records::strip32`) and from 4-row panels elsewhere:
    /// rows past the last strip's live ones, strips starting mid-weight (N split over
    /// units), groups past the weight, and both decode paths.
    #[test]
    fn outer_on_records_equals_panel_bitwise(
        m in 1usize..20, n in 1usize..80, kb in 1usize..5, d in 0usize..3, mr in 1usize..15,
        mc in 1usize..30, nc in 1usize..70, kcb in 0usize..3, units in 1usize..4,
        awkward in any::<bool>(),
    ) {
        if !crate::exact::outer::available() {
            return Ok(());
        }
        let (dtype, k) = (BLOCKED[d], 32 * kb);
        let f = Fixture::new(dtype, m, n, k, units, awkward, ((n * 13 + k + d) as u64, (m * 7 + d) as u64), 1 + d % 2);
        let (x, pool, repacked, want) = (&f.x, &f.pool, &f.repacked, &f.want);
        let kc = 32 * kcb;
        for par in [(1, units), (units.min(m), 1)] {
            let p = plan(F32Kernel::Packed, mr, 16, mc, nc, kc, par);
            let got = run(&p, pool, x, m, repacked, None);
            prop_assert!(same(&got, want), "{} {}x16 mc={} nc={} kc={} {:?}", dtype, mr, mc, nc, kc, par);
        }
    }

    /// A row alone (stream, M = 1) equals the same row in a batch (stream at M = 2..5 in
    /// tiles of 2 and 4 rows, and packed), all on the repacked weight.
    #[test]
    fn rows_on_records_are_batch_invariant(
        m in 2usize..6, n in 1usize..40, kb in 1usize..4, d in 0usize..3, pick in 0usize..1000,
    ) {
        let dtype = BLOCKED[d];
        let k = 32 * kb;
        let (_, w) = pair(dtype, quantized_rows(dtype, n, k, 3), k, 2);
        let x = acts(m, k, pick as u64);
        let row = pick % m;
        let pool = ThreadPool::new(2);
        let one = run(&plan(F32Kernel::Stream, 1, 4, 1, 32, k, (1, 2)), &pool, &x[row * k..(row + 1) * k], 1, &w, None);
        for p in [
            plan(F32Kernel::Stream, 2, 4, m, 16, k, (1, 2)),
            plan(F32Kernel::Stream, 4, 4, m, 8, k, (1, 2)),
            plan(F32Kernel::Packed, 3, 4, 8, 16, 32, (1, 2)),
        ] {
            let all = run(&p, &pool, &x, m, &w, None);
            prop_assert_eq!(&all[row * n..(row + 1) * n], &one[..]);
        }
    }
}

/// With one-hot activations each output is one dequantized weight: every weight of awkward
/// rows through the stream kernel (where it runs on the records) equals the stored rows'
/// through the panel kernel, bit for bit.
#[test]
fn stream_on_records_dequantizes_every_weight_like_the_reference() {
    for dtype in BLOCKED {
        for (n, k, seed) in [
            (16, 128, 1),
            (23, 96, 2),
            (8, 320, 3),
            (40, 64, 4),
            (5, 32, 5),
        ] {
            let rows = awkward_rows(dtype, n, k, seed);
            assert_every_weight_dequantizes_alike(dtype, rows, k, &[1, 2, 3, 4]);
        }
    }
}

/// Runs one-hot activations (each output one dequantized weight) through the stream kernel
/// on the records of `rows` (`n` rows of `k`) at each `mr`, and asserts every weight equals
/// the panel kernel's on the stored rows, bit for bit (NaNs alike).
fn assert_every_weight_dequantizes_alike(
    dtype: DType,
    rows: Vec<Vec<u8>>,
    k: usize,
    mrs: &[usize],
) {
    let n = rows.len();
    let (stored, repacked) = pair(dtype, rows, k, 2);
    let mut x = vec![0f32; k * k];
    for t in 0..k {
        x[t * k + t] = 1.0;
    }
    let pool = ThreadPool::new(2);
    let want = reference(&pool, &x, k, &stored, None);
    for &mr in mrs {
        let p = plan(F32Kernel::Stream, mr, 4, k, 32, k, (1, 2));
        let got = run(&p, &pool, &x, k, &repacked, None);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                "{dtype} n={n} k={k} mr={mr}: weight {} of row {}: {g} vs {w}",
                i / n,
                i % n
            );
        }
    }
}

/// Records whose scales sit at the edges of the AVX-512 fast decodes (`packed::magic_ok`):
/// Q4_1's and Q8_0's low field (`D = d · 2^129` and `d · 2^133` by the exponent field).
/// Block 0 holds the largest f16 scale each takes in every row (and must be flagged fast,
/// so the test runs the fast decode at its edge); blocks 1..=5 hold, in one row of each
/// group, the smallest scale each refuses, `+0`, `-0`, `+inf`, `-inf` (the exponent add
/// would make `±0` a finite `D` and `±inf` a finite or wrong one): those records must take
/// the general path. Block 6 holds a negative scale (fast for Q4_1 only). Every weight,
/// one-hot, against the panel on the stored rows; Q4_1's `m = 0` in the odd rows, so a zero
/// scale read as non-zero shows.
#[test]
fn scales_at_the_fast_decodes_edges_keep_the_reference_bits() {
    for (dtype, below, at) in [
        (DType::Q4_1, 0x37ffu16, 0x3800u16), // the largest f16 below 1/2, and 1/2
        (DType::Q8_0, 0x27ff, 0x2800),       // the largest f16 below 2^-5, and 2^-5
    ] {
        let (n, k) = (16, 32 * 7);
        let odd = [at, 0x0000, 0x8000, 0x7c00, 0xfc00];
        let bb = dtype.block_bytes();
        let mut rng = rand::rngs::StdRng::seed_from_u64(21);
        let rows: Vec<Vec<u8>> = (0..n)
            .map(|r| {
                let mut row = vec![0u8; (k / 32) * bb];
                rng.fill(&mut row[..]);
                for (b, blk) in row.chunks_exact_mut(bb).enumerate() {
                    let marked = r == b || r == 8 + (3 * b) % 8;
                    let (d, m) = match b {
                        1..=5 if marked => (odd[b - 1], 0u16),
                        6 if marked => (0xa400, 0), // -2^-6
                        _ => (below, 0xb266),       // m = -0.2
                    };
                    blk[0..2].copy_from_slice(&d.to_le_bytes());
                    if dtype == DType::Q4_1 {
                        blk[2..4].copy_from_slice(&m.to_le_bytes());
                    }
                }
                row
            })
            .collect();
        let pw = crate::packed::PackedWeight::pack_rows(dtype, n, k, &|r| &rows[r]).unwrap();
        let fast = |g: usize, b: usize| {
            let i = g * pw.blocks + b;
            pw.fast[i / 8] >> (i % 8) & 1 == 1
        };
        for g in 0..2 {
            assert!(fast(g, 0), "{dtype}: group {g}, block 0 not flagged fast");
            for b in 1..=5 {
                assert!(!fast(g, b), "{dtype}: group {g}, block {b} flagged fast");
            }
            assert_eq!(fast(g, 6), dtype == DType::Q4_1, "{dtype}: negative scale");
        }
        // Both decodes of the fast records, whichever this CPU chose (the same bits).
        let _one = LOW_FIELD.lock().unwrap_or_else(|e| e.into_inner());
        for low_field in [true, false] {
            crate::variants::override_low_field(Some(low_field));
            assert_every_weight_dequantizes_alike(dtype, rows.clone(), k, &[1, 2, 4]);
        }
        crate::variants::override_low_field(None);
    }
}

/// Held by the tests that set `crate::variants::override_low_field`, one at a time.
static LOW_FIELD: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Wherever AVX2 runs the exact path repacks at load, and the stream kernel runs on the
/// records; the portable kernels read stored rows.
#[test]
fn repack_policy_follows_the_isa() {
    use crate::plan::Precision;
    assert!(crate::wants_repack(Precision::Fast));
    assert_eq!(
        crate::wants_repack(Precision::Exact),
        Isa::active() == Isa::Avx2Fma
    );
    assert_eq!(
        stream_on_records(DType::Q4_1),
        Isa::active() == Isa::Avx2Fma
    );
    assert!(!stream_on_records(DType::F16));
    if crate::isa::avx512_exact() {
        assert_eq!(Isa::active(), Isa::Avx2Fma);
        assert!(Isa::active().name().contains("avx512"));
    }
}

/// Activation blocks too large to expand (`records::stream_range` then broadcasts from the
/// stored rows) give the same bits as expanded ones and as the panel on the stored rows.
#[test]
fn stream_on_records_plain_and_expanded_rows_agree() {
    for dtype in BLOCKED {
        let (m, n, k) = (9, 21, 32 * 33); // 9 · 1056 · 32 bytes: over the expansion limit
        let (stored, repacked) = pair(dtype, quantized_rows(dtype, n, k, 7), k, 1);
        let x = acts(m, k, 11);
        let pool = ThreadPool::new(2);
        let want = reference(&pool, &x, m, &stored, None);
        for (mr, par) in [(4, (1, 1)), (3, (1, 2)), (1, (2, 1)), (2, (1, 1))] {
            // Whole M on one unit: plain rows; split over units, or one row tile: expanded
            // wherever a unit's rows fit.
            let p = plan(F32Kernel::Stream, mr, 4, m, 16, k, par);
            let got = run(&p, &pool, &x, m, &repacked, None);
            assert!(same(&got, &want), "{dtype} mr={mr} {par:?}");
        }
        let one = run(
            &plan(F32Kernel::Stream, 1, 4, 1, 16, k, (1, 2)),
            &pool,
            &x[..k],
            1,
            &repacked,
            None,
        );
        assert!(same(&one, &want[..n]), "{dtype}: one row");
    }
}

/// The low-field decodes read subnormal floats (`x86::avx512_decode::subnormal_q4_1`,
/// `subnormal_q8_0`): on a thread whose MXCSR has DAZ set (a fast-math host), small quants
/// would read as zero, so the kernel takes the general path there, and its results stay
/// the same bits.
#[test]
#[cfg(target_arch = "x86_64")]
fn low_field_streams_keep_their_bits_where_denormals_are_zero() {
    use crate::x86::avx512_exact::{Q4_1, Q8_0};
    stream_keeps_its_bits_where_denormals_are_zero::<Q4_1>(DType::Q4_1);
    stream_keeps_its_bits_where_denormals_are_zero::<Q8_0>(DType::Q8_0);
}

/// [`low_field_streams_keep_their_bits_where_denormals_are_zero`] for one format (`DT` its
/// kernel constant).
#[cfg(target_arch = "x86_64")]
fn stream_keeps_its_bits_where_denormals_are_zero<const DT: u8>(dtype: DType) {
    use crate::x86::avx512_exact::{record_geometry, stream16};
    use std::arch::is_x86_feature_detected as has;
    let cpu = [
        has!("avx512f"),
        has!("avx512bw"),
        has!("avx512dq"),
        has!("avx512vl"),
    ];
    if !(cpu.iter().all(|&f| f) && has!("fma") && has!("f16c")) {
        return;
    }
    let (n, k) = (16, 96);
    let rows = quantized_rows(dtype, n, k, 11);
    let pw = crate::packed::PackedWeight::pack_rows(dtype, n, k, &|r| &rows[r]).unwrap();
    // Every record flagged fast: the test runs the guard, not the general path by chance.
    assert!(
        (0..pw.groups * pw.blocks).all(|i| pw.fast[i / 8] >> (i % 8) & 1 == 1),
        "{dtype}"
    );
    let x = acts(1, k, 12);
    let (rb, _, _) = record_geometry(DT);
    let (xp, r0, fast) = (
        x.as_ptr() as usize,
        pw.data.as_ptr() as usize,
        pw.fast.as_ptr() as usize,
    );
    let call = move || {
        // SAFETY: the features were checked above; `x` holds `32 · blocks` values, the
        // records are the two groups' `blocks` records each, `fast` their bitmap.
        unsafe {
            let r0 = r0 as *const u8;
            let r1 = r0.add(pw.blocks * rb);
            stream16::<DT, 1>(
                [xp as *const f32],
                r0,
                r1,
                pw.blocks,
                fast as *const u8,
                0,
                pw.blocks,
                true,
            )
        }
    };
    let plain = call();
    let daz = std::thread::spawn(move || {
        let mut csr = 0u32;
        // SAFETY: reads and writes this thread's MXCSR through a local: DAZ (bit 6) set.
        unsafe {
            std::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack));
            let daz = csr | 1 << 6;
            std::arch::asm!("ldmxcsr [{}]", in(reg) &daz, options(nostack));
        }
        call()
    })
    .join()
    .unwrap();
    let bits = |v: &[f32; 16]| v.map(f32::to_bits);
    assert_eq!(bits(&plain[0]), bits(&daz[0]), "{dtype}");
    // And they are the reference's where the reference runs the same ISA family (the
    // portable kernels' separate multiply and add round differently).
    if crate::isa::avx512_exact() {
        let stored = pair(dtype, rows, k, 1).0;
        let want = reference(&ThreadPool::new(1), &x, 1, &stored, None);
        assert_eq!(
            bits(&plain[0]),
            bits(&want[..16].try_into().unwrap()),
            "{dtype}"
        );
    }
}
