//! Fast-path (integer-dot) kernels for the ggml formats Tessera keeps as stored: Q5_0, Q5_1
//! and IQ4_NL (32-weight blocks) and the super-block types Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and
//! IQ4_XS (256 weights), against 8-bit activations as llama.cpp computes them
//! (`ggml_vec_dot_*_q8_K`, `ggml_vec_dot_q5_0_q8_0`, …).
//!
//! Activations ([`QkActs`]) are quantized per row: Q8_K blocks (ggml's `quantize_row_q8_K`,
//! bitwise; on AVX2 by `x86_quant`) for the super-block types, 32-element blocks with
//! `d = amax / 127` and the quant sum ([`crate::quant_acts`]) for the others. Q4_K's and Q5_K's
//! quants are kept in the weights' nibble order (`QkActs::stored`).
//!
//! Arithmetic, the same on every kernel ([`Kernel`]): per weight row, activation row and
//! block, the integer sums are exact:
//! - `isum = Σ_g sc_g · Σ_{i∈g} q_i · a_i` over the block's sub-blocks `g`, with the
//!   weights' signed integer levels `q_i` (Q5_0's `q − 16`, Q6_K's `q − 32`, Q3_K's
//!   `q − 4·!hbit`, IQ4's table values) and integer sub-block scales `sc_g` (1 for the
//!   32-weight types; Q3_K's and IQ4_XS's `s − 32`);
//! - `msum = Σ_g m_g · Σ_{i∈g} a_i` for the types with sub-block minimums (Q2_K, Q4_K, Q5_K).
//!
//! and then, per output element and block in order, starting from `acc = 0` (`combine`,
//! every `·+` one fused multiply-add):
//! `acc = isum ·+ (d_w · d_a)`, then `acc = msum ·+ −(dmin_w · d_a)` (Q2_K, Q4_K, Q5_K) or
//! `acc = m_w ·+ s_a` (Q5_1, `s_a = d_a · Σa`). The integer sums are computed in any order
//! (they are exact) and each element's float operations do not depend on the tile shape, its
//! position or the other rows: results are batch invariant and **bitwise the same** on the
//! portable, AVX2 and AVX-512 kernels (the tests check equality, no tolerance).
//!
//! Kernels: `portable` (decode to integer levels, plain sums); `x86` (the loop: 4 weight
//! rows a pass, horizontal integer sums, the float steps lane-wise) over per-format dots:
//! `x86_k` (super-blocks) and `x86_small` (32-weight blocks) with `vpmaddubsw`/`vpmaddwd` on
//! AVX2, the same on 256-bit AVX-512VL with VNNI's `vpdpwssd`/`vpdpbusd`, and `x86_k512`
//! (Q4_K, Q5_K, Q6_K on 512-bit vectors).

use tessera_core::ggml_quants::{quantize_row_q8_k_into, QK_K};
use tessera_core::DType;

use crate::isa::Isa;
use crate::quant_acts::QuantizedActs;

mod portable;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_k;
#[cfg(target_arch = "x86_64")]
mod x86_k512;
#[cfg(target_arch = "x86_64")]
mod x86_quant;
#[cfg(target_arch = "x86_64")]
mod x86_small;

#[cfg(test)]
mod tests;

/// Register tiles `(mr, nr)` that [`tile`] implements; any `mr ≤ 4` and `nr ≤ 8` works.
pub const TILES: &[(usize, usize)] = &[(1, 8), (2, 8), (4, 8)];
/// The largest `mr` of [`TILES`].
pub const MAX_MR: usize = 4;
/// The largest `nr` of [`TILES`].
pub const MAX_NR: usize = 8;

/// The formats, as small integers for const generics.
pub(crate) mod fmt {
    pub const Q5_0: u8 = 0;
    pub const Q5_1: u8 = 1;
    pub const IQ4_NL: u8 = 2;
    pub const Q2_K: u8 = 3;
    pub const Q3_K: u8 = 4;
    pub const Q4_K: u8 = 5;
    pub const Q5_K: u8 = 6;
    pub const Q6_K: u8 = 7;
    pub const IQ4_XS: u8 = 8;
}

/// The format id of `dtype`, if it has kernels here.
fn fmt_of(dtype: DType) -> Option<u8> {
    Some(match dtype {
        DType::Q5_0 => fmt::Q5_0,
        DType::Q5_1 => fmt::Q5_1,
        DType::IQ4_NL => fmt::IQ4_NL,
        DType::Q2_K => fmt::Q2_K,
        DType::Q3_K => fmt::Q3_K,
        DType::Q4_K => fmt::Q4_K,
        DType::Q5_K => fmt::Q5_K,
        DType::Q6_K => fmt::Q6_K,
        DType::IQ4_XS => fmt::IQ4_XS,
        _ => return None,
    })
}

/// Whether `dtype` has fast-path kernels here.
pub fn supports(dtype: DType) -> bool {
    fmt_of(dtype).is_some()
}

/// How a block's minimum enters the float accumulation.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum MinKind {
    /// No minimum (`isum` holds the whole dot).
    None,
    /// `acc = msum ·+ −(dmin_w · d_a)` (Q2_K, Q4_K, Q5_K).
    Int,
    /// `acc = m_w ·+ s_a` (Q5_1).
    Float,
}

/// Per-format constants: block bytes, byte offsets of the f16 scale and minimum.
pub(crate) const fn layout(f: u8) -> (usize, usize, usize, MinKind) {
    match f {
        fmt::Q5_0 => (22, 0, 0, MinKind::None),
        fmt::Q5_1 => (24, 0, 2, MinKind::Float),
        fmt::IQ4_NL => (18, 0, 0, MinKind::None),
        fmt::Q2_K => (84, 80, 82, MinKind::Int),
        fmt::Q3_K => (110, 108, 0, MinKind::None),
        fmt::Q4_K => (144, 0, 2, MinKind::Int),
        fmt::Q5_K => (176, 0, 2, MinKind::Int),
        fmt::Q6_K => (210, 208, 0, MinKind::None),
        _ => (136, 0, 0, MinKind::None), // IQ4_XS
    }
}

/// Weights per block of format `f`.
pub(crate) const fn block_len(f: u8) -> usize {
    match f {
        fmt::Q5_0 | fmt::Q5_1 | fmt::IQ4_NL => 32,
        _ => QK_K,
    }
}

/// The f16 at `b[off..off + 2]`, widened exactly.
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], off: usize) -> f32 {
    tessera_core::blocks::f16_bits_to_f32([b[off], b[off + 1]])
}

/// One block's contribution to an output element (see the module docs): `dw`, `mw` the
/// weight block's scale and minimum, `da`, `sa` the activation block's scale and `d·Σq`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn combine(
    min: MinKind,
    acc: f32,
    isum: i32,
    msum: i32,
    dw: f32,
    mw: f32,
    da: f32,
    sa: f32,
) -> f32 {
    let acc = (isum as f32).mul_add(dw * da, acc);
    match min {
        MinKind::None => acc,
        MinKind::Int => (msum as f32).mul_add(-(mw * da), acc),
        MinKind::Float => mw.mul_add(sa, acc),
    }
}

/// Activations of `m` rows of `k`, quantized for the integer dots with weights of one dtype:
/// Q8_K blocks (`f32 d`, 256 quants, 16 sums of 16, as ggml's `quantize_row_q8_K`, bitwise)
/// for the super-block types, 32-element blocks (`d = amax / 127`, quants, their sum and
/// `d · Σq`, as [`QuantizedActs`]) for Q5_0, Q5_1 and IQ4_NL.
#[derive(Debug, Clone)]
pub struct QkActs {
    pub m: usize,
    pub k: usize,
    /// Elements per block: 256 (Q8_K) or 32.
    block: usize,
    /// Per block: the scale.
    d: Vec<f32>,
    /// `m · k` quants, row-major; for Q4_K and Q5_K ([`QkActs::nibble_order`]) the middle
    /// two 32-element quarters of each 128 swapped.
    qs: Vec<i8>,
    /// Whether `qs` is in the nibble order.
    nibble_order: bool,
    /// Q8_K: 16 sums of 16 quants per block.
    bsums: Vec<i16>,
    /// Q8_K: 8 sums of 32 quants per block.
    bsums32: Vec<i16>,
    /// 32-element blocks: the quant sum, and `d · Σq`.
    qsum: Vec<i32>,
    s: Vec<f32>,
}

impl QkActs {
    /// Quantizes `m` rows of `k` values of `x` for weights of `dtype` ([`supports`]; `k` a
    /// whole number of its blocks).
    ///
    /// # Panics
    /// If `dtype` is not supported, `k` is not a whole number of blocks or `x.len() != m·k`.
    pub fn quantize(dtype: DType, x: &[f32], m: usize, k: usize) -> QkActs {
        let f = fmt_of(dtype).unwrap_or_else(|| panic!("qk: no fast-path kernels for {dtype}"));
        let block = block_len(f);
        assert!(
            k.is_multiple_of(block),
            "qk: K = {k} is not a whole number of {block}-element blocks"
        );
        assert_eq!(x.len(), m * k, "qk: activations are not m x k");
        if block == 32 {
            let q = QuantizedActs::quantize(x, m, k);
            return QkActs {
                m,
                k,
                block,
                d: q.d,
                qs: q.qs,
                bsums: Vec::new(),
                bsums32: Vec::new(),
                qsum: q.qsum,
                s: q.s,
                nibble_order: false,
            };
        }
        let nb = m * k / QK_K;
        let mut acts = QkActs {
            m,
            k,
            block,
            d: vec![0.0; nb],
            qs: vec![0; m * k],
            bsums: vec![0; nb * 16],
            bsums32: vec![0; nb * 8],
            qsum: Vec::new(),
            s: Vec::new(),
            nibble_order: matches!(f, fmt::Q4_K | fmt::Q5_K),
        };
        let simd = cfg!(target_arch = "x86_64") && Isa::active() == Isa::Avx2Fma;
        for (b, xb) in x.chunks_exact(QK_K).enumerate() {
            let qs = &mut acts.qs[b * QK_K..(b + 1) * QK_K];
            let bsums = &mut acts.bsums[b * 16..(b + 1) * 16];
            acts.d[b] = q8k_block(simd, xb, qs, bsums);
            if acts.nibble_order {
                for half in qs.chunks_exact_mut(128) {
                    let (a, b) = half[32..96].split_at_mut(32);
                    a.swap_with_slice(b);
                }
            }
            for (s, p) in acts.bsums32[b * 8..].iter_mut().zip(bsums.chunks_exact(2)) {
                *s = p[0] + p[1];
            }
        }
        acts
    }

    /// The activations the kernels compute with exactly (`d · q` per element), as f32.
    pub fn dequantized(&self) -> Vec<f32> {
        (0..self.qs.len())
            .map(|i| self.d[i / self.block] * self.qs[self.stored(i)] as f32)
            .collect()
    }

    /// Where element `i` (of the whole `m · k`) is kept in `qs`. Q4_K and Q5_K keep their
    /// activations in the nibble order: the 64 bytes `qs[64p..64p + 64]` of a weight block
    /// hold elements `128p + (0..32, 64..96)` in their low nibbles and `128p + (32..64,
    /// 96..128)` in their high ones, so each 128 elements are kept as quarters 0, 2, 1, 3
    /// and one 64-byte vector of activations meets each nibble vector of weights.
    fn stored(&self, i: usize) -> usize {
        if !self.nibble_order {
            return i;
        }
        let q = (i / 32) % 4;
        let q = [0, 2, 1, 3][q];
        i / 128 * 128 + 32 * q + i % 32
    }

    /// Whether these activations serve weights of `dtype` (the same block size and quant
    /// order: Q4_K and Q5_K share theirs, the other super-block types theirs, Q5_0, Q5_1 and
    /// IQ4_NL theirs); otherwise quantize again for `dtype`.
    pub fn serves(&self, dtype: DType) -> bool {
        fmt_of(dtype).is_some_and(|f| {
            block_len(f) == self.block && matches!(f, fmt::Q4_K | fmt::Q5_K) == self.nibble_order
        })
    }

    /// Blocks per row.
    fn blocks(&self) -> usize {
        self.k / self.block
    }
}

/// Quantizes one block of 256 to Q8_K (ggml's `quantize_row_q8_K`, bitwise): its quants and
/// 16 sums of 16 into `qs` and `bsums`; returns `d`. `simd`: on AVX2 (the same results).
fn q8k_block(simd: bool, x: &[f32], qs: &mut [i8], bsums: &mut [i16]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: `simd` only where AVX2 runs (`Isa::Avx2Fma`); 256, 256 and 16 elements.
        return unsafe { x86_quant::q8k_block(x, qs, bsums) };
    }
    let _ = simd;
    let mut raw = [0u8; 4 + QK_K + 32];
    if let Err(e) = quantize_row_q8_k_into(x, &mut raw) {
        panic!("{e}");
    }
    for (q, &r) in qs.iter_mut().zip(&raw[4..4 + QK_K]) {
        *q = r as i8;
    }
    for (s, r) in bsums.iter_mut().zip(raw[4 + QK_K..].chunks_exact(2)) {
        *s = i16::from_le_bytes([r[0], r[1]]);
    }
    f32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]])
}

/// One kernel set: every format on one instruction set.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kernel {
    Portable,
    /// AVX2, FMA, F16C: `vpmaddubsw`/`vpmaddwd` dots.
    Avx2,
    /// AVX-512 F/BW/VL on 512-bit vectors.
    Avx512,
    /// As [`Kernel::Avx512`] with VNNI's `vpdpbusd`.
    Avx512Vnni,
}

impl Kernel {
    /// The kernels [`tile`] runs for `isa`: AVX2 on `Isa::Avx2Fma`, the AVX-512 ones (with
    /// VNNI when the CPU has it) where [`crate::isa::avx512_qk`] says AVX-512 is in use.
    pub fn for_isa(isa: Isa) -> Kernel {
        match isa {
            Isa::Generic => Kernel::Portable,
            Isa::Avx2Fma if crate::isa::avx512_qk() => {
                if Kernel::Avx512Vnni.available() {
                    Kernel::Avx512Vnni
                } else {
                    Kernel::Avx512
                }
            }
            Isa::Avx2Fma => Kernel::Avx2,
        }
    }

    /// Whether this CPU can run the kernel set.
    pub fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let avx2 = has!("avx2") && has!("fma") && has!("f16c");
            let avx512 = avx2 && has!("avx512f") && has!("avx512bw") && has!("avx512vl");
            match self {
                Kernel::Portable => true,
                Kernel::Avx2 => avx2,
                Kernel::Avx512 => avx512,
                Kernel::Avx512Vnni => avx512 && has!("avx512vnni"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Kernel::Portable
        }
    }
}

/// `out[a · nr + b] = Σ_k acts[i0 + a][k] · W_b[k]` for `a < mr`, `b < nr = rows.len()`,
/// where `rows[b]` is stored row `b` of a `dtype` weight (`acts.k / block_len` whole blocks),
/// on the kernels of `isa` ([`Kernel::for_isa`]).
///
/// # Panics
/// If `mr` is 0 or above [`MAX_MR`], `nr` above [`MAX_NR`], rows `i0 .. i0 + mr` are not in
/// `acts`, `acts` was not quantized for `dtype`'s block size, a row's length is not `K`'s
/// blocks, or `out` holds fewer than `mr · nr` values.
pub fn tile(
    isa: Isa,
    dtype: DType,
    acts: &QkActs,
    i0: usize,
    mr: usize,
    rows: &[&[u8]],
    out: &mut [f32],
) {
    tile_with(Kernel::for_isa(isa), dtype, acts, i0, mr, rows, out)
}

/// [`tile`] on an explicit kernel set (tests, benchmarks, variant measurement).
///
/// # Panics
/// As [`tile`], and if this CPU lacks `kernel` ([`Kernel::available`]).
pub fn tile_with(
    kernel: Kernel,
    dtype: DType,
    acts: &QkActs,
    i0: usize,
    mr: usize,
    rows: &[&[u8]],
    out: &mut [f32],
) {
    let f = fmt_of(dtype).unwrap_or_else(|| panic!("qk: no fast-path kernels for {dtype}"));
    let nr = rows.len();
    assert!(
        (1..=MAX_MR).contains(&mr),
        "qk: mr = {mr} is not in 1..={MAX_MR}"
    );
    assert!(nr <= MAX_NR, "qk: nr = {nr} is above {MAX_NR}");
    assert!(i0 + mr <= acts.m, "qk: activation rows outside the batch");
    assert!(
        acts.serves(dtype),
        "qk: activations quantized for another layout than {dtype}'s"
    );
    let row_bytes = acts.blocks() * layout(f).0;
    assert!(
        rows.iter().all(|r| r.len() == row_bytes),
        "qk: a weight row is not K long"
    );
    assert!(out.len() >= mr * nr, "qk: output smaller than the tile");
    if nr == 0 {
        return;
    }
    match kernel {
        Kernel::Portable => portable::tile(f, acts, i0, mr, rows, out),
        #[cfg(target_arch = "x86_64")]
        _ => {
            assert!(
                kernel.available(),
                "qk: this CPU lacks the {kernel:?} kernels"
            );
            // SAFETY: the CPU has the kernel's features (checked just above); the tile's
            // rows, activation rows and output sizes were checked above.
            unsafe { x86::tile(kernel, f, acts, i0, mr, rows, out) }
        }
        #[cfg(not(target_arch = "x86_64"))]
        _ => panic!("qk: the {kernel:?} kernels need x86-64"),
    }
}
