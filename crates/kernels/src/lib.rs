//! Compute kernels over weights in their stored formats.
//!
//! - [`isa`]: which instruction set the kernels use, detected once at run time.
//! - [`generic`]: portable kernels, always complete; the reference for the SIMD ones.
//! - `x86::avx2`: AVX2+FMA kernels with the same arithmetic (same summation order).
//! - [`matmul`]: `y = x · Wᵀ` for f32 activations and any stored weight format, parallel
//!   over the compute units.
//! - [`ops`]: RMSNorm, SwiGLU, softmax and friends.
//!
//! Numerics contract of the exact path: a weight is dequantized to the f32 value the
//! reference (`tessera_core::blocks`) defines, and each output element is a dot product whose
//! summation order depends only on K (8 lanes, a fixed lane tree, then the tail), never on M,
//! N, the thread count or the other rows. That makes every row's result batch-invariant.

pub mod calibrate;
pub mod cost;
pub mod gemm;
pub mod generic;
pub mod isa;
pub mod math;
pub mod matmul;
pub mod ops;
pub mod packed;
pub mod plan;
pub mod planner;
pub mod quant_acts;
#[cfg(target_arch = "x86_64")]
pub mod x86;

pub use isa::Isa;
pub use matmul::matmul;

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
