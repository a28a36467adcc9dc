//! `tessera bench serve --scenario long-prefill`: how long a short request waits for its
//! first token while long prompts prefill, against the same request on the idle server.
//!
//! 1. One untimed short request (warm-up), then `idle_samples` short requests one after
//!    another: the idle TTFT.
//! 2. `long_prompts` requests of `long_prompt_tokens` random words sent at once; while any of
//!    them runs, short requests arrive on their own clock, one every `gap_ms` on average
//!    (uniformly 0.5 to 1.5 times it apart, whether or not the last one has finished), so
//!    they arrive at every phase of the prefill steps and every server sees the same
//!    arrivals. A short request counts as *during* the prefill when it was sent before the
//!    last long prompt's first token; its row also says how many long prompts were still
//!    prefilling then.
//!
//! Every short prompt is a fresh draw of random words, so no request hits the prefix cache.
//! The report: the medians idle and during (and by how many long prompts were prefilling),
//! their ratio against the target, and the long prompts' own TTFT and completion times.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use super::requests::{build_prompt, ReqSpec};
use super::runner::{connect, runtime, Client};
use super::stats::{num, percentile, Outcome, Summary};
use super::Endpoint;

#[derive(Debug, Clone)]
pub struct LongPrefillConfig {
    pub url: String,
    pub model: Option<String>,
    pub api_key: Option<String>,
    pub endpoint: Endpoint,
    pub temperature: f64,
    pub timeout: Duration,
    pub seed: u64,
    pub json: bool,
    pub long_prompts: usize,
    pub long_prompt_tokens: usize,
    pub short_prompt_tokens: usize,
    /// Output tokens of every request (the long prompts' too).
    pub output_tokens: usize,
    pub idle_samples: usize,
    pub gap_ms: f64,
    /// The ratio during / idle the report checks against.
    pub target_ratio: f64,
}

/// A short request sent during the long prompts' run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Seconds since the long prompts were sent.
    pub sent: f64,
    pub ttft: f64,
    /// Long prompts still without their first token when it was sent.
    pub prefilling: usize,
}

/// The samples sent while at least one long prompt prefilled, each with how many did:
/// `shorts` are `(sent, ttft)` and `long_first` each long prompt's first-token time, all in
/// seconds since the long prompts were sent.
pub fn classify(shorts: &[(f64, f64)], long_first: &[f64]) -> Vec<Sample> {
    shorts
        .iter()
        .filter_map(|&(sent, ttft)| {
            let prefilling = long_first.iter().filter(|&&f| f > sent).count();
            (prefilling > 0).then_some(Sample {
                sent,
                ttft,
                prefilling,
            })
        })
        .collect()
}

/// What the scenario measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub idle_ttft: Vec<f64>,
    pub during: Vec<Sample>,
    /// Each long prompt's prompt tokens (from the usage), TTFT and end-to-end seconds.
    pub longs: Vec<(usize, f64, f64)>,
    pub failed: usize,
    pub first_error: Option<String>,
}

impl Report {
    pub fn idle_p50_ms(&self) -> f64 {
        percentile(&self.idle_ttft, 50.0) * 1e3
    }
    pub fn during_ms(&self, prefilling: Option<usize>) -> Summary {
        let v: Vec<f64> = self
            .during
            .iter()
            .filter(|s| prefilling.is_none_or(|n| s.prefilling == n))
            .map(|s| s.ttft)
            .collect();
        Summary::of_secs(&v)
    }
    /// Median TTFT during the prefill over median idle.
    pub fn ratio(&self) -> f64 {
        self.during_ms(None).p50 / self.idle_p50_ms()
    }

    pub fn to_json(&self, cfg: &LongPrefillConfig, model: Option<&str>) -> Value {
        let by: Vec<Value> = (1..=cfg.long_prompts)
            .rev()
            .map(|n| {
                let s = self.during_ms(Some(n));
                let count = self.during.iter().filter(|x| x.prefilling == n).count();
                json!({"prefilling": n, "count": count, "ttft_ms": s.to_json()})
            })
            .collect();
        json!({
            "scenario": "long-prefill",
            "model": model,
            "endpoint": cfg.endpoint.name(),
            "long_prompts": cfg.long_prompts,
            "long_prompt_tokens": self.longs.iter().map(|l| l.0).collect::<Vec<_>>(),
            "short_prompt_tokens": cfg.short_prompt_tokens,
            "output_tokens": cfg.output_tokens,
            "idle_ttft_ms": Summary::of_secs(&self.idle_ttft).to_json(),
            "idle_count": self.idle_ttft.len(),
            "during_ttft_ms": self.during_ms(None).to_json(),
            "during_count": self.during.len(),
            "during_by_prefilling": by,
            "ratio_p50": num(self.ratio()),
            "target_ratio": cfg.target_ratio,
            "long_ttft_s": self.longs.iter().map(|l| num(l.1)).collect::<Vec<_>>(),
            "long_e2e_s": self.longs.iter().map(|l| num(l.2)).collect::<Vec<_>>(),
            "failed": self.failed,
        })
    }

    pub fn table(&self, cfg: &LongPrefillConfig, model: Option<&str>) -> String {
        let mut s = String::new();
        let line = |s: &mut String, k: &str, v: String| s.push_str(&format!("{k:<34}{v}\n"));
        line(
            &mut s,
            "Scenario / model:",
            format!("long-prefill / {}", model.unwrap_or("-")),
        );
        let toks: Vec<String> = self.longs.iter().map(|l| l.0.to_string()).collect();
        line(
            &mut s,
            "Long prompts (tokens):",
            format!("{} ({})", cfg.long_prompts, toks.join(", ")),
        );
        line(
            &mut s,
            "Short request:",
            format!(
                "~{} prompt tokens, {} output tokens",
                cfg.short_prompt_tokens, cfg.output_tokens
            ),
        );
        s.push_str("                         count       p50       p90       max\n");
        let row = |s: &mut String, name: &str, n: usize, v: Summary, max: f64| {
            s.push_str(&format!(
                "{name:<20}{n:>10}{:>10.1}{:>10.1}{max:>10.1}\n",
                v.p50, v.p90
            ))
        };
        let max_ms = |v: &[f64]| v.iter().copied().fold(f64::NAN, f64::max) * 1e3;
        row(
            &mut s,
            "TTFT idle (ms)",
            self.idle_ttft.len(),
            Summary::of_secs(&self.idle_ttft),
            max_ms(&self.idle_ttft),
        );
        let all: Vec<f64> = self.during.iter().map(|x| x.ttft).collect();
        row(
            &mut s,
            "TTFT during (ms)",
            all.len(),
            self.during_ms(None),
            max_ms(&all),
        );
        for n in (1..=cfg.long_prompts).rev() {
            let v: Vec<f64> = self
                .during
                .iter()
                .filter(|x| x.prefilling == n)
                .map(|x| x.ttft)
                .collect();
            if !v.is_empty() {
                let name = format!("  {n} prefilling");
                row(&mut s, &name, v.len(), self.during_ms(Some(n)), max_ms(&v));
            }
        }
        let r = self.ratio();
        let verdict = if r <= cfg.target_ratio {
            "met"
        } else {
            "not met"
        };
        line(
            &mut s,
            "TTFT p50 during / idle:",
            format!("{r:.2}x (target <= {}x: {verdict})", cfg.target_ratio),
        );
        let firsts: Vec<String> = self.longs.iter().map(|l| format!("{:.1}", l.1)).collect();
        let ends: Vec<String> = self.longs.iter().map(|l| format!("{:.1}", l.2)).collect();
        line(&mut s, "Long prompts' TTFT (s):", firsts.join(", "));
        line(&mut s, "Long prompts' completion (s):", ends.join(", "));
        s
    }
}

fn short_spec(rng: &mut StdRng, index: usize, cfg: &LongPrefillConfig) -> ReqSpec {
    ReqSpec {
        index,
        prompt: build_prompt(rng, cfg.short_prompt_tokens),
        prompt_tokens_est: cfg.short_prompt_tokens,
        max_tokens: cfg.output_tokens,
    }
}

/// The pause between short requests: uniformly 0.5 to 1.5 times `gap_ms`.
fn gap(rng: &mut StdRng, cfg: &LongPrefillConfig) -> Duration {
    Duration::from_secs_f64(rng.gen_range(0.5..=1.5) * cfg.gap_ms.max(0.0) * 1e-3)
}

async fn measure(client: Client, cfg: &LongPrefillConfig) -> Result<Report> {
    let client = std::sync::Arc::new(client);
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let mut failed = Vec::new();
    let t0 = Instant::now();
    let mut index = 0;
    let mut next = |rng: &mut StdRng| {
        index += 1;
        short_spec(rng, index, cfg)
    };
    // Warm-up, then idle samples.
    let _ = client.send(&next(&mut rng), t0).await;
    let mut idle_ttft = Vec::new();
    for _ in 0..cfg.idle_samples {
        match client.send(&next(&mut rng), t0).await.result {
            Ok(t) => idle_ttft.push(t.ttft),
            Err(e) => failed.push(e),
        }
        tokio::time::sleep(gap(&mut rng, cfg)).await;
    }
    // The long prompts, all at once; short requests while any runs.
    let t1 = Instant::now();
    let mut longs = tokio::task::JoinSet::new();
    for i in 0..cfg.long_prompts {
        let spec = ReqSpec {
            index: 1_000_000 + i,
            prompt: build_prompt(&mut rng, cfg.long_prompt_tokens),
            prompt_tokens_est: cfg.long_prompt_tokens,
            max_tokens: cfg.output_tokens,
        };
        let c = client.clone();
        longs.spawn(async move { c.send(&spec, t1).await });
    }
    let mut shorts = Vec::new();
    let mut long_outcomes: Vec<Outcome> = Vec::new();
    let mut sent = tokio::task::JoinSet::new();
    while !longs.is_empty() {
        let spec = next(&mut rng);
        let c = client.clone();
        sent.spawn(async move { c.send(&spec, t1).await });
        tokio::time::sleep(gap(&mut rng, cfg)).await;
        while let Some(done) = longs.try_join_next() {
            longs_done(done, &mut failed, &mut long_outcomes);
        }
    }
    while let Some(done) = sent.join_next().await {
        match done {
            Ok(o) => match o.result {
                Ok(t) => shorts.push((o.start, t.ttft)),
                Err(e) => failed.push(e),
            },
            Err(e) => failed.push(format!("a short-request task failed: {e}")),
        }
    }
    Ok(finish(idle_ttft, shorts, long_outcomes, failed))
}

/// Records a joined long-prompt task.
fn longs_done(
    done: std::result::Result<Outcome, tokio::task::JoinError>,
    failed: &mut Vec<String>,
    out: &mut Vec<Outcome>,
) {
    match done {
        Ok(o) => out.push(o),
        Err(e) => failed.push(format!("a long-prompt task failed: {e}")),
    }
}

fn finish(
    idle_ttft: Vec<f64>,
    shorts: Vec<(f64, f64)>,
    long_outcomes: Vec<Outcome>,
    mut failed: Vec<String>,
) -> Report {
    let mut longs = Vec::new();
    for o in long_outcomes {
        match o.result {
            Ok(t) => longs.push((t.prompt_tokens, o.start + t.ttft, o.start + t.e2e)),
            Err(e) => failed.push(format!("long prompt: {e}")),
        }
    }
    let firsts: Vec<f64> = longs.iter().map(|l| l.1).collect();
    Report {
        idle_ttft,
        during: classify(&shorts, &firsts),
        longs,
        failed: failed.len(),
        first_error: failed.into_iter().next(),
    }
}

/// Runs the scenario and prints its report.
pub fn run_long_prefill(cfg: &LongPrefillConfig) -> Result<()> {
    if cfg.long_prompts == 0 || cfg.long_prompt_tokens == 0 || cfg.short_prompt_tokens == 0 {
        bail!("--long-prompts, --long-prompt-tokens and --short-prompt-tokens must be positive");
    }
    if cfg.output_tokens == 0 || cfg.idle_samples == 0 {
        bail!("--short-output-tokens and --idle-samples must be positive");
    }
    if !(cfg.gap_ms.is_finite() && cfg.gap_ms >= 0.0) {
        bail!("--short-gap-ms must be a non-negative number of milliseconds");
    }
    runtime()?.block_on(async {
        let (client, model) = connect(
            &cfg.url,
            cfg.api_key.clone(),
            cfg.model.clone(),
            None,
            cfg.endpoint,
            cfg.temperature,
            cfg.timeout,
        )
        .await?;
        let report = measure(client, cfg).await?;
        if cfg.json {
            println!("{}", report.to_json(cfg, model.as_deref()));
        } else {
            print!("{}", report.table(cfg, model.as_deref()));
        }
        if report.failed > 0 {
            eprintln!(
                "{} requests failed; first error: {}",
                report.failed,
                report.first_error.as_deref().unwrap_or("?")
            );
        }
        if report.idle_ttft.is_empty() || report.during.is_empty() || report.longs.is_empty() {
            bail!("the scenario measured nothing to compare (see the errors above)");
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_count_while_any_long_prompt_prefills() {
        // Long prompts got their first token at 5 s, 9 s and 12 s.
        let firsts = [9.0, 5.0, 12.0];
        let shorts = [(0.5, 0.1), (6.0, 0.2), (9.5, 0.3), (12.0, 0.4), (13.0, 0.5)];
        let s = classify(&shorts, &firsts);
        let got: Vec<(f64, usize)> = s.iter().map(|x| (x.sent, x.prefilling)).collect();
        assert_eq!(got, [(0.5, 3), (6.0, 2), (9.5, 1)]);
    }

    #[test]
    fn the_report_compares_medians() {
        let r = Report {
            idle_ttft: vec![0.05, 0.06, 0.04],
            during: [0.1, 0.08, 0.2, 0.09]
                .iter()
                .enumerate()
                .map(|(i, &t)| Sample {
                    sent: i as f64,
                    ttft: t,
                    prefilling: 1 + i % 2,
                })
                .collect(),
            longs: vec![(3600, 40.0, 41.0)],
            failed: 0,
            first_error: None,
        };
        assert!((r.idle_p50_ms() - 50.0).abs() < 1e-9);
        assert!((r.during_ms(None).p50 - 95.0).abs() < 1e-9);
        assert!((r.ratio() - 1.9).abs() < 1e-9);
        assert!((r.during_ms(Some(2)).p50 - 85.0).abs() < 1e-9);
        let cfg = LongPrefillConfig {
            url: "http://h:1".into(),
            model: None,
            api_key: None,
            endpoint: Endpoint::Completions,
            temperature: 0.0,
            timeout: Duration::from_secs(1),
            seed: 1,
            json: true,
            long_prompts: 2,
            long_prompt_tokens: 3600,
            short_prompt_tokens: 30,
            output_tokens: 4,
            idle_samples: 3,
            gap_ms: 100.0,
            target_ratio: 2.0,
        };
        let j = r.to_json(&cfg, Some("m"));
        assert_eq!(j["during_count"], 4);
        assert_eq!(j["during_by_prefilling"][0]["prefilling"], 2);
        assert_eq!(j["during_by_prefilling"][0]["count"], 2);
        let t = r.table(&cfg, Some("m"));
        assert!(t.contains("1.90x (target <= 2x: met)"), "{t}");
    }
}
