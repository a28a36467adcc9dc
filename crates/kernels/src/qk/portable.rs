//! Portable kernels, the reference for the SIMD ones: each weight block is decoded to its
//! integer levels `q_i`, sub-block scales `sc_g` and minimums `m_g` (laid out as ggml's
//! `dequantize_row_*` reads them), the integer sums are taken element by element, and
//! [`combine`] applies the scales.

use tessera_core::ggml_quants::KVALUES_IQ4NL;

use super::{block_len, combine, f16_at, fmt, layout, QkActs};

/// One block as integers: `len` levels in sub-blocks of `group` with a scale and a minimum
/// each (every level fits an `i8`: at most 127 in magnitude).
pub(super) struct IntBlock {
    pub q: [i8; 256],
    pub sc: [i32; 16],
    pub mn: [i32; 16],
    pub group: usize,
    pub len: usize,
}

impl IntBlock {
    fn new() -> IntBlock {
        IntBlock {
            q: [0; 256],
            sc: [1; 16],
            mn: [0; 16],
            group: 32,
            len: 32,
        }
    }
}

/// IQ4's level of a nibble.
fn kv(n: u8) -> i8 {
    KVALUES_IQ4NL[(n & 15) as usize]
}

/// Decodes one block of format `f` (`w` exactly its bytes), in the loops of ggml's
/// `dequantize_row_*`.
pub(super) fn decode(f: u8, w: &[u8], o: &mut IntBlock) {
    o.len = block_len(f);
    o.sc = [1; 16];
    o.mn = [0; 16];
    let q = &mut o.q;
    match f {
        fmt::Q5_0 | fmt::Q5_1 => {
            // Level j: nibble j % 16 of qs (low for j < 16), fifth bit j of qh.
            let off = if f == fmt::Q5_0 { 2 } else { 4 };
            let qh = u32::from_le_bytes([w[off], w[off + 1], w[off + 2], w[off + 3]]);
            let bias = if f == fmt::Q5_0 { 16 } else { 0 };
            o.group = 32;
            for j in 0..16 {
                let b = w[off + 4 + j];
                q[j] = ((b & 15) | (((qh >> j) & 1) << 4) as u8) as i8 - bias;
                q[j + 16] = ((b >> 4) | (((qh >> (j + 16)) & 1) << 4) as u8) as i8 - bias;
            }
        }
        fmt::IQ4_NL => {
            o.group = 32;
            for j in 0..16 {
                q[j] = kv(w[2 + j]);
                q[j + 16] = kv(w[2 + j] >> 4);
            }
        }
        fmt::Q2_K => {
            o.group = 16;
            for (g, &s) in w[..16].iter().enumerate() {
                o.sc[g] = (s & 15) as i32;
                o.mn[g] = (s >> 4) as i32;
            }
            // Levels 128n + 32s + l: bits 2s.. of qs[32n + l].
            for n in 0..2 {
                for s in 0..4 {
                    for l in 0..32 {
                        q[128 * n + 32 * s + l] = ((w[16 + 32 * n + l] >> (2 * s)) & 3) as i8;
                    }
                }
            }
        }
        fmt::Q3_K => {
            o.group = 16;
            o.sc = q3k_scales(&w[96..108]);
            // Levels 128n + 32s + l: bits 2s.. of qs[32n + l], less 4 unless bit 4n + s of
            // hmask[l] is set.
            for n in 0..2 {
                for s in 0..4 {
                    for l in 0..32 {
                        let low = ((w[32 + 32 * n + l] >> (2 * s)) & 3) as i8;
                        let high = (w[l] >> (4 * n + s)) & 1;
                        q[128 * n + 32 * s + l] = low - if high == 1 { 0 } else { 4 };
                    }
                }
            }
        }
        fmt::Q4_K | fmt::Q5_K => {
            o.group = 32;
            let qs = if f == fmt::Q4_K { 16 } else { 48 };
            for j in 0..8 {
                (o.sc[j], o.mn[j]) = scale_min_k4(j, &w[4..16]);
            }
            // Levels 64g + 32h + l: nibble h of qs[32g + l]; Q5_K's fifth bit is bit 2g + h
            // of qh[l].
            for g in 0..4 {
                for h in 0..2 {
                    for l in 0..32 {
                        let mut v = (w[qs + 32 * g + l] >> (4 * h)) & 15;
                        if f == fmt::Q5_K {
                            v |= ((w[16 + l] >> (2 * g + h)) & 1) << 4;
                        }
                        q[64 * g + 32 * h + l] = v as i8;
                    }
                }
            }
        }
        fmt::Q6_K => {
            o.group = 16;
            for g in 0..16 {
                o.sc[g] = w[192 + g] as i8 as i32;
            }
            // Levels 128n + 32s + l: nibble s / 2 of ql[64n + 32(s % 2) + l], bits 2s.. of
            // qh[32n + l] above it, less 32.
            for n in 0..2 {
                for s in 0..4 {
                    for l in 0..32 {
                        let low = (w[64 * n + 32 * (s % 2) + l] >> (4 * (s / 2))) & 15;
                        let high = (w[128 + 32 * n + l] >> (2 * s)) & 3;
                        q[128 * n + 32 * s + l] = (low | (high << 4)) as i8 - 32;
                    }
                }
            }
        }
        _ => {
            // IQ4_XS: sub-block ib has scale ls − 32 and 16 bytes: low nibbles then high.
            o.group = 32;
            let sh = u16::from_le_bytes([w[2], w[3]]) as i32;
            for ib in 0..8 {
                let lo = (w[4 + ib / 2] as i32 >> (4 * (ib % 2))) & 15;
                o.sc[ib] = (lo | (((sh >> (2 * ib)) & 3) << 4)) - 32;
                for j in 0..16 {
                    let b = w[8 + 16 * ib + j];
                    q[32 * ib + j] = kv(b);
                    q[32 * ib + j + 16] = kv(b >> 4);
                }
            }
        }
    }
}

/// ggml's `get_scale_min_k4`: sub-block `j`'s 6-bit scale and minimum.
pub(super) fn scale_min_k4(j: usize, s: &[u8]) -> (i32, i32) {
    let (sc, m) = if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    };
    (sc as i32, m as i32)
}

/// Q3_K's 16 six-bit scales less 32, from their 12 packed bytes: scale `g` has its low
/// nibble in `s[g % 8]` (bits 4.. for `g ≥ 8`) and its top two bits at bits `2(g / 4)..`
/// of `s[8 + g % 4]`.
pub(super) fn q3k_scales(s: &[u8]) -> [i32; 16] {
    let mut out = [0; 16];
    for (g, o) in out.iter_mut().enumerate() {
        let low = (s[g % 8] >> (4 * (g / 8))) & 15;
        let high = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
        *o = (low | (high << 4)) as i32 - 32;
    }
    out
}

/// `(isum, msum)` of a decoded block against `len` activation quants.
pub(super) fn block_sums(w: &IntBlock, a: &[i8]) -> (i32, i32) {
    let (mut isum, mut msum) = (0i32, 0i32);
    for g in 0..w.len / w.group {
        let r = g * w.group..(g + 1) * w.group;
        let dot: i32 = w.q[r.clone()]
            .iter()
            .zip(&a[r.clone()])
            .map(|(&q, &x)| q as i32 * x as i32)
            .sum();
        let sum: i32 = a[r].iter().map(|&x| x as i32).sum();
        isum += w.sc[g] * dot;
        msum += w.mn[g] * sum;
    }
    (isum, msum)
}

/// The portable [`super::tile`].
pub(super) fn tile(f: u8, acts: &QkActs, i0: usize, mr: usize, rows: &[&[u8]], out: &mut [f32]) {
    let (bb, d_off, m_off, min) = layout(f);
    let (bl, nb, nr) = (block_len(f), acts.blocks(), rows.len());
    let mut w = IntBlock::new();
    // The tile's activation rows in element order.
    let x0 = i0 * acts.k;
    let xq: Vec<i8> = (x0..x0 + mr * acts.k)
        .map(|i| acts.qs[acts.stored(i)])
        .collect();
    for (n, row) in rows.iter().enumerate() {
        let mut acc = [0f32; super::MAX_MR];
        for b in 0..nb {
            let wb = &row[b * bb..(b + 1) * bb];
            decode(f, wb, &mut w);
            let dw = f16_at(wb, d_off);
            let mw = f16_at(wb, m_off);
            for (a, acc) in acc.iter_mut().enumerate().take(mr) {
                let blk = (i0 + a) * nb + b;
                let xb = &xq[(a * nb + b) * bl..(a * nb + b + 1) * bl];
                let (isum, msum) = block_sums(&w, xb);
                let sa = acts.s.get(blk).copied().unwrap_or(0.0);
                *acc = combine(min, *acc, isum, msum, dw, mw, acts.d[blk], sa);
            }
        }
        for a in 0..mr {
            out[a * nr + n] = acc[a];
        }
    }
}
