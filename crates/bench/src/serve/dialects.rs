//! `tessera bench serve --api chat,responses,messages`: one server's dialects under the
//! same load, compared.
//!
//! Each round measures every API in turn with the same load, prompt lengths and output
//! lengths; rounds interleave the APIs so that drift of the machine touches them alike, and
//! the order rotates from round to round so that no API always goes first or last.
//! Every (round, API) measurement draws its own prompts (the seed is offset per
//! measurement): the same prompts sent again would be served by the prefix cache and favour
//! whichever API came second. The report: per API, the medians over rounds of output
//! tokens/s and of the TPOT and TTFT medians, each as a ratio to the first API, and the
//! spread (largest over smallest) against a tolerance (3%).

use anyhow::{anyhow, bail, Result};
use serde_json::{json, Value};

use super::runner::{connect, measure_once, prepare, runtime, warm_up};
use super::stats::{num, percentile, summarize, RunStats};
use super::{Endpoint, ServeConfig};

/// The order of the APIs in round `round`: rotated by one each round, so that every API
/// takes every place in turn (the first measurement of a round, or the one after a given
/// other, is not always the same API's).
pub fn rotation(n: usize, round: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |j| (j + round) % n.max(1))
}

/// The per-API medians over rounds.
#[derive(Debug, Clone, PartialEq)]
pub struct DialectSummary {
    pub api: Endpoint,
    pub rounds: usize,
    pub output_tok_per_s: f64,
    pub tpot_p50_ms: f64,
    pub ttft_p50_ms: f64,
    pub failed: usize,
}

/// The medians of each API's rounds (`runs`: (API, figures) in any order).
pub fn summarize_dialects(apis: &[Endpoint], runs: &[(Endpoint, RunStats)]) -> Vec<DialectSummary> {
    apis.iter()
        .map(|&api| {
            let mine: Vec<&RunStats> = runs.iter().filter(|r| r.0 == api).map(|r| &r.1).collect();
            let med = |f: &dyn Fn(&RunStats) -> f64| {
                let v: Vec<f64> = mine
                    .iter()
                    .map(|r| f(r))
                    .filter(|x| x.is_finite())
                    .collect();
                if v.is_empty() {
                    f64::NAN
                } else {
                    percentile(&v, 50.0)
                }
            };
            DialectSummary {
                api,
                rounds: mine.len(),
                output_tok_per_s: med(&|r| r.output_tok_per_s),
                tpot_p50_ms: med(&|r| r.tpot_ms.p50),
                ttft_p50_ms: med(&|r| r.ttft_ms.p50),
                failed: mine.iter().map(|r| r.failed).sum(),
            }
        })
        .collect()
}

/// Largest over smallest of the finite values (NaN with fewer than one).
pub fn spread(values: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = values.filter(|x| x.is_finite() && *x > 0.0).collect();
    let max = v.iter().copied().fold(f64::NAN, f64::max);
    let min = v.iter().copied().fold(f64::NAN, f64::min);
    max / min
}

/// The comparison table; `tolerance` is the allowed spread (0.03: within 3%).
pub fn table(summaries: &[DialectSummary], tolerance: f64, label: &str) -> String {
    let mut s = format!("Dialects compared at {label}, medians over rounds:\n");
    s.push_str(&format!(
        "{:<14}{:>7}{:>14}{:>8}{:>11}{:>8}{:>11}{:>8}\n",
        "api", "rounds", "output tok/s", "ratio", "TPOT ms", "ratio", "TTFT ms", "ratio"
    ));
    let first = summaries.first();
    for d in summaries {
        let r = |x: f64, f: Option<f64>| f.map_or(f64::NAN, |f| x / f);
        s.push_str(&format!(
            "{:<14}{:>7}{:>14.1}{:>8.3}{:>11.2}{:>8.3}{:>11.1}{:>8.3}\n",
            d.api.name(),
            d.rounds,
            d.output_tok_per_s,
            r(d.output_tok_per_s, first.map(|f| f.output_tok_per_s)),
            d.tpot_p50_ms,
            r(d.tpot_p50_ms, first.map(|f| f.tpot_p50_ms)),
            d.ttft_p50_ms,
            r(d.ttft_p50_ms, first.map(|f| f.ttft_p50_ms)),
        ));
    }
    for (what, sp) in [
        (
            "throughput",
            spread(summaries.iter().map(|d| d.output_tok_per_s)),
        ),
        ("TPOT", spread(summaries.iter().map(|d| d.tpot_p50_ms))),
    ] {
        let verdict = if sp - 1.0 <= tolerance {
            "within"
        } else {
            "outside"
        };
        s.push_str(&format!(
            "Spread of {what} (largest / smallest): {sp:.3} ({verdict} {:.0}%)\n",
            tolerance * 100.0
        ));
    }
    let failed: usize = summaries.iter().map(|d| d.failed).sum();
    if failed > 0 {
        s.push_str(&format!("Failed requests: {failed}\n"));
    }
    s
}

fn to_json(summaries: &[DialectSummary], tolerance: f64) -> Value {
    let rows: Vec<Value> = summaries
        .iter()
        .map(|d| {
            json!({"api": d.api.name(), "rounds": d.rounds,
                "output_tok_per_s": num(d.output_tok_per_s), "tpot_p50_ms": num(d.tpot_p50_ms),
                "ttft_p50_ms": num(d.ttft_p50_ms), "failed": d.failed})
        })
        .collect();
    json!({
        "comparison": "dialects",
        "apis": rows,
        "throughput_spread": num(spread(summaries.iter().map(|d| d.output_tok_per_s))),
        "tpot_spread": num(spread(summaries.iter().map(|d| d.tpot_p50_ms))),
        "tolerance": tolerance,
    })
}

/// Runs every API of `apis` for `rounds` rounds under `cfg`'s single load and prints the
/// comparison (and, with `--json`, one row per measurement and the summary).
pub fn run_dialects(cfg: &ServeConfig, apis: &[Endpoint], rounds: usize) -> Result<()> {
    if rounds == 0 {
        bail!("--rounds must be positive");
    }
    let [load] = cfg.loads[..] else {
        bail!("comparing APIs takes one load (--concurrency or --rate), not --sweep");
    };
    if cfg.prompt_file.is_some() {
        bail!(
            "comparing APIs draws fresh prompts for each measurement (a prompt file's would \
             repeat and be served by the prefix cache): use --prompt-tokens"
        );
    }
    if cfg.response_format.is_some() && apis.contains(&Endpoint::Messages) {
        bail!("--response-format is not available with --api messages");
    }
    let response_format = prepare(cfg)?.1.map(std::sync::Arc::new);
    runtime()?.block_on(async {
        let mut clients = vec![];
        let mut model = None;
        for &api in apis {
            let (c, m) = connect(
                &cfg.url,
                cfg.api_key.clone(),
                cfg.model.clone(),
                cfg.adapters.clone(),
                api,
                cfg.temperature,
                cfg.timeout,
            )
            .await?;
            model = m;
            let c = c.with_response_format(response_format.clone());
            if cfg.warmup > 0 {
                warm_up(&c, cfg, cfg.seed ^ 0x5eed ^ (api as u64) << 32, None).await;
            }
            clients.push(Some(c));
        }
        let mut runs = vec![];
        for round in 0..rounds {
            for j in rotation(apis.len(), round) {
                let api = apis[j];
                let label = format!("[round {}/{rounds}] {}", round + 1, api.name());
                let seed = cfg.seed.wrapping_add(((round * apis.len() + j) as u64) << 20);
                let c = clients[j].take().ok_or_else(|| anyhow!("no client"))?;
                let (c, outcomes, secs) = measure_once(c, cfg, load, seed, None, &label).await?;
                clients[j] = Some(c);
                let stats = summarize(load, &outcomes, secs, cfg.slo_ttft_ms, cfg.slo_tpot_ms);
                if cfg.json {
                    let mut row = stats.to_json(api, model.as_deref());
                    row["round"] = json!(round + 1);
                    println!("{row}");
                } else {
                    eprintln!(
                        "{label}: {:.1} output tok/s, TPOT p50 {:.2} ms, TTFT p50 {:.1} ms, {} failed",
                        stats.output_tok_per_s, stats.tpot_ms.p50, stats.ttft_ms.p50, stats.failed
                    );
                }
                if let Some(e) = &stats.first_error {
                    eprintln!("{label}: first error: {e}");
                }
                runs.push((api, stats));
            }
        }
        let summaries = summarize_dialects(apis, &runs);
        if cfg.json {
            println!("{}", to_json(&summaries, 0.03));
        } else {
            print!("{}", table(&summaries, 0.03, &load.label()));
        }
        if runs.iter().all(|r| r.1.completed == 0) {
            bail!("no request completed");
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::stats::{summarize, Outcome, Timing};
    use crate::serve::Load;

    fn run(tok_per_s_scale: f64, tpot: f64) -> RunStats {
        let outcomes: Vec<Outcome> = (0..4)
            .map(|i| Outcome {
                index: i,
                start: 0.0,
                result: Ok(Timing {
                    ttft: 0.1,
                    tpot: Some(tpot),
                    e2e: 1.0,
                    output_tokens: 10,
                    prompt_tokens: 5,
                    prompt_tokens_exact: true,
                    verdict: None,
                }),
            })
            .collect();
        summarize(
            Load::Concurrency(4),
            &outcomes,
            1.0 / tok_per_s_scale,
            1e9,
            1e9,
        )
    }

    #[test]
    fn every_api_takes_every_place() {
        let orders: Vec<Vec<usize>> = (0..4).map(|r| rotation(3, r).collect()).collect();
        assert_eq!(
            orders,
            [vec![0, 1, 2], vec![1, 2, 0], vec![2, 0, 1], vec![0, 1, 2]]
        );
        assert_eq!(rotation(1, 5).collect::<Vec<_>>(), [0]);
    }

    #[test]
    fn medians_over_rounds_and_the_spread() {
        let apis = [Endpoint::Chat, Endpoint::Responses, Endpoint::Messages];
        let runs = vec![
            (Endpoint::Chat, run(1.0, 0.020)),
            (Endpoint::Responses, run(1.01, 0.020)),
            (Endpoint::Messages, run(0.99, 0.0202)),
            (Endpoint::Chat, run(1.02, 0.021)),
            (Endpoint::Responses, run(5.0, 0.019)),
            (Endpoint::Messages, run(1.0, 0.020)),
            (Endpoint::Chat, run(0.98, 0.020)),
            (Endpoint::Responses, run(1.0, 0.020)),
            (Endpoint::Messages, run(1.01, 0.020)),
        ];
        let s = summarize_dialects(&apis, &runs);
        assert_eq!(s.len(), 3);
        assert!(s.iter().all(|d| d.rounds == 3));
        // 40 output tokens per run over 1/scale seconds: medians 40, 40.4 (the 5x outlier
        // is not the median), 40.
        assert!((s[0].output_tok_per_s - 40.0).abs() < 1e-9);
        assert!((s[1].output_tok_per_s - 40.4).abs() < 1e-9);
        assert!((s[2].tpot_p50_ms - 20.0).abs() < 1e-9);
        let t = table(&s, 0.03, "concurrency 4");
        assert!(
            t.contains("Spread of throughput (largest / smallest): 1.010 (within 3%)"),
            "{t}"
        );
        assert!(t.contains("responses"), "{t}");
        let j = to_json(&s, 0.03);
        assert_eq!(j["apis"][2]["api"], "messages");
        // A slow dialect is outside.
        let slow = vec![
            (Endpoint::Chat, run(1.0, 0.020)),
            (Endpoint::Messages, run(0.9, 0.025)),
        ];
        let s = summarize_dialects(&[Endpoint::Chat, Endpoint::Messages], &slow);
        assert!(table(&s, 0.03, "x").contains("(outside 3%)"));
        assert!(spread([1.0, f64::NAN, 2.0].into_iter()) == 2.0);
    }
}
