//! `ggml_quants::quantize_row` against `dequantize_row`: every type's round trip stays
//! within the per-weight bound derived below from its encoder (see the module doc of
//! `ggml_quants/encode.rs`), zeros stay exactly zero, awkward rows encode to finite blocks,
//! and bad rows are errors.

use proptest::prelude::*;
use tessera_core::ggml_quants::{dequantize_row, quantize_row, GgmlQuant};

/// An upper bound on rounding `v >= 0` up to f16: relative 2^-10 (normal), 2^-24 (subnormal).
fn up16(v: f32) -> f32 {
    v * (1.0 + 1.0 / 1024.0) + 2f32.powi(-24)
}

fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        })
}

fn round_trip(q: GgmlQuant, x: &[f32]) -> Vec<f32> {
    let bytes = quantize_row(q, x).unwrap();
    assert_eq!(bytes.len(), q.row_bytes(x.len()).unwrap());
    let mut y = vec![0f32; x.len()];
    dequantize_row(q, &bytes, &mut y).unwrap();
    y
}

/// The largest `|x - decoded|` each weight may have. `slack` covers f32 rounding in the
/// encoder and decoder (a few ulps of the block's largest magnitude).
///
/// * Q8_K (ggml): half of `d = amax / 127` (all of amax where ggml's `1 / d` overflows).
/// * Q5_0 (ggml): `d = amax / 16` with the max-magnitude value at level -16, so levels
///   reach -16·d one way but only +15·d the other: half a step, or a whole one for
///   `x / d` in (15.5, 16]; plus `d`'s f16 rounding on up to 16 levels.
/// * Q5_1 (ggml): half of `d = (hi - lo) / 31`, plus the f16 rounding of `d` (31 levels)
///   and of the min `m`.
/// * Q2_K, Q4_K, Q5_K (affine, `qmax` 3/15/31, 6-bit or 4-bit `smax` 63/63/15): sub-block
///   offset `o = -min(lo, 0)`, `dmin <= up16(max o / smax)`, `m·dmin < o + dmin`, step
///   needed `(hi + m·dmin) / qmax <= (hi + o + dmin) / qmax =: need`,
///   `d <= up16(max need / smax)`, decoded step `d·sc < need + d`: half of `need + d`.
/// * Q3_K, Q6_K, IQ4_XS (symmetric, levels -4..3, -32..31, IQ4's -127..113; sub-scales up
///   to 31, 127, 31): sub-block step `s` the smaller of `max(hi/pos, -lo/neg)` and
///   `max(hi/neg, -lo/pos)`, `d <= up16(max s / kmax)`, decoded step `< s + d`: half of it
///   for the uniform levels, 12 times it for the IQ4 levels (widest gap 113 - 89 = 24).
/// * IQ4_NL: one f16 scale, `|d| <= up16(s)`: 12 |d|.
fn bounds(q: GgmlQuant, x: &[f32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for blk in x.chunks_exact(q.block_len()) {
        let amax = blk.iter().fold(0f32, |a, v| a.max(v.abs()));
        let slack = 2e-6 * amax;
        let affine = |n: usize, qmax: f32, smax: f32, out: &mut Vec<f32>| {
            let subs: Vec<(f32, f32)> = blk.chunks_exact(256 / n).map(min_max).collect();
            let omax = subs.iter().fold(0f32, |a, &(lo, _)| a.max(-lo));
            let dmin = up16(omax / smax);
            let need: Vec<f32> = subs
                .iter()
                .map(|&(lo, hi)| (hi - lo.min(0.0) + dmin) / qmax)
                .collect();
            let d = up16(need.iter().fold(0f32, |a, &v| a.max(v)) / smax);
            for nd in need {
                out.extend(std::iter::repeat_n(0.5 * (nd + d) + slack, 256 / n));
            }
        };
        let step = |s: &[f32], neg: f32, pos: f32| {
            let (lo, hi) = min_max(s);
            (hi / pos).max(-lo / neg).min((hi / neg).max(-lo / pos))
        };
        let sym = |n: usize, neg: f32, pos: f32, kmax: f32, f: f32, out: &mut Vec<f32>| {
            let s: Vec<f32> = blk
                .chunks_exact(256 / n)
                .map(|s| step(s, neg, pos))
                .collect();
            let d = up16(s.iter().fold(0f32, |a, &v| a.max(v)) / kmax);
            for s in s {
                out.extend(std::iter::repeat_n(f * (s + d) + slack, 256 / n));
            }
        };
        let h = 2f32.powi(-11);
        let sub = 2f32.powi(-25);
        match q {
            // ggml's `-127 / max` overflows for amax < 127 / f32::MAX: the block decodes to 0.
            GgmlQuant::Q8_K if amax < 127.0 / f32::MAX => out.extend(blk.iter().map(|_| amax)),
            GgmlQuant::Q8_K => out.extend(blk.iter().map(|_| amax / 254.0 + slack)),
            GgmlQuant::Q5_0 => {
                let max = blk
                    .iter()
                    .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
                let d = amax / 16.0;
                out.extend(blk.iter().map(|&v| {
                    let u = if max != 0.0 { -16.0 * v / max } else { 0.0 };
                    let part = if u < 15.49 { 0.5 } else { 1.0 };
                    part * d + 16.0 * (d * h + sub) + slack
                }));
            }
            GgmlQuant::Q5_1 => {
                let (lo, hi) = min_max(blk);
                let d = (hi - lo) / 31.0;
                let b = d / 2.0 + 31.0 * (d * h + sub) + lo.abs() * h + sub + slack;
                out.extend(blk.iter().map(|_| b));
            }
            GgmlQuant::Q2_K => affine(16, 3.0, 15.0, &mut out),
            GgmlQuant::Q4_K => affine(8, 15.0, 63.0, &mut out),
            GgmlQuant::Q5_K => affine(8, 31.0, 63.0, &mut out),
            GgmlQuant::Q3_K => sym(16, 4.0, 3.0, 31.0, 0.5, &mut out),
            GgmlQuant::Q6_K => sym(16, 32.0, 31.0, 127.0, 0.5, &mut out),
            GgmlQuant::IQ4_XS => sym(8, 127.0, 113.0, 31.0, 12.0, &mut out),
            GgmlQuant::IQ4_NL => {
                let b = 12.0 * up16(step(blk, 127.0, 113.0)) + slack;
                out.extend(blk.iter().map(|_| b));
            }
        }
    }
    out
}

fn check_within(q: GgmlQuant, x: &[f32], y: &[f32]) -> Result<(), String> {
    for (i, ((&x, &y), b)) in x.iter().zip(y).zip(bounds(q, x)).enumerate() {
        if !y.is_finite() || (x - y).abs() > b {
            return Err(format!("{q} weight {i}: {x} decoded as {y}, bound {b}"));
        }
    }
    Ok(())
}

/// A row of `blocks` blocks of `q`: uniform values times a per-16-weight magnitude
/// `10^(e + f)` (f in -2..0), plus a per-row offset (|offset| > 1 makes one-signed rows).
fn row(q: GgmlQuant, blocks: usize, e: i32, offset: f32, u: &[f32], f: &[f32]) -> Vec<f32> {
    (0..blocks * q.block_len())
        .map(|i| (u[i] + offset) * 10f32.powf(e as f32 + f[i / 16]))
        .collect()
}

proptest! {
    #[test]
    fn round_trip_within_bound_and_requantize_is_stable(
        t in 0usize..10,
        blocks in 1usize..=4,
        e in -3i32..=3,
        offset in prop_oneof![Just(0.0f32), -2.5f32..2.5],
        u in prop::collection::vec(-1.0f32..1.0, 1024),
        f in prop::collection::vec(-2.0f32..0.0, 64),
    ) {
        let q = GgmlQuant::ALL[t];
        let x = row(q, blocks, e, offset, &u, &f);
        let y = round_trip(q, &x);
        check_within(q, &x, &y).map_err(TestCaseError::fail)?;
        // A decoded row is itself a row: it must round-trip within its own bound, and the
        // second trip may drift from `x` by at most both bounds.
        let y2 = round_trip(q, &y);
        check_within(q, &y, &y2).map_err(TestCaseError::fail)?;
        for ((&a, &b), (bx, by)) in x.iter().zip(&y2).zip(bounds(q, &x).into_iter().zip(bounds(q, &y))) {
            prop_assert!((a - b).abs() <= bx + by, "{q}: {a} -> {b}");
        }
    }
}

#[test]
fn zero_rows_decode_to_exact_zero() {
    for q in GgmlQuant::ALL {
        for blocks in 1..=4 {
            let y = round_trip(q, &vec![0.0; blocks * q.block_len()]);
            assert!(y.iter().all(|&v| v == 0.0), "{q}");
        }
    }
}

#[test]
fn single_nonzero_and_one_signed_rows_within_bound() {
    for q in GgmlQuant::ALL {
        let n = 2 * q.block_len();
        for v in [1.0f32, -3.5, 1e-3, -7e3, 2.5e4, 1e-30] {
            for at in [0, 17, n / 2 - 1, n - 1] {
                let mut x = vec![0.0; n];
                x[at] = v;
                check_within(q, &x, &round_trip(q, &x)).unwrap();
            }
        }
        for sign in [1.0f32, -1.0] {
            let x: Vec<f32> = (0..n)
                .map(|i| sign * (1.0 + (i % 7) as f32 * 0.25))
                .collect();
            check_within(q, &x, &round_trip(q, &x)).unwrap();
            let c = vec![sign * 0.3; n];
            check_within(q, &c, &round_trip(q, &c)).unwrap();
        }
    }
}

#[test]
fn tiny_and_huge_rows_give_finite_blocks() {
    for q in GgmlQuant::ALL {
        let n = q.block_len();
        let pattern = |s: f32| -> Vec<f32> { (0..n).map(|i| s * ((i % 9) as f32 - 4.0)).collect() };
        for s in [1e-30f32, 1e-42, 1e-7] {
            let x = pattern(s);
            check_within(q, &x, &round_trip(q, &x)).unwrap();
        }
        for s in [1e6f32, 1e30] {
            let y = round_trip(q, &pattern(s));
            assert!(y.iter().all(|v| v.is_finite()), "{q} at {s}");
        }
        // Q8_K is ggml's f32-scaled block as is: `d * 127` may round past f32::MAX there.
        if q != GgmlQuant::Q8_K {
            let mut x = pattern(f32::MAX / 4.0);
            x[0] = f32::MAX;
            x[1] = -f32::MAX;
            assert!(round_trip(q, &x).iter().all(|v| v.is_finite()), "{q}");
        }
    }
}

#[test]
fn bad_rows_are_errors() {
    for q in GgmlQuant::ALL {
        let n = q.block_len();
        for len in [1, n - 1, n + 1, 3 * n / 2] {
            assert!(quantize_row(q, &vec![0.5; len]).is_err(), "{q} len {len}");
        }
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut x = vec![0.5; n];
            x[n - 1] = bad;
            assert!(quantize_row(q, &x).is_err(), "{q} {bad}");
        }
        assert_eq!(quantize_row(q, &[]).unwrap(), Vec::<u8>::new());
    }
}
