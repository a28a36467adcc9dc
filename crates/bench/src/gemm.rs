//! The GEMM sweep: the planner's choice against the oracle (best measured of the top
//! candidates), the best single fixed strategy, and OpenBLAS, over real model shapes.

mod cold;
mod report;
mod strategies;

pub use cold::{Cold, COLD_MAX_M, COLD_ORACLE_MAX_M};
pub use report::{
    assign_best_fixed, bandwidth_bound_gflops, dtype_name, plan_short, summarize, Machine, Row,
    Summary,
};
pub use strategies::{
    fixed_strategies, parse_families, shape_family, FixedStrategy, ShapeFamily, SplitKind,
};

use report::{header, row_line, same_plan};

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use rand::{Rng, SeedableRng};
use serde_json::Value;
use tessera_core::tensor::quantize_row;
use tessera_core::{DType, TensorBytes, WeightTensor};
use tessera_kernels::calibrate;
use tessera_kernels::gemm::{execute, GemmWeight};
use tessera_kernels::plan::{KernelFamily, Plan, Precision};
use tessera_kernels::planner::ShapeKey;
use tessera_runtime::ThreadPool;

use crate::openblas::{OpenBlas, INSTALL_HINT};
use crate::stats::{gflops, time_interleaved, Repeat};

/// Interleaved timing rounds per row (`stats::time_interleaved`).
const ROUNDS: usize = 3;

/// Interleaved rounds of the two finalists' fresh timing when the oracle is another plan,
/// each round as long as one of the first pass's: the comparison that decides the row gets
/// more runs than the first pass gave each contender, so a swing of the host that lasts a
/// round moves it less.
const FINAL_ROUNDS: usize = 7;

/// A fixed strategy faster than this fraction of the planned plan's time in the rounds is
/// re-timed against it in final rounds before its ratio is reported.
const FIXED_RETIME_BELOW: f64 = 0.95;

/// Milliseconds to wait after OpenBLAS runs. `OpenBlas::load` sets its idle threads to sleep
/// as soon as a call returns; this pause covers a user's own `OPENBLAS_THREAD_TIMEOUT`
/// (the default, 2^28 cycles, was not always over even after 300 ms).
const BLAS_QUIET_MS: u64 = 300;

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
    /// Also time the planned plan with the weights coming from DRAM, for M <= [`COLD_MAX_M`],
    /// and against the oracle so, for M <= [`COLD_ORACLE_MAX_M`].
    pub cold: bool,
}

/// The bytes of a random `[n, k]` weight of `dtype` (uniform in [-1, 1) before
/// quantization), with its f32 values kept for an f32 weight (OpenBLAS reads them).
pub(crate) fn random_weight_bytes(
    dtype: DType,
    n: usize,
    k: usize,
    seed: u64,
) -> (Vec<u8>, Option<Vec<f32>>) {
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
    (bytes, values)
}

/// A `[n, k]` weight of `dtype` holding `bytes`, as the model loads it.
pub(crate) fn weight_of(
    bytes: &[u8],
    dtype: DType,
    n: usize,
    k: usize,
    repack: bool,
) -> Result<GemmWeight> {
    let t = WeightTensor::new(
        format!("bench.{n}x{k}"),
        dtype,
        vec![n, k],
        TensorBytes::owned(bytes),
    )?;
    Ok(GemmWeight::new(t, repack))
}

/// A random weight (see [`random_weight_bytes`]) as the model loads it.
#[cfg(test)]
fn random_weight(
    dtype: DType,
    n: usize,
    k: usize,
    repack: bool,
    seed: u64,
) -> Result<(GemmWeight, Option<Vec<f32>>)> {
    let (bytes, values) = random_weight_bytes(dtype, n, k, seed);
    Ok((weight_of(&bytes, dtype, n, k, repack)?, values))
}

/// Measures the machine figures the report is relative to.
pub fn measure_machine(pool: &ThreadPool) -> Machine {
    Machine {
        // The best of several measurements spread over about a second.
        peak_gflops: (0..5)
            .map(|_| {
                std::thread::sleep(std::time::Duration::from_millis(150));
                calibrate::peak_fma_gflops(pool)
            })
            .fold(0.0, f64::max),
        dram_gbs: calibrate::dram_read_gbs(pool),
        dispatch_us: calibrate::dispatch_us(pool),
    }
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
    // The machine's figures first: loading OpenBLAS starts its threads, which compete with
    // the FMA peak measurement for a while (right after the load it reads half the peak).
    let mach = measure_machine(&pool);
    let blas = OpenBlas::load(units);
    info(&format!(
        "tessera bench gemm: {} units, precision {}, isa {}, cpu {}",
        units,
        cfg.precision,
        tessera_engine::isa_name(),
        planner.profile.cpu
    ));
    info(&tessera_engine::kernel_variants_line());
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
                let (bytes, wf32) = random_weight_bytes(dtype, n, k, cfg.seed);
                let w = weight_of(&bytes, dtype, n, k, repack)?;
                let copies = if cfg.cold && ms.iter().any(|&m| m <= COLD_ORACLE_MAX_M) {
                    pb.set_message(format!("{}: cold copies of {k}x{n}", dtype_name(dtype)));
                    cold::cold_copies(bytes.len(), || weight_of(&bytes, dtype, n, k, repack))?
                } else {
                    Vec::new()
                };
                drop(bytes);
                let mut rng = rand::rngs::StdRng::seed_from_u64(cfg.seed.wrapping_add(1));
                let x: Vec<f32> = (0..m_max * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
                let mut c = vec![0f32; m_max * n];
                for &m in &ms {
                    pb.set_message(format!("{} m={m} k={k} n={n}", dtype_name(dtype)));
                    let key = ShapeKey::new(m, k, n, dtype, key_precision, units);
                    let xs = &x[..m * k];
                    let cs = &mut c[..m * n];
                    // Every contender of the row: the planned plan, the top candidates,
                    // the fixed strategies (each plan once), and OpenBLAS, timed in
                    // interleaved rounds so that the host's slow spells fall on all alike.
                    let planned = planner.plan(&key);
                    let mut plans: Vec<Plan> = vec![planned];
                    let add = |p: Plan, plans: &mut Vec<Plan>| -> usize {
                        match plans.iter().position(|q| same_plan(q, &p)) {
                            Some(i) => i,
                            None => {
                                plans.push(p);
                                plans.len() - 1
                            }
                        }
                    };
                    for cand in planner.candidates(&key).into_iter().take(cfg.candidates) {
                        add(cand, &mut plans);
                    }
                    let candidates = plans.len();
                    let fixed_at: Vec<usize> = strategies
                        .iter()
                        .map(|s| add(s.apply(&planned, units), &mut plans))
                        .collect();
                    let blas_row = match (&blas, &wf32) {
                        (Some(b), Some(wv)) => Some((b, wv)),
                        _ => None,
                    };
                    let times = {
                        let cs = std::cell::RefCell::new(&mut *cs);
                        let mut runs: Vec<Box<dyn FnMut() + '_>> = plans
                            .iter()
                            .map(|p| {
                                let (pool, w, cs) = (&pool, &w, &cs);
                                Box::new(move || {
                                    execute(pool, p, xs, m, w, None, &mut cs.borrow_mut())
                                }) as Box<dyn FnMut()>
                            })
                            .collect();
                        if let Some((b, wv)) = blas_row {
                            let cs = &cs;
                            runs.push(Box::new(move || {
                                b.sgemm_abt(xs, wv, &mut cs.borrow_mut(), m, k, n)
                            }));
                        }
                        let mut refs: Vec<&mut dyn FnMut()> = runs
                            .iter_mut()
                            .map(|r| &mut **r as &mut dyn FnMut())
                            .collect();
                        time_interleaved(&cfg.repeat, ROUNDS, &mut refs, &mut |i| {
                            if i == plans.len() {
                                // Let OpenBLAS's threads stop spinning before our pool runs.
                                std::thread::sleep(std::time::Duration::from_millis(BLAS_QUIET_MS));
                            }
                        })
                    };
                    let mut t_planned = times[0];
                    // The oracle: the fastest of the planned plan and the candidates (the
                    // planned plan on ties).
                    let best =
                        (1..candidates).fold(0, |b, i| if times[i] < times[b] { i } else { b });
                    let mut oracle = (plans[best], times[best]);
                    if best != 0 {
                        // The fastest of several noisy medians is biased fast (of candidates
                        // that run alike, one wins by luck): time the two finalists afresh,
                        // in interleaved rounds, and compare only the new runs.
                        let (tp, to) = time_finalists(
                            &pool,
                            &plans[0],
                            &plans[best],
                            xs,
                            m,
                            &w,
                            cs,
                            &cfg.repeat,
                        );
                        t_planned = tp;
                        oracle = if tp <= to {
                            (plans[0], tp)
                        } else {
                            (plans[best], to)
                        };
                    }
                    // A fixed strategy that beat the planned plan by more than 5% in the
                    // rounds is timed against it afresh the same way, and its figure is the
                    // planned plan's (from the rounds) times the finals' ratio: a 5% verdict
                    // should not rest on which seconds of a noisy host each one drew.
                    let fixed_each: Vec<f64> = fixed_at
                        .iter()
                        .map(|&i| {
                            let t_fixed = if i != 0 && times[i] < FIXED_RETIME_BELOW * times[0] {
                                let (tp, tf) = time_finalists(
                                    &pool,
                                    &plans[0],
                                    &plans[i],
                                    xs,
                                    m,
                                    &w,
                                    cs,
                                    &cfg.repeat,
                                );
                                times[0] * tf / tp
                            } else {
                                times[i]
                            };
                            gflops(m, k, n, t_fixed)
                        })
                        .collect();
                    let gflops_openblas = blas_row.map(|_| gflops(m, k, n, times[plans.len()]));
                    let cold = (!copies.is_empty() && m <= COLD_MAX_M)
                        .then(|| cold::measure_cold(&pool, &planned, xs, m, k, n, &copies, cs));
                    let cold_over_oracle =
                        (!copies.is_empty() && m <= COLD_ORACLE_MAX_M).then(|| {
                            if same_plan(&planned, &oracle.0) {
                                1.0
                            } else {
                                cold::planned_over_oracle(
                                    &pool, &planned, &oracle.0, xs, m, &copies, cs,
                                )
                            }
                        });
                    rows.push(Row {
                        m,
                        k,
                        n,
                        dtype,
                        plan: planned,
                        gflops_planned: gflops(m, k, n, t_planned),
                        gflops_planned_rounds: gflops(m, k, n, times[0]),
                        oracle_plan: oracle.0,
                        gflops_oracle: gflops(m, k, n, oracle.1),
                        fixed_each,
                        gflops_fixed: f64::NAN,
                        fixed_name: String::new(),
                        gflops_openblas,
                        cold,
                        cold_over_oracle,
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

    // The FMA peak again, at the end: a measurement disturbed at the start (another process
    // finishing, write-back after a build) reads low and would inflate every fraction of
    // peak; the summary takes the higher of the two.
    let peak_end = calibrate::peak_fma_gflops(&pool);
    if peak_end > mach.peak_gflops * 1.05 {
        info(&format!(
            "peak FMA re-measured at the end: {peak_end:.1} GFLOP/s (the summary uses it)"
        ));
    }
    let mach = Machine {
        peak_gflops: mach.peak_gflops.max(peak_end),
        ..mach
    };
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

/// Times plans `a` and `b` afresh in [`FINAL_ROUNDS`] interleaved rounds (each round as long
/// as one of the first pass's) and returns their times; only these runs decide between them.
#[allow(clippy::too_many_arguments)]
fn time_finalists(
    pool: &ThreadPool,
    a: &Plan,
    b: &Plan,
    xs: &[f32],
    m: usize,
    w: &GemmWeight,
    cs: &mut [f32],
    repeat: &Repeat,
) -> (f64, f64) {
    let cs = std::cell::RefCell::new(cs);
    let (mut run_a, mut run_b) = (
        || execute(pool, a, xs, m, w, None, &mut cs.borrow_mut()),
        || execute(pool, b, xs, m, w, None, &mut cs.borrow_mut()),
    );
    let finals = Repeat {
        min_runs: repeat.min_runs,
        min_time: repeat.min_time * FINAL_ROUNDS as u32 / ROUNDS as u32,
        max_runs: repeat.max_runs * FINAL_ROUNDS / ROUNDS,
    };
    let t = time_interleaved(
        &finals,
        FINAL_ROUNDS,
        &mut [&mut run_a, &mut run_b],
        &mut |_| {},
    );
    (t[0], t[1])
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_kernels::planner::Planner;

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
