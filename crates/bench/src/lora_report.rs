//! `tessera bench plot-lora FILE`: the report of a multi-LoRA serving benchmark
//! (scripts/bench-lora.sh): a summary table of output tokens/s per adapter kind, batching
//! mode and adapter count, with the ratio to the base-only run and the co-batching /
//! serial ratio at the largest count, and an SVG chart of output tokens/s against the
//! adapter count.
//!
//! FILE holds one JSON object per line:
//! `{"kind": "qv-r8", "batching": "mixed", "n_adapters": 4, "bench": {…}}` where `bench` is
//! a row of `tessera bench serve --json`. A bare `bench serve` row is read too: its kind
//! and batching are then `-` and its adapter count that of its distinct `adapters`.

use std::path::Path;

use anyhow::{bail, Context, Result};
use plotters::prelude::*;
use serde_json::Value;

use crate::serve::adapters::distinct;
use crate::serve::stats::fmt1;
use crate::serve_plot::{draw_panel, Series, XAxis};

/// One measurement of the benchmark.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraRun {
    /// Adapter kind, e.g. `qv-r8`.
    pub kind: String,
    /// `mixed` (co-batching) or `serial`.
    pub batching: String,
    /// 0: base model only.
    pub n_adapters: usize,
    pub completed: usize,
    pub failed: usize,
    pub out_tok_s: f64,
    pub ttft_p50_ms: f64,
    pub tpot_p50_ms: f64,
}

fn f(v: &Value, ptr: &str) -> f64 {
    v.pointer(ptr).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

/// Parses one line of the results file.
pub fn parse_run(line: &str) -> Result<LoraRun> {
    let v: Value = serde_json::from_str(line).context("not a JSON object")?;
    let bench = v.get("bench").unwrap_or(&v);
    if bench.get("output_token_throughput").is_none() {
        bail!("no output_token_throughput (not a `tessera bench serve --json` row)");
    }
    let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("-").to_string();
    let n_adapters = match v.get("n_adapters").and_then(Value::as_u64) {
        Some(n) => n as usize,
        None => bench
            .get("adapters")
            .and_then(Value::as_array)
            .map(|a| {
                let names: Vec<String> = a
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect();
                distinct(&names).len()
            })
            .unwrap_or(0),
    };
    let u = |k: &str| bench.get(k).and_then(Value::as_u64).unwrap_or(0) as usize;
    Ok(LoraRun {
        kind: s("kind"),
        batching: s("batching"),
        n_adapters,
        completed: u("completed"),
        failed: u("failed"),
        out_tok_s: f(bench, "/output_token_throughput"),
        ttft_p50_ms: f(bench, "/ttft_ms/p50"),
        tpot_p50_ms: f(bench, "/tpot_ms/p50"),
    })
}

/// Parses a results file; blank lines are skipped, a bad line is an error naming it.
pub fn parse_runs(text: &str) -> Result<Vec<LoraRun>> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| parse_run(l).with_context(|| format!("line {}", i + 1)))
        .collect()
}

/// Output tokens/s of the base-only run of `kind` (else of any kind), mixed preferred.
pub fn base_rate(runs: &[LoraRun], kind: &str) -> Option<f64> {
    let base = |same_kind: bool| {
        let mut v: Vec<&LoraRun> = runs
            .iter()
            .filter(|r| r.n_adapters == 0 && (!same_kind || r.kind == kind))
            .collect();
        v.sort_by_key(|r| r.batching != "mixed");
        v.first().map(|r| r.out_tok_s)
    };
    base(true).or_else(|| base(false))
}

/// Per kind (first-seen order): the largest adapter count run both mixed and serial, and
/// mixed / serial output tokens/s there.
pub fn cobatch_ratios(runs: &[LoraRun]) -> Vec<(String, usize, f64)> {
    let kinds: Vec<String> = runs.iter().map(|r| r.kind.clone()).collect();
    distinct(&kinds)
        .into_iter()
        .filter_map(|kind| {
            let rate = |batching: &str, n: usize| {
                runs.iter()
                    .find(|r| r.kind == kind && r.batching == batching && r.n_adapters == n)
                    .map(|r| r.out_tok_s)
            };
            let n = runs
                .iter()
                .filter(|r| r.kind == kind && r.batching == "serial")
                .map(|r| r.n_adapters)
                .filter(|&n| rate("mixed", n).is_some())
                .max()?;
            Some((kind.to_string(), n, rate("mixed", n)? / rate("serial", n)?))
        })
        .collect()
}

fn count_label(n: usize) -> String {
    if n == 0 {
        "base".into()
    } else {
        n.to_string()
    }
}

fn ratio(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2}x")
    } else {
        "-".into()
    }
}

/// The summary table and the co-batching / serial ratios.
pub fn summary_table(runs: &[LoraRun]) -> String {
    let kw = runs
        .iter()
        .map(|r| r.kind.chars().count())
        .max()
        .unwrap_or(0)
        .max(4);
    let mut s = format!(
        "{:<kw$} {:<8} {:>8} {:>5} {:>5} {:>10} {:>8} {:>9} {:>9}\n",
        "kind",
        "batching",
        "adapters",
        "ok",
        "fail",
        "out tok/s",
        "vs base",
        "ttft p50",
        "tpot p50"
    );
    for r in runs {
        let vs = base_rate(runs, &r.kind).map_or(f64::NAN, |b| r.out_tok_s / b);
        s.push_str(&format!(
            "{:<kw$} {:<8} {:>8} {:>5} {:>5} {:>10} {:>8} {:>9} {:>9}\n",
            r.kind,
            r.batching,
            count_label(r.n_adapters),
            r.completed,
            r.failed,
            fmt1(r.out_tok_s),
            ratio(vs),
            fmt1(r.ttft_p50_ms),
            fmt1(r.tpot_p50_ms),
        ));
    }
    for (kind, n, x) in cobatch_ratios(runs) {
        s.push_str(&format!(
            "co-batching / serial at {n} adapters, {kind}: {}\n",
            ratio(x)
        ));
    }
    s
}

/// x position of an adapter count: log2, with the base-only run at -1.
fn x_of(n: usize) -> f64 {
    if n == 0 {
        -1.0
    } else {
        (n as f64).log2()
    }
}

const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// One line per (kind, batching), first-seen order; the base-only run of a kind is the
/// first point of its every line.
pub fn series(runs: &[LoraRun]) -> Vec<Series> {
    let keys: Vec<String> = runs
        .iter()
        .filter(|r| r.n_adapters > 0)
        .map(|r| format!("{} {}", r.kind, r.batching))
        .collect();
    distinct(&keys)
        .into_iter()
        .enumerate()
        .map(|(i, key)| {
            let mut pts: Vec<(f64, f64)> = runs
                .iter()
                .filter(|r| r.n_adapters > 0 && format!("{} {}", r.kind, r.batching) == key)
                .map(|r| (x_of(r.n_adapters), r.out_tok_s))
                .collect();
            let kind = runs
                .iter()
                .find(|r| format!("{} {}", r.kind, r.batching) == key)
                .map(|r| r.kind.clone())
                .unwrap_or_default();
            if let Some(b) = base_rate(runs, &kind) {
                pts.push((x_of(0), b));
            }
            pts.retain(|p| p.1.is_finite());
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            (key.to_string(), PALETTE[i % PALETTE.len()], pts)
        })
        .collect()
}

/// Writes the chart of output tokens/s against the adapter count to `path` as SVG.
pub fn plot_lora(path: &Path, runs: &[LoraRun]) -> Result<()> {
    let mut series = series(runs);
    if series.is_empty() {
        // Base-only runs alone: one point per kind.
        let kinds: Vec<String> = runs.iter().map(|r| r.kind.clone()).collect();
        series = distinct(&kinds)
            .into_iter()
            .enumerate()
            .filter_map(|(i, k)| {
                let b = base_rate(runs, k)?;
                Some((
                    k.to_string(),
                    PALETTE[i % PALETTE.len()],
                    vec![(x_of(0), b)],
                ))
            })
            .collect();
    }
    if series.iter().all(|s| s.2.is_empty()) {
        bail!("nothing to plot");
    }
    let root = SVGBackend::new(path, (720, 440)).into_drawing_area();
    root.fill(&WHITE)
        .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    draw_panel(
        &root,
        "output tokens/s against LoRA adapters in use",
        "adapters (requests round-robin over them)",
        XAxis::Log2Base,
        false,
        SeriesLabelPosition::UpperRight,
        series,
    )
    .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    root.present().map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    Ok(())
}

/// `tessera bench plot-lora FILE [--out SVG]`: prints the summary, writes the chart.
pub fn run_plot_lora(file: &Path, out: Option<&Path>) -> Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let runs = parse_runs(&text).with_context(|| file.display().to_string())?;
    if runs.is_empty() {
        bail!("{} holds no results", file.display());
    }
    print!("{}", summary_table(&runs));
    if let Some(out) = out {
        plot_lora(out, &runs)?;
        eprintln!("wrote {}", out.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(kind: &str, batching: &str, n: usize, tps: f64) -> String {
        format!(
            r#"{{"kind":"{kind}","batching":"{batching}","n_adapters":{n},"bench":{{"completed":64,"failed":0,"output_token_throughput":{tps},"ttft_ms":{{"p50":12.5}},"tpot_ms":{{"p50":null}}}}}}"#
        )
    }

    fn sample() -> String {
        [
            line("qv-r8", "mixed", 0, 400.0),
            line("qv-r8", "mixed", 1, 380.0),
            line("qv-r8", "mixed", 16, 300.0),
            line("qv-r8", "serial", 16, 100.0),
            line("all-r16", "mixed", 0, 390.0),
            line("all-r16", "mixed", 16, 200.0),
            line("all-r16", "serial", 16, 80.0),
        ]
        .join("\n")
            + "\n\n"
    }

    #[test]
    fn parses_wrapped_and_bare_rows() {
        let runs = parse_runs(&sample()).unwrap();
        assert_eq!(runs.len(), 7);
        assert_eq!(runs[2].kind, "qv-r8");
        assert_eq!(runs[2].n_adapters, 16);
        assert_eq!(runs[2].out_tok_s, 300.0);
        assert_eq!(runs[2].ttft_p50_ms, 12.5);
        assert!(runs[2].tpot_p50_ms.is_nan());
        let bare = parse_run(
            r#"{"completed":4,"failed":1,"output_token_throughput":9.5,"adapters":["base","a0","a0"]}"#,
        )
        .unwrap();
        assert_eq!(
            (bare.kind.as_str(), bare.n_adapters, bare.failed),
            ("-", 2, 1)
        );
        let e = parse_runs("{\"a\":1}\n").unwrap_err();
        assert!(format!("{e:#}").contains("line 1"));
    }

    #[test]
    fn ratios_and_table() {
        let runs = parse_runs(&sample()).unwrap();
        assert_eq!(base_rate(&runs, "qv-r8"), Some(400.0));
        assert_eq!(base_rate(&runs, "all-r16"), Some(390.0));
        // No base run of this kind: any kind's.
        assert_eq!(base_rate(&runs, "other"), Some(400.0));
        assert_eq!(
            cobatch_ratios(&runs),
            vec![
                ("qv-r8".to_string(), 16, 3.0),
                ("all-r16".to_string(), 16, 2.5)
            ]
        );
        let t = summary_table(&runs);
        assert!(t.contains("0.75x"), "{t}");
        assert!(t.contains("co-batching / serial at 16 adapters, qv-r8: 3.00x"));
        assert!(t.contains("base"));
        assert_eq!(t.lines().count(), 1 + 7 + 2);
    }

    #[test]
    fn series_start_at_the_base_and_the_chart_is_written() {
        let runs = parse_runs(&sample()).unwrap();
        let s = series(&runs);
        let names: Vec<&str> = s.iter().map(|x| x.0.as_str()).collect();
        assert_eq!(
            names,
            [
                "qv-r8 mixed",
                "qv-r8 serial",
                "all-r16 mixed",
                "all-r16 serial"
            ]
        );
        assert_eq!(s[0].2, vec![(-1.0, 400.0), (0.0, 380.0), (4.0, 300.0)]);
        assert_eq!(s[1].2, vec![(-1.0, 400.0), (4.0, 100.0)]);
        let path = std::env::temp_dir().join(format!("tessera-lora-{}.svg", std::process::id()));
        plot_lora(&path, &runs).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("<svg") && svg.contains("qv-r8 serial") && svg.contains("base"));
        let _ = std::fs::remove_file(&path);
        assert!(plot_lora(&path, &[]).is_err());
    }
}
