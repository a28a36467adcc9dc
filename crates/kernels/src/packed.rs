//! Block-quantized weights repacked for the integer-dot path: eight output rows interleaved.
//!
//! For every group of 8 weight rows and every 32-wide block of K, one record holds the 8
//! rows' quants arranged so that one 32-byte load yields 4 consecutive K elements of each
//! of the 8 rows (byte `4·c + j` = row `c`, element `4·v + j` of the block, for k-group `v`),
//! followed by the 8 rows' f16 scales (and, for Q4_1, their f16 minimums). A kernel then
//! produces 8 outputs per vector lane set, one per row, and a block's scale product is one
//! vector multiply. For 4-bit formats k-groups `v` and `v + 4` share bytes (low and high
//! nibble). The last group is padded with zero rows. (The idea is ggml's `q4_0_8x8` repack;
//! this layout and its kernels are our own.)
//!
//! Record sizes: Q4_0 144 B, Q4_1 160 B, Q8_0 272 B per 8 rows × 32 elements, the same bytes
//! per weight as the original formats (plus the padding rows).

use tessera_core::blocks::{as_blocks, f16_bits_to_f32, BlockQ4_0, BlockQ4_1, BlockQ8_0, QK};
use tessera_core::{DType, WeightTensor};

use crate::aligned::Aligned;

pub const GROUP: usize = 8;

#[derive(Debug, Clone)]
pub struct PackedWeight {
    pub dtype: DType,
    /// Output rows (N) and inputs (K) of the original weight.
    pub n: usize,
    pub k: usize,
    pub groups: usize,
    pub blocks: usize,
    pub record_bytes: usize,
    /// The records, group-major then block: `(g · blocks + b) · record_bytes`; 64-byte
    /// aligned so the kernels' 32-byte loads of a Q4_1 record never straddle lines.
    pub data: Aligned<u8>,
    /// One bit per record (bit `i % 8` of byte `i / 8`, `i = g · blocks + b`): whether every
    /// real row of the record meets [`magic_ok`], so the AVX-512 stream kernel may take its
    /// fast decode (magic exponent, or Q4_1's low field) without checking the scales itself.
    pub fast: Vec<u8>,
}

/// Whether a row's block scales allow the AVX-512 stream kernel's fast decode
/// (`x86::avx512_exact`). Q4_0 (magic exponent): `d > 0` and finite and `264d` finite, so
/// that `(2^e + q) · d + C` rounded once is the reference's value. Q8_0 (low field):
/// `0 < d < 2^-5`, so that `D = d · 2^133` is finite and `q = 0` gives `+0` (ggml's Q8_0
/// scale is `max |w| / 127`: `2^-5` is a block maximum near 4). Q4_1 (low field): `d`
/// finite, non-zero and `|d| < 1/2`, so that the kernel's `D = d · 2^129`, made by adding
/// 129 to the exponent field of `d`'s bits, is that product and finite:
/// `(q · 2^-129) · D + m` rounded once is the reference's `q · d + m` for every `m`. Otherwise the kernel's
/// general path, bitwise the same, runs (a zero `d`, a block of 32 equal weights, is rare
/// in a trained model).
pub fn magic_ok(dtype: DType, d: f32) -> bool {
    let d_ok = d > 0.0 && d.is_finite();
    match dtype {
        DType::Q4_1 => d.is_finite() && d != 0.0 && d.abs() < 0.5,
        DType::Q4_0 => d_ok && (264.0 * d).is_finite(),
        _ => d_ok && d < 2f32.powi(-5),
    }
}

/// Record layout offsets.
pub fn record_layout(dtype: DType) -> Option<(usize, usize, usize)> {
    // (bytes of quants, offset of d, offset of m)
    match dtype {
        DType::Q4_0 => Some((128, 128, 0)),
        DType::Q4_1 => Some((128, 128, 144)),
        DType::Q8_0 => Some((256, 256, 0)),
        _ => None,
    }
}

impl PackedWeight {
    /// Repacks a Q4_0, Q4_1 or Q8_0 weight; `None` for other formats.
    pub fn pack(w: &WeightTensor) -> Option<Self> {
        Self::pack_rows(w.dtype, w.rows(), w.cols(), &|r| w.row(r))
    }

    /// Repacks `n` stored rows of `k` elements given by `row(r)`; `None` for formats
    /// without an interleaved layout.
    pub fn pack_rows<'a>(
        dtype: DType,
        n: usize,
        k: usize,
        row: &dyn Fn(usize) -> &'a [u8],
    ) -> Option<Self> {
        let (qbytes, d_off, m_off) = record_layout(dtype)?;
        let record_bytes = match dtype {
            DType::Q4_1 => 160,
            _ => qbytes + 16,
        };
        let groups = n.div_ceil(GROUP);
        let blocks = k / QK;
        let mut data = Aligned::<u8>::zeroed(groups * blocks * record_bytes);
        let mut fast = vec![0u8; (groups * blocks).div_ceil(8)];
        let mut q = [[0u8; QK]; GROUP];
        for g in 0..groups {
            for b in 0..blocks {
                let rec = &mut data[(g * blocks + b) * record_bytes..][..record_bytes];
                let mut d = [[0u8; 2]; GROUP];
                let mut m = [[0u8; 2]; GROUP];
                for (c, qc) in q.iter_mut().enumerate() {
                    let r = g * GROUP + c;
                    qc.fill(0);
                    if r >= n {
                        continue;
                    }
                    let bytes = row(r);
                    match dtype {
                        DType::Q4_0 => {
                            let blk = &as_blocks::<BlockQ4_0>(bytes).unwrap()[b];
                            d[c] = blk.d;
                            for j in 0..QK / 2 {
                                qc[j] = blk.qs[j] & 0x0f;
                                qc[j + QK / 2] = blk.qs[j] >> 4;
                            }
                        }
                        DType::Q4_1 => {
                            let blk = &as_blocks::<BlockQ4_1>(bytes).unwrap()[b];
                            d[c] = blk.d;
                            m[c] = blk.m;
                            for j in 0..QK / 2 {
                                qc[j] = blk.qs[j] & 0x0f;
                                qc[j + QK / 2] = blk.qs[j] >> 4;
                            }
                        }
                        DType::Q8_0 => {
                            let blk = &as_blocks::<BlockQ8_0>(bytes).unwrap()[b];
                            d[c] = blk.d;
                            for j in 0..QK {
                                qc[j] = blk.qs[j] as u8;
                            }
                        }
                        _ => unreachable!(),
                    }
                }
                match dtype {
                    DType::Q8_0 => {
                        for v in 0..8 {
                            for c in 0..GROUP {
                                for j in 0..4 {
                                    rec[v * 32 + 4 * c + j] = q[c][4 * v + j];
                                }
                            }
                        }
                    }
                    _ => {
                        for v in 0..4 {
                            for c in 0..GROUP {
                                for j in 0..4 {
                                    rec[v * 32 + 4 * c + j] =
                                        q[c][4 * v + j] | (q[c][4 * (v + 4) + j] << 4);
                                }
                            }
                        }
                    }
                }
                let real = n.saturating_sub(g * GROUP).min(GROUP);
                if (0..real).all(|c| magic_ok(dtype, f16_bits_to_f32(d[c]))) {
                    let i = g * blocks + b;
                    fast[i / 8] |= 1 << (i % 8);
                }
                for c in 0..GROUP {
                    rec[d_off + 2 * c..d_off + 2 * c + 2].copy_from_slice(&d[c]);
                    if dtype == DType::Q4_1 {
                        rec[m_off + 2 * c..m_off + 2 * c + 2].copy_from_slice(&m[c]);
                    }
                }
            }
        }
        Some(PackedWeight {
            dtype,
            n,
            k,
            groups,
            blocks,
            record_bytes,
            data,
            fast,
        })
    }

    /// The records of groups `groups`, each group's `blocks` records in a row.
    #[inline]
    pub fn group_bytes(&self, groups: std::ops::Range<usize>) -> &[u8] {
        let group = self.blocks * self.record_bytes;
        &self.data[groups.start * group..groups.end * group]
    }

    #[inline]
    pub fn record(&self, g: usize, b: usize) -> &[u8] {
        &self.data[(g * self.blocks + b) * self.record_bytes..][..self.record_bytes]
    }

    /// Quant of row `c` of group `g`, element `e` of block `b` (for the portable kernel).
    #[inline]
    pub fn quant(&self, g: usize, b: usize, c: usize, e: usize) -> i32 {
        let rec = self.record(g, b);
        let (v, j) = (e / 4, e % 4);
        match self.dtype {
            DType::Q8_0 => rec[v * 32 + 4 * c + j] as i8 as i32,
            _ => {
                let byte = rec[(v % 4) * 32 + 4 * c + j];
                (if v < 4 { byte & 0x0f } else { byte >> 4 }) as i32
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::blocks::f32_to_f16_bits;

    #[test]
    fn magic_ok_is_the_fast_paths_precondition() {
        assert!(magic_ok(DType::Q4_0, 0.5) && magic_ok(DType::Q4_0, 1e-7));
        for d in [0.0, -0.5, f32::INFINITY, f32::NAN] {
            assert!(!magic_ok(DType::Q8_0, d) && !magic_ok(DType::Q4_0, d));
        }
        // Q8_0: positive scales below 2^-5 (the largest f16 under it, f16's smallest).
        for d in [0.031234741, 6e-8, 0.0078] {
            assert!(magic_ok(DType::Q8_0, d), "d {d}");
        }
        for d in [0.03125, 0.5, 65504.0, -0.0078] {
            assert!(!magic_ok(DType::Q8_0, d), "d {d}");
        }
        // Q4_1: every finite non-zero scale below 1/2 in magnitude (f16's smallest
        // subnormal, 2^-24, included: a normal f32 once converted).
        for d in [-0.1, 0.4997559, -0.4997559, 6e-8, -6e-8] {
            assert!(magic_ok(DType::Q4_1, d), "d {d}");
        }
        for d in [
            0.5,
            -0.5,
            1.0,
            65504.0,
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ] {
            assert!(!magic_ok(DType::Q4_1, d), "d {d}");
        }
    }

    /// One Q4_1 block per row with scales `(d, m)`.
    fn q41_row(d: f32, m: f32) -> Vec<u8> {
        let mut row = f32_to_f16_bits(d).to_vec();
        row.extend_from_slice(&f32_to_f16_bits(m));
        row.extend_from_slice(&[0x5a; QK / 2]);
        row
    }

    #[test]
    fn the_fast_bitmap_marks_records_whose_real_rows_all_qualify() {
        // 19 rows: groups 0 and 1 whole, group 2 with 3 real rows (its padding rows have
        // zero scales and must not clear its bit). Row 9 (group 1) has a scale of 1/2.
        let rows: Vec<Vec<u8>> = (0..19)
            .map(|r| {
                if r == 9 {
                    q41_row(-0.5, 1.0)
                } else {
                    q41_row(0.125, -1.75)
                }
            })
            .collect();
        let pw = PackedWeight::pack_rows(DType::Q4_1, 19, QK, &|r| &rows[r]).unwrap();
        assert_eq!((pw.groups, pw.blocks), (3, 1));
        let bits: Vec<bool> = (0..3).map(|i| pw.fast[i / 8] >> (i % 8) & 1 == 1).collect();
        assert_eq!(bits, [true, false, true]);
    }
}
