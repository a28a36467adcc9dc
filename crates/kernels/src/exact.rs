//! The exact family's streaming (small M) and packed (large M) kernels, as plan executors.
//!
//! Both follow the canonical summation order of the crate (see `docs/bench/exact-path.md`):
//! every output element `y[i, j]` is one 8-lane accumulator fed the K chunks `0, 1, 2, …` of
//! `x[i] · W[j]` in order, then the fixed lane tree, then the `K % 8` tail in order, then the
//! bias. Weights enter as their reference f32 values (`tessera_core::tensor::dequantize_row`).
//! Nothing in that order depends on M, N, the tile, the blocks, the split or the other rows,
//! so the panel (`KernelFamily::F32Dot` with `F32Kernel::Panel`), [`stream_range`] and
//! [`packed_range`] give bitwise the same result for every element on one ISA.
//!
//! - Stream: for each block of `nc` weight rows, for each `mr`-row tile of activations, for
//!   each `nr` weight rows: dequantize in registers and accumulate; the stored rows are read
//!   once per activation tile (from DRAM the first time, then from cache).
//! - Packed: for each block of `nc` weight rows, for each K block of `kc`: dequantize the
//!   block once into a panel interleaved by `nr` rows; for each block of `mc` activation rows,
//!   each `nr`-row group, each `mr`-row tile: run the register tile over the K block, its lane
//!   accumulators kept in memory between K blocks; after the last K block, reduce and write
//!   (`packed`).
//!
//! Wherever AVX2 runs, block-quantized weights are repacked at load and the stream form runs
//! on the records (`records`: `x86::avx2_records`, or `x86::avx512_exact` where AVX-512
//! runs, `crate::isa::avx512_exact`), and the packed form dequantizes its panels from them;
//! with AVX-512 its even-`nr` tiles are AVX-512 tiles (`x86::avx512_packed`). Same order, so
//! the same bits on every ISA.

use std::ops::Range;

use tessera_core::DType;
use tessera_runtime::DisjointMut;

use crate::gemm::GemmWeight;
use crate::generic::{self, LANES};
use crate::isa::Isa;
use crate::plan::Plan;
pub use outer::STRIP as OUTER_STRIP;
pub(crate) use packed::packed_range;
pub use packed::{packed_kc, packed_tile_for, packed_tiles};

/// The streaming kernel's tile for a requested one: `mr ≤ 4`, and `nr` a power of two at
/// most 8, 2, 2, 1 for `mr` = 1, 2, 3, 4 (what the 16 vector registers hold without spills
/// next to the dequantization temporaries).
pub fn stream_tile_for(mr: usize, nr: usize) -> (usize, usize) {
    let mr = mr.clamp(1, 4);
    let cap = match mr {
        1 => 8,
        2 | 3 => 2,
        _ => 1,
    };
    let nr = nr.clamp(1, cap);
    (mr, 1 << (usize::BITS - 1 - nr.leading_zeros()))
}

/// Register tiles of the stream kernel on the repack with AVX-512 (see
/// [`stream_on_records`]): 1 or 2 activation rows by 16 weight rows.
pub const STREAM16_TILES: &[(usize, usize)] = &[(1, 16), (2, 16)];

/// Register tiles of the stream kernel on the repack with AVX2: 1 to 4 activation rows by
/// one 8-row group.
pub const STREAM8_TILES: &[(usize, usize)] = &[(1, 8), (2, 8), (3, 8), (4, 8)];

/// Whether a stream plan on `dtype` weights runs on their repack (`records::stream_range`):
/// wherever AVX2 runs the loader repacks block-quantized weights for the exact path
/// (`crate::wants_repack`).
pub fn stream_on_records(dtype: DType) -> bool {
    Isa::active() == Isa::Avx2Fma && matches!(dtype, DType::Q4_0 | DType::Q4_1 | DType::Q8_0)
}

/// The stream tiles the planner proposes for `dtype` weights.
pub fn stream_tiles(dtype: DType) -> &'static [(usize, usize)] {
    match (stream_on_records(dtype), crate::isa::avx512_exact()) {
        (true, true) => STREAM16_TILES,
        (true, false) => STREAM8_TILES,
        _ => crate::plan::F32Kernel::Stream.tiles(),
    }
}

/// The tile a stream plan's `mr × nr` runs as on `dtype` weights.
pub fn stream_tile_of(dtype: DType, mr: usize, nr: usize) -> (usize, usize) {
    if stream_on_records(dtype) {
        (records::stream_mr(mr), records::stream_rows())
    } else {
        stream_tile_for(mr, nr)
    }
}

/// Portable canonical dot of `x` with a stored row, dequantizing a storage block (at least 32
/// elements) at a time; equal to `generic::dot_f32(x, dequantized row)`.
pub fn stream_dot_generic(dtype: DType, x: &[f32], row: &[u8]) -> f32 {
    let k = x.len();
    let (bl, bb) = (dtype.block_len(), dtype.block_bytes());
    let chunk = bl.max(32);
    let n8 = k / 8 * 8;
    let mut acc = [0f32; LANES];
    let mut buf = [0f32; 256];
    let mut t0 = 0;
    let mut last = 0;
    while t0 < k {
        let len = chunk.min(k - t0);
        generic::dequantize(
            dtype,
            &row[t0 / bl * bb..(t0 + len) / bl * bb],
            &mut buf[..len],
        );
        let steps = n8.saturating_sub(t0).min(len) / LANES;
        for c in 0..steps {
            for l in 0..LANES {
                acc[l] += x[t0 + 8 * c + l] * buf[8 * c + l];
            }
        }
        last = t0;
        t0 += len;
    }
    let mut s = generic::reduce_lanes(&acc);
    for t in n8..k {
        s += x[t] * buf[t - last];
    }
    s
}

/// Writes `vals` (plus the bias) to `out[row, col0 .. col0 + vals.len()]`.
#[inline]
pub(crate) fn write_row(
    out: DisjointMut<f32>,
    n: usize,
    row: usize,
    col0: usize,
    vals: &[f32],
    bias: Option<&[f32]>,
) {
    // SAFETY: callers pass rows and columns inside their unit's disjoint ranges.
    let dst = unsafe { out.slice(row * n + col0, vals.len()) };
    match bias {
        Some(b) => {
            for ((d, &v), &bb) in dst.iter_mut().zip(vals).zip(&b[col0..col0 + vals.len()]) {
                *d = v + bb;
            }
        }
        None => dst.copy_from_slice(vals),
    }
}

/// Runs a streaming plan over activation rows `rows` and weight rows `cols`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn stream_range(
    isa: Isa,
    plan: &Plan,
    x: &[f32],
    k: usize,
    n: usize,
    w: &GemmWeight,
    bias: Option<&[f32]>,
    rows: Range<usize>,
    cols: Range<usize>,
    out: DisjointMut<f32>,
) {
    #[cfg(target_arch = "x86_64")]
    if let (Isa::Avx2Fma, Some(pw)) = (isa, w.packed.as_ref()) {
        return records::stream_range(plan, x, k, n, pw, bias, rows, cols, out);
    }
    let (mr, nr) = stream_tile_for(plan.tile.mr, plan.tile.nr);
    let nc = plan.tile.nc.max(nr);
    let dtype = w.dtype();
    let mut n0 = cols.start;
    while n0 < cols.end {
        let n1 = (n0 + nc).min(cols.end);
        let mut i = rows.start;
        while i < rows.end {
            let mi = mr.min(rows.end - i);
            let mut j = n0;
            while j < n1 {
                let (_, nj) = stream_tile_for(mi, nr.min(n1 - j));
                let vals = stream_tile(isa, dtype, mi, nj, x, k, i, w, j);
                for a in 0..mi {
                    write_row(out, n, i + a, j, &vals[a * nj..(a + 1) * nj], bias);
                }
                j += nj;
            }
            i += mi;
        }
        n0 = n1;
    }
}

/// One streaming tile: activation rows `i0..i0 + mr` with weight rows `j0..j0 + nr`.
#[allow(clippy::too_many_arguments)]
fn stream_tile(
    isa: Isa,
    dtype: DType,
    mr: usize,
    nr: usize,
    x: &[f32],
    k: usize,
    i0: usize,
    w: &GemmWeight,
    j0: usize,
) -> [f32; 16] {
    assert!(mr * nr <= 16);
    let xrow = |a: usize| &x[(i0 + a) * k..(i0 + a + 1) * k];
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2Fma {
        use crate::x86::avx2_exact as ax;
        // The ggml types: decoded chunk by chunk into L1, then the f32 tile (`decoded`).
        if ax::code(dtype).is_none() {
            return decoded::stream_tile(isa, dtype, mr, nr, x, k, i0, w, j0);
        }
        macro_rules! run {
            ($DT:expr, $MR:literal, $NR:literal) => {{
                let xp: [*const f32; $MR] = std::array::from_fn(|a| xrow(a).as_ptr());
                let wp: [*const u8; $NR] = std::array::from_fn(|b| w.row(j0 + b).as_ptr());
                // SAFETY: AVX2+FMA+F16C checked via `Isa`; every activation row holds `k`
                // values and every stored row `k` elements of `dtype` (checked at load).
                let r = unsafe { ax::stream_tile::<{ $DT }, $MR, $NR>(xp, wp, k) };
                let mut v = [0f32; 16];
                for a in 0..$MR {
                    for b in 0..$NR {
                        v[a * $NR + b] = r[a][b];
                    }
                }
                return v;
            }};
        }
        macro_rules! tiles {
            ($DT:expr) => {
                match (mr, nr) {
                    (1, 8) => run!($DT, 1, 8),
                    (1, 4) => run!($DT, 1, 4),
                    (1, 2) => run!($DT, 1, 2),
                    (1, 1) => run!($DT, 1, 1),
                    (2, 2) => run!($DT, 2, 2),
                    (2, 1) => run!($DT, 2, 1),
                    (3, 2) => run!($DT, 3, 2),
                    (3, 1) => run!($DT, 3, 1),
                    (4, 1) => run!($DT, 4, 1),
                    _ => unreachable!("stream tile {mr}x{nr} (see stream_tile_for)"),
                }
            };
        }
        match dtype {
            DType::F32 => tiles!(ax::F32),
            DType::F16 => tiles!(ax::F16),
            DType::BF16 => tiles!(ax::BF16),
            DType::Q8_0 => tiles!(ax::Q8_0),
            DType::Q4_0 => tiles!(ax::Q4_0),
            DType::Q4_1 => tiles!(ax::Q4_1),
            _ => unreachable!("ggml types are decoded above"),
        }
    }
    let _ = isa;
    let mut v = [0f32; 16];
    for b in 0..nr {
        let row = w.row(j0 + b);
        for a in 0..mr {
            v[a * nr + b] = stream_dot_generic(dtype, xrow(a), row);
        }
    }
    v
}

mod ahead;
mod decoded;
pub(crate) mod outer;
pub(crate) mod packed;
mod panel_pack;
pub(crate) mod records;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_outer;
#[cfg(test)]
mod tests_records;
