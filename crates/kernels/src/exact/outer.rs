//! The exact family's packed form with an outer-product tile (a packed plan with
//! `nr ≥ 16`): the canonical order's eight lanes are eight independent fused chains, so
//! each lane of an `mr × width` block of outputs is computed as a BLIS-style outer product
//! (one activation value broadcast against `width` weight values: `x86::avx2_outer::lane_tile`,
//! 6 × 16 with AVX2, `x86::avx512_outer::lane_tile`, 12 × 32 where the AVX-512 kernels
//! run), and the lanes are added with the canonical tree at the end (`finish_rows`).
//! Bitwise the numbers of every other exact kernel (see `super`).
//!
//! Loop order, for the rows and columns of one unit:
//! - the activations are packed once per call, lane-major: `[lane][tile][step][mr]`;
//! - for each block of `nc` weight rows: dequantize it into `width`-row strips, each
//!   `[lane][step][width]` then the tail `[t][width]` (the weights are read once per call);
//! - for each block of `mc` activation rows, each strip, each K block of `kc`, each lane:
//!   the strip's lane block (`width · kc / 8` values) stays in L1 while the block's tiles
//!   stream their activations past it (2 bytes per FMA with AVX2, 1 with AVX-512); the lane
//!   sums of the block's tiles (`[tile][lane][mr][width]`) stay in L2 between K blocks; then
//!   each tile is finished.

use std::cell::RefCell;
use std::ops::Range;

use tessera_runtime::DisjointMut;

use super::ahead::Ahead;
use super::packed::pack;
use crate::aligned::AlignedF32;
use crate::gemm::GemmWeight;
use crate::isa::Isa;
use crate::plan::Plan;

/// The narrowest strip (the AVX2 tile's: two 8-wide vectors along N); a packed plan whose
/// `nr` is at least this runs the outer-product tile.
pub const STRIP: usize = 16;
/// The most activation rows of one AVX2 tile (12 accumulators, two weight vectors and a
/// broadcast fill 15 of the 16 vector registers).
pub const MAX_MR: usize = 6;
/// The most activation rows of one AVX-512 tile (28 accumulators and two weight vectors of
/// the 32 registers).
pub const MAX_MR_512: usize = 14;
const LANES: usize = crate::generic::LANES;

thread_local! {
    static X_LANES: RefCell<AlignedF32> = const { RefCell::new(AlignedF32::new()) };
    static STRIPS: RefCell<AlignedF32> = const { RefCell::new(AlignedF32::new()) };
    static SUMS: RefCell<AlignedF32> = const { RefCell::new(AlignedF32::new()) };
    static GROUP: RefCell<AlignedF32> = const { RefCell::new(AlignedF32::new()) };
    /// Per `mc` block: each row's output at the unit's first column, and its K tail.
    static ROWS: RefCell<(Vec<*mut f32>, Vec<*const f32>)> =
        const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Whether this machine runs the outer-product tile (AVX2 and FMA).
pub fn available() -> bool {
    cfg!(target_arch = "x86_64") && Isa::active() == Isa::Avx2Fma
}

/// Whether the wide (AVX-512) form runs: 32-row strips, up to [`MAX_MR_512`] rows.
fn wide() -> bool {
    available() && crate::isa::avx512_exact()
}

/// The strip width this machine's outer-product tile runs: 32 where the AVX-512 kernels run,
/// else 16.
pub fn strip() -> usize {
    if wide() {
        2 * STRIP
    } else {
        STRIP
    }
}

/// The most activation rows of this machine's outer-product tile.
pub fn max_mr() -> usize {
    if wide() {
        MAX_MR_512
    } else {
        MAX_MR
    }
}

/// Runs a packed plan with `nr ≥ 16` over activation rows `rows` and weight rows `cols`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn outer_range(
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
    assert!(available(), "the outer-product tile needs AVX2 and FMA");
    assert!(rows.end * k <= x.len() && cols.end <= n && bias.is_none_or(|b| b.len() == n));
    if rows.is_empty() || cols.is_empty() {
        return;
    }
    let sw = strip();
    let mr = plan.tile.mr.clamp(1, max_mr());
    let (steps, tail) = (k / LANES, k % LANES);
    let kc_steps = (super::packed_kc(plan.tile.kc, k, w.dtype()) / LANES).clamp(1, steps.max(1));
    let blocks_k = steps.div_ceil(kc_steps).max(1);
    let nc = plan.tile.nc.max(sw).div_ceil(sw) * sw;
    // Tiles start at multiples of `mr` from `rows.start` (mc is a multiple of mr).
    let mc = plan.tile.mc.max(mr).div_ceil(mr) * mr;
    let m = rows.len();
    let strip_len = sw * k;
    X_LANES.with(|xl| {
        STRIPS.with(|sp| {
            SUMS.with(|su| {
                let (mut xl, mut sp, mut su) = (xl.borrow_mut(), sp.borrow_mut(), su.borrow_mut());
                xl.grow(LANES * m * steps);
                sp.grow(nc.min(cols.len().div_ceil(sw) * sw) / sw * strip_len);
                su.grow(mc.min(m).div_ceil(mr) * LANES * mr * sw);
                pack_x_lanes(x, k, rows.clone(), mr, &mut xl[..LANES * m * steps]);
                let mut n0 = cols.start;
                while n0 < cols.end {
                    let ncb = nc.min(cols.end - n0);
                    let strips = ncb.div_ceil(sw);
                    for s in 0..strips {
                        let r0 = n0 + s * sw;
                        let live = sw.min(n0 + ncb - r0);
                        pack_strip(w, r0, live, k, &mut sp[s * strip_len..(s + 1) * strip_len]);
                    }
                    // The next `nc` block's weights, hinted into L2 a share at a time
                    // while this block's tiles run (`ahead`).
                    let next = n0 + ncb..(n0 + 2 * ncb).min(cols.end);
                    let mut ahead = Ahead::next_block(w, next, strips * LANES);
                    let mut m0 = rows.start;
                    while m0 < rows.end {
                        let m1 = (m0 + mc).min(rows.end);
                        let tiles = (m1 - m0).div_ceil(mr);
                        ROWS.with(|r| {
                            let (outs, tails) = &mut *r.borrow_mut();
                            outs.clear();
                            tails.clear();
                            for row in m0..m1 {
                                // SAFETY: this unit's rows and columns (disjoint from the
                                // other units').
                                let o = unsafe { out.slice(row * n + cols.start, cols.len()) };
                                outs.push(o.as_mut_ptr());
                                tails.push(x[row * k + k - tail..].as_ptr());
                            }
                        });
                        for s in 0..strips {
                            let strip = &sp[s * strip_len..(s + 1) * strip_len];
                            for kb in 0..blocks_k {
                                let c0 = kb * kc_steps;
                                let c1 = ((kb + 1) * kc_steps).min(steps);
                                for l in 0..LANES {
                                    if kb == 0 {
                                        ahead.step();
                                    }
                                    let b = &strip[(l * steps + c0) * sw..];
                                    // Tile `t` of the block, lane `l`: every tile before it
                                    // in the unit's rows is whole, so whole tiles are
                                    // `mr · steps` apart, and their sums `8 · mr · sw`.
                                    let at = |t: usize| {
                                        l * m * steps + (m0 + t * mr - rows.start) * steps
                                    };
                                    let whole = (m1 - m0) / mr;
                                    let rest = (m1 - m0) % mr;
                                    let span = LANES * mr * sw;
                                    let run = LaneRun {
                                        b: &b[..(c1 - c0) * sw],
                                        sw,
                                        c0,
                                        c1,
                                        first: kb == 0,
                                    };
                                    if whole > 0 {
                                        let a = &xl[at(0)..at(whole - 1) + steps * mr];
                                        let sums = &mut su[l * mr * sw..whole * span];
                                        run.tiles(mr, whole, a, steps * mr, sums, span);
                                    }
                                    if rest > 0 {
                                        let a = &xl[at(whole)..at(whole) + steps * rest];
                                        let sums = &mut su[whole * span + l * rest * sw..];
                                        run.tiles(rest, 1, a, 0, sums, 0);
                                    }
                                }
                            }
                            let col0 = n0 + s * sw;
                            let live = sw.min(n0 + ncb - col0);
                            let w_tail = &strip[LANES * steps * sw..];
                            let bias = bias.map(|b| &b[col0..col0 + live]);
                            ROWS.with(|r| {
                                let (outs, tails) = &*r.borrow();
                                for t in 0..tiles {
                                    let (i, span) = (t * mr, LANES * mr * sw);
                                    let mi = mr.min(m1 - m0 - i);
                                    finish(
                                        sw,
                                        &su[t * span..t * span + LANES * mi * sw],
                                        &tails[i..i + mi],
                                        &outs[i..i + mi],
                                        col0 - cols.start,
                                        w_tail,
                                        tail,
                                        bias,
                                        live,
                                    );
                                }
                            });
                        }
                        m0 = m1;
                    }
                    n0 += ncb;
                }
            })
        })
    });
}

/// Packs the chunked part of activation rows `rows` lane-major: `[lane][tile][step][mi]`,
/// tiles of `mr` rows from `rows.start` (the last may hold fewer, `mi`).
fn pack_x_lanes(x: &[f32], k: usize, rows: Range<usize>, mr: usize, dst: &mut [f32]) {
    let steps = k / LANES;
    let m = rows.len();
    assert!(dst.len() == LANES * m * steps && rows.end * k <= x.len() && mr <= 16);
    if steps == 0 {
        // K < 8: nothing is chunked (the tail holds it all).
        return;
    }
    let mut i = rows.start;
    while i < rows.end {
        let mi = mr.min(rows.end - i);
        let at = (i - rows.start) * steps;
        #[cfg(target_arch = "x86_64")]
        {
            // At most 8 rows per transpose, the tile's last rows first (their 8-value
            // stores spill into the next chunk's first rows, which the next call writes).
            let parts: &[usize] = if mi > 8 { &[8, 0] } else { &[0] };
            for &r0 in parts {
                let rn = (mi - r0).min(8);
                let src: [*const f32; 8] =
                    std::array::from_fn(|r| x[(i + r0 + r.min(rn - 1)) * k..].as_ptr());
                let base = dst.as_mut_ptr();
                // In bounds: lane l's tile holds steps · mi values from l · m · steps + at;
                // these rows start r0 into it.
                let lanes: [*mut f32; 8] =
                    std::array::from_fn(|l| base.wrapping_add(l * m * steps + at + r0));
                // SAFETY: AVX2 (asserted by `outer_range`); rows i + r0.. i + r0 + rn hold
                // k ≥ 8 · steps values each; each lane's tile lies inside `dst` (asserted
                // length), `steps · mi − r0` values from these rows' start.
                unsafe {
                    crate::x86::avx2_outer::transpose_tile(
                        src,
                        rn,
                        steps,
                        mi,
                        lanes,
                        steps * mi - r0,
                    )
                };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        for r in 0..mi {
            let row = &x[(i + r) * k..(i + r) * k + steps * LANES];
            for (c, chunk) in row.chunks_exact(LANES).enumerate() {
                for (l, &v) in chunk.iter().enumerate() {
                    dst[l * m * steps + at + c * mi + r] = v;
                }
            }
        }
        i += mi;
    }
}

/// Dequantizes weight rows `r0..r0 + live` into one strip `sw = dst.len() / k` rows wide:
/// `[lane][step][sw]`, then the tail `[t][sw]`; rows `live..sw` are zero. f32 rows are
/// transposed as stored; other formats are dequantized into 4-row panels first (`pack`).
fn pack_strip(w: &GemmWeight, r0: usize, live: usize, k: usize, dst: &mut [f32]) {
    let (steps, tail) = (k / LANES, k % LANES);
    let sw = dst.len() / k.max(1);
    assert!(dst.len() == sw * k && sw.is_multiple_of(STRIP) && (1..=sw).contains(&live));
    if w.dtype() == tessera_core::DType::F32 && w.packed.is_none() {
        return pack_strip_f32(w, r0, live, k, sw, dst);
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(pw) = &w.packed {
        if sw == 32 && super::records::strip32_fits(r0) {
            return super::records::strip32(pw, r0, live, dst);
        }
    }
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        g.grow(sw * k);
        let tmp = &mut g[..sw * k];
        // `sw / 4` 4-row groups, each `[step][4][8]` then its tail `[4][tail]`.
        for (grp, panel) in tmp.chunks_exact_mut(4 * k).enumerate() {
            let glive = live.saturating_sub(4 * grp).min(4);
            if glive == 0 {
                panel.fill(0.0);
            } else {
                pack(
                    Isa::active(),
                    w.dtype(),
                    w,
                    r0 + 4 * grp,
                    glive,
                    4,
                    0,
                    k,
                    panel,
                );
            }
        }
        #[cfg(target_arch = "x86_64")]
        for half in 0..sw / STRIP {
            let src: [*const f32; 16] = std::array::from_fn(|j| {
                let row = 16 * half + j;
                tmp[(row / 4) * 4 * k + (row % 4) * LANES..].as_ptr()
            });
            // SAFETY: AVX2 (asserted by `outer_range`); row j's chunk c is 8 values at
            // 32 · c from its pointer inside its group's panel (4 · k ≥ 32 · steps values);
            // `dst` holds sw · k ≥ 8 · steps · sw (asserted), these 16 rows from 16 · half
            // into each `sw`-wide row of it.
            unsafe {
                crate::x86::avx2_outer::transpose_strip(
                    src,
                    4 * LANES,
                    steps,
                    dst.as_mut_ptr().add(STRIP * half),
                    sw,
                )
            };
        }
        for grp in 0..sw / 4 {
            let panel = &tmp[grp * 4 * k..(grp + 1) * 4 * k];
            #[cfg(not(target_arch = "x86_64"))]
            for c in 0..steps {
                for jj in 0..4 {
                    let src = &panel[(c * 4 + jj) * LANES..(c * 4 + jj + 1) * LANES];
                    for (l, &v) in src.iter().enumerate() {
                        dst[(l * steps + c) * sw + 4 * grp + jj] = v;
                    }
                }
            }
            for jj in 0..4 {
                for t in 0..tail {
                    dst[(LANES * steps + t) * sw + 4 * grp + jj] =
                        panel[steps * 4 * LANES + jj * tail + t];
                }
            }
        }
    });
}

/// [`pack_strip`] for f32 rows: each row's chunks transposed into the strip as stored (the
/// rows' values are their reference values), no panel in between.
fn pack_strip_f32(w: &GemmWeight, r0: usize, live: usize, k: usize, sw: usize, dst: &mut [f32]) {
    let (steps, tail) = (k / LANES, k % LANES);
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        // A zero row stands in for the rows past `live` (a strip's last, partial one).
        g.grow(k);
        if live < sw {
            g[..k].fill(0.0);
        }
        let zero = g.as_ptr();
        // Row j's K values (unaligned: stored rows are read with unaligned loads only).
        let row = |j: usize| -> *const f32 {
            if j < live {
                let bytes = w.row(r0 + j);
                assert!(bytes.len() == 4 * k);
                bytes.as_ptr().cast::<f32>()
            } else {
                zero
            }
        };
        #[cfg(target_arch = "x86_64")]
        for half in 0..sw / STRIP {
            let src: [*const f32; 16] = std::array::from_fn(|j| row(16 * half + j));
            // SAFETY: AVX2 (asserted by `outer_range`); each row holds k ≥ 8 · steps values
            // (4 · k bytes, checked), chunk c at 8 · c, read unaligned; `dst` holds
            // sw · k ≥ 8 · steps · sw (asserted by the caller).
            unsafe {
                crate::x86::avx2_outer::transpose_strip(
                    src,
                    LANES,
                    steps,
                    dst.as_mut_ptr().add(STRIP * half),
                    sw,
                )
            };
        }
        for j in 0..sw {
            let r = row(j);
            // SAFETY (both reads): inside row j's K values (checked above), unaligned.
            #[cfg(not(target_arch = "x86_64"))]
            for c in 0..steps {
                for l in 0..LANES {
                    dst[(l * steps + c) * sw + j] =
                        unsafe { r.add(LANES * c + l).read_unaligned() };
                }
            }
            for t in 0..tail {
                dst[(LANES * steps + t) * sw + j] =
                    unsafe { r.add(LANES * steps + t).read_unaligned() };
            }
        }
    });
}

/// One lane's strip block over the chunks `c0..c1` (`b`: `[step][sw]`).
struct LaneRun<'a> {
    b: &'a [f32],
    sw: usize,
    c0: usize,
    c1: usize,
    first: bool,
}

impl LaneRun<'_> {
    /// `tiles` tiles of `mi` rows: tile `t`'s lane is `a[t · a_stride..]` (`[step][mi]`
    /// over the whole K, this run reading its chunks `c0..c1`), its sums
    /// `sums[t · s_stride..]` (`[mi][sw]`, from zero when `first`).
    fn tiles(
        &self,
        mi: usize,
        tiles: usize,
        a: &[f32],
        a_stride: usize,
        sums: &mut [f32],
        s_stride: usize,
    ) {
        let (steps, sw) = (self.c1 - self.c0, self.sw);
        assert!(tiles >= 1 && self.b.len() == steps * sw && sw == strip());
        assert!((1..=max_mr()).contains(&mi));
        assert!(a.len() >= (tiles - 1) * a_stride + self.c1 * mi);
        assert!(sums.len() >= (tiles - 1) * s_stride + mi * sw);
        #[cfg(target_arch = "x86_64")]
        {
            use crate::x86::{avx2_outer as ax, avx512_outer as az};
            let a = a[self.c0 * mi..].as_ptr();
            let (b, acc, first) = (self.b.as_ptr(), sums.as_mut_ptr(), self.first);
            macro_rules! run {
                ($m:ident, $MR:literal) => {
                    // SAFETY: AVX2+FMA (asserted by `outer_range`), and AVX-512 for the wide
                    // form (`strip()` is 32 only then); each tile's lane holds its chunks
                    // c0..c1 (c1 · mi values from its start), `b` steps · sw values, each
                    // tile's sums MR · sw (asserted above).
                    unsafe {
                        $m::lane_tiles::<$MR>(a, a_stride, b, steps, tiles, acc, s_stride, first)
                    }
                };
            }
            if sw == STRIP {
                match mi {
                    1 => run!(ax, 1),
                    2 => run!(ax, 2),
                    3 => run!(ax, 3),
                    4 => run!(ax, 4),
                    5 => run!(ax, 5),
                    _ => run!(ax, 6),
                }
            } else {
                match mi {
                    1 => run!(az, 1),
                    2 => run!(az, 2),
                    3 => run!(az, 3),
                    4 => run!(az, 4),
                    5 => run!(az, 5),
                    6 => run!(az, 6),
                    7 => run!(az, 7),
                    8 => run!(az, 8),
                    9 => run!(az, 9),
                    10 => run!(az, 10),
                    11 => run!(az, 11),
                    12 => run!(az, 12),
                    13 => run!(az, 13),
                    _ => run!(az, 14),
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("the outer-product tile runs on x86-64 only ({a_stride} {s_stride})");
    }
}

/// Finishes one tile of a `sw`-wide strip: `sums` are its lane sums `[lane][mi][sw]`; row
/// `r`'s K tail starts at `tails[r]` and its output (the unit's columns) at `outs[r]`, the
/// strip's `live` columns at `off` from there; `w_tail` is the strip's `[t][sw]` tail weights.
#[allow(clippy::too_many_arguments)]
fn finish(
    sw: usize,
    sums: &[f32],
    tails: &[*const f32],
    outs: &[*mut f32],
    off: usize,
    w_tail: &[f32],
    tail: usize,
    bias: Option<&[f32]>,
    live: usize,
) {
    let mi = tails.len();
    assert!(sums.len() == LANES * mi * sw && w_tail.len() >= tail * sw && sw.is_multiple_of(8));
    assert!(outs.len() == mi && (1..=max_mr()).contains(&mi) && (1..=sw).contains(&live));
    assert!(bias.is_none_or(|b| b.len() == live));
    let bias = bias.map_or(std::ptr::null(), |b| b.as_ptr());
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX2+FMA (asserted by `outer_range`); sums hold 8 · mi · sw values (asserted);
    // each tail pointer starts a row's last `tail` values and each output pointer the
    // unit's columns of a row (`outer_range`), `off + live` of them; `w_tail` holds
    // tail · sw values and the bias `live`.
    unsafe {
        crate::x86::avx2_outer::finish_rows(
            sums.as_ptr(),
            mi,
            tails,
            w_tail.as_ptr(),
            tail,
            bias,
            outs,
            off,
            live,
            sw,
        )
    }
}
