//! The GEMM sweep: the planner's choice against the oracle (best measured of the top
//! candidates), the best single fixed strategy, and OpenBLAS, over real model shapes.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tessera_core::tensor::quantize_row;
use tessera_core::{DType, TensorBytes, WeightTensor};
use tessera_kernels::calibrate;
use tessera_kernels::cost::bytes_per_weight;
use tessera_kernels::gemm::{execute, GemmWeight};
use tessera_kernels::plan::{KernelFamily, ParallelPlan, ParallelSplit, Plan, Precision};
use tessera_kernels::planner::ShapeKey;
use tessera_runtime::ThreadPool;

use crate::openblas::{OpenBlas, INSTALL_HINT};
use crate::stats::{best_by_geomean, geomean, gflops, time_median, Repeat};

/// A set of weight shapes `(K, N)` with the M values swept over them.
#[derive(Debug, Clone, PartialEq)]
pub struct ShapeFamily {
    pub name: &'static str,
    pub shapes: Vec<(usize, usize)>,
    pub ms: Vec<usize>,
}

/// The known shape families: `smollm` (SmolLM2-135M) and `llama7b` (one Llama-7B layer).
pub fn shape_family(name: &str) -> Option<ShapeFamily> {
    match name {
        "smollm" => Some(ShapeFamily {
            name: "smollm",
            shapes: vec![
                (576, 576),
                (576, 192),
                (576, 1536),
                (1536, 576),
                (576, 49152),
            ],
            ms: vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 512],
        }),
        "llama7b" => Some(ShapeFamily {
            name: "llama7b",
            shapes: vec![(4096, 4096), (4096, 11008), (11008, 4096)],
            ms: vec![1, 4, 16, 64, 256, 512],
        }),
        _ => None,
    }
}

/// How a fixed strategy spreads work over the units (always all of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitKind {
    N,
    M,
    /// A 2 × (units / 2) grid; only for an even number of at least 4 units.
    Grid2,
}

/// One strategy applied unchanged to every shape: register tile, cache blocks, split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedStrategy {
    pub mr: usize,
    pub nr: usize,
    pub mc: usize,
    pub nc: usize,
    pub split: SplitKind,
}

impl FixedStrategy {
    const fn new(mr: usize, nr: usize, mc: usize, nc: usize, split: SplitKind) -> Self {
        FixedStrategy {
            mr,
            nr,
            mc,
            nc,
            split,
        }
    }

    pub fn name(&self) -> String {
        let split = match self.split {
            SplitKind::N => "N",
            SplitKind::M => "M",
            SplitKind::Grid2 => "G2",
        };
        format!(
            "{}x{} mc{} nc{} {split}",
            self.mr, self.nr, self.mc, self.nc
        )
    }

    pub fn valid_for_units(&self, units: usize) -> bool {
        match self.split {
            SplitKind::Grid2 => units >= 4 && units & 1 == 0,
            _ => true,
        }
    }

    pub fn parallel(&self, units: usize) -> ParallelPlan {
        let units = units.max(1);
        match self.split {
            SplitKind::N => ParallelPlan {
                split: ParallelSplit::N,
                units,
            },
            SplitKind::M => ParallelPlan {
                split: ParallelSplit::M,
                units,
            },
            SplitKind::Grid2 => ParallelPlan {
                split: ParallelSplit::Grid {
                    m_parts: 2,
                    n_parts: units / 2,
                },
                units,
            },
        }
    }

    /// The strategy as a plan for one shape, from a plan of that shape's family (which
    /// supplies everything the strategy does not fix: family, packing, K extent).
    pub fn apply(&self, template: &Plan, units: usize) -> Plan {
        let mut p = *template;
        p.tile.mr = self.mr;
        p.tile.nr = self.nr;
        p.tile.mc = self.mc;
        p.tile.nc = self.nc;
        p.parallel = self.parallel(units);
        p.predicted_us = 0.0;
        p
    }
}

/// The fixed strategies of a kernel family that run on `units` units. Every one is valid for
/// every shape (the executor clamps blocks and tiles to the shape's edges).
pub fn fixed_strategies(family: KernelFamily, units: usize) -> Vec<FixedStrategy> {
    use SplitKind::*;
    let all: &[FixedStrategy] = match family {
        KernelFamily::F32Dot => &[
            FixedStrategy::new(1, 4, 64, 16, N),
            FixedStrategy::new(2, 4, 64, 32, N),
            FixedStrategy::new(3, 4, 64, 32, N),
            FixedStrategy::new(3, 4, 256, 64, N),
            FixedStrategy::new(4, 3, 128, 32, N),
            FixedStrategy::new(1, 8, 16, 64, N),
            FixedStrategy::new(3, 4, 64, 32, M),
            FixedStrategy::new(2, 2, 32, 16, N),
            FixedStrategy::new(3, 4, 64, 32, Grid2),
        ],
        KernelFamily::Q8Interleaved => &[
            FixedStrategy::new(1, 8, 4, 64, N),
            FixedStrategy::new(2, 8, 16, 128, N),
            FixedStrategy::new(4, 8, 16, 64, N),
            FixedStrategy::new(4, 8, 64, 256, N),
            FixedStrategy::new(4, 8, 256, 512, N),
            FixedStrategy::new(3, 8, 32, 128, N),
            FixedStrategy::new(4, 8, 64, 64, M),
            FixedStrategy::new(2, 8, 8, 32, N),
            FixedStrategy::new(4, 8, 64, 128, Grid2),
        ],
    };
    all.iter()
        .copied()
        .filter(|s| family.tiles().contains(&(s.mr, s.nr)) && s.valid_for_units(units))
        .collect()
}

/// A plan in a few characters: `4x8 mc64 nc256 N2`.
pub fn plan_short(p: &Plan) -> String {
    let t = &p.tile;
    let par = match p.parallel.split {
        ParallelSplit::N => format!("N{}", p.parallel.units),
        ParallelSplit::M => format!("M{}", p.parallel.units),
        ParallelSplit::Grid { m_parts, n_parts } => format!("G{m_parts}x{n_parts}"),
    };
    format!("{}x{} mc{} nc{} {par}", t.mr, t.nr, t.mc, t.nc)
}

/// Whether two plans do the same work the same way (predictions aside).
fn same_plan(a: &Plan, b: &Plan) -> bool {
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
    pub gflops_planned: f64,
    pub oracle_plan: Plan,
    pub gflops_oracle: f64,
    /// GFLOP/s of each fixed strategy of the dtype's family, in [`fixed_strategies`] order.
    pub fixed_each: Vec<f64>,
    /// The best-by-geomean fixed strategy's GFLOP/s here (set once the dtype is done).
    pub gflops_fixed: f64,
    pub fixed_name: String,
    pub gflops_openblas: Option<f64>,
}

impl Row {
    pub fn frac_peak(&self, mach: &Machine) -> Option<f64> {
        (mach.peak_gflops > 0.0).then(|| self.gflops_planned / mach.peak_gflops)
    }
    /// Planned throughput as a fraction of the weight-streaming bound (M ≤ 4 only).
    pub fn frac_bw(&self, mach: &Machine) -> Option<f64> {
        (self.m <= 4 && mach.dram_gbs > 0.0).then(|| {
            self.gflops_planned
                / bandwidth_bound_gflops(self.m, self.k, self.n, self.dtype, mach.dram_gbs)
        })
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
            "gflops_oracle": self.gflops_oracle,
            "gflops_fixed": self.gflops_fixed,
            "gflops_openblas": self.gflops_openblas,
            "planned_over_oracle": self.gflops_planned / self.gflops_oracle,
            "planned_over_fixed": self.gflops_planned / self.gflops_fixed,
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
}

fn some_finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

pub fn summarize(rows: &[Row], mach: &Machine) -> Summary {
    let mut s = Summary::default();
    for r in rows {
        let ratio = r.gflops_planned / r.gflops_oracle;
        if s.min_planned_over_oracle
            .as_ref()
            .is_none_or(|(v, _)| ratio < *v)
        {
            let at = format!("m={} k={} n={} {}", r.m, r.k, r.n, dtype_name(r.dtype));
            s.min_planned_over_oracle = Some((ratio, at));
        }
    }
    let po: Vec<f64> = rows
        .iter()
        .map(|r| r.gflops_planned / r.gflops_oracle)
        .collect();
    s.geomean_planned_over_oracle = some_finite(geomean(&po));
    let pf: Vec<f64> = rows
        .iter()
        .map(|r| r.gflops_planned / r.gflops_fixed)
        .collect();
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
        .filter_map(|r| r.gflops_openblas.map(|o| r.gflops_planned / o))
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
        )
    }
}

/// What the sweep runs.
#[derive(Debug, Clone)]
pub struct GemmConfig {
    pub threads: usize,
    pub precision: Precision,
    pub dtypes: Vec<DType>,
    pub families: Vec<ShapeFamily>,
    /// Replaces every family's M list when given.
    pub ms: Option<Vec<usize>>,
    /// Top candidates (by predicted time) measured for the oracle.
    pub candidates: usize,
    pub repeat: Repeat,
    pub json: bool,
    pub plot: Option<PathBuf>,
    pub seed: u64,
}

/// A random `[n, k]` weight of `dtype` (uniform in [-1, 1) before quantization), with its
/// f32 values kept for an f32 weight (OpenBLAS reads them).
fn random_weight(
    dtype: DType,
    n: usize,
    k: usize,
    repack: bool,
    seed: u64,
) -> Result<(GemmWeight, Option<Vec<f32>>)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ ((n as u64) << 32) ^ (k as u64));
    let mut bytes = Vec::with_capacity(dtype.row_bytes(k).unwrap_or(0) * n);
    let mut values = (dtype == DType::F32).then(|| Vec::with_capacity(n * k));
    let mut row = vec![0f32; k];
    for _ in 0..n {
        for v in row.iter_mut() {
            *v = rng.gen_range(-1.0..1.0);
        }
        bytes.extend_from_slice(&quantize_row(dtype, &row));
        if let Some(vs) = values.as_mut() {
            vs.extend_from_slice(&row);
        }
    }
    let t = WeightTensor::new(
        format!("bench.{n}x{k}"),
        dtype,
        vec![n, k],
        TensorBytes::owned(&bytes),
    )?;
    drop(bytes);
    Ok((GemmWeight::new(t, repack), values))
}

/// Measures the machine figures the report is relative to.
pub fn measure_machine(pool: &ThreadPool) -> Machine {
    Machine {
        peak_gflops: calibrate::peak_fma_gflops(pool),
        dram_gbs: calibrate::dram_read_gbs(pool),
        dispatch_us: calibrate::dispatch_us(pool),
    }
}

fn fmt_opt(x: Option<f64>, digits: usize) -> String {
    x.map_or("n/a".to_string(), |v| format!("{v:.digits$}"))
}

fn header() -> String {
    format!(
        "{:>4} {:>6} {:>6} {:<5} {:<20} {:>8} {:>8} {:>8} {:>8} {:>5} {:>5} {:>5} {:>5}",
        "M",
        "K",
        "N",
        "dtype",
        "plan",
        "planned",
        "oracle",
        "fixed",
        "openblas",
        "p/o",
        "p/f",
        "peak",
        "bw"
    )
}

fn row_line(r: &Row, mach: &Machine) -> String {
    format!(
        "{:>4} {:>6} {:>6} {:<5} {:<20} {:>8.1} {:>8.1} {:>8.1} {:>8} {:>5.2} {:>5.2} {:>5} {:>5}",
        r.m,
        r.k,
        r.n,
        dtype_name(r.dtype),
        plan_short(&r.plan),
        r.gflops_planned,
        r.gflops_oracle,
        r.gflops_fixed,
        fmt_opt(r.gflops_openblas, 1),
        r.gflops_planned / r.gflops_oracle,
        r.gflops_planned / r.gflops_fixed,
        fmt_opt(r.frac_peak(mach), 2),
        fmt_opt(r.frac_bw(mach), 2),
    )
}

/// Runs the sweep and prints the report (text or JSON lines on stdout).
pub fn run_gemm(cfg: &GemmConfig) -> Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    // Human-readable context goes to stdout in text mode, stderr in JSON mode.
    let info = |s: &str| {
        if cfg.json {
            eprintln!("{s}");
        } else {
            println!("{s}");
        }
    };
    let pool = ThreadPool::new(cfg.threads);
    let units = pool.units();
    let planner = tessera_engine::tuning::load_planner();
    let blas = OpenBlas::load(units);
    info(&format!(
        "tessera bench gemm: {} units, precision {}, isa {}, cpu {}",
        units,
        cfg.precision,
        tessera_engine::isa_name(),
        planner.profile.cpu
    ));
    match &blas {
        Some(b) => info(&format!(
            "OpenBLAS: {}{}",
            b.name,
            if b.threads_set {
                format!(" ({units} threads)")
            } else {
                " (thread count not settable)".into()
            }
        )),
        None => info(&format!(
            "OpenBLAS: n/a (not found; install with: {INSTALL_HINT})"
        )),
    }
    if let Some(w) = crate::stats::load_warning() {
        eprintln!("{w}");
    }
    let mach = measure_machine(&pool);
    info(&format!(
        "peak FMA {:.1} GFLOP/s, DRAM read {:.1} GB/s, dispatch {:.2} us/op",
        mach.peak_gflops, mach.dram_gbs, mach.dispatch_us
    ));

    let ms_of = |f: &ShapeFamily| cfg.ms.clone().unwrap_or_else(|| f.ms.clone());
    let total: usize = cfg.dtypes.len()
        * cfg
            .families
            .iter()
            .map(|f| f.shapes.len() * ms_of(f).len())
            .sum::<usize>();
    let pb = ProgressBar::new(total as u64);
    pb.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );

    let mut all_rows: Vec<Row> = Vec::new();
    let mut best_fixed: Vec<(DType, String)> = Vec::new();
    if !cfg.json {
        pb.suspend(|| println!("{}", header()));
    }
    for &dtype in &cfg.dtypes {
        // Weights as the model loads them: repacked for the fast path, and for the exact
        // path where its AVX-512 stream kernel reads the repack.
        let repack = tessera_kernels::wants_repack(cfg.precision) && dtype.is_quantized();
        let key_precision = if cfg.precision == Precision::Fast && dtype.is_quantized() {
            Precision::Fast
        } else {
            Precision::Exact
        };
        let family = KernelFamily::for_weight(dtype, key_precision);
        let strategies = fixed_strategies(family, units);
        let mut rows: Vec<Row> = Vec::new();
        for fam in &cfg.families {
            let ms = ms_of(fam);
            let m_max = ms.iter().copied().max().unwrap_or(1);
            for &(k, n) in &fam.shapes {
                pb.set_message(format!("{}: weights {k}x{n}", dtype_name(dtype)));
                let (w, wf32) = random_weight(dtype, n, k, repack, cfg.seed)?;
                let mut rng = rand::rngs::StdRng::seed_from_u64(cfg.seed.wrapping_add(1));
                let x: Vec<f32> = (0..m_max * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
                let mut c = vec![0f32; m_max * n];
                for &m in &ms {
                    pb.set_message(format!("{} m={m} k={k} n={n}", dtype_name(dtype)));
                    let key = ShapeKey::new(m, k, n, dtype, key_precision, units);
                    let xs = &x[..m * k];
                    let cs = &mut c[..m * n];
                    let mut measured: Vec<(Plan, f64)> = Vec::new();
                    let mut measure = |p: &Plan, cs: &mut [f32]| -> f64 {
                        if let Some(&(_, s)) = measured.iter().find(|(q, _)| same_plan(q, p)) {
                            return s;
                        }
                        let s = time_median(&cfg.repeat, || {
                            execute(&pool, p, xs, m, &w, None, cs);
                        });
                        measured.push((*p, s));
                        s
                    };
                    let planned = planner.plan(&key);
                    let t_planned = measure(&planned, cs);
                    let mut oracle = (planned, t_planned);
                    for cand in planner.candidates(&key).into_iter().take(cfg.candidates) {
                        let t = measure(&cand, cs);
                        if t < oracle.1 {
                            oracle = (cand, t);
                        }
                    }
                    let fixed_each: Vec<f64> = strategies
                        .iter()
                        .map(|s| gflops(m, k, n, measure(&s.apply(&planned, units), cs)))
                        .collect();
                    let gflops_openblas = match (&blas, &wf32) {
                        (Some(b), Some(wv)) => {
                            let t = time_median(&cfg.repeat, || b.sgemm_abt(xs, wv, cs, m, k, n));
                            // Let OpenBLAS's threads stop spinning before our pool runs again.
                            std::thread::sleep(std::time::Duration::from_millis(100));
                            Some(gflops(m, k, n, t))
                        }
                        _ => None,
                    };
                    rows.push(Row {
                        m,
                        k,
                        n,
                        dtype,
                        plan: planned,
                        gflops_planned: gflops(m, k, n, t_planned),
                        oracle_plan: oracle.0,
                        gflops_oracle: gflops(m, k, n, oracle.1),
                        fixed_each,
                        gflops_fixed: f64::NAN,
                        fixed_name: String::new(),
                        gflops_openblas,
                    });
                    pb.inc(1);
                }
            }
        }
        let best = assign_best_fixed(&mut rows, &strategies);
        let best_name = best.map_or("n/a".to_string(), |b| strategies[b].name());
        pb.suspend(|| -> Result<()> {
            if cfg.json {
                for r in &rows {
                    writeln!(out, "{}", r.to_json(&mach))?;
                }
            } else {
                for r in &rows {
                    writeln!(out, "{}", row_line(r, &mach))?;
                }
                writeln!(
                    out,
                    "  {}: best fixed strategy {best_name} (fixed set: {})",
                    dtype_name(dtype),
                    strategies
                        .iter()
                        .map(|s| s.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                )?;
            }
            out.flush()?;
            Ok(())
        })?;
        best_fixed.push((dtype, best_name));
        all_rows.extend(rows);
    }
    pb.finish_and_clear();

    let summary = summarize(&all_rows, &mach);
    if cfg.json {
        let mut v = summary.to_json(&mach, units, cfg.precision);
        v["best_fixed"] = best_fixed
            .iter()
            .map(|(d, s)| (dtype_name(*d), Value::from(s.clone())))
            .collect::<serde_json::Map<_, _>>()
            .into();
        writeln!(out, "{v}")?;
    } else {
        summary.print(&mut out)?;
    }
    if let Some(path) = &cfg.plot {
        crate::plot::plot_gemm(path, &all_rows, &cfg.dtypes)?;
        info(&format!("plot written to {}", path.display()));
    }
    Ok(())
}

/// Parses a comma-separated list of dtypes (`f32,q4_1,q8_0`).
pub fn parse_dtypes(list: &[String]) -> Result<Vec<DType>> {
    list.iter()
        .map(|s| DType::parse(s.trim()).ok_or_else(|| anyhow::anyhow!("unknown dtype {s:?}")))
        .collect()
}

/// Parses shape family names.
pub fn parse_families(list: &[String]) -> Result<Vec<ShapeFamily>> {
    list.iter()
        .map(|s| {
            shape_family(s.trim())
                .ok_or_else(|| anyhow::anyhow!("unknown shape set {s:?} (known: smollm, llama7b)"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_kernels::planner::Planner;

    #[test]
    fn families_have_the_documented_shapes() {
        let s = shape_family("smollm").unwrap();
        assert_eq!(s.shapes.len(), 5);
        assert_eq!(s.ms, vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 512]);
        let l = shape_family("llama7b").unwrap();
        assert_eq!(l.shapes, vec![(4096, 4096), (4096, 11008), (11008, 4096)]);
        assert!(shape_family("gpt").is_none());
    }

    #[test]
    fn fixed_strategies_use_family_tiles_and_all_units() {
        for family in [KernelFamily::F32Dot, KernelFamily::Q8Interleaved] {
            for units in [1, 2, 3, 4, 8] {
                let s = fixed_strategies(family, units);
                assert!(
                    s.len() >= 6 && s.len() <= 9,
                    "{family:?} {units}: {}",
                    s.len()
                );
                for f in &s {
                    assert!(family.tiles().contains(&(f.mr, f.nr)));
                    let (mp, np) = f.parallel(units).parts();
                    assert_eq!(mp * np, units);
                }
                assert_eq!(
                    s.iter().any(|f| f.split == SplitKind::Grid2),
                    units >= 4 && units & 1 == 0
                );
            }
        }
    }

    #[test]
    fn fixed_strategies_are_valid_plans_for_every_shape() {
        // Every fixed strategy computes the same product as the planner's choice.
        let pool = ThreadPool::new(2);
        let planner = Planner::untuned();
        for (dtype, precision) in [
            (DType::F32, Precision::Exact),
            (DType::Q4_1, Precision::Fast),
        ] {
            for (m, k, n) in [(1, 64, 24), (5, 96, 17)] {
                let (w, _) = random_weight(dtype, n, k, precision == Precision::Fast, 7).unwrap();
                let x: Vec<f32> = (0..m * k).map(|i| (i % 11) as f32 * 0.1 - 0.5).collect();
                let key = ShapeKey::new(m, k, n, dtype, precision, 2);
                let planned = planner.plan(&key);
                let mut want = vec![0f32; m * n];
                execute(&pool, &planned, &x, m, &w, None, &mut want);
                for s in fixed_strategies(planned.tile.family, 2) {
                    let mut got = vec![f32::NAN; m * n];
                    execute(&pool, &s.apply(&planned, 2), &x, m, &w, None, &mut got);
                    assert_eq!(got, want, "{} on {m}x{k}x{n} {dtype}", s.name());
                }
            }
        }
    }

    fn row(m: usize, dtype: DType, planned: f64, oracle: f64, fixed: Vec<f64>) -> Row {
        let plan = Planner::untuned().plan(&ShapeKey::new(m, 64, 64, dtype, Precision::Exact, 1));
        Row {
            m,
            k: 64,
            n: 64,
            dtype,
            plan,
            gflops_planned: planned,
            oracle_plan: plan,
            gflops_oracle: oracle,
            fixed_each: fixed,
            gflops_fixed: f64::NAN,
            fixed_name: String::new(),
            gflops_openblas: None,
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

    #[test]
    fn bandwidth_bound_matches_hand_computation() {
        // 4096·4096 f32 weights = 64 MiB; at 32 GB/s that is 2.097 ms; 2·4096² FLOP / t.
        let g = bandwidth_bound_gflops(1, 4096, 4096, DType::F32, 32.0);
        let want = 2.0 * 4096.0 * 4096.0 / (4096.0 * 4096.0 * 4.0 / 32e9) / 1e9;
        assert!((g - want).abs() < 1e-9);
    }

    #[test]
    fn parsing_lists() {
        let d = parse_dtypes(&["f32".into(), "q4_1".into(), "Q8_0".into()]).unwrap();
        assert_eq!(d, vec![DType::F32, DType::Q4_1, DType::Q8_0]);
        assert!(parse_dtypes(&["q9".into()]).is_err());
        assert_eq!(
            parse_families(&["llama7b".into()]).unwrap()[0].name,
            "llama7b"
        );
        assert!(parse_families(&["x".into()]).is_err());
    }
}
