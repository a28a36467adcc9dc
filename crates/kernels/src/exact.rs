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
//!   accumulators kept in memory between K blocks; after the last K block, reduce and write.

use std::cell::RefCell;
use std::ops::Range;

use tessera_core::DType;
use tessera_runtime::DisjointMut;

use crate::gemm::GemmWeight;
use crate::generic::{self, LANES};
use crate::isa::Isa;
use crate::plan::Plan;

thread_local! {
    static PANEL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static LANE_ACC: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

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

/// Register tiles of the stream kernel on the repack (AVX-512, see [`stream_on_records`]):
/// 1 or 2 activation rows by 16 weight rows.
pub const STREAM16_TILES: &[(usize, usize)] = &[(1, 16), (2, 16)];

/// Whether a stream plan on `dtype` weights runs on their repack with the AVX-512 kernel
/// (`records::stream_range`): where that kernel runs, the loader repacks block-quantized
/// weights for the exact path (`crate::wants_repack`).
pub fn stream_on_records(dtype: DType) -> bool {
    crate::isa::avx512_exact() && matches!(dtype, DType::Q4_0 | DType::Q4_1 | DType::Q8_0)
}

/// The stream tiles the planner proposes for `dtype` weights.
pub fn stream_tiles(dtype: DType) -> &'static [(usize, usize)] {
    if stream_on_records(dtype) {
        STREAM16_TILES
    } else {
        crate::plan::F32Kernel::Stream.tiles()
    }
}

/// The tile a stream plan's `mr × nr` runs as on `dtype` weights.
pub fn stream_tile_of(dtype: DType, mr: usize, nr: usize) -> (usize, usize) {
    if stream_on_records(dtype) {
        (records::stream_mr(mr), 16)
    } else {
        stream_tile_for(mr, nr)
    }
}

/// The packed kernel's tile for a requested one: `mr` in 1..=4, `nr` in 2..=4.
pub fn packed_tile_for(mr: usize, nr: usize) -> (usize, usize) {
    (mr.clamp(1, 4), nr.clamp(2, 4))
}

/// The K block of a packed plan: all of K, or a multiple of 32 (so every block but the last
/// holds whole quantization blocks and whole chunks of 8).
pub fn packed_kc(kc: usize, k: usize) -> usize {
    if kc == 0 || kc >= k {
        k.max(1)
    } else {
        kc.div_ceil(32).max(1) * 32
    }
}

/// Portable canonical dot of `x` with a stored row, dequantizing 32 elements at a time;
/// equal to `generic::dot_f32(x, dequantized row)`.
pub fn stream_dot_generic(dtype: DType, x: &[f32], row: &[u8]) -> f32 {
    let k = x.len();
    let bb = dtype.block_bytes() * 32 / dtype.block_len();
    let mut acc = [0f32; LANES];
    let mut buf = [0f32; 32];
    let groups = k / 32;
    for b in 0..groups {
        generic::dequantize(dtype, &row[b * bb..(b + 1) * bb], &mut buf);
        for (c, xs) in x[32 * b..32 * b + 32].chunks_exact(LANES).enumerate() {
            for l in 0..LANES {
                acc[l] += xs[l] * buf[8 * c + l];
            }
        }
    }
    let n8 = k / 8 * 8;
    let rest = k - 32 * groups;
    if rest > 0 {
        let es = dtype.block_bytes() / dtype.block_len();
        generic::dequantize(dtype, &row[32 * groups * es..k * es], &mut buf[..rest]);
        for c in 0..(n8 - 32 * groups) / 8 {
            for l in 0..LANES {
                acc[l] += x[32 * groups + 8 * c + l] * buf[8 * c + l];
            }
        }
    }
    let mut s = generic::reduce_lanes(&acc);
    for t in n8..k {
        s += x[t] * buf[t - 32 * groups];
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
        if crate::isa::avx512_exact() {
            return records::stream_range(plan, x, k, n, pw, bias, rows, cols, out);
        }
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

/// Runs a packed plan over activation rows `rows` and weight rows `cols`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn packed_range(
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
    let (mr, nr) = packed_tile_for(plan.tile.mr, plan.tile.nr);
    let kc = packed_kc(plan.tile.kc, k);
    let nc = plan.tile.nc.max(nr).div_ceil(nr) * nr;
    // Tiles start at multiples of `mr` from `rows.start`, so each has one lane slot.
    let mc = plan.tile.mc.max(mr).div_ceil(mr) * mr;
    let blocks_k = k.div_ceil(kc);
    let groups_max = nc / nr;
    let tiles_m = rows.len().div_ceil(mr);
    let slot = mr * nr * LANES;
    let dtype = w.dtype();
    PANEL.with(|panel| {
        LANE_ACC.with(|lanes| {
            let mut panel = panel.borrow_mut();
            let mut lanes = lanes.borrow_mut();
            if panel.len() < nc * kc {
                panel.resize(nc * kc, 0.0);
            }
            // One lane slot per tile when K is blocked (they live across K blocks), else one.
            let need = if blocks_k > 1 {
                tiles_m * groups_max * slot
            } else {
                slot
            };
            if lanes.len() < need {
                lanes.resize(need, 0.0);
            }
            let mut n0 = cols.start;
            while n0 < cols.end {
                let ncb = nc.min(cols.end - n0);
                let groups = ncb.div_ceil(nr);
                for kb in 0..blocks_k {
                    let (k0, k1) = (kb * kc, ((kb + 1) * kc).min(k));
                    let len = k1 - k0;
                    for g in 0..groups {
                        let r0 = n0 + g * nr;
                        let live = nr.min(n0 + ncb - r0);
                        let dst = &mut panel[g * nr * len..(g + 1) * nr * len];
                        pack(isa, dtype, w, r0, live, nr, k0, k1, dst);
                    }
                    let mut m0 = rows.start;
                    while m0 < rows.end {
                        let m1 = (m0 + mc).min(rows.end);
                        // Each activation tile stays in L1 while the interleaved panel
                        // groups stream past it (one contiguous stream from L2).
                        let mut i = m0;
                        while i < m1 {
                            let mi = mr.min(m1 - i);
                            for g in 0..groups {
                                let pg = &panel[g * nr * len..(g + 1) * nr * len];
                                let live = nr.min(ncb - g * nr);
                                let s = if blocks_k > 1 {
                                    (((i - rows.start) / mr) * groups_max + g) * slot
                                } else {
                                    0
                                };
                                let acc = &mut lanes[s..s + slot];
                                let last = kb + 1 == blocks_k;
                                let vals =
                                    tile(isa, mi, nr, x, k, i, k0, k1, pg, acc, kb == 0, last);
                                if last {
                                    for a in 0..mi {
                                        let v = &vals[a * nr..a * nr + live];
                                        write_row(out, n, i + a, n0 + g * nr, v, bias);
                                    }
                                }
                            }
                            i += mi;
                        }
                        m0 = m1;
                    }
                }
                n0 += ncb;
            }
        })
    });
}

/// Dequantizes elements `k0..k1` of weight rows `r0..r0 + live` into `dst` as
/// `[step][nr][8]` then the tail `[nr][len % 8]`; rows `live..nr` are zero.
#[allow(clippy::too_many_arguments)]
fn pack(
    isa: Isa,
    dtype: DType,
    w: &GemmWeight,
    r0: usize,
    live: usize,
    nr: usize,
    k0: usize,
    k1: usize,
    dst: &mut [f32],
) {
    let len = k1 - k0;
    assert!(dst.len() == nr * len && k0 % 32 == 0);
    #[cfg(target_arch = "x86_64")]
    if let (Isa::Avx2Fma, Some(pw)) = (isa, w.packed.as_ref()) {
        // Repacked: read the records (the stored rows' pages were released).
        return records::pack(pw, r0, live, nr, k0, k1, dst);
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2Fma {
        use crate::x86::avx2_exact as ax;
        let row = |b: usize| w.row(r0 + b.min(live - 1)).as_ptr();
        macro_rules! run {
            ($DT:expr, $NR:literal) => {{
                let wp: [*const u8; $NR] = std::array::from_fn(row);
                // SAFETY: AVX2+FMA+F16C checked via `Isa`; the first `live` pointers are
                // stored rows of K elements (the others are only counted, never read); k0 is
                // a multiple of 32 and, for block formats, so is k1 (K and kc are); `dst`
                // holds nr · len values (asserted).
                unsafe { ax::pack_panel::<{ $DT }, $NR>(wp, live, k0, k1, dst.as_mut_ptr()) };
                return;
            }};
        }
        macro_rules! nrs {
            ($DT:expr) => {
                match nr {
                    2 => run!($DT, 2),
                    3 => run!($DT, 3),
                    4 => run!($DT, 4),
                    _ => unreachable!("packed nr {nr}"),
                }
            };
        }
        match dtype {
            DType::F32 => nrs!(ax::F32),
            DType::F16 => nrs!(ax::F16),
            DType::BF16 => nrs!(ax::BF16),
            DType::Q8_0 => nrs!(ax::Q8_0),
            DType::Q4_0 => nrs!(ax::Q4_0),
            DType::Q4_1 => nrs!(ax::Q4_1),
        }
    }
    let _ = isa;
    let steps = len / 8;
    let tail = len % 8;
    let es_num = dtype.block_bytes();
    let es_den = dtype.block_len();
    let mut buf = vec![0f32; len];
    for b in 0..nr {
        if b < live {
            let row = w.row(r0 + b);
            generic::dequantize(
                dtype,
                &row[k0 * es_num / es_den..k1 * es_num / es_den],
                &mut buf,
            );
        } else {
            buf.fill(0.0);
        }
        for s in 0..steps {
            dst[(s * nr + b) * 8..(s * nr + b) * 8 + 8].copy_from_slice(&buf[8 * s..8 * s + 8]);
        }
        dst[steps * 8 * nr + b * tail..steps * 8 * nr + (b + 1) * tail]
            .copy_from_slice(&buf[steps * 8..]);
    }
}

/// One packed tile over the K block `k0..k1` of activation rows `i0..i0 + mr`: accumulates
/// `acc` (lane slots `[m][n][8]`), and on the last K block returns the finished `mr × nr`
/// values (row-major; zeros otherwise).
#[allow(clippy::too_many_arguments)]
fn tile(
    isa: Isa,
    mr: usize,
    nr: usize,
    x: &[f32],
    k: usize,
    i0: usize,
    k0: usize,
    k1: usize,
    panel: &[f32],
    acc: &mut [f32],
    first: bool,
    last: bool,
) -> [f32; 16] {
    let len = k1 - k0;
    let steps = len / 8;
    let tail = len % 8;
    assert!(panel.len() == nr * len && acc.len() >= mr * nr * LANES && mr <= 4 && nr <= 4);
    assert!(k1 <= k && (i0 + mr) * k <= x.len());
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2Fma {
        use crate::x86::avx2_exact as ax;
        macro_rules! run {
            ($MR:literal, $NR:literal) => {{
                // SAFETY: in bounds (asserted above): row i0 + a of x holds k ≥ k1 values, so
                // 8·steps + tail = len values from k0; the panel holds nr·len values; the
                // slot mr·nr·8.
                let xp: [*const f32; $MR] =
                    std::array::from_fn(|a| unsafe { x.as_ptr().add((i0 + a) * k + k0) });
                let r = unsafe {
                    ax::packed_tile::<$MR, $NR>(
                        xp,
                        panel.as_ptr(),
                        steps,
                        tail,
                        acc.as_mut_ptr(),
                        first,
                        last,
                    )
                };
                let mut v = [0f32; 16];
                for a in 0..$MR {
                    for b in 0..$NR {
                        v[a * $NR + b] = r[a][b];
                    }
                }
                return v;
            }};
        }
        match (mr, nr) {
            (1, 2) => run!(1, 2),
            (1, 3) => run!(1, 3),
            (1, 4) => run!(1, 4),
            (2, 2) => run!(2, 2),
            (2, 3) => run!(2, 3),
            (2, 4) => run!(2, 4),
            (3, 2) => run!(3, 2),
            (3, 3) => run!(3, 3),
            (3, 4) => run!(3, 4),
            (4, 2) => run!(4, 2),
            (4, 3) => run!(4, 3),
            (4, 4) => run!(4, 4),
            _ => unreachable!("packed tile {mr}x{nr}"),
        }
    }
    let _ = isa;
    // Portable twin: the same lanes, products then sums (as generic::dot_f32).
    let xs = |a: usize| &x[(i0 + a) * k + k0..(i0 + a) * k + k1];
    if first {
        acc[..mr * nr * LANES].fill(0.0);
    }
    for s in 0..steps {
        for b in 0..nr {
            let wv = &panel[(s * nr + b) * 8..(s * nr + b) * 8 + 8];
            for a in 0..mr {
                let xv = &xs(a)[8 * s..8 * s + 8];
                let lane = &mut acc[(a * nr + b) * LANES..(a * nr + b + 1) * LANES];
                for l in 0..LANES {
                    lane[l] += xv[l] * wv[l];
                }
            }
        }
    }
    let mut v = [0f32; 16];
    if !last {
        return v;
    }
    for a in 0..mr {
        for b in 0..nr {
            let lane: &[f32; LANES] = acc[(a * nr + b) * LANES..(a * nr + b + 1) * LANES]
                .try_into()
                .expect("8 lanes");
            let mut s = generic::reduce_lanes(lane);
            for t in 0..tail {
                s += xs(a)[8 * steps + t] * panel[8 * steps * nr + b * tail + t];
            }
            v[a * nr + b] = s;
        }
    }
    v
}

pub(crate) mod records;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_records;
