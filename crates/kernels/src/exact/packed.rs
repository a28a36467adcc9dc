//! The exact family's packed form (large M), as a plan executor: for each block of `nc`
//! weight rows, for each K block of `kc`, the block is dequantized once into a panel
//! interleaved by `nr` rows; for each block of `mc` activation rows, each `nr`-row group,
//! each `mr`-row tile, the register tile runs over the K block, its lane accumulators kept
//! in memory between K blocks; after the last K block it reduces them and writes.
//! Canonical order throughout (see `super`).

use std::cell::RefCell;
use std::ops::Range;

use tessera_core::DType;
use tessera_runtime::DisjointMut;

pub(crate) use super::panel_pack::pack;
use super::write_row;
use crate::aligned::AlignedF32;
use crate::gemm::GemmWeight;
use crate::generic::{self, LANES};
use crate::isa::Isa;
use crate::plan::Plan;

thread_local! {
    static PANEL: RefCell<AlignedF32> = const { RefCell::new(AlignedF32::new()) };
    static LANE_ACC: RefCell<AlignedF32> = const { RefCell::new(AlignedF32::new()) };
    static X_TILES: RefCell<AlignedF32> = const { RefCell::new(AlignedF32::new()) };
}

/// The packed kernel's tile for a requested one: `nr` in 2..=4, `mr` in 1..=4, or up to 8
/// for an even `nr` where the AVX-512 tile runs (`x86::avx512_packed`); from `nr = 16` the
/// outer-product tile (`super::outer`), as wide as this machine runs it.
pub fn packed_tile_for(mr: usize, nr: usize) -> (usize, usize) {
    if nr >= super::outer::STRIP && super::outer::available() {
        return (mr.clamp(1, super::outer::max_mr()), super::outer::strip());
    }
    let nr = nr.clamp(2, 4);
    (mr.clamp(1, if wide(nr) { 8 } else { 4 }), nr)
}

/// Whether `nr`-wide packed tiles run as AVX-512 tiles.
fn wide(nr: usize) -> bool {
    nr.is_multiple_of(2) && crate::isa::avx512_exact()
}

/// Register tiles of the packed kernel the planner proposes.
pub fn packed_tiles() -> &'static [(usize, usize)] {
    if crate::isa::avx512_exact() {
        // The macro tiles, and the outer-product tile at AVX-512 width.
        &[(8, 4), (6, 4), (4, 4), (8, 2), (12, 32), (8, 32)]
    } else if super::outer::available() {
        // The macro tiles, and the outer-product tile (`super::outer`).
        &[(3, 4), (2, 4), (4, 3), (4, 2), (6, 16)]
    } else {
        crate::plan::F32Kernel::Packed.tiles()
    }
}

/// The K block of a packed plan: all of K, or a multiple of 32 (256 for the super-block
/// types) so every block but the last holds whole quantization blocks and chunks of 8.
pub fn packed_kc(kc: usize, k: usize, dtype: DType) -> usize {
    // K blocks start on whole storage blocks (32, or 256 for the super-block types).
    let granule = dtype.block_len().max(32);
    if kc == 0 || kc >= k {
        k.max(1)
    } else {
        kc.div_ceil(granule).max(1) * granule
    }
}
/// Runs a packed plan over activation rows `rows` and weight rows `cols`.
///
/// Loop order: for each block of `nc` weight rows, every K block of it is dequantized into
/// the panel (`[kb][group][step][nr][8]` with each block's tails); then for each block of
/// `mc` activation rows, each K block, each `mr`-row tile, the tile runs over the panel's
/// groups. Lane slots (the accumulators that live between K blocks) are needed only for the
/// tiles of one `mc` block, so they stay in cache.
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
    if nr >= super::outer::STRIP {
        return super::outer::outer_range(plan, x, k, n, w, bias, rows, cols, out);
    }
    let kc = packed_kc(plan.tile.kc, k, w.dtype());
    let nc = plan.tile.nc.max(nr).div_ceil(nr) * nr;
    // Tiles start at multiples of `mr` from each `mc` block's start, so each has one slot.
    let mc = plan.tile.mc.max(mr).div_ceil(mr) * mr;
    let blocks_k = k.div_ceil(kc);
    let groups_max = nc / nr;
    let slot = mr * nr * LANES;
    let dtype = w.dtype();
    // 4-wide tiles run as macro tiles: one call per activation tile and K block
    // (`x86::avx512_packed::packed_groups`, `x86::avx2_packed::packed_groups`).
    let macro_tile = cfg!(target_arch = "x86_64") && isa == Isa::Avx2Fma && nr == 4;
    // Rows a multiple of 4 KiB apart map to the same L1 sets: then the tiles are packed
    // (once per call). Otherwise they are read in place, which costs no copy.
    let pack_x = macro_tile && (k * 4).is_multiple_of(4096);
    X_TILES.with(|xt| {
        PANEL.with(|panel| {
            LANE_ACC.with(|lanes| {
                let mut panel = panel.borrow_mut();
                let mut lanes = lanes.borrow_mut();
                let mut xt = xt.borrow_mut();
                if pack_x {
                    // Every tile of the unit's rows packed once per call (tiles start at
                    // multiples of `mr` from `rows.start`, as the loops below take them).
                    xt.grow(rows.len() * k);
                    let mut i = rows.start;
                    while i < rows.end {
                        let mi = mr.min(rows.end - i).min(mc - (i - rows.start) % mc);
                        let at = (i - rows.start) * k;
                        pack_x_tile(x, k, i..i + mi, &mut xt[at..at + mi * k]);
                        i += mi;
                    }
                }
                // The panel starts on a 64-byte line (`AlignedF32`): a register tile's
                // 32-byte loads then never straddle two lines.
                panel.grow(nc * k);
                let panel = &mut panel[..nc * k];
                // One lane slot per tile of an `mc` block and group when K is blocked, else one.
                let need = if blocks_k > 1 {
                    mc.min(rows.len()).div_ceil(mr) * groups_max * slot
                } else {
                    slot
                };
                lanes.grow(need);
                let mut n0 = cols.start;
                while n0 < cols.end {
                    let ncb = nc.min(cols.end - n0);
                    let groups = ncb.div_ceil(nr);
                    // K block `kb` of the panel: `groups · nr · len` values from here.
                    let kb_at = |kb: usize| kb * kc * nr * groups;
                    for kb in 0..blocks_k {
                        let (k0, k1) = (kb * kc, ((kb + 1) * kc).min(k));
                        let len = k1 - k0;
                        for g in 0..groups {
                            let r0 = n0 + g * nr;
                            let live = nr.min(n0 + ncb - r0);
                            let at = kb_at(kb) + g * nr * len;
                            pack(
                                isa,
                                dtype,
                                w,
                                r0,
                                live,
                                nr,
                                k0,
                                k1,
                                &mut panel[at..at + nr * len],
                            );
                        }
                    }
                    let mut m0 = rows.start;
                    while m0 < rows.end {
                        let m1 = (m0 + mc).min(rows.end);
                        for kb in 0..blocks_k {
                            let (k0, k1) = (kb * kc, ((kb + 1) * kc).min(k));
                            let len = k1 - k0;
                            let pkb = &panel[kb_at(kb)..kb_at(kb) + groups * nr * len];
                            let (first, last) = (kb == 0, kb + 1 == blocks_k);
                            // Each activation tile stays in L1 while the interleaved panel
                            // groups stream past it (one contiguous stream from L2).
                            let mut i = m0;
                            while i < m1 {
                                let mi = mr.min(m1 - i);
                                let s = if blocks_k > 1 {
                                    ((i - m0) / mr) * groups_max * slot
                                } else {
                                    0
                                };
                                #[cfg(target_arch = "x86_64")]
                                if macro_tile {
                                    let at = (i - rows.start) * k;
                                    // The next tile's activations of this K block (or the
                                    // first tile's of the next), fetched while this one runs.
                                    let (ni, nk0, nk1) = if i + mi < m1 {
                                        (i + mi, k0, k1)
                                    } else if kb + 1 < blocks_k {
                                        (m0, k1, (k1 + kc).min(k))
                                    } else {
                                        (m1, 0, kc)
                                    };
                                    let mut next = [&[][..]; 8];
                                    let mut count = 0;
                                    if ni < rows.end {
                                        let nmi = mr.min(rows.end - ni);
                                        if pack_x {
                                            let nat = (ni - rows.start) * k;
                                            next[0] = &xt[nat + nk0 * nmi..nat + nk1 * nmi];
                                            count = 1;
                                        } else {
                                            for (a, r) in next.iter_mut().take(nmi).enumerate() {
                                                *r = &x[(ni + a) * k + nk0..(ni + a) * k + nk1];
                                            }
                                            count = nmi;
                                        }
                                    }
                                    let block = Block {
                                        x_next: &next[..count],
                                        x: if pack_x { &xt[at..at + mi * k] } else { x },
                                        packed: pack_x,
                                        k,
                                        rows: i..i + mi,
                                        k0,
                                        k1,
                                        panel: pkb,
                                        slots: &mut lanes[s..],
                                        slot,
                                        first,
                                        last,
                                        out,
                                        n,
                                        cols: n0..n0 + ncb,
                                        bias: bias.map(|b| &b[n0..n0 + ncb]),
                                    };
                                    block.run();
                                    i += mi;
                                    continue;
                                }
                                for g in 0..groups {
                                    let pg = &pkb[g * nr * len..(g + 1) * nr * len];
                                    let live = nr.min(ncb - g * nr);
                                    let gs = if blocks_k > 1 { s + g * slot } else { 0 };
                                    let acc = &mut lanes[gs..gs + slot];
                                    let vals =
                                        tile(isa, mi, nr, x, k, i, k0, k1, pg, acc, first, last);
                                    if last {
                                        for a in 0..mi {
                                            let v = &vals[a * nr..a * nr + live];
                                            write_row(out, n, i + a, n0 + g * nr, v, bias);
                                        }
                                    }
                                }
                                i += mi;
                            }
                        }
                        m0 = m1;
                    }
                    n0 += ncb;
                }
            })
        })
    });
}

/// Packs activation rows `rows` (K values each) as one tile: chunks of 8 as
/// `[step][row][8]`, then the `K % 8` tail as `[row][tail]`.
fn pack_x_tile(x: &[f32], k: usize, rows: Range<usize>, dst: &mut [f32]) {
    let mr = rows.len();
    let steps = k / 8;
    assert!(dst.len() == mr * k && rows.end * k <= x.len());
    for (a, i) in rows.enumerate() {
        let row = &x[i * k..(i + 1) * k];
        for s in 0..steps {
            dst[(s * mr + a) * 8..(s * mr + a) * 8 + 8].copy_from_slice(&row[8 * s..8 * s + 8]);
        }
        let tail = k - 8 * steps;
        let at = steps * 8 * mr + a * tail;
        dst[at..at + tail].copy_from_slice(&row[8 * steps..]);
    }
}

/// One activation tile against every 4-row group of a panel over one K block, for the
/// macro tiles (`x86::avx512_packed::packed_groups`, `x86::avx2_packed::packed_groups`).
#[cfg(target_arch = "x86_64")]
struct Block<'a, 'o> {
    /// The tile's activations: rows `rows` of `x` (`k` apart), or, when `packed`, the tile
    /// packed by `pack_x_tile` (`rows.len() · k` values).
    x: &'a [f32],
    packed: bool,
    /// What the next tile will read, to prefetch (at most 8 ranges, maybe none).
    x_next: &'a [&'a [f32]],
    k: usize,
    /// Activation rows of the tile (at most 8).
    rows: Range<usize>,
    k0: usize,
    k1: usize,
    /// `groups · 4 · (k1 − k0)` values.
    panel: &'a [f32],
    /// Lane slots of the tile's groups, `slot` floats apart.
    slots: &'a mut [f32],
    slot: usize,
    first: bool,
    last: bool,
    out: DisjointMut<'o, f32>,
    n: usize,
    /// Output columns of the panel's groups (the last group may be partial).
    cols: Range<usize>,
    bias: Option<&'a [f32]>,
}

#[cfg(target_arch = "x86_64")]
impl Block<'_, '_> {
    fn run(self) {
        let len = self.k1 - self.k0;
        let (steps, tail) = (len / 8, len % 8);
        let groups = self.cols.len().div_ceil(4);
        let mr = self.rows.len();
        let wide = wide(4);
        assert!(self.k1 <= self.k && self.panel.len() == groups * 4 * len);
        assert!((1..=if wide { 8 } else { 4 }).contains(&mr) && (tail == 0 || self.k1 == self.k));
        if self.packed {
            assert!(self.x.len() == mr * self.k);
        } else {
            assert!(self.rows.end * self.k <= self.x.len());
        }
        assert!(self.first && self.last || self.slots.len() >= (groups - 1) * self.slot + mr * 32);
        assert!(self.slot >= mr * 32 && self.bias.is_none_or(|b| b.len() == self.cols.len()));
        let bias = self.bias.map_or(std::ptr::null(), |b| b.as_ptr());
        macro_rules! run {
            ($MR:literal) => {{
                let (xp, x_step, xt): ([*const f32; $MR], usize, [*const f32; $MR]) = if self.packed
                {
                    let tail0 = (self.k / 8) * 8 * $MR;
                    (
                        std::array::from_fn(|a| self.x[self.k0 * $MR + 8 * a..].as_ptr()),
                        8 * $MR,
                        std::array::from_fn(|a| self.x[tail0 + a * tail..].as_ptr()),
                    )
                } else {
                    let row = |a: usize| (self.rows.start + a) * self.k;
                    (
                        std::array::from_fn(|a| self.x[row(a) + self.k0..].as_ptr()),
                        8,
                        std::array::from_fn(|a| self.x[row(a) + self.k1 - tail..].as_ptr()),
                    )
                };
                // Row segments of the block's columns (bounds checked by `slice`); only
                // written on the last K block.
                let op: [*mut f32; $MR] = std::array::from_fn(|a| {
                    let start = (self.rows.start + a) * self.n + self.cols.start;
                    // SAFETY: rows and columns inside this unit's disjoint ranges.
                    unsafe { self.out.slice(start, self.cols.len()) }.as_mut_ptr()
                });
                // SAFETY: AVX2 and FMA checked (`Isa::Avx2Fma`), and AVX-512 F/DQ/VL for the
                // wide tile (`avx512_exact`); a row
                // holds k ≥ k1 values (steps chunks from k0, the tail up to k1), and a packed
                // tile mr · k values (steps chunks of mr · 8 from k0 · mr, the tail, only in
                // the last K block, after all chunks); the panel holds every
                // group (asserted); slots as asserted; the row segments hold the block's
                // columns, and so does the bias.
                unsafe {
                    (if wide {
                        crate::x86::avx512_packed::packed_groups::<$MR>
                    } else {
                        crate::x86::avx2_packed::packed_groups::<$MR>
                    })(
                        xp,
                        x_step,
                        xt,
                        self.x_next,
                        self.panel.as_ptr(),
                        groups,
                        steps,
                        tail,
                        self.slots.as_mut_ptr(),
                        self.slot,
                        self.first,
                        self.last,
                        op,
                        self.cols.len(),
                        bias,
                    )
                }
            }};
        }
        match mr {
            1 => run!(1),
            2 => run!(2),
            3 => run!(3),
            4 => run!(4),
            5 => run!(5),
            6 => run!(6),
            7 => run!(7),
            _ => run!(8),
        }
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
) -> [f32; 32] {
    let len = k1 - k0;
    let steps = len / 8;
    let tail = len % 8;
    assert!(panel.len() == nr * len && acc.len() >= mr * nr * LANES && mr <= 8 && nr <= 4);
    assert!(k1 <= k && (i0 + mr) * k <= x.len() && (mr <= 4 || wide(nr)));
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2Fma && nr == 2 && wide(nr) {
        use crate::x86::avx512_packed as ax;
        macro_rules! run {
            ($MR:literal, $NR:literal) => {{
                // SAFETY: AVX-512 F/DQ, AVX2 and FMA checked (`wide`); bounds as below.
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
                let mut v = [0f32; 32];
                for a in 0..$MR {
                    v[a * $NR..(a + 1) * $NR].copy_from_slice(&r[a]);
                }
                return v;
            }};
        }
        match (mr, nr) {
            (1, 2) => run!(1, 2),
            (2, 2) => run!(2, 2),
            (3, 2) => run!(3, 2),
            (4, 2) => run!(4, 2),
            (5, 2) => run!(5, 2),
            (6, 2) => run!(6, 2),
            (7, 2) => run!(7, 2),
            (8, 2) => run!(8, 2),
            // 4-wide AVX-512 tiles run as macro tiles (`Block::run_avx512`).
            _ => unreachable!("packed tile {mr}x{nr}"),
        }
    }
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
                let mut v = [0f32; 32];
                for a in 0..$MR {
                    v[a * $NR..(a + 1) * $NR].copy_from_slice(&r[a]);
                }
                return v;
            }};
        }
        match (mr, nr) {
            (1, 2) => run!(1, 2),
            (1, 3) => run!(1, 3),
            (2, 2) => run!(2, 2),
            (2, 3) => run!(2, 3),
            (3, 2) => run!(3, 2),
            (3, 3) => run!(3, 3),
            (4, 2) => run!(4, 2),
            (4, 3) => run!(4, 3),
            // 4-wide tiles run as macro tiles (`x86::avx2_packed::packed_groups`).
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
    let mut v = [0f32; 32];
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
