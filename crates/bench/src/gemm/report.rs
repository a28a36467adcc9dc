//! The GEMM sweep's rows and summary: what each shape measured, the figures over all of
//! them, and the text and JSON forms they are printed in.

use std::io::Write;

use serde_json::{json, Value};
use tessera_core::DType;
use tessera_kernels::cost::bytes_per_weight;
use tessera_kernels::plan::{F32Kernel, KernelFamily, ParallelSplit, Plan, Precision};

use super::cold::{Cold, COLD_MAX_M, COLD_ORACLE_MAX_M};
use super::strategies::FixedStrategy;
use crate::stats::{best_by_geomean, geomean, gflops};

/// A plan in a few characters: `4x8 mc64 nc256 N2`, with the exact family's kernel in front
/// (`s` stream, `p` packed with its K block, `panel`): `p8x4 mc8 nc64 k256 N2`.
pub fn plan_short(p: &Plan) -> String {
    let t = &p.tile;
    let par = match p.parallel.split {
        ParallelSplit::N => format!("N{}", p.parallel.units),
        ParallelSplit::M => format!("M{}", p.parallel.units),
        ParallelSplit::Grid { m_parts, n_parts } => format!("G{m_parts}x{n_parts}"),
    };
    let (kernel, kc) = match (t.family, t.kernel) {
        (KernelFamily::F32Dot, F32Kernel::Stream) => ("s", String::new()),
        (KernelFamily::F32Dot, F32Kernel::Packed) => ("p", format!(" k{}", t.kc)),
        (KernelFamily::F32Dot, F32Kernel::Panel) => ("panel ", String::new()),
        (KernelFamily::Q8Interleaved, _) => ("", String::new()),
        (KernelFamily::QkDot, _) => ("qk ", String::new()),
    };
    format!("{kernel}{}x{} mc{} nc{}{kc} {par}", t.mr, t.nr, t.mc, t.nc)
}

/// Whether two plans do the same work the same way (predictions aside).
pub(crate) fn same_plan(a: &Plan, b: &Plan) -> bool {
    a.tile == b.tile && a.parallel == b.parallel
}

/// GFLOP/s an `m × k × n` product reaches if it takes as long as reading its weights once
/// from DRAM at `dram_gbs`.
pub fn bandwidth_bound_gflops(m: usize, k: usize, n: usize, dtype: DType, dram_gbs: f64) -> f64 {
    let bytes = (n * k) as f64 * bytes_per_weight(dtype);
    gflops(m, k, n, bytes / (dram_gbs * 1e9))
}

/// Lower-case name of a dtype, as the command line spells it.
pub fn dtype_name(d: DType) -> String {
    d.to_string().to_ascii_lowercase()
}

/// Machine figures measured before the sweep.
#[derive(Debug, Clone, Copy)]
pub struct Machine {
    pub peak_gflops: f64,
    pub dram_gbs: f64,
    pub dispatch_us: f64,
}

/// One measured shape.
#[derive(Debug, Clone)]
pub struct Row {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub dtype: DType,
    pub plan: Plan,
    /// The planned plan, from the same timing as [`Self::gflops_oracle`] (when the oracle is
    /// another plan, both are timed afresh together).
    pub gflops_planned: f64,
    /// The planned plan in the rounds that also timed the fixed strategies and OpenBLAS:
    /// what the ratios against them use, so that each ratio compares runs of one spell.
    pub gflops_planned_rounds: f64,
    pub oracle_plan: Plan,
    pub gflops_oracle: f64,
    /// GFLOP/s of each fixed strategy of the dtype's family, in [`fixed_strategies`] order.
    pub fixed_each: Vec<f64>,
    /// The best-by-geomean fixed strategy's GFLOP/s here (set once the dtype is done).
    pub gflops_fixed: f64,
    pub fixed_name: String,
    pub gflops_openblas: Option<f64>,
    /// The planned plan with its weight read from DRAM (copies that together exceed the
    /// last-level cache, run in turn), and a plain read of the same bytes beside it;
    /// measured for M ≤ 4 unless `--no-cold`.
    pub cold: Option<Cold>,
    /// The planned plan over the oracle with the weights from DRAM, both timed over the cold
    /// copies (1 where they are the same plan); for M ≤ [`COLD_ORACLE_MAX_M`] unless
    /// `--no-cold`.
    pub cold_over_oracle: Option<f64>,
}

impl Row {
    /// Planned over the best fixed strategy, timed in the same rounds.
    pub fn planned_over_fixed(&self) -> f64 {
        self.gflops_planned_rounds / self.gflops_fixed
    }
    /// Planned over OpenBLAS, timed in the same rounds.
    pub fn planned_over_openblas(&self) -> Option<f64> {
        self.gflops_openblas.map(|o| self.gflops_planned_rounds / o)
    }
    pub fn planned_over_oracle(&self) -> f64 {
        self.gflops_planned / self.gflops_oracle
    }
    /// Planned over oracle as a model's step sees it: with the weights from DRAM where that
    /// was measured (M ≤ [`COLD_ORACLE_MAX_M`]), else on the sweep's warm caches.
    pub fn planned_over_oracle_in_a_step(&self) -> f64 {
        self.cold_over_oracle
            .unwrap_or_else(|| self.planned_over_oracle())
    }
    pub fn frac_peak(&self, mach: &Machine) -> Option<f64> {
        (mach.peak_gflops > 0.0).then(|| self.gflops_planned / mach.peak_gflops)
    }
    /// Planned throughput as a fraction of the weight-streaming bound (M ≤ 4 only): the cold
    /// measurement against the read of the same bytes measured beside it where there is one;
    /// else the warm one against the sweep's DRAM figure (above 1 when the weight came from
    /// cache).
    pub fn frac_bw(&self, mach: &Machine) -> Option<f64> {
        if self.m > COLD_MAX_M {
            return None;
        }
        match self.cold {
            Some(c) => Some(c.frac_bound()),
            None => (mach.dram_gbs > 0.0).then(|| {
                self.gflops_planned
                    / bandwidth_bound_gflops(self.m, self.k, self.n, self.dtype, mach.dram_gbs)
            }),
        }
    }

    pub fn to_json(&self, mach: &Machine) -> Value {
        json!({
            "m": self.m,
            "k": self.k,
            "n": self.n,
            "dtype": dtype_name(self.dtype),
            "plan": plan_short(&self.plan),
            "oracle_plan": plan_short(&self.oracle_plan),
            "fixed_strategy": self.fixed_name,
            "gflops_planned": self.gflops_planned,
            "gflops_planned_rounds": self.gflops_planned_rounds,
            "gflops_oracle": self.gflops_oracle,
            "gflops_fixed": self.gflops_fixed,
            "gflops_openblas": self.gflops_openblas,
            "gflops_cold": self.cold.map(|c| c.gflops),
            "read_gbs_cold": self.cold.map(|c| c.read_gbs),
            "gflops_bound_cold": self.cold.map(|c| c.bound_gflops),
            "planned_over_oracle": self.planned_over_oracle(),
            "planned_over_oracle_cold": self.cold_over_oracle,
            "planned_over_fixed": self.planned_over_fixed(),
            "frac_peak": self.frac_peak(mach),
            "frac_bw_bound": self.frac_bw(mach),
        })
    }
}

/// Sets each row's fixed figure to the strategy with the best geometric mean over `rows`
/// (all of one dtype); returns that strategy's index, if any strategy ran on every row.
pub fn assign_best_fixed(rows: &mut [Row], strategies: &[FixedStrategy]) -> Option<usize> {
    let scores: Vec<Vec<f64>> = (0..strategies.len())
        .map(|s| {
            rows.iter()
                .map(|r| r.fixed_each.get(s).copied().unwrap_or(f64::NAN))
                .collect()
        })
        .collect();
    let best = best_by_geomean(&scores)?;
    for r in rows.iter_mut() {
        r.gflops_fixed = r.fixed_each[best];
        r.fixed_name = strategies[best].name();
    }
    Some(best)
}

/// The end-of-sweep figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// Smallest planned / oracle ratio, and the row (m, k, n, dtype) where it occurs.
    pub min_planned_over_oracle: Option<(f64, String)>,
    pub geomean_planned_over_oracle: Option<f64>,
    pub geomean_planned_over_fixed: Option<f64>,
    /// f32 rows with M ≥ 256: mean fraction of peak, geomean planned / OpenBLAS.
    pub large_m_f32_frac_peak: Option<f64>,
    pub large_m_f32_over_openblas: Option<f64>,
    /// Quantized rows with M = 1: geomean fraction of the bandwidth bound.
    pub m1_quant_frac_bw: Option<f64>,
    /// Rows with M = 1 on weights of at least [`LARGE_WEIGHT`] elements (the 7B shapes), any
    /// dtype: the smallest fraction of the bandwidth bound, and where.
    pub m1_large_min_frac_bw: Option<(f64, String)>,
    /// Rows, and rows whose planned plan is within 0.90 and 0.95 of the oracle.
    pub rows: usize,
    pub within_090: usize,
    pub within_095: usize,
    /// The same counts with the rows at M ≤ [`COLD_ORACLE_MAX_M`] judged on cold weights
    /// where that was measured ([`Row::planned_over_oracle_in_a_step`]), and how many were.
    pub within_090_in_a_step: usize,
    pub within_095_in_a_step: usize,
    pub judged_cold: usize,
}

/// Elements from which a weight counts as large (a 4096 × 4096 projection and up).
pub const LARGE_WEIGHT: usize = 4096 * 4096;

fn at(r: &Row) -> String {
    format!("m={} k={} n={} {}", r.m, r.k, r.n, dtype_name(r.dtype))
}

fn some_finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

pub fn summarize(rows: &[Row], mach: &Machine) -> Summary {
    let mut s = Summary::default();
    for r in rows {
        let ratio = r.planned_over_oracle();
        if s.min_planned_over_oracle
            .as_ref()
            .is_none_or(|(v, _)| ratio < *v)
        {
            s.min_planned_over_oracle = Some((ratio, at(r)));
        }
    }
    let po: Vec<f64> = rows.iter().map(Row::planned_over_oracle).collect();
    let step: Vec<f64> = rows
        .iter()
        .map(Row::planned_over_oracle_in_a_step)
        .collect();
    let within = |v: &[f64], t: f64| v.iter().filter(|&&x| x >= t).count();
    s.rows = rows.len();
    (s.within_090, s.within_095) = (within(&po, 0.90), within(&po, 0.95));
    (s.within_090_in_a_step, s.within_095_in_a_step) = (within(&step, 0.90), within(&step, 0.95));
    s.judged_cold = rows.iter().filter(|r| r.cold_over_oracle.is_some()).count();
    s.geomean_planned_over_oracle = some_finite(geomean(&po));
    let pf: Vec<f64> = rows.iter().map(|r| r.planned_over_fixed()).collect();
    s.geomean_planned_over_fixed = some_finite(geomean(&pf));
    let large: Vec<&Row> = rows
        .iter()
        .filter(|r| r.dtype == DType::F32 && r.m >= 256)
        .collect();
    let fp: Vec<f64> = large.iter().filter_map(|r| r.frac_peak(mach)).collect();
    if !fp.is_empty() {
        s.large_m_f32_frac_peak = Some(fp.iter().sum::<f64>() / fp.len() as f64);
    }
    let vs: Vec<f64> = large
        .iter()
        .filter_map(|r| r.planned_over_openblas())
        .collect();
    if !vs.is_empty() {
        s.large_m_f32_over_openblas = some_finite(geomean(&vs));
    }
    let bw: Vec<f64> = rows
        .iter()
        .filter(|r| r.dtype.is_quantized() && r.m == 1)
        .filter_map(|r| r.frac_bw(mach))
        .collect();
    if !bw.is_empty() {
        s.m1_quant_frac_bw = some_finite(geomean(&bw));
    }
    for r in rows
        .iter()
        .filter(|r| r.m == 1 && r.k * r.n >= LARGE_WEIGHT)
    {
        if let Some(f) = r.frac_bw(mach) {
            if s.m1_large_min_frac_bw.as_ref().is_none_or(|(v, _)| f < *v) {
                s.m1_large_min_frac_bw = Some((f, at(r)));
            }
        }
    }
    s
}

impl Summary {
    pub fn to_json(&self, mach: &Machine, threads: usize, precision: Precision) -> Value {
        json!({
            "summary": true,
            "threads": threads,
            "precision": precision.to_string(),
            "peak_gflops": mach.peak_gflops,
            "dram_gbs": mach.dram_gbs,
            "dispatch_us": mach.dispatch_us,
            "min_planned_over_oracle": self.min_planned_over_oracle.as_ref().map(|x| x.0),
            "min_planned_over_oracle_at": self.min_planned_over_oracle.as_ref().map(|x| x.1.clone()),
            "geomean_planned_over_oracle": self.geomean_planned_over_oracle,
            "geomean_planned_over_fixed": self.geomean_planned_over_fixed,
            "large_m_f32_frac_peak": self.large_m_f32_frac_peak,
            "large_m_f32_planned_over_openblas": self.large_m_f32_over_openblas,
            "m1_quant_frac_bw_bound": self.m1_quant_frac_bw,
            "m1_large_min_frac_bw_bound": self.m1_large_min_frac_bw.as_ref().map(|x| x.0),
            "m1_large_min_frac_bw_bound_at": self.m1_large_min_frac_bw.as_ref().map(|x| x.1.clone()),
            "rows": self.rows,
            "within_090_of_oracle": self.within_090,
            "within_095_of_oracle": self.within_095,
            "within_090_of_oracle_in_a_step": self.within_090_in_a_step,
            "within_095_of_oracle_in_a_step": self.within_095_in_a_step,
            "rows_judged_cold": self.judged_cold,
        })
    }

    pub fn print(&self, out: &mut dyn Write) -> std::io::Result<()> {
        let f = |x: Option<f64>| x.map_or("n/a".to_string(), |v| format!("{v:.3}"));
        writeln!(out, "summary:")?;
        match &self.min_planned_over_oracle {
            Some((v, at)) => writeln!(out, "  min planned/oracle          {v:.3}  ({at})")?,
            None => writeln!(out, "  min planned/oracle          n/a")?,
        }
        writeln!(
            out,
            "  geomean planned/oracle      {}",
            f(self.geomean_planned_over_oracle)
        )?;
        writeln!(
            out,
            "  within 0.90 / 0.95 of oracle {} / {} of {} rows",
            self.within_090, self.within_095, self.rows
        )?;
        writeln!(
            out,
            "  the same, weights from DRAM at M<={COLD_ORACLE_MAX_M} ({} rows judged so) {} / {}",
            self.judged_cold, self.within_090_in_a_step, self.within_095_in_a_step
        )?;
        writeln!(
            out,
            "  geomean planned/fixed       {}",
            f(self.geomean_planned_over_fixed)
        )?;
        writeln!(
            out,
            "  f32 M>=256 fraction of peak {}",
            f(self.large_m_f32_frac_peak)
        )?;
        writeln!(
            out,
            "  f32 M>=256 planned/OpenBLAS {}",
            f(self.large_m_f32_over_openblas)
        )?;
        writeln!(
            out,
            "  quantized M=1 fraction of bandwidth bound {}",
            f(self.m1_quant_frac_bw)
        )?;
        match &self.m1_large_min_frac_bw {
            Some((v, at)) => writeln!(
                out,
                "  M=1, weights >= 4096x4096: min fraction of bandwidth bound {v:.3}  ({at})"
            ),
            None => writeln!(
                out,
                "  M=1, weights >= 4096x4096: min fraction of bandwidth bound n/a"
            ),
        }
    }
}

fn fmt_opt(x: Option<f64>, digits: usize) -> String {
    x.map_or("n/a".to_string(), |v| format!("{v:.digits$}"))
}

pub(crate) fn header() -> String {
    format!(
        "{:>4} {:>6} {:>6} {:<5} {:<26} {:<26} {:>8} {:>8} {:>8} {:>8} {:>6} {:>5} {:>5} {:>5} {:>5} {:>5} {:>5}",
        "M",
        "K",
        "N",
        "dtype",
        "plan",
        "oracle plan",
        "planned",
        "oracle",
        "fixed",
        "openblas",
        "cold",
        "read",
        "p/o",
        "p/f",
        "p/o-c",
        "peak",
        "bw"
    )
}

pub(crate) fn row_line(r: &Row, mach: &Machine) -> String {
    format!(
        "{:>4} {:>6} {:>6} {:<5} {:<26} {:<26} {:>8.1} {:>8.1} {:>8.1} {:>8} {:>6} {:>5} {:>5.2} {:>5.2} {:>5} {:>5} {:>5}",
        r.m,
        r.k,
        r.n,
        dtype_name(r.dtype),
        plan_short(&r.plan),
        if same_plan(&r.plan, &r.oracle_plan) {
            "=".to_string()
        } else {
            plan_short(&r.oracle_plan)
        },
        r.gflops_planned,
        r.gflops_oracle,
        r.gflops_fixed,
        fmt_opt(r.gflops_openblas, 1),
        fmt_opt(r.cold.map(|c| c.gflops), 1),
        fmt_opt(r.cold.map(|c| c.read_gbs), 1),
        r.planned_over_oracle(),
        r.planned_over_fixed(),
        fmt_opt(r.cold_over_oracle, 2),
        fmt_opt(r.frac_peak(mach), 2),
        fmt_opt(r.frac_bw(mach), 2),
    )
}

#[cfg(test)]
mod tests {
    use super::super::strategies::fixed_strategies;
    use super::*;
    use tessera_kernels::planner::{Planner, ShapeKey};

    fn row(m: usize, dtype: DType, planned: f64, oracle: f64, fixed: Vec<f64>) -> Row {
        let plan = Planner::untuned().plan(&ShapeKey::new(m, 64, 64, dtype, Precision::Exact, 1));
        Row {
            m,
            k: 64,
            n: 64,
            dtype,
            plan,
            gflops_planned: planned,
            gflops_planned_rounds: planned,
            oracle_plan: plan,
            gflops_oracle: oracle,
            fixed_each: fixed,
            gflops_fixed: f64::NAN,
            fixed_name: String::new(),
            gflops_openblas: None,
            cold: None,
            cold_over_oracle: None,
        }
    }

    #[test]
    fn best_fixed_is_assigned_to_every_row() {
        let strategies = fixed_strategies(KernelFamily::F32Dot, 1);
        let mut rows = vec![
            row(1, DType::F32, 10.0, 10.0, vec![1.0, 8.0, 100.0]),
            row(2, DType::F32, 10.0, 12.0, vec![1.0, 8.0, 0.5]),
        ];
        // Geomeans: 1, 8, sqrt(50) ≈ 7.07 → strategy 1.
        assert_eq!(assign_best_fixed(&mut rows, &strategies), Some(1));
        assert_eq!(rows[0].gflops_fixed, 8.0);
        assert_eq!(rows[1].fixed_name, strategies[1].name());
    }

    #[test]
    fn summary_figures() {
        let mach = Machine {
            peak_gflops: 100.0,
            dram_gbs: 10.0,
            dispatch_us: 1.0,
        };
        let mut rows = vec![
            row(1, DType::Q4_1, 10.0, 20.0, vec![5.0]),
            row(256, DType::F32, 50.0, 50.0, vec![25.0]),
        ];
        rows[1].gflops_openblas = Some(100.0);
        assign_best_fixed(&mut rows, &fixed_strategies(KernelFamily::F32Dot, 1)[..1]);
        let s = summarize(&rows, &mach);
        let (min, at) = s.min_planned_over_oracle.clone().unwrap();
        assert_eq!(min, 0.5);
        assert!(at.starts_with("m=1 "));
        assert!((s.geomean_planned_over_fixed.unwrap() - 2.0).abs() < 1e-12);
        // Ratios against the fixed strategies and OpenBLAS use the planned plan's run in
        // their rounds, not its re-timing beside the oracle.
        let mut r = rows[1].clone();
        r.gflops_planned = 40.0;
        assert_eq!(r.planned_over_fixed(), 2.0);
        assert_eq!(r.planned_over_openblas(), Some(0.5));
        assert_eq!(s.large_m_f32_frac_peak, Some(0.5));
        assert_eq!(s.large_m_f32_over_openblas, Some(0.5));
        // Q4_1: 0.625 bytes per weight → 64·64·0.625 B at 10 GB/s.
        let bound = bandwidth_bound_gflops(1, 64, 64, DType::Q4_1, 10.0);
        assert!((s.m1_quant_frac_bw.unwrap() - 10.0 / bound).abs() < 1e-9);
        let j = rows[0].to_json(&mach);
        for key in [
            "m",
            "k",
            "n",
            "dtype",
            "plan",
            "gflops_planned",
            "gflops_oracle",
            "gflops_fixed",
            "gflops_openblas",
        ] {
            assert!(j.get(key).is_some(), "{key}");
        }
        assert!(j["gflops_openblas"].is_null());
        assert_eq!(j["dtype"], "q4_1");
    }

    /// Rows are counted against the oracle on the sweep's warm caches, and again with the
    /// small-M rows judged on cold weights where that was measured.
    #[test]
    fn rows_are_counted_warm_and_as_a_step_sees_them() {
        let mach = Machine {
            peak_gflops: 100.0,
            dram_gbs: 10.0,
            dispatch_us: 1.0,
        };
        // Below the oracle warm, ahead of it cold.
        let mut warm_miss = row(4, DType::F32, 8.0, 10.0, vec![1.0]);
        warm_miss.cold_over_oracle = Some(1.05);
        // Level warm, behind cold.
        let mut cold_miss = row(8, DType::Q8_0, 10.0, 10.0, vec![1.0]);
        cold_miss.cold_over_oracle = Some(0.92);
        let large = row(64, DType::F32, 9.2, 10.0, vec![1.0]);
        let rows = [warm_miss, cold_miss, large];
        let s = summarize(&rows, &mach);
        assert_eq!((s.rows, s.within_090, s.within_095), (3, 2, 1));
        assert_eq!(
            (
                s.within_090_in_a_step,
                s.within_095_in_a_step,
                s.judged_cold
            ),
            (3, 1, 2)
        );
        assert!(row_line(&rows[0], &mach).contains(" 1.05 "));
        assert_eq!(rows[1].to_json(&mach)["planned_over_oracle_cold"], 0.92);
        assert!(rows[2].to_json(&mach)["planned_over_oracle_cold"].is_null());
        let j = s.to_json(&mach, 2, Precision::Exact);
        assert_eq!(j["within_090_of_oracle_in_a_step"], 3);
        assert_eq!(j["rows_judged_cold"], 2);
    }

    #[test]
    fn a_cold_row_is_held_to_the_read_beside_it() {
        let mach = Machine {
            peak_gflops: 100.0,
            dram_gbs: 10.0,
            dispatch_us: 1.0,
        };
        let mut r = row(1, DType::Q8_0, 30.0, 30.0, vec![30.0]);
        let warm = r.frac_bw(&mach).unwrap();
        let bound = bandwidth_bound_gflops(1, 64, 64, DType::Q8_0, 10.0);
        assert!((warm - 30.0 / bound).abs() < 1e-12);
        r.cold = Some(Cold {
            gflops: 12.0,
            read_gbs: 14.0,
            bound_gflops: 16.0,
        });
        assert_eq!(r.frac_bw(&mach), Some(0.75));
        assert!(row_line(&r, &mach).contains(" 14.0 "));
        assert_eq!(r.to_json(&mach)["read_gbs_cold"], 14.0);
        assert_eq!(
            row(8, DType::Q8_0, 1.0, 1.0, vec![1.0]).frac_bw(&mach),
            None
        );
    }

    #[test]
    fn bandwidth_bound_matches_hand_computation() {
        // 4096·4096 f32 weights = 64 MiB; at 32 GB/s that is 2.097 ms; 2·4096² FLOP / t.
        let g = bandwidth_bound_gflops(1, 4096, 4096, DType::F32, 32.0);
        let want = 2.0 * 4096.0 * 4096.0 / (4096.0 * 4096.0 * 4.0 / 32e9) / 1e9;
        assert!((g - want).abs() < 1e-9);
    }
}
