//! Batched multi-LoRA deltas on CPU (SGMV/BGMV-style "shrink then expand", after Punica,
//! Chen et al. 2023, and S-LoRA): the rows of a step come in contiguous segments, each with
//! its own adapter (rank, scale, A, B) or none, and for a fused linear each part (q, k, v)
//! has its own output columns. This module owns the task description ([`LoraTask`]), the
//! parallel plan ([`LoraPlan`], chosen by [`plan_lora`]), its execution ([`lora_apply`]) and
//! the f64 reference ([`lora_apply_reference`]); the caller owns adapters and shape checks.
//!
//! For each task and row i: `t[r] = dot(x[i], A[r])` (shrink, into the scratch), then for
//! each column j: `acc = Σ_r t[r]·Bᵀ[r, j]` in order of r from zero and
//! `out[i, col0 + j] += scale·acc` (expand). Ranks are heterogeneous and never padded.
//!
//! Factors are read as they are held ([`FactorView`]): f32, or f16 / bf16 at half the bytes,
//! converted to f32 in registers as they are loaded (F16C's `vcvtph2ps`; bf16 by widening
//! and a shift of 16) and accumulated in f32. The conversion is exact and changes no
//! arithmetic, so a module held in halves gives bitwise the result of the same values held
//! as f32, on every ISA.
//!
//! Batch invariance (bitwise, on a given ISA): each `t` is the crate's canonical dot product
//! (order fixed by k alone; [`crate::dot_tile`] keeps it whatever the tile), and each output
//! element has one fixed expand arithmetic whatever block or part its column falls in (FMA
//! chains on AVX2, scalar tails with `mul_add`; multiply-then-add throughout on the portable
//! path). So a row's delta depends only on its own x, its adapter and the ISA — not on the
//! other tasks, the plan or the unit count.
//!
//! Cost: `Σ rows·rank·(k + n)` multiply-adds and one read of each adapter's A and B. Each
//! call makes one pool dispatch (rows split: a unit shrinks and expands its own rows) or two
//! (columns split: a balanced shrink, then every task's columns divided among the units).
//! Each part knows the factor bytes it will read, in order, and prefetches them a fixed
//! distance ahead of its reads (`ahead::Ahead`): a decode step's factors are many short runs in
//! separate allocations, which the hardware prefetchers alone leave waiting on memory.

use std::ops::Range;

use tessera_runtime::{split_range, split_range_aligned, DisjointMut, ThreadPool};

use crate::Isa;

mod ahead;
mod factors;

pub(crate) use ahead::Ahead;

pub use factors::FactorView;
pub(crate) use factors::{Elem, ElemKind};

/// One (segment, part) pair: rows `rows` of the input use this adapter's A and B for the
/// output columns `col0..col0 + n`.
#[derive(Debug, Clone)]
pub struct LoraTask<'a> {
    pub rows: Range<usize>,
    pub rank: usize,
    /// A, row-major `rank × k`.
    pub a: FactorView<'a>,
    /// B transposed, row-major `rank × n` (so the expand is a run of contiguous row updates).
    pub b_t: FactorView<'a>,
    pub scale: f32,
    pub col0: usize,
    pub n: usize,
}

/// `$e` with `$v` bound to the view's slice, whatever its element type (one monomorphized
/// copy of the generic code in `$e` per type).
macro_rules! with_values {
    ($view:expr, $v:ident => $e:expr) => {
        match $view {
            FactorView::F32($v) => $e,
            FactorView::F16($v) => $e,
            FactorView::BF16($v) => $e,
        }
    };
}

/// How a call's work is divided among units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LoraSplit {
    /// The (task, row) items, weighted `rank·(k + n)`, cut into `units` contiguous parts;
    /// each unit shrinks and expands its own rows (one dispatch). Suits many rows.
    Rows,
    /// First all shrink dots cut evenly into `units` parts, then each task's columns cut
    /// into `units` parts at multiples of 16 (two dispatches). Suits few rows.
    Cols,
}

/// The parallel strategy chosen for one call, as plain data (printable with `{:?}`). Any
/// plan is valid on any pool: parts beyond the pool's units run round-robin; `units == 1`
/// runs on the calling thread without a dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoraPlan {
    pub split: LoraSplit,
    /// Number of parts the work is cut into.
    pub units: usize,
}
/// Multiply-adds per ns of one core on cache-resident f32 tiles (≈ 20 GFLOP/s).
const MACS_PER_NS: f64 = 10.0;
/// Adapter bytes one core streams per ns (its share of DRAM bandwidth).
const WEIGHT_BYTES_PER_NS: f64 = 6.0;
/// One pool dispatch and join (`MachineProfile::default_for`'s `dispatch_us`).
const DISPATCH_NS: f64 = 600.0;
/// How much cheaper than `Rows` the model must find `Cols` to pick it.
const COLS_MARGIN: f64 = 0.95;
/// Column alignment of the columns split (the AVX2 expand's widest block).
const COL_ALIGN: usize = 16;

/// Chooses the plan from the shapes (rows per task, ranks, k, n, unit count) with a simple
/// cost model: per part, multiply-adds at `MACS_PER_NS` plus adapter bytes read at
/// `WEIGHT_BYTES_PER_NS` (4 a value for f32 factors, 2 for halves); a plan costs its
/// slowest part per phase plus `DISPATCH_NS` per dispatch. On several units `Cols` must beat `Rows` by `COLS_MARGIN` (the model does not
/// price the rows split's locality: each t is used at once by the core that made it); the
/// winner runs unless serial (`Rows` on 1 unit) is cheaper still.
pub fn plan_lora(tasks: &[LoraTask], k: usize, units: usize) -> LoraPlan {
    let serial = plan(LoraSplit::Rows, 1);
    if units <= 1 {
        return serial;
    }
    let (rows, cols) = (plan(LoraSplit::Rows, units), plan(LoraSplit::Cols, units));
    let (rows_ns, cols_ns) = (estimate_ns(&rows, tasks, k), estimate_ns(&cols, tasks, k));
    let (best, best_ns) = match cols_ns < COLS_MARGIN * rows_ns {
        true => (cols, cols_ns),
        false => (rows, rows_ns),
    };
    match best_ns < estimate_ns(&serial, tasks, k) {
        true => best,
        false => serial,
    }
}

const fn plan(split: LoraSplit, units: usize) -> LoraPlan {
    LoraPlan { split, units }
}

/// The cost model's time for `plan`, ns (see [`plan_lora`]).
fn estimate_ns(plan: &LoraPlan, tasks: &[LoraTask], k: usize) -> f64 {
    let ns = |(macs, bytes): (usize, usize)| {
        macs as f64 / MACS_PER_NS + bytes as f64 / WEIGHT_BYTES_PER_NS
    };
    let mut slowest = [0f64; 2];
    for p in 0..plan.units.max(1) {
        for (s, w) in slowest.iter_mut().zip(part_work(plan, tasks, k, p)) {
            *s = s.max(ns(w));
        }
    }
    let dispatches = match (plan.units, plan.split) {
        (0 | 1, _) => 0.0,
        (_, LoraSplit::Rows) => 1.0,
        (_, LoraSplit::Cols) => 2.0,
    };
    slowest[0] + slowest[1] + dispatches * DISPATCH_NS
}

/// (multiply-adds, adapter bytes read) of part `p` of `plan`, per phase (rows: one phase).
fn part_work(plan: &LoraPlan, tasks: &[LoraTask], k: usize, p: usize) -> [(usize, usize); 2] {
    let parts = plan.units.max(1);
    let mut w = [(0, 0); 2];
    match plan.split {
        LoraSplit::Rows => for_rows_part(tasks, k, parts, p, |ti, rows, _| {
            let t = &tasks[ti];
            let per_row = t.rank * (k + t.n);
            let bytes = t.rank * (t.a.elem_bytes() * k + t.b_t.elem_bytes() * t.n);
            w[0] = (w[0].0 + rows.len() * per_row, w[0].1 + bytes);
        }),
        LoraSplit::Cols => {
            for_dots_part(tasks, parts, p, |ti, dots, _| {
                let a_rows = dots.len().min(tasks[ti].rank);
                let bytes = tasks[ti].a.elem_bytes() * a_rows * k;
                w[0] = (w[0].0 + dots.len() * k, w[0].1 + bytes);
            });
            for t in tasks.iter().filter(|t| active(t)) {
                let cols = split_range_aligned(t.n, parts, p, COL_ALIGN).len();
                w[1] = (
                    w[1].0 + t.rows.len() * t.rank * cols,
                    w[1].1 + t.b_t.elem_bytes() * t.rank * cols,
                );
            }
        }
    }
    w
}

/// Whether a task adds anything (rank 0, no rows or no columns: nothing to do).
fn active(t: &LoraTask) -> bool {
    t.rank > 0 && t.n > 0 && !t.rows.is_empty()
}

/// The task's shrunk values in the scratch: `rows.len() × rank`, tasks back to back.
fn t_len(t: &LoraTask) -> usize {
    usize::from(active(t)) * t.rows.len() * t.rank
}

/// Calls `f(task, local rows, task's scratch offset)` for what part `p` of `parts` owns in
/// the rows split: the (task, row) items in order, each weighted `rank·(k + n)`, item j
/// going to the part whose share of the total weight contains j's starting weight. A part's
/// items are contiguous, in the scratch too.
fn for_rows_part(
    tasks: &[LoraTask],
    k: usize,
    parts: usize,
    p: usize,
    mut f: impl FnMut(usize, Range<usize>, usize),
) {
    let w = |t: &LoraTask| (usize::from(active(t)) * t.rank * (k + t.n)) as u128;
    let total: u128 = tasks.iter().map(|t| w(t) * t.rows.len() as u128).sum();
    let np = parts as u128;
    let lo = (total * p as u128).div_ceil(np);
    let hi = (total * (p as u128 + 1)).div_ceil(np);
    let (mut cum, mut off) = (0u128, 0usize);
    for (ti, t) in tasks.iter().enumerate() {
        if cum >= hi {
            break;
        }
        let wt = w(t);
        if wt == 0 {
            continue;
        }
        let len = t.rows.len() as u128;
        // Item j starts at cum + j·wt and is ours iff lo <= start < hi.
        let j0 = lo.saturating_sub(cum).div_ceil(wt).min(len) as usize;
        let j1 = hi.saturating_sub(cum).div_ceil(wt).min(len) as usize;
        if j0 < j1 {
            f(ti, j0..j1, off);
        }
        cum += wt * len;
        off += t_len(t);
    }
}

/// Calls `f(task, local dot range, task's scratch offset)` for part `p`'s even share of all
/// shrink dots, numbered as their scratch positions.
fn for_dots_part(
    tasks: &[LoraTask],
    parts: usize,
    p: usize,
    mut f: impl FnMut(usize, Range<usize>, usize),
) {
    let mine = split_range(tasks.iter().map(t_len).sum(), parts, p);
    let mut off = 0;
    for (ti, t) in tasks.iter().enumerate() {
        if off >= mine.end {
            break;
        }
        let len = t_len(t);
        let (s, e) = (mine.start.max(off), mine.end.min(off + len));
        if s < e {
            f(ti, s - off..e - off, off);
        }
        off += len;
    }
}

/// Asserts the shape invariants the caller has already checked.
fn check(x: &[f32], k: usize, tasks: &[LoraTask], out_len: usize, out_stride: usize) {
    for t in tasks {
        assert_eq!(t.a.len(), t.rank * k, "lora: A is not rank × k");
        assert_eq!(t.b_t.len(), t.rank * t.n, "lora: Bᵀ is not rank × n");
        assert!(t.col0 + t.n <= out_stride, "lora: columns past the row");
        if !t.rows.is_empty() {
            assert!(t.rows.end * k <= x.len(), "lora: rows past x");
            let end = (t.rows.end - 1) * out_stride + t.col0 + t.n;
            assert!(end <= out_len, "lora: rows past out");
        }
    }
    let meet = |r: Range<usize>, s: Range<usize>| r.start < s.end && s.start < r.end;
    let clash = |a: &LoraTask, b: &LoraTask| {
        let cols = |t: &LoraTask| t.col0..t.col0 + t.n;
        active(a) && active(b) && meet(a.rows.clone(), b.rows.clone()) && meet(cols(a), cols(b))
    };
    let disjoint = || (0..tasks.len()).all(|i| tasks[..i].iter().all(|b| !clash(&tasks[i], b)));
    debug_assert!(disjoint(), "lora: tasks overlap in out");
}

/// Adds every task's delta to `out` (`m` rows of `out_stride` floats; task rows index x and out).
/// `x`: rows of `k` floats. `scratch` holds the shrunk t values (grown as needed, reused).
#[allow(clippy::too_many_arguments)]
pub fn lora_apply(
    pool: &ThreadPool,
    plan: &LoraPlan,
    x: &[f32],
    k: usize,
    tasks: &[LoraTask],
    out: &mut [f32],
    out_stride: usize,
    scratch: &mut Vec<f32>,
) {
    check(x, k, tasks, out.len(), out_stride);
    let total = tasks.iter().map(t_len).sum();
    if total == 0 {
        return;
    }
    if scratch.len() < total {
        scratch.resize(total, 0.0);
    }
    let isa = Isa::active();
    let parts = plan.units.max(1);
    let on_units = |job: &(dyn Fn(usize) + Sync)| {
        if parts == 1 {
            job(0);
        } else {
            let step = pool.units();
            pool.run(|u| (u..parts).step_by(step).for_each(job));
        }
    };
    let outs = DisjointMut::new(out);
    match plan.split {
        LoraSplit::Rows => {
            let ts = DisjointMut::new(&mut scratch[..total]);
            on_units(&|p| {
                let mut spans = Vec::new();
                for_rows_part(tasks, k, parts, p, |ti, _, _| {
                    spans.extend([tasks[ti].a.byte_span(), tasks[ti].b_t.byte_span()])
                });
                let mut ahead = Ahead::new(spans);
                for_rows_part(tasks, k, parts, p, |ti, rows, off| {
                    let task = &tasks[ti];
                    let dots = rows.start * task.rank..rows.end * task.rank;
                    // SAFETY: parts own disjoint (task, row) items, hence scratch ranges.
                    let t = unsafe { ts.slice(off + dots.start, dots.len()) };
                    shrink(x, k, task, dots, t, &mut ahead);
                    expand(isa, task, t, rows, 0..task.n, outs, out_stride, &mut ahead);
                })
            });
        }
        LoraSplit::Cols => {
            let ts = DisjointMut::new(&mut scratch[..total]);
            on_units(&|p| {
                let mut spans = Vec::new();
                for_dots_part(tasks, parts, p, |ti, dots, _| {
                    let (t, row) = (&tasks[ti], dots.start / tasks[ti].rank);
                    let within = dots.len() < t.rank && (dots.end - 1) / t.rank == row;
                    let r = match within {
                        true => dots.start % t.rank..(dots.end - 1) % t.rank + 1,
                        false => 0..t.rank,
                    };
                    spans.push(t.a.byte_range(r.start * k..r.end * k));
                });
                let mut ahead = Ahead::new(spans);
                for_dots_part(tasks, parts, p, |ti, dots, off| {
                    // SAFETY: parts own disjoint dot ranges, i.e. scratch ranges.
                    let t = unsafe { ts.slice(off + dots.start, dots.len()) };
                    shrink(x, k, &tasks[ti], dots, t, &mut ahead);
                })
            });
            let all_t = &scratch[..total];
            on_units(&|p| {
                let cols = |t: &LoraTask| split_range_aligned(t.n, parts, p, COL_ALIGN);
                let mut ahead = Ahead::new(tasks.iter().filter(|t| active(t)).flat_map(|t| {
                    let c = cols(t);
                    (0..t.rank).map(move |r| t.b_t.byte_range(r * t.n + c.start..r * t.n + c.end))
                }));
                let mut off = 0;
                for task in tasks.iter().filter(|t| active(t)) {
                    let len = t_len(task);
                    let cols = cols(task);
                    if !cols.is_empty() {
                        let t = &all_t[off..off + len];
                        let rows = 0..task.rows.len();
                        expand(isa, task, t, rows, cols, outs, out_stride, &mut ahead);
                    }
                    off += len;
                }
            });
        }
    }
}

/// `t[d - dots.start] = dot(x[task row d / rank], A[d % rank])` for the task's dots `dots`
/// (numbered `row·rank + r`, as in the scratch), in tiles of canonical dots: up to 3 whole
/// rows × 4 ranks, sharing loads; a partial row at either end on its own.
fn shrink(
    x: &[f32],
    k: usize,
    task: &LoraTask,
    dots: Range<usize>,
    t: &mut [f32],
    ahead: &mut Ahead,
) {
    with_values!(task.a, a => shrink_as(x, k, task, a, dots, t, ahead))
}

/// [`shrink`] with A's values `a`.
fn shrink_as<W: Elem>(
    x: &[f32],
    k: usize,
    task: &LoraTask,
    a: &[W],
    dots: Range<usize>,
    t: &mut [f32],
    ahead: &mut Ahead,
) {
    let rank = task.rank;
    let first_row = dots.start / rank;
    let x_row = |i: usize| &x[(task.rows.start + i) * k..][..k];
    let mut d = dots.start;
    while d < dots.end {
        let (i0, r0, left) = (d / rank, d % rank, dots.end - d);
        let (mr, r1) = match r0 == 0 && left >= rank {
            true => ((left / rank).min(3), rank),
            false => (1, rank.min(r0 + left)),
        };
        let xs: [&[f32]; 3] = std::array::from_fn(|a| x_row(i0 + a.min(mr - 1)));
        for q in (r0..r1).step_by(4) {
            let nr = (r1 - q).min(4);
            let ws: [&[W]; 4] = std::array::from_fn(|b| &a[(q + b.min(nr - 1)) * k..][..k]);
            let base = i0 * rank + q - dots.start;
            let ahead = match i0 == first_row {
                true => &mut *ahead,
                false => &mut Ahead::none(),
            };
            W::dot_tile(
                &xs[..mr],
                &ws[..nr],
                &mut |i, r, v| t[base + i * rank + r] = v,
                ahead,
            );
        }
        d += (mr - 1) * rank + r1 - r0;
    }
}

/// `out[task row i, col0 + j] += scale · Σ_r t[i, r]·Bᵀ[r, j]` for local rows `rows` (`t`
/// holds them from `rows.start`, `rank` apart) and columns `cols`, up to 4 rows at a time.
/// The first rows' pass reports the factor bytes it reads to `ahead`.
#[allow(clippy::too_many_arguments)]
fn expand(
    isa: Isa,
    task: &LoraTask,
    t: &[f32],
    rows: Range<usize>,
    cols: Range<usize>,
    outs: DisjointMut<f32>,
    out_stride: usize,
    ahead: &mut Ahead,
) {
    with_values!(task.b_t, b => expand_as(isa, task, b, t, rows, cols, outs, out_stride, ahead))
}

/// [`expand`] with Bᵀ's values `b_t`.
#[allow(clippy::too_many_arguments)]
fn expand_as<W: Elem>(
    isa: Isa,
    task: &LoraTask,
    b_t: &[W],
    t: &[f32],
    rows: Range<usize>,
    cols: Range<usize>,
    outs: DisjointMut<f32>,
    out_stride: usize,
    ahead: &mut Ahead,
) {
    let (rank, len) = (task.rank, cols.len());
    assert!(cols.end <= task.n && t.len() >= rows.len() * rank);
    let (b, ldb) = (&b_t[cols.start..], task.n);
    let t_row = |i: usize| &t[(i - rows.start) * rank..][..rank];
    let out_at = |i: usize| (task.rows.start + i) * out_stride + task.col0 + cols.start;
    let _ = isa; // only x86 builds branch on it
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2Fma {
        for i0 in rows.clone().step_by(4) {
            let mr = (rows.end - i0).min(4);
            let o: [*mut f32; 4] = std::array::from_fn(|a| match a < mr {
                // SAFETY: this part owns these (row, column) elements of out.
                true => unsafe { outs.slice(out_at(i0 + a), len) }.as_mut_ptr(),
                false => std::ptr::null_mut(),
            });
            let tp: [*const f32; 4] = std::array::from_fn(|a| t_row(i0 + a.min(mr - 1)).as_ptr());
            // SAFETY: AVX2+FMA+F16C checked via `Isa`; the first `mr` out rows hold `len` values
            // each (bounds-checked slices of distinct rows), each t row `rank`; Bᵀ rows are
            // `ldb = n` apart and `cols.end <= n`, so each row r < rank of `b` has `len` values.
            unsafe {
                let b = b.as_ptr();
                let ahead = match i0 == rows.start {
                    true => &mut *ahead,
                    false => &mut Ahead::none(),
                };
                crate::x86::lora_avx2::expand_rows(o, tp, mr, b, ldb, rank, len, task.scale, ahead)
            }
        }
        return;
    }
    for i in rows.clone() {
        // SAFETY: this part owns these (row, column) elements of out.
        let o = unsafe { outs.slice(out_at(i), len) };
        expand_row_generic(o, t_row(i), b, ldb, task.scale);
        if i == rows.start {
            ahead.consume(rank * len * std::mem::size_of::<W>());
        }
    }
}

/// Portable twin of `x86::lora_avx2::expand_tile` for one row: per column, `acc += t[r]·b`
/// over r in order from zero, then `out += scale·acc`; 64 columns of accumulators at a time.
/// Halves in `b` are converted to f32 (exactly) as they are read.
pub(crate) fn expand_row_generic<W: Elem>(
    out: &mut [f32],
    t: &[f32],
    b: &[W],
    ldb: usize,
    scale: f32,
) {
    const C: usize = 64;
    for c0 in (0..out.len()).step_by(C) {
        let w = C.min(out.len() - c0);
        let mut acc = [0f32; C];
        for (r, &tr) in t.iter().enumerate() {
            for (a, &bv) in acc[..w].iter_mut().zip(&b[r * ldb + c0..][..w]) {
                *a += tr * bv.into();
            }
        }
        for (o, &a) in out[c0..c0 + w].iter_mut().zip(&acc[..w]) {
            *o += scale * a;
        }
    }
}

/// Naive reference, f64 accumulation, returns the deltas added to a copy of `out`.
pub fn lora_apply_reference(
    x: &[f32],
    k: usize,
    tasks: &[LoraTask],
    out: &[f32],
    out_stride: usize,
) -> Vec<f64> {
    check(x, k, tasks, out.len(), out_stride);
    let mut res: Vec<f64> = out.iter().map(|&v| v as f64).collect();
    for task in tasks.iter().filter(|t| active(t)) {
        let a: Vec<f32> = (0..task.a.len()).map(|i| task.a.get(i)).collect();
        for i in task.rows.clone() {
            let xi = &x[i * k..][..k];
            let dot =
                |a: &[f32]| -> f64 { a.iter().zip(xi).map(|(&a, &x)| a as f64 * x as f64).sum() };
            let t: Vec<f64> = (0..task.rank).map(|r| dot(&a[r * k..][..k])).collect();
            for j in 0..task.n {
                let acc: f64 = (0..task.rank)
                    .map(|r| t[r] * task.b_t.get(r * task.n + j) as f64)
                    .sum();
                res[i * out_stride + task.col0 + j] += task.scale as f64 * acc;
            }
        }
    }
    res
}

#[cfg(test)]
mod tests;
