//! The exact kernels over a weight's 8-row interleaved repack (`crate::packed`), which the
//! loader builds in exact mode wherever AVX2 runs (`crate::wants_repack`):
//!
//! - [`stream_range`]: the stream plan, on AVX-512 (`x86::avx512_exact::stream16`) 16
//!   weight rows (two groups) by 1 or 2 activation rows per call, on AVX2
//!   (`x86::avx2_records::stream8`) one group of 8 rows by 1 to 4 activation rows;
//! - [`pack`]: the packed plan's panels dequantized from the records instead of the stored
//!   rows, so the stored bytes (released after repacking) are not read again.
//!
//! Both compute every element in the canonical order, so results are bitwise those of the
//! stored-row kernels (`super::stream_range`, `super::pack`).

use std::ops::Range;

use tessera_core::DType;
use tessera_runtime::DisjointMut;

use crate::packed::{PackedWeight, GROUP};
use crate::plan::Plan;

/// The stream kernel's activation tile for a plan's `mr`: 1 or 2 rows on AVX-512, 1 to 4 on
/// AVX2.
pub fn stream_mr(mr: usize) -> usize {
    mr.clamp(1, if crate::isa::avx512_exact() { 2 } else { 4 })
}

/// Weight rows of one stream call on the records: 16 on AVX-512, 8 on AVX2.
pub fn stream_rows() -> usize {
    if crate::isa::avx512_exact() {
        2 * GROUP
    } else {
        GROUP
    }
}

/// Runs a stream plan on the records: for each block of `nc` weight rows (a multiple of the
/// call's rows), each activation tile, each call: one 8-row group (AVX2), or a pair of
/// groups or a last single group (AVX-512). `cols.start` is a multiple of 8 (units split N
/// in whole groups).
#[allow(clippy::too_many_arguments)]
#[cfg(target_arch = "x86_64")]
pub(crate) fn stream_range(
    plan: &Plan,
    x: &[f32],
    k: usize,
    n: usize,
    pw: &PackedWeight,
    bias: Option<&[f32]>,
    rows: Range<usize>,
    cols: Range<usize>,
    out: DisjointMut<f32>,
) {
    if cols.is_empty() || rows.is_empty() {
        return;
    }
    assert!(cols.start.is_multiple_of(GROUP) && cols.end <= n && pw.n == n && pw.k == k);
    assert!(x.len() >= rows.end * k);
    let mr = stream_mr(plan.tile.mr);
    let call = stream_rows();
    let nc = plan.tile.nc.max(call).div_ceil(call) * call;
    // The AVX2 kernel reads the unit's activation rows expanded (8 copies of each value)
    // when they fit EXPAND_BYTES (half a Zen 3 core's L2) beside the streaming weights.
    let expanded = call == GROUP && rows.len() * k * 32 <= EXPAND_BYTES;
    XE.with_borrow_mut(|xe| {
        if expanded {
            xe.resize(rows.len() * k * 8, 0.0);
            let src = &x[rows.start * k..rows.end * k];
            crate::x86::avx2_records::expand(src, xe);
        }
        let x_of = |i: usize| {
            if expanded {
                XRows::Expanded(&xe[(i - rows.start) * k * 8..])
            } else {
                XRows::Plain(&x[i * k..])
            }
        };
        stream_blocks(pw, n, k, (nc, mr, call), bias, &rows, &cols, &x_of, out);
    });
}

/// Largest expanded activation block (bytes) the AVX2 stream kernel takes.
const EXPAND_BYTES: usize = 256 << 10;

thread_local! {
    /// Expanded activation rows of this unit's last AVX2 stream call.
    static XE: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Activation rows from row `i` on, as stored or expanded (`avx2_records::expand`).
#[derive(Clone, Copy)]
enum XRows<'a> {
    Plain(&'a [f32]),
    Expanded(&'a [f32]),
}

/// The loops of [`stream_range`]: `nc`-row weight blocks, `mr`-row activation tiles, calls.
#[allow(clippy::too_many_arguments)]
#[cfg(target_arch = "x86_64")]
fn stream_blocks<'a>(
    pw: &PackedWeight,
    n: usize,
    k: usize,
    (nc, mr, call): (usize, usize, usize),
    bias: Option<&[f32]>,
    rows: &Range<usize>,
    cols: &Range<usize>,
    x_of: &dyn Fn(usize) -> XRows<'a>,
    out: DisjointMut<f32>,
) {
    let mut n0 = cols.start;
    while n0 < cols.end {
        let n1 = (n0 + nc).min(cols.end);
        let mut i = rows.start;
        while i < rows.end {
            let mi = mr.min(rows.end - i);
            let mut j = n0;
            while j < n1 {
                let width = call.min(n1 - j);
                let write = |a: usize, v: &[f32]| {
                    super::write_row(out, n, i + a, j, &v[..width], bias);
                };
                // 16-row calls are AVX-512's (plain rows only); 8-row calls AVX2's.
                match x_of(i) {
                    XRows::Plain(xi) if call != GROUP => {
                        let (g0, g1) = (j / GROUP, (j + width - 1) / GROUP);
                        let vals = tile16(pw, mi, xi, k, g0, g1);
                        vals.iter()
                            .take(mi)
                            .enumerate()
                            .for_each(|(a, v)| write(a, v));
                    }
                    xi => {
                        let vals = tile8(pw, mi, xi, k, j / GROUP);
                        vals.iter()
                            .take(mi)
                            .enumerate()
                            .for_each(|(a, v)| write(a, v));
                    }
                }
                j += width;
            }
            i += mi;
        }
        n0 = n1;
    }
}

/// One call of the AVX-512 kernel: activation rows `i0 .. i0 + mr` with groups `g0`, `g1`.
#[allow(clippy::too_many_arguments)]
#[cfg(target_arch = "x86_64")]
fn tile16(
    pw: &PackedWeight,
    mr: usize,
    x: &[f32],
    k: usize,
    g0: usize,
    g1: usize,
) -> [[f32; 16]; 2] {
    use crate::x86::avx512_exact as ax;
    assert!(crate::isa::avx512_exact() && g0 < pw.groups && g1 < pw.groups);
    assert!(mr <= 2 && mr * k <= x.len() && pw.blocks * 32 == k);
    let group = |g: usize| pw.group_bytes(g..g + 1).as_ptr();
    let (r0, r1) = (group(g0), group(g1));
    assert!(pw.fast.len() * 8 >= pw.groups * pw.blocks);
    let fast = pw.fast.as_ptr();
    let low_field = crate::variants::low_field(pw.dtype);
    macro_rules! run {
        ($DT:expr, $MR:literal) => {{
            let xp: [*const f32; $MR] = std::array::from_fn(|a| x[a * k..].as_ptr());
            // SAFETY: AVX-512 F/BW/DQ/VL, AVX2, FMA and F16C checked (asserted above);
            // each activation row holds k = 32 · blocks values and each group `blocks`
            // records of the weight's format (asserted: groups and blocks of `pw`); the
            // bitmap holds a bit per record (asserted), set by `pack_rows` only where every
            // real row meets `magic_ok` (rows kept are real rows).
            let r = unsafe {
                ax::stream16::<{ $DT }, $MR>(
                    xp,
                    r0,
                    r1,
                    pw.blocks,
                    fast,
                    g0 * pw.blocks,
                    g1 * pw.blocks,
                    low_field,
                )
            };
            let mut v = [[0f32; 16]; 2];
            v[..$MR].copy_from_slice(&r);
            v
        }};
    }
    match (pw.dtype, mr) {
        (DType::Q4_0, 1) => run!(ax::Q4_0, 1),
        (DType::Q4_0, _) => run!(ax::Q4_0, 2),
        (DType::Q4_1, 1) => run!(ax::Q4_1, 1),
        (DType::Q4_1, _) => run!(ax::Q4_1, 2),
        (DType::Q8_0, 1) => run!(ax::Q8_0, 1),
        (DType::Q8_0, _) => run!(ax::Q8_0, 2),
        (d, _) => unreachable!("{d} has no repack"),
    }
}

/// One call of the AVX2 kernel: the `mr` activation rows at the start of `x` with group `g`
/// (rows past the weight's last row are the group's zero padding).
#[cfg(target_arch = "x86_64")]
fn tile8(pw: &PackedWeight, mr: usize, x: XRows, k: usize, g: usize) -> [[f32; 8]; 4] {
    use crate::x86::avx2_records as ax;
    let (xs, row, xe) = match x {
        XRows::Plain(xs) => (xs, k, false),
        XRows::Expanded(xs) => (xs, 8 * k, true),
    };
    assert!(crate::Isa::active() == crate::Isa::Avx2Fma && g < pw.groups);
    assert!((1..=4).contains(&mr) && mr * row <= xs.len() && pw.blocks * 32 == k);
    let r = pw.group_bytes(g..g + 1).as_ptr();
    macro_rules! run {
        ($DT:expr, $MR:literal, $L:literal) => {{
            let xp: [*const f32; $MR] = std::array::from_fn(|a| xs[a * row..].as_ptr());
            // SAFETY: AVX2, FMA and F16C checked via `Isa` (asserted above); each activation
            // row holds k = 32 · blocks values (8k expanded) and the group `blocks` records
            // of the weight's format (asserted: group and blocks of `pw`).
            let r = unsafe {
                if xe {
                    ax::stream8::<{ $DT }, $MR, $L, true>(xp, r, pw.blocks)
                } else {
                    ax::stream8::<{ $DT }, $MR, $L, false>(xp, r, pw.blocks)
                }
            };
            let mut v = [[0f32; 8]; 4];
            v[..$MR].copy_from_slice(&r);
            v
        }};
    }
    macro_rules! mrs {
        ($DT:expr) => {
            match mr {
                1 => run!($DT, 1, 8),
                2 => run!($DT, 2, 4),
                3 => run!($DT, 3, 2),
                _ => run!($DT, 4, 2),
            }
        };
    }
    match pw.dtype {
        DType::Q4_0 => mrs!(ax::Q4_0),
        DType::Q4_1 => mrs!(ax::Q4_1),
        DType::Q8_0 => mrs!(ax::Q8_0),
        d => unreachable!("{d} has no repack"),
    }
}

/// Whether [`strip32`] can decode a strip starting at weight row `r0` (AVX-512, a group
/// boundary).
pub(crate) fn strip32_fits(r0: usize) -> bool {
    cfg!(target_arch = "x86_64") && crate::isa::avx512_exact() && r0.is_multiple_of(GROUP)
}

/// Decodes weight rows `r0..r0 + live` straight from the records into a 32-row strip of the
/// outer-product tile (`dst`: `[lane][step][32]`, `k / 8` steps; K is a multiple of 32, so
/// there is no tail), rows `live..32` zero: the AVX-512 stream kernel's decode stores each
/// 16-row vector as a strip row half (`x86::avx512_exact::decode_strip16`) where the
/// general route decodes into 4-row panels and transposes them.
#[cfg(target_arch = "x86_64")]
pub(crate) fn strip32(pw: &PackedWeight, r0: usize, live: usize, dst: &mut [f32]) {
    use crate::x86::avx512_exact as ax;
    let k = pw.k;
    assert!(strip32_fits(r0) && (1..=32).contains(&live) && r0 + live <= pw.n);
    assert!(dst.len() == 32 * k && pw.blocks * 32 == k);
    assert!(pw.fast.len() * 8 >= pw.groups * pw.blocks);
    let group = |g: usize| pw.group_bytes(g..g + 1).as_ptr();
    let low_field = crate::variants::low_field(pw.dtype);
    for half in 0..2 {
        let ga = r0 / GROUP + 2 * half;
        if 16 * half >= live {
            break;
        }
        // The half's second group may lie past the weight: decode the first twice (its
        // columns are zeroed below, being past `live`).
        let gb = if ga + 1 < pw.groups { ga + 1 } else { ga };
        macro_rules! run {
            ($DT:expr) => {
                // SAFETY: AVX-512 F/BW/DQ/VL, AVX2, FMA and F16C checked (`strip32_fits`,
                // asserted); both groups exist (ga < groups since row r0 + 16 · half < n)
                // with `blocks` records of the weight's format; the bitmap holds a bit per
                // record (asserted), set only where every real row meets `magic_ok`; `dst`
                // holds 32 · k values (asserted) and the half's 16 columns start at 16 · half.
                unsafe {
                    ax::decode_strip16::<{ $DT }>(
                        group(ga),
                        group(gb),
                        pw.blocks,
                        pw.fast.as_ptr(),
                        ga * pw.blocks,
                        gb * pw.blocks,
                        dst.as_mut_ptr().add(16 * half),
                        low_field,
                    )
                }
            };
        }
        match pw.dtype {
            DType::Q4_0 => run!(ax::Q4_0),
            DType::Q4_1 => run!(ax::Q4_1),
            DType::Q8_0 => run!(ax::Q8_0),
            d => unreachable!("{d} has no repack"),
        }
    }
    if live < 32 {
        for row in dst.chunks_exact_mut(32) {
            row[live..].fill(0.0);
        }
    }
}

/// Dequantizes elements `k0..k1` (multiples of 32) of weight rows `r0..r0 + live` from the
/// records into `dst` as `[step][nr][8]` (rows `live..nr` zero), as `super::pack` does from
/// the stored rows.
#[allow(clippy::too_many_arguments)]
#[cfg(target_arch = "x86_64")]
pub(crate) fn pack(
    pw: &PackedWeight,
    r0: usize,
    live: usize,
    nr: usize,
    k0: usize,
    k1: usize,
    dst: &mut [f32],
) {
    use crate::x86::avx2_exact as ax;
    assert!(
        dst.len() == nr * (k1 - k0) && k0.is_multiple_of(32) && k1.is_multiple_of(32) && k1 <= pw.k
    );
    assert!(live >= 1 && r0 + live <= pw.n && crate::Isa::active() == crate::Isa::Avx2Fma);
    let src = |b: usize| {
        let r = r0 + b.min(live - 1);
        (
            pw.data[r / GROUP * pw.blocks * pw.record_bytes..].as_ptr(),
            r % GROUP,
        )
    };
    macro_rules! run {
        ($DT:expr, $NR:literal) => {{
            let recs: [*const u8; $NR] = std::array::from_fn(|b| src(b).0);
            let cs: [usize; $NR] = std::array::from_fn(|b| src(b).1);
            // SAFETY: AVX2+FMA+F16C checked via `Isa` (asserted); every row's group has
            // `blocks ≥ k1 / 32` records; `dst` holds nr · (k1 − k0) values (asserted).
            unsafe {
                ax::pack_panel_records::<{ $DT }, $NR>(
                    recs,
                    cs,
                    pw.record_bytes,
                    live,
                    k0,
                    k1,
                    dst.as_mut_ptr(),
                )
            };
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
    match pw.dtype {
        DType::Q4_0 => nrs!(ax::Q4_0),
        DType::Q4_1 => nrs!(ax::Q4_1),
        DType::Q8_0 => nrs!(ax::Q8_0),
        d => unreachable!("{d} has no repack"),
    }
}
