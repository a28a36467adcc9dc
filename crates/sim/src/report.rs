//! `tessera simulate`'s rows: predictions over step shapes and sub-batchings, and the
//! comparison of predictions with rows measured by `tessera bench tp`.

use serde::{Deserialize, Serialize};
use tessera_model::{SplitBy, SubBatching};

use crate::step::{candidates, StepModel, StepShape};

/// One predicted configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimRow {
    /// `prefill` or `decode`.
    pub phase: String,
    pub tokens: usize,
    pub seqs: usize,
    pub context: usize,
    pub s: usize,
    pub split: String,
    pub predicted_ms: f64,
    pub compute_ms: f64,
    pub comm_ms: f64,
    pub hidden: f64,
    pub chosen: bool,
}

/// A step to predict: a label and its shape.
pub struct Scenario {
    pub phase: &'static str,
    pub context: usize,
    pub shape: StepShape,
}

/// Prefills of `tokens` tokens (four sequences of the benchmark's uneven lengths) and decode
/// steps of `batch` sequences at `context` positions each.
pub fn scenarios(prefill: &[usize], decode: &[usize], context: usize) -> Vec<Scenario> {
    let mut out: Vec<Scenario> = prefill
        .iter()
        .map(|&t| Scenario {
            phase: "prefill",
            context: 0,
            shape: StepShape::prefill(bench_lens(t)),
        })
        .collect();
    out.extend(decode.iter().map(|&b| Scenario {
        phase: "decode",
        context,
        shape: StepShape {
            seq_rows: vec![1; b],
            seq_start: vec![context; b],
            logit_rows: b,
        },
    }));
    out
}

/// The sequence lengths of `tokens` tokens in the benchmarks' steps: four sequences in the
/// ratio 1:2:3:2 (at least one token each).
pub fn bench_lens(tokens: usize) -> Vec<usize> {
    let weights = [1usize, 2, 3, 2];
    let n = tokens.max(weights.len());
    let mut lens: Vec<usize> = weights.iter().map(|w| (n * w / 8).max(1)).collect();
    let short = n - lens.iter().sum::<usize>().min(n);
    lens[2] += short;
    lens
}

fn ms(x: f64) -> f64 {
    (x * 1e7).round() / 1e4
}

/// Every scenario under every sub-batching up to `max_s` (S = 1, then 2..=max_s by sequence
/// and by tokens), plus the model's choice marked `chosen`.
pub fn sweep(model: &StepModel, scenarios: &[Scenario], max_s: usize) -> Vec<SimRow> {
    let options = candidates(max_s);
    let mut rows = Vec::new();
    for sc in scenarios {
        let (pick, _) = model.choose(&sc.shape, &options);
        for (i, &o) in options.iter().enumerate() {
            let e = model.predict(&sc.shape, o);
            rows.push(SimRow {
                phase: sc.phase.to_string(),
                tokens: sc.shape.rows(),
                seqs: sc.shape.seq_rows.len(),
                context: sc.context,
                s: o.count,
                split: o.split.to_string(),
                predicted_ms: ms(e.step),
                compute_ms: ms(e.compute),
                comm_ms: ms(e.comm),
                hidden: (e.hidden() * 1e4).round() / 1e4,
                chosen: o == pick && options[..i].iter().all(|&p| p != pick),
            });
        }
    }
    rows
}

/// A row of `tessera bench tp --json` (the keys `simulate --against` reads).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct MeasuredRow {
    pub tokens: usize,
    pub s: usize,
    pub split: String,
    pub step_ms: f64,
    #[serde(default)]
    pub chosen: bool,
    #[serde(default)]
    pub tp: Option<usize>,
    #[serde(default)]
    pub threads_per_rank: Option<usize>,
    #[serde(default)]
    pub link_latency_us: Option<f64>,
    #[serde(default)]
    pub link_gb_s: Option<f64>,
    #[serde(default)]
    pub precision: Option<String>,
    /// `local` or `mpi`.
    #[serde(default)]
    pub backend: Option<String>,
    /// The all-reduce times measured at start-up, `[bytes, secs]`.
    #[serde(default)]
    pub link_points: Option<Vec<(usize, f64)>>,
}

/// Parses bench tp's JSON lines (blank lines and lines not starting with `{` are skipped).
pub fn parse_measured(text: &str) -> Result<Vec<MeasuredRow>, String> {
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if !line.starts_with('{') {
            continue;
        }
        let r: MeasuredRow = serde_json::from_str(line)
            .map_err(|e| format!("line {}: not a bench tp row: {e}", i + 1))?;
        if r.tokens == 0 || r.s == 0 {
            return Err(format!("line {}: tokens and s must be positive", i + 1));
        }
        rows.push(r);
    }
    if rows.is_empty() {
        return Err("no bench tp rows (JSON objects, one per line) in the file".into());
    }
    Ok(rows)
}

/// One measured row beside its prediction.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Compared {
    pub tokens: usize,
    pub s: usize,
    pub split: String,
    pub predicted_ms: f64,
    pub measured_ms: f64,
    pub chosen: bool,
}

impl Compared {
    /// Relative error of the prediction.
    pub fn error(&self) -> f64 {
        (self.predicted_ms - self.measured_ms) / self.measured_ms
    }
}

/// Predictions of `model` for each measured row's step (the benchmark's shape of that size,
/// cut as the row was).
pub fn compare(model: &StepModel, rows: &[MeasuredRow]) -> Result<Vec<Compared>, String> {
    rows.iter()
        .map(|r| {
            let split: SplitBy = r.split.parse().map_err(|e: String| e)?;
            let spec = SubBatching { count: r.s, split };
            let e = model.predict(&StepShape::prefill(bench_lens(r.tokens)), spec);
            Ok(Compared {
                tokens: r.tokens,
                s: r.s,
                split: r.split.clone(),
                predicted_ms: ms(e.step),
                measured_ms: r.step_ms,
                chosen: r.chosen,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_lens_keep_the_token_count() {
        assert_eq!(bench_lens(16), vec![2, 4, 6, 4]);
        for t in [1, 5, 17, 1023, 1024] {
            assert_eq!(bench_lens(t).iter().sum::<usize>(), t.max(4));
        }
    }

    #[test]
    fn measured_rows_parse_and_bad_ones_are_named() {
        let text = "bench tp: ...\n{\"tokens\":16,\"s\":2,\"split\":\"tokens\",\"step_ms\":3.5,\"chosen\":false,\"extra\":1}\n";
        let rows = parse_measured(text).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].s, 2);
        assert!(parse_measured("").unwrap_err().contains("no bench tp rows"));
        let e = parse_measured("{\"tokens\": 1}\n").unwrap_err();
        assert!(e.contains("line 1"), "{e}");
    }
}
