//! The SIMD decoders against the reference, bit for bit: random blocks with scales drawn
//! over zero, subnormal, largest, negative, infinite and NaN halves; every half-float scale
//! value exhaustively; and an ignored timing of each type per ISA.

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use tessera_core::ggml_quants::{dequantize_row, GgmlQuant};
use tessera_core::DType;

/// A decoder under test: a name and the function.
type Decoder = (&'static str, fn(GgmlQuant, &[u8], &mut [f32]));

fn run_avx2(q: GgmlQuant, row: &[u8], out: &mut [f32]) {
    // SAFETY: listed by `decoders` only where AVX2, FMA and F16C were detected.
    unsafe { super::avx2::dequantize(q, row, out) }
}

fn run_avx512(q: GgmlQuant, row: &[u8], out: &mut [f32]) {
    // SAFETY: listed by `decoders` only where AVX-512 F/BW/VL, AVX2, FMA, F16C were detected.
    unsafe { super::avx512::dequantize(q, row, out) }
}

fn run_active(q: GgmlQuant, row: &[u8], out: &mut [f32]) {
    crate::gemm::dequantize(crate::Isa::active(), dtype_of(q), row, out)
}

fn has_avx2() -> bool {
    use std::arch::is_x86_feature_detected as has;
    has!("avx2") && has!("fma") && has!("f16c")
}

fn has_avx512() -> bool {
    use std::arch::is_x86_feature_detected as has;
    has_avx2() && has!("avx512f") && has!("avx512bw") && has!("avx512vl")
}

/// Every decoder this CPU runs: AVX2 and AVX-512 called directly, and the dispatch the
/// exact path uses (whatever `TESSERA_ISA` chose).
fn decoders() -> Vec<Decoder> {
    let mut v: Vec<Decoder> = vec![("active", run_active)];
    if has_avx2() {
        v.push(("avx2", run_avx2));
    }
    if has_avx512() {
        v.push(("avx512", run_avx512));
    }
    v
}

fn dtype_of(q: GgmlQuant) -> DType {
    DType::ALL
        .into_iter()
        .find(|d| d.ggml_quant() == Some(q))
        .expect("every ggml quant is a DType")
}

/// Byte offsets of a block's half-float scales (Q8_K's scale is an f32 at 0).
fn half_offsets(q: GgmlQuant) -> &'static [usize] {
    match q {
        GgmlQuant::Q5_0 | GgmlQuant::IQ4_NL | GgmlQuant::IQ4_XS => &[0],
        GgmlQuant::Q5_1 | GgmlQuant::Q4_K | GgmlQuant::Q5_K => &[0, 2],
        GgmlQuant::Q2_K => &[80, 82],
        GgmlQuant::Q3_K => &[108],
        GgmlQuant::Q6_K => &[208],
        GgmlQuant::Q8_K => &[],
    }
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Every decoder's output for `row` against the reference's; the first difference.
fn check(q: GgmlQuant, row: &[u8]) -> Result<(), String> {
    let n = row.len() / q.block_bytes() * q.block_len();
    let mut want = vec![0f32; n];
    dequantize_row(q, row, &mut want)?;
    for (name, f) in decoders() {
        let mut got = vec![f32::from_bits(0x7fa0_0001); n];
        f(q, row, &mut got);
        if let Some(i) = (0..n).find(|&i| !same(got[i], want[i])) {
            let b = i / q.block_len() * q.block_bytes();
            return Err(format!(
                "{q} {name}: weight {i} is {:?} ({:#x}), the reference's {:?} ({:#x}); block {:02x?}",
                got[i],
                got[i].to_bits(),
                want[i],
                want[i].to_bits(),
                &row[b..b + q.block_bytes()]
            ));
        }
    }
    Ok(())
}

/// Half-float scales: zeros, subnormals, the largest, negatives, infinities, NaNs, scales
/// of real weights, any bits.
fn half_bits() -> impl Strategy<Value = u16> {
    let sign = || prop_oneof![Just(0u16), Just(0x8000u16)];
    prop_oneof![
        sign(),
        (sign(), 1u16..0x400).prop_map(|(s, m)| s | m),
        sign().prop_map(|s| s | 0x7bff),
        (sign(), 0x0400u16..0x2c00).prop_map(|(s, m)| s | m),
        (sign(), 0u16..0x7c00).prop_map(|(s, m)| s | m),
        sign().prop_map(|s| s | 0x7c00),
        (sign(), 1u16..0x400).prop_map(|(s, m)| s | 0x7c00 | m),
        any::<u16>(),
    ]
}

/// Q8_K's f32 scales, likewise.
fn f32_bits() -> impl Strategy<Value = u32> {
    let sign = || prop_oneof![Just(0u32), Just(0x8000_0000u32)];
    prop_oneof![
        sign(),
        (sign(), 1u32..0x0080_0000).prop_map(|(s, m)| s | m),
        sign().prop_map(|s| s | 0x7f7f_ffff),
        (sign(), 0x3000_0000u32..0x3e00_0000).prop_map(|(s, m)| s | m),
        sign().prop_map(|s| s | 0x7f80_0000),
        any::<u32>(),
    ]
}

/// A row of 1..5 random blocks of a random type, its scales drawn from the strategies.
fn any_row() -> impl Strategy<Value = (GgmlQuant, Vec<u8>)> {
    (prop::sample::select(GgmlQuant::ALL.to_vec()), 1usize..=5).prop_flat_map(|(q, n)| {
        (
            Just(q),
            prop::collection::vec(any::<u8>(), n * q.block_bytes()),
            prop::collection::vec(half_bits(), 2 * n),
            prop::collection::vec(f32_bits(), n),
        )
            .prop_map(|(q, mut row, halves, singles)| {
                for (b, blk) in row.chunks_exact_mut(q.block_bytes()).enumerate() {
                    for (k, &o) in half_offsets(q).iter().enumerate() {
                        blk[o..o + 2].copy_from_slice(&halves[2 * b + k].to_le_bytes());
                    }
                    if q == GgmlQuant::Q8_K {
                        blk[..4].copy_from_slice(&singles[b].to_le_bytes());
                    }
                }
                (q, row)
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn ggml_decode_matches_reference_bitwise((q, row) in any_row()) {
        check(q, &row).map_err(TestCaseError::fail)?;
    }
}

/// Every half-float value as each scale of a type (the other scale, where there is one, a
/// different value), over random quants: 65536 blocks per type and scale.
#[test]
fn ggml_decode_every_half_scale() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x6767_6d6c);
    for q in GgmlQuant::ALL {
        let bb = q.block_bytes();
        let offs = half_offsets(q);
        for which in 0..offs.len().max(1) {
            let mut row: Vec<u8> = (0..65536 * bb).map(|_| rng.gen()).collect();
            for (v, blk) in row.chunks_exact_mut(bb).enumerate() {
                if q == GgmlQuant::Q8_K {
                    // f32 scales: each half value widened, and random bits.
                    let h = half::f16::from_bits(v as u16).to_f32().to_bits();
                    let s = if v % 2 == 0 { h } else { rng.gen() };
                    blk[..4].copy_from_slice(&s.to_le_bytes());
                    continue;
                }
                for (k, &o) in offs.iter().enumerate() {
                    let s = if k == which {
                        v as u16
                    } else {
                        (v as u16).rotate_left(5) ^ 0x8000
                    };
                    blk[o..o + 2].copy_from_slice(&s.to_le_bytes());
                }
            }
            // In rows of a few blocks, as the exact path decodes them.
            for part in row.chunks(5 * bb) {
                check(q, part).unwrap();
            }
        }
    }
}

#[test]
fn ggml_decode_empty_row_writes_nothing() {
    for q in GgmlQuant::ALL {
        check(q, &[]).unwrap();
    }
}

#[test]
#[should_panic(expected = "does not hold")]
fn ggml_decode_rejects_a_partial_block() {
    let row = vec![0u8; GgmlQuant::Q4_K.block_bytes() + 1];
    let mut out = vec![0f32; 256];
    if has_avx2() {
        run_avx2(GgmlQuant::Q4_K, &row, &mut out);
    } else {
        panic!("does not hold (no AVX2 here)");
    }
}

/// Nanoseconds per 256 weights of each type: the reference, AVX2 and AVX-512, decoding
/// rows of `GGML_DECODE_BLOCKS` (default 8) times 256 weights into an L1-resident,
/// 64-byte aligned buffer.
/// `cargo test --release -p tessera-kernels ggml_decode_speed -- --ignored --nocapture`
#[test]
#[ignore]
fn ggml_decode_speed() {
    use std::hint::black_box;
    use std::time::Instant;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let reference: Decoder = ("scalar", |q, r, o| dequantize_row(q, r, o).unwrap());
    let mut all = vec![reference];
    all.extend(decoders().into_iter().filter(|d| d.0 != "active"));
    let ghz = (0..3).map(|_| ghz()).fold(0.0, f64::max);
    println!("core clock about {ghz:.2} GHz");
    print!("{:8}", "ns/256");
    for d in &all {
        print!("{:>10}", d.0);
    }
    println!();
    let blocks: usize = std::env::var("GGML_DECODE_BLOCKS").map_or(8, |v| v.parse().unwrap());
    for q in GgmlQuant::ALL {
        let n = 256 * blocks;
        let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let row = tessera_core::ggml_quants::quantize_row(q, &x).unwrap();
        // 64-byte aligned, as the exact path's buffers (a split line per store otherwise).
        let mut out_all = crate::aligned::AlignedF32::zeroed(n);
        let out = &mut out_all[..];
        print!("{:8}", q.name());
        for &(_, f) in &all {
            let mut best = f64::MAX;
            for _ in 0..7 {
                let reps = 2000;
                let t = Instant::now();
                for _ in 0..reps {
                    f(q, black_box(&row), black_box(&mut *out));
                }
                best = best.min(t.elapsed().as_nanos() as f64 / reps as f64);
            }
            print!("{:>10.1}", best * 256.0 / n as f64);
        }
        println!();
    }
}

/// The core's clock, from a chain of dependent one-cycle register adds (adds of an
/// immediate would not do: Golden Cove folds those at rename).
fn ghz() -> f64 {
    let n = 200_000_000u64;
    let t = std::time::Instant::now();
    let mut x = 0u64;
    // SAFETY: register arithmetic only (a counted loop of adds), no memory or stack.
    unsafe {
        std::arch::asm!(
            "2:",
            "add {x}, {x}",
            "add {x}, {x}",
            "add {x}, {x}",
            "add {x}, {x}",
            "sub {n}, 4",
            "jnz 2b",
            x = inout(reg) x,
            n = inout(reg) n => _,
            options(nomem, nostack),
        );
    }
    std::hint::black_box(x);
    n as f64 / t.elapsed().as_nanos() as f64
}
