//! Encoders for every [`GgmlQuant`], for tests and tools (synthetic weights of each type):
//! valid blocks that [`dequantize_row`](super::dequantize_row) decodes close to the input.
//!
//! * **Q5_0, Q5_1** follow ggml's `quantize_row_q5_0_ref` / `quantize_row_q5_1_ref`
//!   operation for operation (bitwise the same bytes), and **Q8_K** is
//!   [`quantize_row_q8_k_into`](super::quantize_row_q8_k_into) (`quantize_row_q8_K_ref`).
//! * **The K-quants and IQ4_NL / IQ4_XS** do *not* reproduce ggml's iterative searches
//!   (`make_qkx2_quants`, `make_qx_quants`, `quantize_row_iq4_nl_impl`): they are plain
//!   round-to-nearest from each sub-block's min/max. Every rounded scale is rounded *up*
//!   (away from zero), so each sub-block's grid covers its values, and the quants are
//!   chosen against the scales exactly as the decoder will form them. Hence each weight is
//!   within half a step of its sub-block's decoded grid (half the widest gap, 12 steps, of
//!   the IQ4 levels), up to f32 rounding:
//!   - Q2_K, Q4_K, Q5_K (`y = d·sc·q − dmin·m`): the offset is `o = −min(lo, 0)` as in
//!     ggml, the ideal step `(hi + o) / qmax`; `dmin`, `m`, then `d`, `sc` rounded up.
//!   - Q3_K, Q6_K, IQ4_XS, IQ4_NL (`y = d·sc·level`): the signed sub-block step is the
//!     smaller of the two (one per sign) that fits `[lo, hi]` into the asymmetric level
//!     range (−4..3, −32..31, −127..113); `d`, `sc` rounded away from zero.
//!
//! Awkward input: an all-zero block decodes to exactly zero; a scale that would overflow
//! f16 is clamped to ±65504 (the block then saturates instead of holding inf/NaN); tiny
//! values get at least the smallest f16 subnormal as their scale. A row that is not a
//! whole number of blocks, or holds NaN/inf, is an error. Q8_K is ggml's as is: a block
//! within ~1% of f32::MAX may decode to ±inf, and one below 127 / f32::MAX to zero.
//! `crates/core/tests/ggml_encode.rs` states and checks the per-type error bounds.

use half::f16;

use super::{GgmlQuant, KVALUES_IQ4NL, QK_K};

/// Encodes `x` (a whole number of blocks, all finite) as `q`.
pub fn quantize_row(q: GgmlQuant, x: &[f32]) -> Result<Vec<u8>, String> {
    let (bl, bb) = (q.block_len(), q.block_bytes());
    let Some(n) = q.row_bytes(x.len()) else {
        return Err(format!(
            "{q}: {} weights is not a whole number of {bl}-weight blocks",
            x.len()
        ));
    };
    if let Some(i) = x.iter().position(|v| !v.is_finite()) {
        return Err(format!("{q}: weight {i} is {}", x[i]));
    }
    let mut out = vec![0u8; n];
    let f: fn(&[f32], &mut [u8]) = match q {
        GgmlQuant::Q8_K => {
            super::quantize_row_q8_k_into(x, &mut out)?;
            return Ok(out);
        }
        GgmlQuant::Q5_0 => q5_0,
        GgmlQuant::Q5_1 => q5_1,
        GgmlQuant::Q2_K => q2_k,
        GgmlQuant::Q3_K => q3_k,
        GgmlQuant::Q4_K => q4_k,
        GgmlQuant::Q5_K => q5_k,
        GgmlQuant::Q6_K => q6_k,
        GgmlQuant::IQ4_NL => iq4_nl,
        GgmlQuant::IQ4_XS => iq4_xs,
    };
    for (x, y) in x.chunks_exact(bl).zip(out.chunks_exact_mut(bb)) {
        f(x, y);
    }
    Ok(out)
}

const F16_MAX: f32 = 65504.0;

/// Whether `v` rounds to an infinite f16.
fn f16_overflows(v: f32) -> bool {
    f16::from_f32(v).is_infinite()
}

/// The smallest f16 `>= v` (0 for `v <= 0`), at most 65504.
fn f16_up(v: f32) -> f16 {
    if v.is_nan() || v <= 0.0 {
        return f16::ZERO;
    }
    let h = f16::from_f32(v);
    let up = if h.to_f32() < v {
        f16::from_bits(h.to_bits() + 1)
    } else {
        h
    };
    if up.is_infinite() {
        f16::MAX
    } else {
        up
    }
}

fn put_f16(y: &mut [u8], at: usize, h: f16) {
    y[at..at + 2].copy_from_slice(&h.to_le_bytes());
}

fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        })
}

/// `ceil(v / step)` in `0..=max` (0 when `step` is 0).
fn ceil_steps(v: f32, step: f32, max: u8) -> u8 {
    if step > 0.0 {
        (v / step).ceil().clamp(0.0, max as f32) as u8
    } else {
        0
    }
}

/// The 5-bit quants of a Q5_0/Q5_1 block into `qh` (u32 LE) and `qs` as ggml packs them.
fn pack_q5(q: &[u8; 32], qh: &mut [u8], qs: &mut [u8]) {
    let mut h = 0u32;
    for j in 0..16 {
        qs[j] = (q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4);
        h |= ((q[j] as u32 & 0x10) >> 4) << j;
        h |= ((q[j + 16] as u32 & 0x10) >> 4) << (j + 16);
    }
    qh.copy_from_slice(&h.to_le_bytes());
}

/// `quantize_row_q5_0_ref`; only a `d` beyond f16 is clamped (then the quants saturate).
fn q5_0(x: &[f32], y: &mut [u8]) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let mut d = max / -16.0;
    if f16_overflows(d) {
        d = F16_MAX.copysign(d);
    }
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(y, 0, f16::from_f32(d));
    // C's `MIN(31, (int8_t)(x*id + 16.5f))`; the argument is >= 0 unless d was clamped.
    let q: [u8; 32] = std::array::from_fn(|j| ((x[j] * id + 16.5) as i32).clamp(0, 31) as u8);
    let (qh, qs) = y[2..].split_at_mut(4);
    pack_q5(&q, qh, qs);
}

/// `quantize_row_q5_1_ref`; only a `d` or `m` beyond f16 is clamped (then quants saturate).
fn q5_1(x: &[f32], y: &mut [u8]) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        min = if v < min { v } else { min };
        max = if v > max { v } else { max };
    }
    let mut d = (max - min) / 31.0;
    if f16_overflows(d) || f16_overflows(min) {
        d = d.min(F16_MAX);
        min = min.clamp(-F16_MAX, F16_MAX);
    }
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(y, 0, f16::from_f32(d));
    put_f16(y, 2, f16::from_f32(min));
    // C's `(uint8_t)(x0 + 0.5f)`, in 0..=31 unless clamped above.
    let q: [u8; 32] = std::array::from_fn(|j| (((x[j] - min) * id + 0.5) as u8).min(31));
    let (qh, qs) = y[4..].split_at_mut(4);
    pack_q5(&q, qh, qs);
}

/// An affine K-quant block, `y = (d * sc[j]) * q - (dmin * m[j])` per sub-block `j`.
struct Affine {
    d: f16,
    dmin: f16,
    sc: [u8; 16],
    m: [u8; 16],
    q: [u8; QK_K],
}

/// Encodes a 256-weight block as `n` sub-blocks with quants in `0..=qmax`, `sc`/`m` in
/// `0..=smax`: offsets and steps rounded up so each sub-block's grid covers it.
fn affine(x: &[f32], n: usize, qmax: u8, smax: u8) -> Affine {
    let len = QK_K / n;
    let mut r = Affine {
        d: f16::ZERO,
        dmin: f16::ZERO,
        sc: [0; 16],
        m: [0; 16],
        q: [0; QK_K],
    };
    let (mut lo, mut hi) = ([0f32; 16], [0f32; 16]);
    for (j, s) in x.chunks_exact(len).enumerate() {
        (lo[j], hi[j]) = min_max(s);
    }
    let omax = lo[..n].iter().fold(0f32, |a, &l| a.max(-l));
    r.dmin = f16_up(omax / smax as f32);
    let (mut ml, mut need) = ([0f32; 16], [0f32; 16]);
    for j in 0..n {
        r.m[j] = ceil_steps(-lo[j].min(0.0), r.dmin.to_f32(), smax);
        ml[j] = r.dmin.to_f32() * r.m[j] as f32;
        need[j] = ((hi[j] + ml[j]) / qmax as f32).max(0.0);
    }
    r.d = f16_up(need[..n].iter().fold(0f32, |a, &v| a.max(v)) / smax as f32);
    for (j, s) in x.chunks_exact(len).enumerate() {
        r.sc[j] = ceil_steps(need[j], r.d.to_f32(), smax);
        let dl = r.d.to_f32() * r.sc[j] as f32;
        for (q, &v) in r.q[j * len..].iter_mut().zip(s) {
            if dl > 0.0 {
                *q = ((v + ml[j]) / dl).round().clamp(0.0, qmax as f32) as u8;
            }
        }
    }
    r
}

/// The signed step that fits `[lo, hi]` of `x` into the levels `-neg..=pos`, the smaller of
/// a positive one (`[-neg s, pos s]`) and a negative one (`[-pos |s|, neg |s|]`).
fn sym_step(x: &[f32], neg: f32, pos: f32) -> f32 {
    let (lo, hi) = min_max(x);
    let plus = (hi / pos).max(-lo / neg);
    let minus = (hi / neg).max(-lo / pos);
    if minus < plus {
        -minus
    } else {
        plus
    }
}

/// A symmetric block: f16 `d` and signed sub-scales `k` (|k| <= kmax, rounded away from
/// zero so `|d * k| >= |step|`) for `n` sub-blocks with levels `-neg..=pos`.
fn sym_scales(x: &[f32], n: usize, neg: f32, pos: f32, kmax: f32) -> (f16, [i8; 16]) {
    let mut s = [0f32; 16];
    for (j, sub) in x.chunks_exact(QK_K / n).enumerate() {
        s[j] = sym_step(sub, neg, pos);
    }
    let d = f16_up(s.iter().fold(0f32, |a, v| a.max(v.abs())) / kmax);
    let df = d.to_f32();
    let k = s.map(|s| {
        if df > 0.0 {
            ((s.abs() / df).ceil().min(kmax) * s.signum()) as i8
        } else {
            0
        }
    });
    (d, k)
}

/// `round(v / dl)` in `-neg..=pos` (0 when `dl` is 0).
fn quant(v: f32, dl: f32, neg: f32, pos: f32) -> i32 {
    if dl != 0.0 {
        (v / dl).round().clamp(-neg, pos) as i32
    } else {
        0
    }
}

/// Index of the IQ4_NL level nearest to `v / dl` (any level when `dl` is 0).
fn iq4_index(v: f32, dl: f32) -> u8 {
    let t = if dl != 0.0 { v / dl } else { 0.0 };
    (0..16u8)
        .min_by(|&a, &b| {
            let ea = (t - KVALUES_IQ4NL[a as usize] as f32).abs();
            ea.total_cmp(&(t - KVALUES_IQ4NL[b as usize] as f32).abs())
        })
        .unwrap_or(0)
}

/// Byte and bit shift of 2-bit quant `k` in Q2_K/Q3_K's `qs`; the shift / 2 + 4 * (k / 128)
/// is also Q3_K's hmask bit.
fn qs2_pos(k: usize) -> (usize, usize) {
    (32 * (k / 128) + k % 32, 2 * (k % 128 / 32))
}

fn q2_k(x: &[f32], y: &mut [u8]) {
    let r = affine(x, 16, 3, 15);
    for (s, (&sc, &m)) in y[..16].iter_mut().zip(r.sc.iter().zip(&r.m)) {
        *s = sc | (m << 4);
    }
    for (k, &q) in r.q.iter().enumerate() {
        let (b, sh) = qs2_pos(k);
        y[16 + b] |= q << sh;
    }
    put_f16(y, 80, r.d);
    put_f16(y, 82, r.dmin);
}

fn q3_k(x: &[f32], y: &mut [u8]) {
    let (d, k) = sym_scales(x, 16, 4.0, 3.0, 31.0);
    for (i, v) in x.iter().enumerate() {
        let dl = d.to_f32() * k[i / 16] as f32;
        let q = (quant(*v, dl, 4.0, 3.0) + 4) as u8;
        let (b, sh) = qs2_pos(i);
        y[32 + b] |= (q & 3) << sh;
        y[b % 32] |= (q >> 2) << (sh / 2 + 4 * (i / 128));
    }
    for (j, &k) in k.iter().enumerate() {
        let l = (k as i32 + 32) as u8;
        y[96 + j % 8] |= (l & 0x0f) << (4 * (j / 8));
        y[96 + 8 + j % 4] |= (l >> 4) << (2 * (j / 4));
    }
    put_f16(y, 108, d);
}

/// Q4_K/Q5_K's 12 scale bytes (the inverse of `get_scale_min_k4`).
fn pack_scale_min_k4(r: &Affine, s: &mut [u8]) {
    for j in 0..8 {
        let (ls, lm) = (r.sc[j], r.m[j]);
        if j < 4 {
            s[j] = ls;
            s[j + 4] = lm;
        } else {
            s[j + 4] = (ls & 0x0f) | ((lm & 0x0f) << 4);
            s[j - 4] |= (ls >> 4) << 6;
            s[j] |= (lm >> 4) << 6;
        }
    }
}

fn q4_k(x: &[f32], y: &mut [u8]) {
    let r = affine(x, 8, 15, 63);
    put_f16(y, 0, r.d);
    put_f16(y, 2, r.dmin);
    pack_scale_min_k4(&r, &mut y[4..16]);
    for (k, &q) in r.q.iter().enumerate() {
        y[16 + 32 * (k / 64) + k % 32] |= q << (4 * (k % 64 / 32));
    }
}

fn q5_k(x: &[f32], y: &mut [u8]) {
    let r = affine(x, 8, 31, 63);
    put_f16(y, 0, r.d);
    put_f16(y, 2, r.dmin);
    pack_scale_min_k4(&r, &mut y[4..16]);
    for (k, &q) in r.q.iter().enumerate() {
        y[16 + k % 32] |= (q >> 4) << (k / 32);
        y[48 + 32 * (k / 64) + k % 32] |= (q & 0x0f) << (4 * (k % 64 / 32));
    }
}

fn q6_k(x: &[f32], y: &mut [u8]) {
    let (d, k) = sym_scales(x, 16, 32.0, 31.0, 127.0);
    for (i, v) in x.iter().enumerate() {
        let dl = d.to_f32() * k[i / 16] as f32;
        let q = (quant(*v, dl, 32.0, 31.0) + 32) as u8;
        let (n, t, l) = (i / 128, i % 128 / 32, i % 32);
        y[64 * n + l + 32 * (t & 1)] |= (q & 0x0f) << (4 * (t >> 1));
        y[128 + 32 * n + l] |= (q >> 4) << (2 * t);
    }
    for (j, &k) in k.iter().enumerate() {
        y[192 + j] = k as u8;
    }
    put_f16(y, 208, d);
}

fn iq4_nl(x: &[f32], y: &mut [u8]) {
    let s = sym_step(x, 127.0, 113.0);
    let d = if s < 0.0 { -f16_up(-s) } else { f16_up(s) };
    put_f16(y, 0, d);
    for j in 0..16 {
        y[2 + j] = iq4_index(x[j], d.to_f32()) | (iq4_index(x[j + 16], d.to_f32()) << 4);
    }
}

fn iq4_xs(x: &[f32], y: &mut [u8]) {
    let (d, k) = sym_scales(x, 8, 127.0, 113.0, 31.0);
    put_f16(y, 0, d);
    let mut scales_h = 0u16;
    for (ib, s) in x.chunks_exact(32).enumerate() {
        let ls = (k[ib] as i32 + 32) as u8;
        y[4 + ib / 2] |= (ls & 0x0f) << (4 * (ib % 2));
        scales_h |= ((ls >> 4) as u16) << (2 * ib);
        let dl = d.to_f32() * k[ib] as f32;
        for j in 0..16 {
            y[8 + 16 * ib + j] = iq4_index(s[j], dl) | (iq4_index(s[j + 16], dl) << 4);
        }
    }
    y[2..4].copy_from_slice(&scales_h.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// gguf-py 0.19's `quants.quantize` (numpy transcription of ggml's `_ref` quantizers) of
    /// four blocks: `((37 i) % 101 - 50) / 7`, `-((13 i) % 29 + 1) / 3`, zeros, one -0.1.
    #[test]
    fn q5_0_and_q5_1_match_ggml_bitwise() {
        let mut x = vec![0f32; 128];
        for i in 0..32 {
            x[i] = ((i * 37 % 101) as f32 - 50.0) / 7.0;
            x[32 + i] = -((i * 13 % 29) as f32 + 1.0) / 3.0;
        }
        x[96 + 5] = -0.1;
        let hex = |b: Vec<u8>| b.iter().map(|b| format!("{b:02x}")).collect::<String>();
        assert_eq!(
            hex(quantize_row(GgmlQuant::Q5_0, &x).unwrap()),
            "2537a4a52d6dc07c38f3bf6b26e2ae5a15d18d49f4c0d53800000000df68e17a039c24ad36cf58e1\
             79f28b140080ffffffff00000000000000000000000000000000661edfffffff0000000000000000\
             0000000000000000"
        );
        assert_eq!(
            hex(quantize_row(GgmlQuant::Q5_1, &x).unwrap()),
            "603725c7a4a52d6db07b37e3af6a26d29d5905c18c48f4b0d134d5c8ab56a56a9fb1d2e40627395b\
             7c8ea0c1d3f416280000000000000000000000000000000000000000000000009b1a66aedfffffff\
             fffffffffff0ffffffffffffffffffff"
        );
    }

    #[test]
    fn f16_up_rounds_up_and_saturates() {
        assert_eq!(f16_up(1.0), f16::ONE);
        assert!(f16_up(1.0001).to_f32() > 1.0001);
        assert_eq!(f16_up(1e-30).to_bits(), 1);
        assert_eq!(f16_up(0.0), f16::ZERO);
        assert_eq!(f16_up(65505.0), f16::MAX);
        assert_eq!(f16_up(f32::INFINITY), f16::MAX);
    }
}
