//! Compute kernels over weights in their stored formats, and the shape-aware planner that
//! picks how each matrix product runs.
//!
//! - [`isa`]: which instruction set the kernels use, detected once at run time;
//!   [`variants`]: the kernel variants this CPU runs, chosen by timing them against their
//!   portable twins.
//! - [`generic`]: portable kernels, always complete; the reference for the SIMD ones.
//! - `x86::avx2`, `x86::avx2_q8`, `x86::avx2_exact`: AVX2+FMA kernels with the same
//!   arithmetic (same order); `x86::avx512_exact`: the exact stream kernel on AVX-512.
//! - [`exact`]: the exact family's streaming (small M) and packed (large M) kernels.
//! - [`plan`]: tiling and parallel strategies as plain data; [`cost`]: the cost model;
//!   [`planner`]: candidates, ranking, the tuning cache; [`calibrate`]: machine figures.
//! - [`gemm`]: executes a plan; [`matmul`]: plan-then-execute, what the model calls.
//! - [`packed`], [`quant_acts`]: the integer-dot path's weight repack and 8-bit activations.
//! - [`ops`], [`math`]: RMSNorm, SwiGLU, softmax, vector exp.
//! - [`aligned`]: 64-byte-aligned scratch and record buffers (no split loads).
//! - [`attn`]: flash-style tiled causal attention over paged f32 or f16 K/V (online
//!   softmax); `x86::avx2_attn` is its AVX2 accumulator update and F16C conversion.
//! - [`lora`]: batched multi-LoRA deltas (shrink then expand) over segments of rows, factors
//!   in f32, f16 or bf16; `x86::lora_avx2` is its AVX2 expand and shrink on halves.
//!
//! Numerics contract: the exact path dequantizes a weight to the f32 value the reference
//! (`tessera_core::blocks`) defines, and each output element is a dot product whose
//! summation order depends only on K (8 lanes, a fixed lane tree, then the tail), whichever
//! of its kernels (panel, stream, packed) runs it; the fast
//! path's integer block dots are exact and their scaled sum runs over blocks in order. In
//! neither does the order depend on M, N, the plan, the thread count or the other rows, so
//! every row's result is batch invariant.

// Register tiles index several arrays by the same row and column counters on purpose.
#![allow(clippy::needless_range_loop)]

pub mod aligned;
pub mod attn;
pub mod calibrate;
pub mod cost;
pub mod exact;
pub mod gemm;
pub mod generic;
pub mod isa;
pub mod lora;
pub mod math;
pub mod matmul;
pub mod ops;
pub mod packed;
pub mod plan;
pub mod planner;
pub mod qk;
pub mod quant_acts;
pub mod variants;
#[cfg(target_arch = "x86_64")]
pub mod x86;

pub use isa::Isa;

/// Hints the cache line holding `p` into L2 (on other architectures, nothing). A hint only:
/// it reads nothing architecturally and never faults, whatever the address.
#[inline(always)]
pub(crate) fn prefetch_l2(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch (SSE, baseline on x86-64) never faults and changes no value.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
pub use lora::{
    lora_apply, lora_apply_reference, plan_lora, FactorView, LoraPlan, LoraSplit, LoraTask,
};
pub use matmul::matmul;

/// Whether weights for `precision` should be built with the 8-row interleaved repack
/// ([`packed::PackedWeight`], `GemmWeight::new(.., repack)`): always for the fast path (its
/// integer-dot kernels read only the repack), and for the exact path wherever AVX2 runs: its
/// stream kernels (AVX2 and AVX-512) read the repack too, and its packed kernel dequantizes
/// panels from it. Formats without a repack (f32, f16, bf16) are left as stored either way;
/// the portable kernels read stored rows.
pub fn wants_repack(precision: plan::Precision) -> bool {
    match precision {
        plan::Precision::Fast => true,
        plan::Precision::Exact => Isa::active() == Isa::Avx2Fma,
    }
}

/// The canonical f32 dot product on the active ISA (see the crate's numerics contract).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    match Isa::active() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Avx2Fma is active only on CPUs with those features; lengths checked above.
        Isa::Avx2Fma => unsafe { x86::avx2::dot_f32(a.as_ptr(), b.as_ptr(), a.len()) },
        _ => generic::dot_f32(a, b),
    }
}

/// A tile of canonical dot products: `put(i, j, dot(xs[i], ws[j]))` for up to 4 × 4 rows
/// of equal length. Each element has exactly [`dot`]'s arithmetic, so callers may tile as
/// they like without changing a result.
pub fn dot_tile(xs: &[&[f32]], ws: &[&[f32]], put: &mut dyn FnMut(usize, usize, f32)) {
    let k = xs.first().map_or(0, |x| x.len());
    assert!(
        xs.len() <= 4 && ws.len() <= 4,
        "dot_tile takes at most 4 x 4 rows"
    );
    assert!(
        xs.iter().chain(ws).all(|r| r.len() == k),
        "dot_tile rows differ in length"
    );
    gemm::f32_tile(
        Isa::active(),
        xs.len(),
        ws.len(),
        &|i| xs[i],
        &|j| ws[j],
        k,
        put,
    )
}

/// `outs[g] = Σ_p weights[g][p] · v[offs[p]..offs[p] + hd]` for each output `g` (at most 3
/// share one pass over the rows). Per element, positions are summed in order exactly as
/// repeated [`axpy`] calls starting from zero would.
pub fn weighted_rows(outs: &mut [&mut [f32]], weights: &[&[f32]], v: &[f32], offs: &[usize]) {
    let hd = outs.first().map_or(0, |o| o.len());
    assert!(outs.len() == weights.len() && outs.len() <= 3);
    assert!(outs.iter().all(|o| o.len() == hd) && weights.iter().all(|w| w.len() == offs.len()));
    assert!(
        offs.iter().all(|&o| o + hd <= v.len()),
        "weighted_rows: row outside v"
    );
    #[cfg(target_arch = "x86_64")]
    if Isa::active() == Isa::Avx2Fma {
        let ptrs: Vec<*mut f32> = outs.iter_mut().map(|o| o.as_mut_ptr()).collect();
        let p = |g: usize| ptrs[g];
        // SAFETY: AVX2+FMA present (Isa); bounds checked above; distinct `&mut` outputs.
        unsafe {
            match ptrs.len() {
                1 => x86::avx2::weighted_rows::<1>([p(0)], [weights[0]], v, offs, hd),
                2 => x86::avx2::weighted_rows::<2>(
                    [p(0), p(1)],
                    [weights[0], weights[1]],
                    v,
                    offs,
                    hd,
                ),
                3 => x86::avx2::weighted_rows::<3>(
                    [p(0), p(1), p(2)],
                    [weights[0], weights[1], weights[2]],
                    v,
                    offs,
                    hd,
                ),
                _ => {}
            }
        }
        return;
    }
    for (o, w) in outs.iter_mut().zip(weights) {
        o.fill(0.0);
        for (&off, &wp) in offs.iter().zip(w.iter()) {
            axpy(o, wp, &v[off..off + hd]);
        }
    }
}

/// `y += a · x`.
#[inline]
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    assert_eq!(y.len(), x.len());
    #[cfg(target_arch = "x86_64")]
    if Isa::active() == Isa::Avx2Fma {
        // SAFETY: AVX2+FMA present (Isa); equal lengths checked above.
        unsafe { x86::avx2::axpy(y, a, x) };
        return;
    }
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn vals(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| (((i * 7919 + seed * 104729) % 2001) as f32 / 1000.0) - 1.0)
            .collect()
    }

    proptest! {
        /// Every tile shape gives each element exactly `dot`'s result.
        #[test]
        fn dot_tile_equals_dot(k in 1usize..150, mr in 1usize..5, nr in 1usize..5) {
            let xs: Vec<Vec<f32>> = (0..mr).map(|i| vals(k, i)).collect();
            let ws: Vec<Vec<f32>> = (0..nr).map(|j| vals(k, 10 + j)).collect();
            let xr: Vec<&[f32]> = xs.iter().map(|v| v.as_slice()).collect();
            let wr: Vec<&[f32]> = ws.iter().map(|v| v.as_slice()).collect();
            let mut got = vec![f32::NAN; mr * nr];
            dot_tile(&xr, &wr, &mut |i, j, v| got[i * nr + j] = v);
            for i in 0..mr {
                for j in 0..nr {
                    prop_assert_eq!(got[i * nr + j], dot(&xs[i], &ws[j]));
                    let exact: f64 = xs[i].iter().zip(&ws[j]).map(|(a, b)| *a as f64 * *b as f64).sum();
                    prop_assert!((got[i * nr + j] as f64 - exact).abs() < 1e-4 * k as f64);
                }
            }
        }

        /// weighted_rows equals repeated axpy from zero, bitwise, for 1 to 3 outputs.
        #[test]
        fn weighted_rows_equals_axpy(hd in 1usize..100, rows in 1usize..20, g in 1usize..4) {
            let v = vals(hd * (rows + 3), 5);
            let offs: Vec<usize> = (0..rows).map(|p| ((p * 7) % (rows + 3)) * hd).collect();
            let ws: Vec<Vec<f32>> = (0..g).map(|i| vals(rows, 20 + i)).collect();
            let wr: Vec<&[f32]> = ws.iter().map(|w| w.as_slice()).collect();
            let mut outs: Vec<Vec<f32>> = vec![vec![f32::NAN; hd]; g];
            {
                let mut o: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
                weighted_rows(&mut o, &wr, &v, &offs);
            }
            for i in 0..g {
                let mut want = vec![0f32; hd];
                for (p, &off) in offs.iter().enumerate() {
                    axpy(&mut want, ws[i][p], &v[off..off + hd]);
                }
                prop_assert_eq!(&outs[i], &want);
            }
        }
    }
}
