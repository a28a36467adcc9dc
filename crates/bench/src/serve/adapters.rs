//! `--adapters NAME,NAME,...`: requests spread round-robin over model names (a server's
//! LoRA adapters, and the base model's own name if listed), and the figures of each name
//! in a measurement: requests, output tokens/s, TTFT and TPOT percentiles.
//!
//! Request `i` of a measurement (and of the warm-up) asks for `names[i % names.len()]`, so
//! which name a request took follows from its index alone: [`per_adapter`] groups the
//! outcomes by it and summarizes each group with the same [`summarize`] as the totals. A
//! name's output tokens/s is its requests' output tokens over the whole measurement's wall
//! time, so the names' figures add up to the total.

use anyhow::{bail, Result};
use serde_json::{json, Value};

use super::stats::{fmt1, num, summarize, Outcome, RunStats};
use super::Load;

/// The model name request `index` asks for; `names` must not be empty.
pub fn adapter_for(names: &[String], index: usize) -> &str {
    &names[index % names.len()]
}

/// Checks an `--adapters` list: at least one name, none empty (names are trimmed).
pub fn parse_adapters(list: &[String]) -> Result<Vec<String>> {
    let names: Vec<String> = list.iter().map(|s| s.trim().to_string()).collect();
    if names.is_empty() {
        bail!("--adapters needs at least one model name");
    }
    if names.iter().any(String::is_empty) {
        bail!("--adapters holds an empty name ({:?})", list.join(","));
    }
    Ok(names)
}

/// The names in first-seen order, each once.
pub fn distinct(names: &[String]) -> Vec<&str> {
    let mut v: Vec<&str> = Vec::new();
    for n in names {
        if !v.contains(&n.as_str()) {
            v.push(n);
        }
    }
    v
}

/// The figures of one model name in a measurement.
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterStats {
    pub model: String,
    /// Requests sent with this name (completed and failed).
    pub requests: usize,
    /// This name's requests summarized as a measurement of the whole wall time.
    pub stats: RunStats,
}

/// One entry per distinct name of `names`, in first-seen order (a name that got no request
/// is listed with zero requests).
pub fn per_adapter(
    names: &[String],
    load: Load,
    outcomes: &[Outcome],
    duration_s: f64,
    slo_ttft_ms: f64,
    slo_tpot_ms: f64,
) -> Vec<AdapterStats> {
    if names.is_empty() {
        return vec![];
    }
    distinct(names)
        .into_iter()
        .map(|name| {
            let mine: Vec<Outcome> = outcomes
                .iter()
                .filter(|o| adapter_for(names, o.index) == name)
                .cloned()
                .collect();
            AdapterStats {
                model: name.to_string(),
                requests: mine.len(),
                stats: summarize(load, &mine, duration_s, slo_ttft_ms, slo_tpot_ms),
            }
        })
        .collect()
}

impl AdapterStats {
    pub fn to_json(&self) -> Value {
        let s = &self.stats;
        json!({
            "model": self.model,
            "requests": self.requests,
            "completed": s.completed,
            "failed": s.failed,
            "output_tokens": s.output_tokens,
            "request_throughput": num(s.req_per_s),
            "output_token_throughput": num(s.output_tok_per_s),
            "ttft_ms": s.ttft_ms.to_json(),
            "tpot_ms": s.tpot_ms.to_json(),
            "e2e_ms": s.e2e_ms.to_json(),
            "slo_met": s.slo_met,
            "goodput": num(s.goodput_req_per_s),
            "first_error": s.first_error,
        })
    }
}

/// Adds `adapters` (the names as given) and `per_adapter` (one object per distinct name)
/// to a measurement's JSON object.
pub fn add_to_json(row: &mut Value, names: &[String], per: &[AdapterStats]) {
    row["adapters"] = json!(names);
    row["per_adapter"] = Value::Array(per.iter().map(AdapterStats::to_json).collect());
}

/// The per-name part of the human-readable report.
pub fn table(names: &[String], per: &[AdapterStats]) -> String {
    let w = per
        .iter()
        .map(|a| a.model.chars().count())
        .max()
        .unwrap_or(0)
        .max(5);
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    let mut s = if names.len() == per.len() {
        format!(
            "Per model (requests round-robin over {} name{}):\n",
            per.len(),
            plural(per.len())
        )
    } else {
        format!(
            "Per model (requests round-robin over {} entries, {} name{}):\n",
            names.len(),
            per.len(),
            plural(per.len())
        )
    };
    s.push_str(&format!(
        "{:<w$} {:>5} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
        "model", "ok", "fail", "out tok/s", "ttft p50", "ttft p99", "tpot p50", "tpot p99"
    ));
    for a in per {
        let r = &a.stats;
        s.push_str(&format!(
            "{:<w$} {:>5} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
            a.model,
            r.completed,
            r.failed,
            fmt1(r.output_tok_per_s),
            fmt1(r.ttft_ms.p50),
            fmt1(r.ttft_ms.p99),
            fmt1(r.tpot_ms.p50),
            fmt1(r.tpot_ms.p99),
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::stats::Timing;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn ok(index: usize, ttft: f64, tokens: usize) -> Outcome {
        Outcome {
            index,
            start: index as f64 * 0.1,
            result: Ok(Timing {
                ttft,
                tpot: Some(0.01),
                e2e: ttft + 0.01 * (tokens as f64 - 1.0),
                output_tokens: tokens,
                prompt_tokens: 5,
                prompt_tokens_exact: true,
                verdict: None,
            }),
        }
    }

    #[test]
    fn round_robin_and_parsing() {
        let n = names(&["base", "a0", "a1"]);
        let got: Vec<&str> = (0..7).map(|i| adapter_for(&n, i)).collect();
        assert_eq!(got, ["base", "a0", "a1", "base", "a0", "a1", "base"]);
        assert_eq!(
            parse_adapters(&names(&[" a0", "a1 "])).unwrap(),
            names(&["a0", "a1"])
        );
        assert!(parse_adapters(&[]).is_err());
        assert!(parse_adapters(&names(&["a0", ""])).is_err());
        assert_eq!(distinct(&names(&["a", "b", "a", "c"])), ["a", "b", "c"]);
    }

    #[test]
    fn figures_per_name_add_up_to_the_totals() {
        let n = names(&["base", "a0", "a0", "a1"]);
        // Indices 0..8: base gets 0 and 4, a0 gets 1, 2, 5, 6, a1 gets 3 and 7 (failed).
        let mut outcomes: Vec<Outcome> = (0..7)
            .map(|i| ok(i, 0.1 * (i + 1) as f64, 10 + i))
            .collect();
        outcomes.push(Outcome {
            index: 7,
            start: 0.7,
            result: Err("boom".into()),
        });
        let load = Load::Concurrency(4);
        let total = summarize(load, &outcomes, 2.0, 1000.0, 100.0);
        let per = per_adapter(&n, load, &outcomes, 2.0, 1000.0, 100.0);
        assert_eq!(
            per.iter().map(|a| a.model.as_str()).collect::<Vec<_>>(),
            ["base", "a0", "a1"]
        );
        assert_eq!(
            per.iter().map(|a| a.requests).collect::<Vec<_>>(),
            [2, 4, 2]
        );
        assert_eq!(
            per.iter().map(|a| a.stats.completed).sum::<usize>(),
            total.completed
        );
        assert_eq!(
            per.iter().map(|a| a.stats.output_tokens).sum::<usize>(),
            total.output_tokens
        );
        let tps: f64 = per.iter().map(|a| a.stats.output_tok_per_s).sum();
        assert!((tps - total.output_tok_per_s).abs() < 1e-9);
        // base: TTFT 100 and 500 ms; its output tokens 10 + 14 over 2 s.
        assert!((per[0].stats.ttft_ms.p50 - 300.0).abs() < 1e-9);
        assert_eq!(per[0].stats.output_tok_per_s, 12.0);
        assert_eq!(per[2].stats.failed, 1);
        assert_eq!(per[2].stats.first_error.as_deref(), Some("boom"));

        let mut row = total.to_json(crate::serve::Endpoint::Completions, Some("base"));
        add_to_json(&mut row, &n, &per);
        assert_eq!(row["adapters"], json!(["base", "a0", "a0", "a1"]));
        let p = row["per_adapter"].as_array().unwrap();
        assert_eq!(p.len(), 3);
        assert_eq!(p[1]["model"], "a0");
        assert_eq!(p[1]["requests"], 4);
        assert_eq!(p[0]["output_token_throughput"], 12.0);
        assert!(p[0]["ttft_ms"]["p99"].is_number());
        assert!(p[0]["tpot_ms"]["p50"].is_number());
        // The totals are untouched.
        assert_eq!(row["completed"], 7);

        let t = table(&n, &per);
        assert_eq!(t.lines().count(), 5);
        assert!(t.contains("a1") && t.contains("ttft p99"));
    }

    #[test]
    fn a_name_without_requests_has_empty_figures() {
        let n = names(&["a", "b", "c"]);
        let outcomes = vec![ok(0, 0.1, 4)];
        let per = per_adapter(&n, Load::Concurrency(1), &outcomes, 1.0, 1000.0, 100.0);
        assert_eq!(per.len(), 3);
        assert_eq!(per[2].requests, 0);
        assert!(per[2].to_json()["ttft_ms"]["p50"].is_null());
        assert!(table(&n, &per).contains('-'));
        assert!(per_adapter(&[], Load::Concurrency(1), &outcomes, 1.0, 1.0, 1.0).is_empty());
    }
}
