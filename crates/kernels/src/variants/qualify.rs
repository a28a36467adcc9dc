//! Times each kernel variant against its twin on this CPU: one unit, M = 1 products over
//! synthetic Q4_1 and Q8_0 weights small enough to stay in L2 (512 × 576: the decode's cost,
//! not the memory's, is what the variants change), the two alternating sample by sample
//! so that the machine's drift hits both alike; each figure is a median.

use std::time::Instant;

use tessera_core::tensor::quantize_row;
use tessera_core::DType;

use super::{Timing, Variant};
use crate::packed::{PackedWeight, GROUP};
use crate::x86::{avx2_records, avx512_exact};

/// Weight rows and inputs of the test product.
const N: usize = 512;
const K: usize = 576;
/// Samples of each kernel (odd: the median is one of them).
const SAMPLES: usize = 9;
/// Least time of one sample: calls are repeated until it has passed.
const SAMPLE_SECS: f64 = 0.0008;

/// Deterministic weights and activations in `[-1, 1)` (a 64-bit LCG).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// The test weight in `dtype`, repacked as the exact path holds it.
pub(crate) fn test_weight(dtype: DType, n: usize, k: usize, seed: u64) -> PackedWeight {
    let w = values(n * k, seed);
    let rows: Vec<Vec<u8>> = w.chunks_exact(k).map(|r| quantize_row(dtype, r)).collect();
    PackedWeight::pack_rows(dtype, n, k, &|r| &rows[r]).expect("a repackable format")
}

/// Nanoseconds per call of `f`: calls repeated until [`SAMPLE_SECS`] has passed.
fn sample(f: &mut dyn FnMut()) -> f64 {
    let t = Instant::now();
    let mut calls = 0u32;
    loop {
        f();
        calls += 1;
        let s = t.elapsed().as_secs_f64();
        if s >= SAMPLE_SECS {
            return s * 1e9 / calls as f64;
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Medians of `a` and `b`, sampled in turn after one warm-up call of each.
pub fn race(a: &mut dyn FnMut(), b: &mut dyn FnMut()) -> (f64, f64) {
    a();
    b();
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    for i in 0..SAMPLES {
        if i % 2 == 0 {
            ta.push(sample(a));
            tb.push(sample(b));
        } else {
            tb.push(sample(b));
            ta.push(sample(a));
        }
    }
    (median(ta), median(tb))
}

/// Whether this CPU runs the AVX-512 exact kernels' instructions.
pub fn has_avx512() -> bool {
    use std::arch::is_x86_feature_detected as has;
    has!("avx512f")
        && has!("avx512bw")
        && has!("avx512dq")
        && has!("avx512vl")
        && has!("avx2")
        && has!("fma")
        && has!("f16c")
}

/// One M = 1 pass of the AVX-512 stream kernel over every group pair of `pw` (a last odd
/// group with itself), into `out[..8 · groups]`.
pub fn stream16_pass(pw: &PackedWeight, x: &[f32], low_field: bool, out: &mut [f32]) {
    assert!(has_avx512() && x.len() == pw.k && out.len() >= pw.groups * GROUP);
    assert!(pw.fast.len() * 8 >= pw.groups * pw.blocks);
    let group = |g: usize| pw.group_bytes(g..g + 1).as_ptr();
    for g in (0..pw.groups).step_by(2) {
        let g1 = (g + 1).min(pw.groups - 1);
        macro_rules! run {
            ($DT:expr) => {
                // SAFETY: the CPU features are checked (asserted above); `x` holds
                // `k = 32 · blocks` values; groups `g` and `g1` exist with `blocks` records
                // each; `fast` holds a bit per record, set by `pack_rows` only where every
                // real row meets `magic_ok`.
                unsafe {
                    avx512_exact::stream16::<{ $DT }, 1>(
                        [x.as_ptr()],
                        group(g),
                        group(g1),
                        pw.blocks,
                        pw.fast.as_ptr(),
                        g * pw.blocks,
                        g1 * pw.blocks,
                        low_field,
                    )
                }
            };
        }
        let r = match pw.dtype {
            DType::Q4_0 => run!(avx512_exact::Q4_0),
            DType::Q4_1 => run!(avx512_exact::Q4_1),
            DType::Q8_0 => run!(avx512_exact::Q8_0),
            d => unreachable!("{d} has no repack"),
        };
        let live = if g1 > g { 2 * GROUP } else { GROUP };
        out[g * GROUP..g * GROUP + live].copy_from_slice(&r[0][..live]);
    }
}

/// One M = 1 pass of the AVX2 stream kernel over every group of `pw`, the activation
/// expanded (`xe`: each value 8 times, as the exact path runs it at M = 1).
pub fn stream8_pass(pw: &PackedWeight, xe: &[f32], out: &mut [f32]) {
    use std::arch::is_x86_feature_detected as has;
    assert!(has!("avx2") && has!("fma") && has!("f16c"));
    assert!(xe.len() == 8 * pw.k && out.len() >= pw.groups * GROUP);
    for g in 0..pw.groups {
        let r = pw.group_bytes(g..g + 1).as_ptr();
        // SAFETY: AVX2, FMA and F16C checked (asserted); `xe` holds `8k = 256 · blocks`
        // values; group `g` holds `blocks` records of the weight's format.
        let v = unsafe {
            match pw.dtype {
                DType::Q4_0 => avx2_records::stream8::<{ avx2_records::Q4_0 }, 1, 8, true>(
                    [xe.as_ptr()],
                    r,
                    pw.blocks,
                ),
                DType::Q4_1 => avx2_records::stream8::<{ avx2_records::Q4_1 }, 1, 8, true>(
                    [xe.as_ptr()],
                    r,
                    pw.blocks,
                ),
                DType::Q8_0 => avx2_records::stream8::<{ avx2_records::Q8_0 }, 1, 8, true>(
                    [xe.as_ptr()],
                    r,
                    pw.blocks,
                ),
                d => unreachable!("{d} has no repack"),
            }
        };
        out[g * GROUP..(g + 1) * GROUP].copy_from_slice(&v[0]);
    }
}

/// Every variant timed against its twin; empty where the CPU lacks AVX-512.
pub fn qualify() -> Vec<Timing> {
    if !has_avx512() {
        return Vec::new();
    }
    let x = values(K, 7);
    let mut xe = vec![0f32; 8 * K];
    avx2_records::expand(&x, &mut xe);
    let mut out = vec![0f32; N];
    let mut timings = Vec::new();
    // The AVX-512 kernels at their best decode, and the AVX2 kernels, summed over formats.
    let (mut wide_ns, mut avx2_ns) = (0.0, 0.0);
    for (dtype, variant) in [
        (DType::Q4_1, Variant::LowFieldQ4_1),
        (DType::Q8_0, Variant::LowFieldQ8_0),
    ] {
        let pw = test_weight(dtype, N, K, 3);
        let mut out2 = out.clone();
        let (low, general) = race(&mut || stream16_pass(&pw, &x, true, &mut out), &mut || {
            stream16_pass(&pw, &x, false, &mut out2)
        });
        std::hint::black_box((&out, &out2));
        timings.push(Timing {
            variant,
            variant_ns: low,
            twin_ns: general,
        });
        let use_low = low < general;
        let (wide, narrow) = race(
            &mut || stream16_pass(&pw, &x, use_low, &mut out),
            &mut || stream8_pass(&pw, &xe, &mut out2),
        );
        std::hint::black_box((&out, &out2));
        wide_ns += wide;
        avx2_ns += narrow;
    }
    timings.insert(
        0,
        Timing {
            variant: Variant::Avx512,
            variant_ns: wide_ns,
            twin_ns: avx2_ns,
        },
    );
    timings.push(ggml_decode_timing());
    timings.push(qk_timing());
    timings
}

/// Synthetic stored rows of `dtype`, `k` weights each.
fn stored_rows(dtype: DType, n: usize, k: usize, seed: u64) -> Vec<Vec<u8>> {
    values(n * k, seed)
        .chunks_exact(k)
        .map(|r| quantize_row(dtype, r))
        .collect()
}

/// The ggml types' decode on AVX-512 against AVX2: Q4_K and Q6_K rows (a Q4_K_M file's
/// two types) decoded 256 weights a call into an L1 buffer, as the exact path runs it.
fn ggml_decode_timing() -> Timing {
    use crate::x86::ggml_decode::{avx2, avx512};
    const ROWS: usize = 16;
    const KQ: usize = 2048;
    let sets: Vec<(DType, Vec<Vec<u8>>)> = [DType::Q4_K, DType::Q6_K]
        .into_iter()
        .map(|d| (d, stored_rows(d, ROWS, KQ, 11)))
        .collect();
    let mut buf = crate::aligned::AlignedF32::new();
    buf.grow(256);
    let mut buf2 = crate::aligned::AlignedF32::new();
    buf2.grow(256);
    let pass = |wide: bool, out: &mut [f32]| {
        for (dtype, rows) in &sets {
            let q = dtype.ggml_quant().expect("a ggml type");
            let bb = dtype.block_bytes();
            for row in rows {
                for blk in row.chunks_exact(bb) {
                    if wide {
                        // SAFETY: `qualify` runs only where `has_avx512` holds.
                        unsafe { avx512::dequantize(q, blk, &mut out[..256]) }
                    } else {
                        // SAFETY: AVX2, FMA and F16C come with `has_avx512`.
                        unsafe { avx2::dequantize(q, blk, &mut out[..256]) }
                    }
                }
            }
        }
    };
    let (wide, narrow) = race(&mut || pass(true, &mut buf[..256]), &mut || {
        pass(false, &mut buf2[..256])
    });
    std::hint::black_box((&buf[..256], &buf2[..256]));
    Timing {
        variant: Variant::GgmlAvx512,
        variant_ns: wide,
        twin_ns: narrow,
    }
}

/// The fast path's integer dots on AVX-512 against AVX2: M = 1 over 512 × 512 Q4_K and Q6_K
/// weights (L2-resident), 8 rows a tile.
fn qk_timing() -> Timing {
    use crate::qk::{tile_with, Kernel, QkActs};
    const KQ: usize = 512;
    let wide_kernel = if Kernel::Avx512Vnni.available() {
        Kernel::Avx512Vnni
    } else {
        Kernel::Avx512
    };
    let x = values(KQ, 5);
    let sets: Vec<(DType, Vec<Vec<u8>>, QkActs)> = [DType::Q4_K, DType::Q6_K]
        .into_iter()
        .map(|d| (d, stored_rows(d, N, KQ, 13), QkActs::quantize(d, &x, 1, KQ)))
        .collect();
    let pass = |kernel: Kernel, out: &mut [f32; 8]| {
        for (dtype, rows, acts) in &sets {
            for group in rows.chunks(8) {
                let refs: Vec<&[u8]> = group.iter().map(|r| r.as_slice()).collect();
                tile_with(kernel, *dtype, acts, 0, 1, &refs, out);
                std::hint::black_box(&*out);
            }
        }
    };
    let (mut o1, mut o2) = ([0f32; 8], [0f32; 8]);
    let (wide, narrow) = race(&mut || pass(wide_kernel, &mut o1), &mut || {
        pass(Kernel::Avx2, &mut o2)
    });
    Timing {
        variant: Variant::QkAvx512,
        variant_ns: wide,
        twin_ns: narrow,
    }
}
