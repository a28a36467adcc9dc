//! Element-wise and row-wise operations of the decoder: RMSNorm, SwiGLU, softmax.
//! Each is a plain loop over a row; the forward parallelises over rows.

/// `out = x / sqrt(mean(x²) + eps) * weight`, accumulated in f64 for a stable mean.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let scale = (1.0 / (ss / x.len() as f64 + eps as f64).sqrt()) as f32;
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * scale * w;
    }
}

/// [`rms_norm`] in place: the same arithmetic, `x` overwritten.
pub fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let scale = (1.0 / (ss / x.len() as f64 + eps as f64).sqrt()) as f32;
    for (v, &w) in x.iter_mut().zip(weight) {
        *v = *v * scale * w;
    }
}

/// `gate = silu(gate) * up`, in place.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let s = *g / (1.0 + (-*g).exp());
        *g = s * u;
    }
}

/// `out = silu(gate) * up`.
pub fn swiglu_into(gate: &[f32], up: &[f32], out: &mut [f32]) {
    crate::math::silu_mul(gate, up, out)
}

/// `out = gelu_tanh(gate) * up` (GeGLU).
pub fn geglu_into(gate: &[f32], up: &[f32], out: &mut [f32]) {
    crate::math::gelu_tanh_mul(gate, up, out)
}

/// `x = c · tanh(x / c)` (soft-capping, Gemma 2's logits).
pub fn softcap(x: &mut [f32], c: f32) {
    x.iter_mut().for_each(|v| *v = (*v / c).tanh() * c);
}

/// Softmax in place; returns nothing, handles `-inf` entries.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let masked = x.contains(&f32::NEG_INFINITY);
    for v in x.iter_mut() {
        *v -= max;
    }
    crate::math::exp_in_place(x);
    if masked {
        // exp's range clamp would turn -inf into the smallest normal, not 0.
        x.iter_mut()
            .filter(|v| **v <= f32::MIN_POSITIVE)
            .for_each(|v| *v = 0.0);
    }
    // Fixed-order sum: 8 lane partials, then the lanes in order.
    let mut lanes = [0f32; 8];
    for (i, v) in x.iter().enumerate() {
        lanes[i % 8] += *v;
    }
    let inv = 1.0 / lanes.iter().sum::<f32>();
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `x += y`.
pub fn add_assign(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_matches_definition() {
        let x = [1.0f32, -2.0, 3.0];
        let w = [1.0f32, 0.5, 2.0];
        let mut o = [0f32; 3];
        rms_norm(&x, &w, 1e-6, &mut o);
        let r = ((1.0 + 4.0 + 9.0) / 3.0f32 + 1e-6).sqrt();
        for i in 0..3 {
            assert!((o[i] - x[i] / r * w[i]).abs() < 1e-6);
        }
    }

    #[test]
    fn softmax_sums_to_one_with_masked_entries() {
        let mut x = [1.0f32, f32::NEG_INFINITY, 3.0];
        softmax(&mut x);
        assert_eq!(x[1], 0.0);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }
}
