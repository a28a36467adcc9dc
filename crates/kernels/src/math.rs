//! Vectorised transcendental functions for the forward's element-wise work (softmax,
//! SiLU). `exp` is the Cephes single-precision polynomial (range reduction by ln 2 split in
//! two constants, degree-6 polynomial): a few ulp from the exact value over the whole f32
//! range, the same sequence of operations in the AVX2 and portable versions.

use crate::isa::Isa;

const LOG2E: f32 = std::f32::consts::LOG2_E;
const C1: f32 = 0.693_359_4;
const C2: f32 = -2.121_944_4e-4;
const P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    5e-1,
];
const HI: f32 = 88.376_26;
const LO: f32 = -87.336_55;

/// Portable `exp` with the vector version's operations.
#[inline]
pub fn exp_scalar(x: f32) -> f32 {
    let x = x.clamp(LO, HI);
    let n = (x * LOG2E + 0.5).floor();
    let r = x - n * C1 - n * C2;
    let mut y = P[0];
    for &p in &P[1..] {
        y = y * r + p;
    }
    let y = y * r * r + r + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// `x[i] = exp(x[i])`.
pub fn exp_in_place(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if Isa::active() == Isa::Avx2Fma {
        // SAFETY: AVX2+FMA present (Isa); the function stays inside the slice.
        unsafe { avx2::exp_in_place(x) };
        return;
    }
    x.iter_mut().for_each(|v| *v = exp_scalar(*v));
}

/// `out[i] = gate[i] / (1 + exp(-gate[i])) * up[i]` (SwiGLU).
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(gate.len() == up.len() && up.len() == out.len());
    #[cfg(target_arch = "x86_64")]
    if Isa::active() == Isa::Avx2Fma {
        // SAFETY: as above; all three slices have the same length.
        unsafe { avx2::silu_mul(gate, up, out) };
        return;
    }
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + exp_scalar(-g)) * u;
    }
}

/// √(2/π) and the cubic coefficient of GELU's tanh approximation.
const GELU_K0: f32 = 0.797_884_6;
const GELU_K1: f32 = 0.044_715;

/// `gelu_tanh(x) = x/2 · (1 + tanh(√(2/π)(x + 0.044715x³)))`, computed as the equal
/// `x / (1 + exp(-2u))` with `u = √(2/π)(x + 0.044715x³)` (no cancellation near 0).
#[inline]
fn gelu_tanh_scalar(x: f32) -> f32 {
    let u = GELU_K0 * (x + GELU_K1 * x * x * x);
    x / (1.0 + exp_scalar(-2.0 * u))
}

/// `out[i] = gelu_tanh(gate[i]) * up[i]` (GeGLU with tanh GELU, as Gemma's MLP).
pub fn gelu_tanh_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(gate.len() == up.len() && up.len() == out.len());
    #[cfg(target_arch = "x86_64")]
    if Isa::active() == Isa::Avx2Fma {
        // SAFETY: AVX2+FMA present (Isa); all three slices have the same length.
        unsafe { avx2::gelu_tanh_mul(gate, up, out) };
        return;
    }
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = gelu_tanh_scalar(g) * u;
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    //! Invariants: callers checked AVX2+FMA; loads and stores are unaligned and stay within
    //! the slices (the tail is handled by the scalar twin).
    use super::*;
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn exp8(x: __m256) -> __m256 {
        let x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(LO)), _mm256_set1_ps(HI));
        let n = _mm256_floor_ps(_mm256_fmadd_ps(
            x,
            _mm256_set1_ps(LOG2E),
            _mm256_set1_ps(0.5),
        ));
        let r = _mm256_fnmadd_ps(
            n,
            _mm256_set1_ps(C2),
            _mm256_fnmadd_ps(n, _mm256_set1_ps(C1), x),
        );
        let mut y = _mm256_set1_ps(P[0]);
        for &p in &P[1..] {
            y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(p));
        }
        let y = _mm256_add_ps(
            _mm256_fmadd_ps(_mm256_mul_ps(y, r), r, r),
            _mm256_set1_ps(1.0),
        );
        let e = _mm256_slli_epi32(
            _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
            23,
        );
        _mm256_mul_ps(y, _mm256_castsi256_ps(e))
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn exp_in_place(x: &mut [f32]) {
        let n8 = x.len() / 8 * 8;
        let p = x.as_mut_ptr();
        for i in (0..n8).step_by(8) {
            _mm256_storeu_ps(p.add(i), exp8(_mm256_loadu_ps(p.add(i))));
        }
        x[n8..].iter_mut().for_each(|v| *v = exp_scalar(*v));
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
        let n8 = gate.len() / 8 * 8;
        let one = _mm256_set1_ps(1.0);
        for i in (0..n8).step_by(8) {
            let g = _mm256_loadu_ps(gate.as_ptr().add(i));
            let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
            let s = _mm256_div_ps(g, _mm256_add_ps(one, e));
            _mm256_storeu_ps(
                out.as_mut_ptr().add(i),
                _mm256_mul_ps(s, _mm256_loadu_ps(up.as_ptr().add(i))),
            );
        }
        for i in n8..gate.len() {
            out[i] = gate[i] / (1.0 + exp_scalar(-gate[i])) * up[i];
        }
    }

    /// [`super::gelu_tanh_mul`]: the scalar twin's operations, eight lanes at a time (the
    /// multiply-adds fused, so values may differ from the tail's by an ulp).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn gelu_tanh_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
        let n8 = gate.len() / 8 * 8;
        let one = _mm256_set1_ps(1.0);
        let k0 = _mm256_set1_ps(-2.0 * GELU_K0);
        let k1 = _mm256_set1_ps(GELU_K1);
        for i in (0..n8).step_by(8) {
            let x = _mm256_loadu_ps(gate.as_ptr().add(i));
            let x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
            let t = _mm256_mul_ps(k0, _mm256_fmadd_ps(k1, x3, x));
            let s = _mm256_div_ps(x, _mm256_add_ps(one, exp8(t)));
            _mm256_storeu_ps(
                out.as_mut_ptr().add(i),
                _mm256_mul_ps(s, _mm256_loadu_ps(up.as_ptr().add(i))),
            );
        }
        for i in n8..gate.len() {
            out[i] = gelu_tanh_scalar(gate[i]) * up[i];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn exp_is_within_a_few_ulp(xs in proptest::collection::vec(-87.0f32..88.0, 1..40)) {
            let mut v = xs.clone();
            exp_in_place(&mut v);
            for (x, y) in xs.iter().zip(&v) {
                let want = (*x as f64).exp();
                prop_assert!(((*y as f64) - want).abs() <= want * 4e-7, "exp({x}) = {y}, want {want}");
                let s = exp_scalar(*x) as f64;
                prop_assert!((s - want).abs() <= want * 4e-7);
            }
        }

        #[test]
        fn gelu_tanh_mul_matches_definition(g in proptest::collection::vec(-30f32..30.0, 1..37)) {
            let up: Vec<f32> = g.iter().map(|v| v * 0.5 + 1.0).collect();
            let mut out = vec![0f32; g.len()];
            gelu_tanh_mul(&g, &up, &mut out);
            for i in 0..g.len() {
                let x = g[i] as f64;
                let gelu = 0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh());
                let want = gelu * up[i] as f64;
                prop_assert!((out[i] as f64 - want).abs() <= 2e-6 * (1.0 + want.abs()), "{} {} {}", x, out[i], want);
            }
        }

        #[test]
        fn silu_mul_matches_definition(g in proptest::collection::vec(-20f32..20.0, 1..37)) {
            let up: Vec<f32> = g.iter().map(|v| v * 0.5 + 1.0).collect();
            let mut out = vec![0f32; g.len()];
            silu_mul(&g, &up, &mut out);
            for i in 0..g.len() {
                let want = g[i] as f64 / (1.0 + (-(g[i] as f64)).exp()) * up[i] as f64;
                prop_assert!((out[i] as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()));
            }
        }
    }
}
