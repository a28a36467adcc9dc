//! Executes a [`Plan`]: `out[m, n] = x[m, k] · W[n, k]ᵀ (+ bias)`.
//!
//! Units take their (activation rows × weight rows) range from the parallel plan; within it
//! the loops run: weight block of `nc` rows (dequantized once into a scratch panel for the
//! F32Dot family) → activation block of `mc` rows → register tiles of `mr × nr`. Edge tiles
//! use smaller register tiles of the same family, so results never depend on the tiling.

use std::cell::RefCell;

use tessera_core::WeightTensor;
use tessera_runtime::{split_range, split_range_aligned, DisjointMut, ThreadPool};

use crate::generic;
use crate::isa::Isa;
use crate::packed::{PackedWeight, GROUP};
use crate::plan::{F32Kernel, KernelFamily, Plan};
use crate::quant_acts::QuantizedActs;

/// A weight in the layouts its kernels read: the stored tensor (or several with the same K
/// and dtype stacked along N, e.g. fused q/k/v projections, without copying), plus the
/// interleaved repack when the fast path is enabled for a block-quantized format.
pub struct GemmWeight {
    pub parts: Vec<WeightTensor>,
    /// First row of each part.
    starts: Vec<usize>,
    n: usize,
    pub packed: Option<PackedWeight>,
}

impl GemmWeight {
    pub fn new(tensor: WeightTensor, repack: bool) -> Self {
        Self::stacked(vec![tensor], repack).expect("a single tensor always stacks")
    }

    /// Stacks `parts` along N. They must share dtype and K; `None` otherwise.
    pub fn stacked(parts: Vec<WeightTensor>, repack: bool) -> Option<Self> {
        let first = parts.first()?;
        if parts
            .iter()
            .any(|p| p.dtype != first.dtype || p.cols() != first.cols() || p.shape.len() != 2)
        {
            return None;
        }
        let mut starts = Vec::with_capacity(parts.len());
        let mut n = 0;
        for p in &parts {
            starts.push(n);
            n += p.rows();
        }
        let mut w = GemmWeight {
            parts,
            starts,
            n,
            packed: None,
        };
        if repack {
            w.packed = PackedWeight::pack_rows(w.dtype(), w.n, w.k(), &|r| w.row(r));
            if w.packed.is_some() {
                // The fast path reads only the repacked copy from now on.
                w.parts.iter().for_each(|p| p.bytes.release_pages());
            }
        }
        Some(w)
    }

    pub fn n(&self) -> usize {
        self.n
    }
    pub fn k(&self) -> usize {
        self.parts[0].cols()
    }
    pub fn dtype(&self) -> tessera_core::DType {
        self.parts[0].dtype
    }

    /// Stored bytes of row `r` (over all parts).
    pub fn row(&self, r: usize) -> &[u8] {
        let i = self.starts.partition_point(|&s| s <= r) - 1;
        self.parts[i].row(r - self.starts[i])
    }

    /// The stored bytes of rows `rows` when one part holds them all (they are then one
    /// contiguous run), else `None`.
    pub fn stored_rows(&self, rows: std::ops::Range<usize>) -> Option<&[u8]> {
        if rows.is_empty() || rows.end > self.n {
            return None;
        }
        let i = self.starts.partition_point(|&s| s <= rows.start) - 1;
        let part = &self.parts[i];
        let (r0, r1) = (rows.start - self.starts[i], rows.end - self.starts[i]);
        let rb = part.row_bytes();
        (r1 <= part.rows()).then(|| &part.data()[r0 * rb..r1 * rb])
    }
}

thread_local! {
    static PANEL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `plan`. Panics on inconsistent shapes (callers check them once at load).
pub fn execute(
    pool: &ThreadPool,
    plan: &Plan,
    x: &[f32],
    m: usize,
    w: &GemmWeight,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    let (n, k) = (w.n(), w.k());
    assert_eq!(x.len(), m * k, "gemm: x is not [m, k]");
    assert_eq!(out.len(), m * n, "gemm: out is not [m, n]");
    if let Some(b) = bias {
        assert_eq!(b.len(), n, "gemm: bias is not [n]");
    }
    if m == 0 || n == 0 {
        return;
    }
    let isa = Isa::active();
    let (m_parts, n_parts) = plan.parallel.parts();
    let units = (m_parts * n_parts).min(pool.units()).max(1);
    let out_ptr = DisjointMut::new(out);
    match plan.tile.family {
        KernelFamily::F32Dot => pool.run(|u| {
            if u >= units {
                return;
            }
            let rows = split_range(m, m_parts, u / n_parts);
            let cols = split_range_aligned(n, n_parts, u % n_parts, GROUP);
            match plan.tile.kernel {
                F32Kernel::Panel => f32dot_range(isa, plan, x, k, n, w, bias, rows, cols, out_ptr),
                F32Kernel::Stream => {
                    crate::exact::stream_range(isa, plan, x, k, n, w, bias, rows, cols, out_ptr)
                }
                F32Kernel::Packed => {
                    crate::exact::packed_range(isa, plan, x, k, n, w, bias, rows, cols, out_ptr)
                }
            }
        }),
        KernelFamily::Q8Interleaved => {
            let pw = w
                .packed
                .as_ref()
                .expect("Q8Interleaved plan needs a repacked weight");
            let xq = QuantizedActs::quantize_parallel(pool, x, m, k);
            pool.run(|u| {
                if u >= units {
                    return;
                }
                let rows = split_range(m, m_parts, u / n_parts);
                let groups = split_range(pw.groups, n_parts, u % n_parts);
                q8_range(isa, plan, &xq, n, pw, bias, rows, groups, out_ptr);
            })
        }
        KernelFamily::QkDot => {
            let xq = crate::qk::QkActs::quantize(w.dtype(), x, m, k);
            pool.run(|u| {
                if u >= units {
                    return;
                }
                let rows = split_range(m, m_parts, u / n_parts);
                let cols = split_range_aligned(n, n_parts, u % n_parts, GROUP);
                qk_range(isa, plan, &xq, n, w, bias, rows, cols, out_ptr);
            })
        }
    }
}

/// Runs a [`KernelFamily::QkDot`] plan over activation rows `rows` and weight rows `cols`:
/// blocks of `nc` weight rows, then of `mc` activation rows, then `mr × nr` tiles.
#[allow(clippy::too_many_arguments)]
fn qk_range(
    isa: Isa,
    plan: &Plan,
    xq: &crate::qk::QkActs,
    n: usize,
    w: &GemmWeight,
    bias: Option<&[f32]>,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    out: DisjointMut<f32>,
) {
    use crate::qk::{MAX_MR, MAX_NR};
    let t = &plan.tile;
    let (mr, nr) = (t.mr.clamp(1, MAX_MR), t.nr.clamp(1, MAX_NR));
    let nc = t.nc.max(nr);
    let dtype = w.dtype();
    let mut vals = [0f32; MAX_MR * MAX_NR];
    let mut n0 = cols.start;
    while n0 < cols.end {
        let n1 = (n0 + nc).min(cols.end);
        let mut m0 = rows.start;
        while m0 < rows.end {
            let m1 = (m0 + t.mc.max(1)).min(rows.end);
            let mut j = n0;
            while j < n1 {
                let nj = nr.min(n1 - j);
                let wrows: [&[u8]; MAX_NR] = std::array::from_fn(|b| w.row(j + b.min(nj - 1)));
                let mut i = m0;
                while i < m1 {
                    let mi = mr.min(m1 - i);
                    crate::qk::tile(isa, dtype, xq, i, mi, &wrows[..nj], &mut vals);
                    for a in 0..mi {
                        crate::exact::write_row(
                            out,
                            n,
                            i + a,
                            j,
                            &vals[a * nj..(a + 1) * nj],
                            bias,
                        );
                    }
                    i += mi;
                }
                j += nj;
            }
            m0 = m1;
        }
        n0 = n1;
    }
}

#[allow(clippy::too_many_arguments)]
fn f32dot_range(
    isa: Isa,
    plan: &Plan,
    x: &[f32],
    k: usize,
    n: usize,
    w: &GemmWeight,
    bias: Option<&[f32]>,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    out: DisjointMut<f32>,
) {
    let t = &plan.tile;
    PANEL.with(|panel| {
        let mut panel = panel.borrow_mut();
        let nc = t.nc.max(1);
        if panel.len() < nc * k {
            panel.resize(nc * k, 0.0);
        }
        let mut n0 = cols.start;
        while n0 < cols.end {
            let ncb = nc.min(cols.end - n0);
            for r in 0..ncb {
                dequantize(
                    isa,
                    w.dtype(),
                    w.row(n0 + r),
                    &mut panel[r * k..(r + 1) * k],
                );
            }
            let mut m0 = rows.start;
            while m0 < rows.end {
                let mcb = t.mc.max(1).min(rows.end - m0);
                let mut j = 0;
                while j < ncb {
                    let nr = t.nr.min(ncb - j);
                    let mut i = 0;
                    while i < mcb {
                        let mr = t.mr.min(mcb - i);
                        let xs = |a: usize| &x[(m0 + i + a) * k..(m0 + i + a + 1) * k];
                        let ws = |b: usize| &panel[(j + b) * k..(j + b + 1) * k];
                        f32_tile(isa, mr, nr, &xs, &ws, k, &mut |a, b, v| {
                            let (row, col) = (m0 + i + a, n0 + j + b);
                            let v = v + bias.map_or(0.0, |bs| bs[col]);
                            // SAFETY: (row, col) lies in this unit's disjoint ranges.
                            unsafe { out.write(row * n + col, v) };
                        });
                        i += mr;
                    }
                    j += nr;
                }
                m0 += mcb;
            }
            n0 += ncb;
        }
    });
}

/// Dequantizes a stored row (or a run of whole blocks) on `isa`.
pub(crate) fn dequantize(isa: Isa, dtype: tessera_core::DType, row: &[u8], out: &mut [f32]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Avx2Fma is active only with AVX2, FMA and F16C; a stored row holds
        // `out.len()` elements (WeightTensor checked its byte length).
        Isa::Avx2Fma => unsafe { crate::x86::avx2::dequantize(dtype, row, out) },
        _ => generic::dequantize(dtype, row, out),
    }
}

/// One `mr × nr` register tile of canonical dots, results delivered through `put`.
pub(crate) fn f32_tile<'a>(
    isa: Isa,
    mr: usize,
    nr: usize,
    xs: &dyn Fn(usize) -> &'a [f32],
    ws: &dyn Fn(usize) -> &'a [f32],
    k: usize,
    put: &mut dyn FnMut(usize, usize, f32),
) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2Fma {
        macro_rules! run {
            ($MR:literal, $NR:literal) => {{
                let xp: [*const f32; $MR] = std::array::from_fn(|a| xs(a).as_ptr());
                let wp: [*const f32; $NR] = std::array::from_fn(|b| ws(b).as_ptr());
                // SAFETY: AVX2+FMA checked via `Isa`; every row slice holds `k` values.
                let r = unsafe { crate::x86::avx2::tile_f32::<$MR, $NR>(xp, wp, k) };
                for a in 0..$MR {
                    for b in 0..$NR {
                        put(a, b, r[a][b]);
                    }
                }
                return;
            }};
        }
        match (mr, nr) {
            (1, 8) => run!(1, 8),
            (1, 1) => run!(1, 1),
            (1, 2) => run!(1, 2),
            (1, 3) => run!(1, 3),
            (1, 4) => run!(1, 4),
            (2, 1) => run!(2, 1),
            (2, 2) => run!(2, 2),
            (2, 3) => run!(2, 3),
            (2, 4) => run!(2, 4),
            (3, 1) => run!(3, 1),
            (3, 2) => run!(3, 2),
            (3, 3) => run!(3, 3),
            (3, 4) => run!(3, 4),
            (4, 1) => run!(4, 1),
            (4, 2) => run!(4, 2),
            (4, 3) => run!(4, 3),
            (4, 4) => run!(4, 4),
            _ => {
                // Edge tiles of wide register tiles: cover them with ≤ 4-wide tiles. Every
                // tile shape computes each element identically, so this changes no result.
                assert!(mr <= 4, "register tiles have at most 4 activation rows");
                let mut b0 = 0;
                while b0 < nr {
                    let nb = (nr - b0).min(4);
                    let shifted = |b: usize| ws(b0 + b);
                    f32_tile(isa, mr, nb, xs, &shifted, k, &mut |a, b, v| {
                        put(a, b0 + b, v)
                    });
                    b0 += nb;
                }
                return;
            }
        }
    }
    let _ = isa;
    for a in 0..mr {
        for b in 0..nr {
            put(a, b, generic::dot_f32(xs(a), ws(b)));
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn q8_range(
    isa: Isa,
    plan: &Plan,
    xq: &QuantizedActs,
    n: usize,
    pw: &PackedWeight,
    bias: Option<&[f32]>,
    rows: std::ops::Range<usize>,
    groups: std::ops::Range<usize>,
    out: DisjointMut<f32>,
) {
    let t = &plan.tile;
    let gc = (t.nc / GROUP).max(1);
    let mut put = |row: usize, g: usize, vals: &[f32; 8]| {
        for (c, &v) in vals.iter().enumerate() {
            let col = g * GROUP + c;
            if col < n {
                let v = v + bias.map_or(0.0, |bs| bs[col]);
                // SAFETY: (row, col) lies in this unit's disjoint ranges.
                unsafe { out.write(row * n + col, v) };
            }
        }
    };
    let mut g0 = groups.start;
    while g0 < groups.end {
        let gcb = gc.min(groups.end - g0);
        let mut m0 = rows.start;
        while m0 < rows.end {
            let mcb = t.mc.max(1).min(rows.end - m0);
            for g in g0..g0 + gcb {
                let mut i = 0;
                while i < mcb {
                    let mr = t.mr.clamp(1, 4).min(mcb - i);
                    q8_tile(isa, mr, xq, pw, g, m0 + i, &mut put);
                    i += mr;
                }
            }
            m0 += mcb;
        }
        g0 += gcb;
    }
}

fn q8_tile(
    isa: Isa,
    mr: usize,
    xq: &QuantizedActs,
    pw: &PackedWeight,
    g: usize,
    row0: usize,
    put: &mut dyn FnMut(usize, usize, &[f32; 8]),
) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2Fma {
        use crate::x86::avx2_q8::{tile, ActRows};
        let nb = xq.blocks_per_row;
        macro_rules! run {
            ($MR:literal) => {{
                let rows = ActRows::<$MR> {
                    qs: std::array::from_fn(|a| xq.qs[(row0 + a) * nb * 32..].as_ptr()),
                    d: std::array::from_fn(|a| &xq.d[(row0 + a) * nb..(row0 + a + 1) * nb]),
                    s: std::array::from_fn(|a| &xq.s[(row0 + a) * nb..(row0 + a + 1) * nb]),
                    qsum: std::array::from_fn(|a| &xq.qsum[(row0 + a) * nb..(row0 + a + 1) * nb]),
                };
                let mut r = [[0f32; 8]; $MR];
                let rec = pw.record(g, 0).as_ptr();
                // SAFETY: AVX2+FMA+F16C checked via `Isa`; the group has `blocks` records and
                // each activation row `blocks · 32` quants (QuantizedActs of the same K).
                unsafe { tile::<$MR>(pw.dtype, rec, pw.blocks, pw.record_bytes, &rows, &mut r) };
                for (a, v) in r.iter().enumerate() {
                    put(row0 + a, g, v);
                }
                return;
            }};
        }
        match mr {
            1 => run!(1),
            2 => run!(2),
            3 => run!(3),
            4 => run!(4),
            _ => {}
        }
    }
    let _ = isa;
    for a in 0..mr {
        let mut v = [0f32; 8];
        generic::packed_group_row(pw, g, xq, row0 + a, &mut v);
        put(row0 + a, g, &v);
    }
}
