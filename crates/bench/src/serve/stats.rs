//! Statistics and the report of `tessera bench serve`: percentiles and latency summaries,
//! the outcome of each request ([`Outcome`], [`Timing`]), the figures of one measurement
//! ([`RunStats`], built by [`summarize`]) and their JSON, table and sweep-table forms.

use serde_json::{json, Value};

use super::response_format::{Validity, Verdict};
use super::{Endpoint, Load};

/// The `p`-th percentile (0..=100) with linear interpolation between closest ranks (as
/// numpy's default); `NaN` when empty. Non-finite values are ignored.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let rank = (p.clamp(0.0, 100.0) / 100.0) * (v.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    v[lo] + (v[hi] - v[lo]) * (rank - lo as f64)
}

/// Mean of the finite values; `NaN` when there are none.
pub fn mean(values: &[f64]) -> f64 {
    let v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        f64::NAN
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// Mean and percentiles of a latency, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

impl Summary {
    /// From values in seconds.
    pub fn of_secs(secs: &[f64]) -> Summary {
        let ms: Vec<f64> = secs.iter().map(|s| s * 1e3).collect();
        Summary {
            mean: mean(&ms),
            p50: percentile(&ms, 50.0),
            p90: percentile(&ms, 90.0),
            p99: percentile(&ms, 99.0),
        }
    }
    pub(crate) fn to_json(self) -> Value {
        json!({"mean": num(self.mean), "p50": num(self.p50), "p90": num(self.p90), "p99": num(self.p99)})
    }
}

/// A JSON number, or null when not finite.
pub(crate) fn num(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        Value::Null
    }
}

/// The result of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub index: usize,
    /// Seconds from the start of the measurement to the request's sending.
    pub start: f64,
    /// `Err` holds the failure's message.
    pub result: std::result::Result<Timing, String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Timing {
    pub ttft: f64,
    /// `None` with a single output token.
    pub tpot: Option<f64>,
    pub e2e: f64,
    pub output_tokens: usize,
    pub prompt_tokens: usize,
    /// Whether `prompt_tokens` came from the server's usage (else it is an estimate).
    pub prompt_tokens_exact: bool,
    /// The output against `--response-format` (`None` without one).
    pub verdict: Option<Verdict>,
}

/// The figures of one measurement.
#[derive(Debug, Clone, PartialEq)]
pub struct RunStats {
    pub load: Load,
    pub completed: usize,
    pub failed: usize,
    pub duration_s: f64,
    pub input_tokens: usize,
    pub input_tokens_exact: bool,
    pub output_tokens: usize,
    pub req_per_s: f64,
    pub output_tok_per_s: f64,
    pub total_tok_per_s: f64,
    pub ttft_ms: Summary,
    pub tpot_ms: Summary,
    pub e2e_ms: Summary,
    /// Completed requests meeting both SLOs.
    pub slo_met: usize,
    pub goodput_req_per_s: f64,
    pub slo_ttft_ms: f64,
    pub slo_tpot_ms: f64,
    pub first_error: Option<String>,
    /// The outputs against `--response-format` (`None` without one).
    pub validity: Option<Validity>,
}

/// Summarizes the outcomes of a measurement that lasted `duration_s`.
pub fn summarize(
    load: Load,
    outcomes: &[Outcome],
    duration_s: f64,
    slo_ttft_ms: f64,
    slo_tpot_ms: f64,
) -> RunStats {
    let ok: Vec<&Timing> = outcomes
        .iter()
        .filter_map(|o| o.result.as_ref().ok())
        .collect();
    let first_error = outcomes
        .iter()
        .filter_map(|o| o.result.as_ref().err().map(|e| (o.index, e)))
        .min_by_key(|(i, _)| *i)
        .map(|(_, e)| e.clone());
    let input_tokens: usize = ok.iter().map(|t| t.prompt_tokens).sum();
    let output_tokens: usize = ok.iter().map(|t| t.output_tokens).sum();
    let per_s = |x: f64| {
        if duration_s > 0.0 {
            x / duration_s
        } else {
            f64::NAN
        }
    };
    let slo_met = ok
        .iter()
        .filter(|t| t.ttft * 1e3 <= slo_ttft_ms && t.tpot.is_none_or(|p| p * 1e3 <= slo_tpot_ms))
        .count();
    RunStats {
        load,
        completed: ok.len(),
        failed: outcomes.len() - ok.len(),
        duration_s,
        input_tokens,
        input_tokens_exact: ok.iter().all(|t| t.prompt_tokens_exact),
        output_tokens,
        req_per_s: per_s(ok.len() as f64),
        output_tok_per_s: per_s(output_tokens as f64),
        total_tok_per_s: per_s((input_tokens + output_tokens) as f64),
        ttft_ms: Summary::of_secs(&ok.iter().map(|t| t.ttft).collect::<Vec<_>>()),
        tpot_ms: Summary::of_secs(&ok.iter().filter_map(|t| t.tpot).collect::<Vec<_>>()),
        e2e_ms: Summary::of_secs(&ok.iter().map(|t| t.e2e).collect::<Vec<_>>()),
        slo_met,
        goodput_req_per_s: per_s(slo_met as f64),
        slo_ttft_ms,
        slo_tpot_ms,
        first_error,
        validity: Validity::tally(ok.iter().copied()),
    }
}

impl RunStats {
    pub fn to_json(&self, endpoint: Endpoint, model: Option<&str>) -> Value {
        let (conc, rate) = match self.load {
            Load::Concurrency(c) => (json!(c), Value::Null),
            Load::Rate {
                rate,
                max_concurrency,
            } => (
                json!(max_concurrency),
                if rate.is_finite() {
                    json!(rate)
                } else {
                    json!("inf")
                },
            ),
        };
        json!({
            "endpoint": endpoint.name(),
            "model": model,
            "concurrency": conc,
            "rate": rate,
            "completed": self.completed,
            "failed": self.failed,
            "duration_s": num(self.duration_s),
            "input_tokens": self.input_tokens,
            "input_tokens_exact": self.input_tokens_exact,
            "output_tokens": self.output_tokens,
            "request_throughput": num(self.req_per_s),
            "output_token_throughput": num(self.output_tok_per_s),
            "total_token_throughput": num(self.total_tok_per_s),
            "ttft_ms": self.ttft_ms.to_json(),
            "tpot_ms": self.tpot_ms.to_json(),
            "e2e_ms": self.e2e_ms.to_json(),
            "slo_ttft_ms": self.slo_ttft_ms,
            "slo_tpot_ms": self.slo_tpot_ms,
            "slo_met": self.slo_met,
            "goodput": num(self.goodput_req_per_s),
            "first_error": self.first_error,
            "valid": self.validity.as_ref().map(|v| v.valid),
            "invalid": self.validity.as_ref().map(|v| v.invalid),
            "truncated": self.validity.as_ref().map(|v| v.truncated),
            "first_invalid": self.validity.as_ref().and_then(|v| v.first_invalid.clone()),
        })
    }

    /// The human-readable report.
    pub fn table(&self, endpoint: Endpoint, model: Option<&str>) -> String {
        let mut s = String::new();
        let mut row = |k: &str, v: String| s.push_str(&format!("{k:<34}{v}\n"));
        row(
            "Endpoint / model:",
            format!(
                "{} / {}",
                endpoint.path(),
                model.unwrap_or("(server default)")
            ),
        );
        row("Load:", self.load.label());
        row(
            "Requests completed / failed:",
            format!("{} / {}", self.completed, self.failed),
        );
        row("Duration (s):", format!("{:.2}", self.duration_s));
        row(
            if self.input_tokens_exact {
                "Input / output tokens:"
            } else {
                "Input (est.) / output tokens:"
            },
            format!("{} / {}", self.input_tokens, self.output_tokens),
        );
        row(
            "Request throughput (req/s):",
            format!("{:.2}", self.req_per_s),
        );
        row(
            "Output token throughput (tok/s):",
            format!("{:.1}", self.output_tok_per_s),
        );
        row(
            "Total token throughput (tok/s):",
            format!("{:.1}", self.total_tok_per_s),
        );
        s.push_str(&format!(
            "{:<14}{:>10}{:>10}{:>10}{:>10}\n",
            "", "mean", "p50", "p90", "p99"
        ));
        for (name, m) in [
            ("TTFT (ms)", self.ttft_ms),
            ("TPOT (ms)", self.tpot_ms),
            ("E2E (ms)", self.e2e_ms),
        ] {
            s.push_str(&format!(
                "{name:<14}{:>10}{:>10}{:>10}{:>10}\n",
                fmt1(m.mean),
                fmt1(m.p50),
                fmt1(m.p90),
                fmt1(m.p99)
            ));
        }
        s.push_str(&format!(
            "{:<34}{:.2} ({}/{} requests with TTFT <= {} ms and TPOT <= {} ms)\n",
            "Goodput (req/s):",
            self.goodput_req_per_s,
            self.slo_met,
            self.completed,
            self.slo_ttft_ms,
            self.slo_tpot_ms
        ));
        if let Some(v) = &self.validity {
            s.push_str(&format!(
                "{:<34}{}\n",
                "Outputs vs response_format:",
                v.line()
            ));
            if let Some(w) = &v.first_invalid {
                s.push_str(&format!("{:<34}{w}\n", "First invalid output:"));
            }
        }
        if let Some(e) = &self.first_error {
            s.push_str(&format!("{:<34}{e}\n", "First error:"));
        }
        s
    }
}

/// One decimal, or `-` when not finite.
pub(crate) fn fmt1(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.1}")
    } else {
        "-".into()
    }
}

/// One line per measurement of a sweep.
pub fn sweep_table(runs: &[RunStats]) -> String {
    let mut s = format!(
        "{:>6} {:>5} {:>5} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8}\n",
        "conc",
        "ok",
        "fail",
        "req/s",
        "out tok/s",
        "ttft p50",
        "ttft p99",
        "tpot p50",
        "tpot p99",
        "e2e p50",
        "e2e p99",
        "goodput"
    );
    let checked = runs.iter().any(|r| r.validity.is_some());
    if checked {
        s.insert_str(s.len() - 1, &format!(" {:>7}", "valid%"));
    }
    for r in runs {
        let conc = match r.load {
            Load::Concurrency(c) => c.to_string(),
            Load::Rate { .. } => "-".into(),
        };
        s.push_str(&format!(
            "{conc:>6} {:>5} {:>5} {:>8.2} {:>9.1} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8.2}\n",
            r.completed,
            r.failed,
            r.req_per_s,
            r.output_tok_per_s,
            fmt1(r.ttft_ms.p50),
            fmt1(r.ttft_ms.p99),
            fmt1(r.tpot_ms.p50),
            fmt1(r.tpot_ms.p99),
            fmt1(r.e2e_ms.p50),
            fmt1(r.e2e_ms.p99),
            r.goodput_req_per_s
        ));
        if checked {
            let pct = r.validity.as_ref().map_or(f64::NAN, Validity::percent);
            s.insert_str(s.len() - 1, &format!(" {:>7}", fmt1(pct)));
        }
    }
    s
}

/// The outcomes' start offsets and a value of each completed request, for charts.
pub fn per_request<F: Fn(&Timing) -> Option<f64>>(outcomes: &[Outcome], f: F) -> Vec<(f64, f64)> {
    outcomes
        .iter()
        .filter_map(|o| o.result.as_ref().ok().and_then(&f).map(|y| (o.start, y)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 50.0), 2.5);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&v, 100.0), 4.0);
        assert!((percentile(&v, 90.0) - 3.7).abs() < 1e-12);
        assert!((percentile(&v, 99.0) - 3.97).abs() < 1e-12);
        // Order does not matter; non-finite values are ignored.
        assert_eq!(percentile(&[4.0, f64::NAN, 1.0, 3.0, 2.0], 50.0), 2.5);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert!(percentile(&[], 50.0).is_nan());
        assert_eq!(mean(&[1.0, 2.0, 6.0]), 3.0);
        assert!(mean(&[]).is_nan());
        let s = Summary::of_secs(&[0.001, 0.002, 0.003]);
        assert!((s.p50 - 2.0).abs() < 1e-9 && (s.mean - 2.0).abs() < 1e-9);
    }

    #[test]
    fn summary_and_goodput() {
        let t = |ttft: f64, tpot: Option<f64>, n: usize| {
            Ok(Timing {
                ttft,
                tpot,
                e2e: ttft + tpot.unwrap_or(0.0) * (n as f64 - 1.0),
                output_tokens: n,
                prompt_tokens: 10,
                prompt_tokens_exact: true,
                verdict: None,
            })
        };
        let outcomes = vec![
            Outcome {
                index: 0,
                start: 0.0,
                result: t(0.5, Some(0.05), 11),
            },
            Outcome {
                index: 1,
                start: 0.1,
                result: t(2.0, Some(0.05), 11),
            }, // TTFT miss
            Outcome {
                index: 2,
                start: 0.2,
                result: t(0.5, Some(0.2), 11),
            }, // TPOT miss
            Outcome {
                index: 3,
                start: 0.3,
                result: t(0.5, None, 1),
            }, // one token: ok
            Outcome {
                index: 5,
                start: 0.4,
                result: Err("second".into()),
            },
            Outcome {
                index: 4,
                start: 0.4,
                result: Err("first".into()),
            },
        ];
        let s = summarize(Load::Concurrency(2), &outcomes, 2.0, 1000.0, 100.0);
        assert_eq!((s.completed, s.failed, s.slo_met), (4, 2, 2));
        assert_eq!(s.goodput_req_per_s, 1.0);
        assert_eq!(s.req_per_s, 2.0);
        assert_eq!(s.output_tokens, 34);
        assert_eq!(s.output_tok_per_s, 17.0);
        assert_eq!(s.total_tok_per_s, 37.0);
        assert_eq!(s.first_error.as_deref(), Some("first"));
        assert!((s.ttft_ms.p50 - 500.0).abs() < 1e-9);
        assert!((s.tpot_ms.p50 - 50.0).abs() < 1e-9);
        let j = s.to_json(Endpoint::Completions, Some("m"));
        assert_eq!(j["completed"], 4);
        assert_eq!(j["goodput"], 1.0);
        assert!(s.table(Endpoint::Completions, None).contains("Goodput"));
        // Nothing completed: NaN figures become null, nothing panics.
        let e = summarize(Load::Concurrency(1), &outcomes[4..], 1.0, 1000.0, 100.0);
        assert_eq!(e.completed, 0);
        assert!(e.to_json(Endpoint::Chat, None)["ttft_ms"]["p50"].is_null());
        assert!(sweep_table(&[s.clone(), e]).lines().count() == 3);
        assert_eq!(per_request(&outcomes, |t| t.tpot).len(), 3);
        // Without --response-format: no validity figures, null in JSON, no column.
        assert_eq!(s.validity, None);
        assert!(j["valid"].is_null() && j["truncated"].is_null());
        assert!(!s.table(Endpoint::Chat, None).contains("valid:"));
        assert!(!sweep_table(&[s]).contains("valid%"));
    }

    #[test]
    fn validity_in_the_reports() {
        let t = |verdict: Verdict| Outcome {
            index: 0,
            start: 0.0,
            result: Ok(Timing {
                ttft: 0.1,
                tpot: Some(0.01),
                e2e: 0.5,
                output_tokens: 41,
                prompt_tokens: 10,
                prompt_tokens_exact: true,
                verdict: Some(verdict),
            }),
        };
        let mut outcomes = vec![
            t(Verdict::Valid),
            t(Verdict::Truncated),
            t(Verdict::Valid),
            t(Verdict::Invalid("schema: x".into())),
            t(Verdict::Valid),
        ];
        // A failed request has no output to check: it is not counted.
        outcomes.push(Outcome {
            index: 5,
            start: 0.0,
            result: Err("HTTP 500".into()),
        });
        for (i, o) in outcomes.iter_mut().enumerate() {
            o.index = i;
        }
        let s = summarize(Load::Concurrency(16), &outcomes, 1.0, 1000.0, 100.0);
        let v = s.validity.clone().unwrap();
        assert_eq!((v.checked, v.valid, v.invalid, v.truncated), (5, 3, 2, 1));
        let j = s.to_json(Endpoint::Chat, Some("m"));
        assert_eq!(
            (j["valid"].as_u64(), j["invalid"].as_u64()),
            (Some(3), Some(2))
        );
        assert_eq!(j["truncated"], 1);
        assert_eq!(j["first_invalid"], "schema: x");
        let table = s.table(Endpoint::Chat, Some("m"));
        assert!(
            table.contains("valid: 3/5 (60.0%); invalid 2, of which 1 cut by max_tokens"),
            "{table}"
        );
        assert!(table.contains("First invalid output:") && table.contains("schema: x"));
        let sweep = sweep_table(&[s.clone(), s]);
        assert!(sweep
            .lines()
            .all(|l| l.ends_with("valid%") || l.ends_with("60.0")));
    }
}
