//! `tessera bench kernels`: every kernel variant of the exact and fast paths on this CPU,
//! beside its more portable twin, on the matrix products of the default model and of one
//! Llama-7B layer at M = 1 and at a large M; and whether the variant this CPU class runs
//! (`tessera_kernels::variants`, the instruction set) is the fastest.
//!
//! Each variant runs in a child process of this binary with the settings a user would give
//! it (`TESSERA_ISA`, the low-field decodes on or off), so every figure is of the code path
//! that setting really takes. Products are timed warm: the same weight again and again, from
//! whichever cache level holds it (the 7B weights from DRAM or a large L3).

use std::collections::BTreeMap;
use std::io::Write;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use tessera_core::DType;
use tessera_kernels::gemm::execute;
use tessera_kernels::isa::CpuFeatures;
use tessera_kernels::plan::Precision;
use tessera_kernels::planner::{Planner, ShapeKey};
use tessera_kernels::{variants, Isa};
use tessera_runtime::ThreadPool;

use crate::gemm::{random_weight_bytes, weight_of, ShapeFamily};
use crate::stats::{time_median, Repeat};

/// One way to run a path's kernels.
#[derive(Debug, Clone, Copy)]
pub struct Variant {
    pub name: &'static str,
    pub precision: Precision,
    /// `TESSERA_ISA` for the child.
    pub isa: &'static str,
    /// The low-field decodes forced on or off (`variants::override_low_field`).
    pub low_field: Option<bool>,
    /// The more portable variant it stands in for.
    pub twin: Option<&'static str>,
}

pub const VARIANTS: [Variant; 6] = [
    Variant {
        name: "avx512+low-field",
        precision: Precision::Exact,
        isa: "avx512",
        low_field: Some(true),
        twin: Some("avx512"),
    },
    Variant {
        name: "avx512",
        precision: Precision::Exact,
        isa: "avx512",
        low_field: Some(false),
        twin: Some("avx2"),
    },
    Variant {
        name: "avx2",
        precision: Precision::Exact,
        isa: "avx2",
        low_field: None,
        twin: Some("portable"),
    },
    Variant {
        name: "portable",
        precision: Precision::Exact,
        isa: "generic",
        low_field: None,
        twin: None,
    },
    Variant {
        name: "avx2",
        precision: Precision::Fast,
        isa: "avx2",
        low_field: None,
        twin: Some("portable"),
    },
    Variant {
        name: "portable",
        precision: Precision::Fast,
        isa: "generic",
        low_field: None,
        twin: None,
    },
];

/// Whether this CPU can run `v`.
fn runs_here(v: &Variant, cpu: CpuFeatures) -> bool {
    match v.isa {
        "avx512" => cpu.avx512,
        "avx2" => cpu.avx2_fma,
        _ => true,
    }
}

/// The variant this process runs for `precision` on `dtype` weights.
pub fn chosen(precision: Precision, dtype: DType) -> &'static str {
    match (precision, Isa::active()) {
        (Precision::Exact, Isa::Avx2Fma) if tessera_kernels::isa::avx512_exact() => {
            if variants::low_field(dtype) {
                "avx512+low-field"
            } else {
                "avx512"
            }
        }
        (_, Isa::Avx2Fma) => "avx2",
        _ => "portable",
    }
}

pub struct KernelsConfig {
    pub threads: usize,
    pub families: Vec<ShapeFamily>,
    pub dtypes: Vec<DType>,
    pub large_m: usize,
    pub min_ms: u64,
    pub json: bool,
    pub seed: u64,
    /// Set in the child processes: the variant (`precision/name`) to time.
    pub child: Option<String>,
}

/// One timed product.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Figure {
    pub variant: String,
    pub precision: String,
    pub dtype: String,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub secs: f64,
    pub weight_bytes: usize,
}

impl Figure {
    pub fn gflops(&self) -> f64 {
        2.0 * (self.m * self.k * self.n) as f64 / self.secs / 1e9
    }

    pub fn gbs(&self) -> f64 {
        self.weight_bytes as f64 / self.secs / 1e9
    }
}

fn precision_name(p: Precision) -> &'static str {
    match p {
        Precision::Exact => "exact",
        Precision::Fast => "fast",
    }
}

/// Runs the benchmark: the variants in turn, each in a child process, then the table.
pub fn run_kernels(cfg: &KernelsConfig) -> Result<()> {
    if let Some(v) = &cfg.child {
        return run_child(cfg, v);
    }
    let cpu = CpuFeatures::detect();
    eprintln!("{}", tessera_engine::kernel_variants_line());
    let exe = std::env::current_exe().context("finding this binary")?;
    let families: Vec<&str> = cfg.families.iter().map(|f| f.name).collect();
    let dtypes: Vec<String> = cfg.dtypes.iter().map(|d| d.to_string()).collect();
    let mut figures: Vec<Figure> = Vec::new();
    let runnable: Vec<&Variant> = VARIANTS.iter().filter(|v| runs_here(v, cpu)).collect();
    for (i, v) in runnable.iter().enumerate() {
        let id = format!("{}/{}", precision_name(v.precision), v.name);
        eprintln!("[{}/{}] timing {id}", i + 1, runnable.len());
        let out = Command::new(&exe)
            .args(["bench", "kernels", "--child", &id])
            .args(["--threads", &cfg.threads.to_string()])
            .args(["--shapes", &families.join(",")])
            .args(["--dtypes", &dtypes.join(",")])
            .args(["--large-m", &cfg.large_m.to_string()])
            .args(["--min-ms", &cfg.min_ms.to_string()])
            .args(["--seed", &cfg.seed.to_string()])
            .env("TESSERA_ISA", v.isa)
            .stderr(std::process::Stdio::inherit())
            .output()
            .with_context(|| format!("running {}", exe.display()))?;
        if !out.status.success() {
            bail!("timing {id} failed ({})", out.status);
        }
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            figures.push(serde_json::from_str(line).context("a child's figure")?);
        }
    }
    let stdout = std::io::stdout();
    let mut w = stdout.lock();
    if cfg.json {
        for f in &figures {
            writeln!(w, "{}", serde_json::to_string(f)?)?;
        }
        return Ok(());
    }
    write!(w, "{}", report(&figures, &|p, d| chosen(p, d)))?;
    Ok(())
}

/// A child: times every product on one variant and prints one JSON figure per line.
fn run_child(cfg: &KernelsConfig, id: &str) -> Result<()> {
    let v = VARIANTS
        .iter()
        .find(|v| format!("{}/{}", precision_name(v.precision), v.name) == id)
        .with_context(|| format!("no kernel variant {id:?}"))?;
    variants::override_low_field(v.low_field);
    let pool = ThreadPool::new(cfg.threads);
    let planner = Planner::untuned();
    let rep = Repeat {
        min_runs: 3,
        min_time: Duration::from_millis(cfg.min_ms),
        max_runs: 2000,
    };
    let repack = tessera_kernels::wants_repack(v.precision);
    settle(&pool);
    let stdout = std::io::stdout();
    let mut w = stdout.lock();
    for fam in &cfg.families {
        for &(k, n) in &fam.shapes {
            for &dtype in &cfg.dtypes {
                let (bytes, _) = random_weight_bytes(dtype, n, k, cfg.seed);
                let weight_bytes = bytes.len();
                let wt = weight_of(&bytes, dtype, n, k, repack)?;
                drop(bytes);
                let mut rng = rand::rngs::StdRng::seed_from_u64(cfg.seed.wrapping_add(1));
                for m in [1, cfg.large_m] {
                    let x: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
                    let mut c = vec![0f32; m * n];
                    let key = ShapeKey::new(m, k, n, dtype, v.precision, pool.units());
                    let plan = planner.plan(&key);
                    let secs = time_median(&rep, || {
                        execute(&pool, &plan, &x, m, &wt, None, &mut c);
                    });
                    let f = Figure {
                        variant: v.name.to_string(),
                        precision: precision_name(v.precision).to_string(),
                        dtype: dtype.to_string(),
                        m,
                        k,
                        n,
                        secs,
                        weight_bytes,
                    };
                    writeln!(w, "{}", serde_json::to_string(&f)?)?;
                }
            }
        }
    }
    Ok(())
}

/// Keeps the units busy with small products for a moment before anything is timed: the
/// first few milliseconds of a fresh process ran its first product at a twentieth of its
/// later speed.
fn settle(pool: &ThreadPool) {
    let (bytes, _) = random_weight_bytes(DType::F32, 64, 64, 0);
    let w = weight_of(&bytes, DType::F32, 64, 64, false).expect("an f32 weight");
    let x = vec![0.5f32; 64];
    let mut c = vec![0f32; 64];
    let plan = Planner::untuned().plan(&ShapeKey::new(
        1,
        64,
        64,
        DType::F32,
        Precision::Exact,
        pool.units(),
    ));
    let t = std::time::Instant::now();
    while t.elapsed() < Duration::from_millis(300) {
        execute(pool, &plan, &x, 1, &w, None, &mut c);
    }
}

/// A chosen variant counts as slower than another when it takes this much longer: closer
/// figures are within this host's run-to-run spread.
pub const SLOWER_MARGIN: f64 = 1.03;

/// The table: per product, each variant's GFLOP/s and GB/s, its speed against its twin, the
/// chosen one marked `*` and flagged where another ran faster; then a count of the flags.
pub fn report(figures: &[Figure], chosen: &dyn Fn(Precision, DType) -> &'static str) -> String {
    let mut groups: BTreeMap<(String, String, usize, usize, usize), Vec<&Figure>> = BTreeMap::new();
    for f in figures {
        let key = (f.precision.clone(), f.dtype.clone(), f.m, f.k, f.n);
        groups.entry(key).or_default().push(f);
    }
    let mut s = String::new();
    s.push_str(&format!(
        "{:9} {:5} {:>5} {:>6} {:>6}  {:18} {:>8} {:>7}  {:16}\n",
        "precision", "dtype", "M", "K", "N", "variant", "GFLOP/s", "GB/s", "vs twin"
    ));
    let (mut flagged, mut total) = (0, 0);
    for ((prec, dtype, m, k, n), fs) in &groups {
        let precision = if prec == "fast" {
            Precision::Fast
        } else {
            Precision::Exact
        };
        let dt = fs
            .first()
            .and_then(|f| parse_dtype(&f.dtype))
            .unwrap_or(DType::Q4_1);
        let pick = chosen(precision, dt);
        let best = fs
            .iter()
            .min_by(|a, b| a.secs.total_cmp(&b.secs))
            .expect("a group has figures");
        total += 1;
        for (i, f) in fs.iter().enumerate() {
            let twin = VARIANTS
                .iter()
                .find(|v| v.precision == precision && v.name == f.variant)
                .and_then(|v| v.twin)
                .and_then(|t| fs.iter().find(|g| g.variant == t));
            let vs = match twin {
                Some(t) => format!("{:.2}x {}", t.secs / f.secs, t.variant),
                None => String::new(),
            };
            let mark = if f.variant == pick { "*" } else { " " };
            let flag = if f.variant == pick && f.secs > best.secs * SLOWER_MARGIN {
                flagged += 1;
                format!(
                    "  << chosen, slower than {} ({:.2}x)",
                    best.variant,
                    best.secs / f.secs
                )
            } else {
                String::new()
            };
            let head = if i == 0 {
                format!("{prec:9} {dtype:5} {m:>5} {k:>6} {n:>6}")
            } else {
                format!("{:9} {:5} {:>5} {:>6} {:>6}", "", "", "", "", "")
            };
            s.push_str(&format!(
                "{head}  {:18} {:>8.1} {:>7.1}  {vs:16}{flag}\n",
                format!("{}{mark}", f.variant),
                f.gflops(),
                f.gbs(),
            ));
        }
    }
    s.push_str(&format!(
        "\n* = the variant this CPU runs. Chosen variant slower than another (by more than {:.0}%): {flagged} of {total} products.\n",
        (SLOWER_MARGIN - 1.0) * 100.0
    ));
    s
}

fn parse_dtype(s: &str) -> Option<DType> {
    crate::gemm::parse_dtypes(&[s.to_string()])
        .ok()
        .and_then(|v| v.first().copied())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fig(variant: &str, secs: f64) -> Figure {
        Figure {
            variant: variant.into(),
            precision: "exact".into(),
            dtype: "Q4_1".into(),
            m: 1,
            k: 576,
            n: 1536,
            secs,
            weight_bytes: 576 * 1536 * 20 / 32,
        }
    }

    #[test]
    fn a_chosen_variant_slower_than_another_is_flagged() {
        let figs = [
            fig("avx512+low-field", 1e-3),
            fig("avx512", 1e-5),
            fig("avx2", 1.5e-5),
            fig("portable", 1e-4),
        ];
        let r = report(&figs, &|_, _| "avx512+low-field");
        assert!(r.contains("<< chosen, slower than avx512"), "{r}");
        assert!(r.contains("1 of 1 products"), "{r}");
        let r = report(&figs, &|_, _| "avx512");
        assert!(!r.contains("<<"), "{r}");
        assert!(r.contains("avx512*") && r.contains("1.50x avx2"), "{r}");
        assert!(r.contains("0 of 1 products"), "{r}");
    }

    #[test]
    fn figures_give_flops_and_bytes_per_second() {
        let f = fig("avx2", 1e-3);
        assert!((f.gflops() - 2.0 * 576.0 * 1536.0 / 1e-3 / 1e9).abs() < 1e-9);
        assert!((f.gbs() - (576 * 1536 * 20 / 32) as f64 / 1e-3 / 1e9).abs() < 1e-9);
    }
}
