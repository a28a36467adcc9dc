//! `tessera simulate`: the step-time model for models and clusters this machine cannot run,
//! and its check against steps measured by `tessera bench tp`.
//!
//! The compute profile is this machine's, measured (stages of the model file timed on one
//! rank's share of the cores, as the engine does at start-up), or a roofline from a device's
//! peak FLOP/s and bandwidth (`--device a100|h100|cpu`) over a model shape (`--model
//! llama-2-70b|llama-3-8b|config.json|model file`). Links are presets or the measured one.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use tessera_engine::{store, tuning, Engine};
use tessera_kernels::plan::Precision;
use tessera_sim::compute::Device;
use tessera_sim::links::Link;
use tessera_sim::report::{compare, parse_measured, scenarios, sweep};
use tessera_sim::{CommCost, ModelShape, Roofline, StepModel};

#[derive(clap::Args)]
pub struct SimulateArgs {
    /// `llama-2-70b`, `llama-3-8b`, a Hugging Face config.json, or a model file (GGUF or
    /// folder; default: the default model), whose stages are then timed on this machine.
    #[arg(long)]
    model: Option<String>,
    /// Tensor-parallel ranks.
    #[arg(long, default_value_t = 8)]
    tp: usize,
    /// Link between ranks: nvlink, pcie4, 100gbe, 10gbe, 1gbe, or `measured` (this machine's,
    /// timed between local ranks).
    #[arg(long)]
    link: Option<String>,
    /// Compute profile: `this` (stages of a model file timed here; for a shape without
    /// weights, a roofline from this machine's measured FMA rate and bandwidth), or a
    /// device preset: a100, h100.
    #[arg(long, default_value = "this")]
    device: String,
    /// CPU threads per rank for `--device this`.
    #[arg(long, default_value_t = 1)]
    threads_per_rank: usize,
    #[arg(long, default_value = "exact")]
    precision: String,
    /// Prefill step sizes (tokens; four sequences of uneven lengths).
    #[arg(long, value_delimiter = ',', default_value = "256,1024,4096,16384")]
    tokens: Vec<usize>,
    /// Decode step sizes (sequences, one token each, at `--context` positions).
    #[arg(long, value_delimiter = ',', default_value = "1,16,64,256")]
    decode: Vec<usize>,
    #[arg(long, default_value_t = 2048)]
    context: usize,
    /// Largest number of sub-batches.
    #[arg(long, default_value_t = 8)]
    max_s: usize,
    /// One JSON object per row.
    #[arg(long)]
    json: bool,
    /// Write an SVG chart: step time against S, or with --against predicted against measured.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Rows of `tessera bench tp --json` to predict: one JSON object per row with tokens, s,
    /// split, predicted_ms, measured_ms (the compute profile is timed here; the link is the
    /// one the rows measured).
    #[arg(long)]
    against: Option<PathBuf>,
}

fn precision(s: &str) -> Result<Precision> {
    Precision::parse(s).ok_or_else(|| anyhow!("--precision {s:?}: expected exact or fast"))
}

/// This machine's measured step model for the model file at `path` over `tp` ranks of
/// `per_rank` threads (the stage profile of rank 0; the link between local ranks).
fn measured(path: Option<&Path>, tp: usize, per_rank: usize, p: Precision) -> Result<StepModel> {
    let path = store::resolve_model(path)?;
    eprintln!(
        "simulate: timing the stages of {} on {per_rank} thread(s) of rank 0 of {tp}",
        path.display()
    );
    let engine = Engine::load_tp(
        &path,
        tp * per_rank,
        p,
        tuning::load_planner(),
        tp.max(2),
        std::time::Duration::from_secs(30),
    )
    .with_context(|| format!("loading {}", path.display()))?;
    let mut m = engine
        .step_model()
        .ok_or_else(|| anyhow!("no step-time model for {} ranks", tp))?;
    m.ranks = tp;
    Ok(m)
}

fn link_cost(name: &str, tp: usize) -> Result<CommCost> {
    let l = Link::preset(name).ok_or_else(|| {
        anyhow!("--link {name:?}: expected nvlink, pcie4, 100gbe, 10gbe, 1gbe or measured")
    })?;
    Ok(l.ring_all_reduce(tp))
}

fn build(a: &SimulateArgs) -> Result<(StepModel, String)> {
    if a.tp == 0 || a.threads_per_rank == 0 || a.max_s == 0 {
        bail!("--tp, --threads-per-rank and --max-s must be at least 1");
    }
    let p = precision(&a.precision)?;
    let preset = a.model.as_deref().and_then(ModelShape::preset);
    let config_json = a
        .model
        .as_deref()
        .filter(|m| m.ends_with(".json"))
        .map(|m| -> Result<ModelShape> {
            let text = std::fs::read_to_string(m).with_context(|| format!("reading {m}"))?;
            ModelShape::from_config_json(m, &text).map_err(|e| anyhow!(e))
        })
        .transpose()?;
    let shape = preset.or(config_json);
    let device = a.device.to_ascii_lowercase();
    let mut model = match (shape, device.as_str()) {
        (None, "this") => measured(
            a.model.as_deref().map(Path::new),
            a.tp,
            a.threads_per_rank,
            p,
        )?,
        (shape, dev) => {
            let shape = match shape {
                Some(s) => s,
                None => {
                    let path = store::resolve_model(a.model.as_deref().map(Path::new))?;
                    let files = tessera_formats::load_model(&path)?;
                    ModelShape::from_model(&files.name, &files.config)
                }
            };
            let device = if dev == "this" {
                let prof = tuning::load_planner().profile;
                Device::cpu(
                    prof.f32_gflops_per_core,
                    a.threads_per_rank,
                    prof.dram_gbs,
                    0.6,
                )
            } else {
                Device::preset(dev)
                    .ok_or_else(|| anyhow!("--device {dev:?}: expected this, a100 or h100"))?
            };
            StepModel {
                layers: shape.layers,
                hidden: shape.hidden,
                vocab: shape.vocab,
                ranks: a.tp,
                act_bytes: device.act_bytes,
                compute: Arc::new(Roofline {
                    shape: shape.clone(),
                    ranks: a.tp,
                    device,
                }),
                comm: CommCost::FREE,
                embed_reduced: false,
                comm_cpu_share: 0.0,
            }
        }
    };
    let link = a.link.clone().unwrap_or_else(|| {
        if model.comm == CommCost::FREE {
            "nvlink".into()
        } else {
            "measured".into()
        }
    });
    if link != "measured" {
        model.comm = link_cost(&link, a.tp)?;
    } else if model.comm == CommCost::FREE && a.tp > 1 {
        bail!("--link measured needs --device this with a model file");
    }
    let label = format!(
        "{} layers, hidden {}, {} ranks, {} link, device {}",
        model.layers, model.hidden, a.tp, link, a.device
    );
    Ok((model, label))
}

pub fn run(a: SimulateArgs) -> Result<()> {
    if let Some(file) = &a.against {
        return against(&a, file);
    }
    let (model, label) = build(&a)?;
    let rows = sweep(&model, &scenarios(&a.tokens, &a.decode, a.context), a.max_s);
    eprintln!("simulate: {label}");
    if a.json {
        for r in &rows {
            println!("{}", serde_json::to_string(r)?);
        }
    } else {
        println!(
            "{:>8} {:>6} {:>5} {:>7} {:>3} {:>8} {:>12} {:>11} {:>9} {:>7} {:>7}",
            "phase",
            "tokens",
            "seqs",
            "context",
            "S",
            "split",
            "predicted_ms",
            "compute_ms",
            "comm_ms",
            "hidden",
            "chosen"
        );
        for r in &rows {
            println!(
                "{:>8} {:>6} {:>5} {:>7} {:>3} {:>8} {:>12.3} {:>11.3} {:>9.3} {:>6.0}% {:>7}",
                r.phase,
                r.tokens,
                r.seqs,
                r.context,
                r.s,
                r.split,
                r.predicted_ms,
                r.compute_ms,
                r.comm_ms,
                100.0 * r.hidden,
                if r.chosen { "chosen" } else { "" }
            );
        }
    }
    if let Some(p) = &a.plot {
        tessera_sim::plot::step_time_vs_s(
            p,
            &rows,
            &format!("Predicted step time against S: {label}"),
        )
        .map_err(|e| anyhow!(e))?;
        eprintln!("simulate: wrote {}", p.display());
    }
    Ok(())
}

fn against(a: &SimulateArgs, file: &Path) -> Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let rows = parse_measured(&text).map_err(|e| anyhow!("{}: {e}", file.display()))?;
    let first = &rows[0];
    let tp = first.tp.unwrap_or(2);
    let per_rank = first.threads_per_rank.unwrap_or(1);
    let p = precision(first.precision.as_deref().unwrap_or(&a.precision))?;
    let path = a.model.as_deref().map(Path::new);
    let mut model = measured(path, tp, per_rank, p)?;
    if let Some(points) = first.link_points.as_deref().filter(|p| p.len() >= 2) {
        model.comm = CommCost::from_points(points);
    } else if let (Some(lat), Some(gbs)) = (first.link_latency_us, first.link_gb_s) {
        model.comm = CommCost::from_figures(lat, gbs);
    }
    // In one process the sums run on the ranks' cores (the model measured here says how
    // much); over MPI the time is the wire's.
    if first.backend.as_deref() == Some("mpi") {
        model.comm_cpu_share = 0.0;
    }
    let out = compare(&model, &rows).map_err(|e| anyhow!(e))?;
    for c in &out {
        println!(
            "{}",
            serde_json::json!({
                "tokens": c.tokens, "s": c.s, "split": c.split,
                "predicted_ms": c.predicted_ms, "measured_ms": c.measured_ms,
                "error": (c.error() * 1e4).round() / 1e4, "chosen": c.chosen,
            })
        );
    }
    let worst = out.iter().map(|c| c.error().abs()).fold(0.0, f64::max);
    let within = out.iter().filter(|c| c.error().abs() <= 0.10).count();
    eprintln!(
        "simulate: {within} of {} rows within 10% of the measurement; largest error {:.1}%",
        out.len(),
        100.0 * worst
    );
    if let Some(pl) = &a.plot {
        tessera_sim::plot::predicted_vs_measured(
            pl,
            &out,
            &format!("Predicted against measured: {}", file.display()),
        )
        .map_err(|e| anyhow!(e))?;
        eprintln!("simulate: wrote {}", pl.display());
    }
    Ok(())
}
