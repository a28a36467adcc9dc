//! `tessera bench serve --scenario conversation`: what `previous_response_id` saves a
//! continued conversation on the Responses API.
//!
//! Each sample is one conversation. Its first turn sends a history of about
//! `history_tokens` random words (`store: true`) and gets an answer of `answer_tokens`
//! tokens. Then, one after another on the otherwise idle server, three requests each ask a
//! short follow-up question of the same length (each its own words, so that none serves
//! another's from the cache), each timed to its first token:
//! - **continued**: `previous_response_id` and the follow-up only: the server rebuilds the
//!   conversation from its store, and the prefix cache holds the first turn's blocks;
//! - **resent**: the whole history as input items (user, assistant, user) without
//!   `previous_response_id`, as a stateless client sends it: the prefix cache serves it too;
//! - **cold**: a history of the same length that was never sent (fresh random words), then
//!   the same answer and a question: nothing but the template's opening can be a cache hit, so
//!   the whole history is prefilled, as on a server without a prefix cache.
//!
//! The report gives each kind's median TTFT, prompt and cached tokens, and the ratio
//! continued / cold against the target (at most 0.3x). One untimed conversation runs first.
//! The words are drawn afresh each run (`--seed` mixed with the clock): the server's prefix
//! cache outlives a run, and a repeated "cold" history would be a cache hit.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::{json, Value};

use super::requests::build_prompt;
use super::runner::{connect, runtime, Client};
use super::stats::{num, percentile, Summary};
use super::Endpoint;

#[derive(Debug, Clone)]
pub struct ConversationConfig {
    pub url: String,
    pub model: Option<String>,
    pub api_key: Option<String>,
    pub temperature: f64,
    pub timeout: Duration,
    pub seed: u64,
    pub json: bool,
    /// Approximate tokens of the first turn's history.
    pub history_tokens: usize,
    /// Output tokens of the first turn's answer.
    pub answer_tokens: usize,
    /// Approximate tokens of the follow-up question.
    pub followup_tokens: usize,
    /// Output tokens of each follow-up request.
    pub output_tokens: usize,
    pub samples: usize,
    /// The ratio continued / cold the report checks against.
    pub target_ratio: f64,
}

/// The three ways a follow-up is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Continued,
    Resent,
    Cold,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Continued, Kind::Resent, Kind::Cold];
    fn name(self) -> &'static str {
        match self {
            Kind::Continued => "continued",
            Kind::Resent => "resent",
            Kind::Cold => "cold",
        }
    }
    fn label(self) -> &'static str {
        match self {
            Kind::Continued => "previous_response_id",
            Kind::Resent => "whole history resent (cache hit)",
            Kind::Cold => "whole history, never seen (cold)",
        }
    }
}

/// The request bodies of one conversation.
pub struct Bodies {
    pub first: Value,
    pub resent: Value,
    pub cold: Value,
    followup: Value,
}

impl Bodies {
    /// `history` and `cold_history` are the two histories (the second never sent before),
    /// `question` the follow-up; the answer is filled in once the first turn has run.
    pub fn new(
        model: Option<&str>,
        history: &str,
        cold_history: &str,
        questions: [&str; 3],
        cfg: &ConversationConfig,
    ) -> Self {
        let [question, resent_question, cold_question] = questions;
        let base = |max: usize| {
            let mut b = json!({"stream": true, "ignore_eos": true, "temperature": cfg.temperature,
                "max_output_tokens": max, "store": false});
            if let Some(m) = model {
                b["model"] = json!(m);
            }
            b
        };
        let mut first = base(cfg.answer_tokens);
        first["input"] = json!(history);
        first["store"] = json!(true);
        let mut followup = base(cfg.output_tokens);
        followup["input"] = json!(question);
        let items = |h: &str, q: &str| {
            json!([{"role": "user", "content": h}, {"role": "assistant", "content": ""},
                {"role": "user", "content": q}])
        };
        let mut resent = base(cfg.output_tokens);
        resent["input"] = items(history, resent_question);
        let mut cold = base(cfg.output_tokens);
        cold["input"] = items(cold_history, cold_question);
        Bodies {
            first,
            resent,
            cold,
            followup,
        }
    }

    /// The follow-up bodies once the first turn answered `answer` as response `id`.
    pub fn after_first(&mut self, id: &str, answer: &str) -> [(Kind, Value); 3] {
        let mut continued = self.followup.clone();
        continued["previous_response_id"] = json!(id);
        for b in [&mut self.resent, &mut self.cold] {
            b["input"][1]["content"] = json!(answer);
        }
        [
            (Kind::Continued, continued),
            (Kind::Resent, self.resent.clone()),
            (Kind::Cold, self.cold.clone()),
        ]
    }
}

/// One follow-up request's figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Turn {
    pub ttft: f64,
    pub prompt_tokens: Option<usize>,
    pub cached_tokens: Option<usize>,
}

/// What the scenario measured: per kind, one [`Turn`] per sample.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    pub turns: Vec<(Kind, Turn)>,
    pub history_prompt_tokens: Vec<usize>,
    pub failed: usize,
    pub first_error: Option<String>,
}

fn median_of(v: impl Iterator<Item = usize>) -> Option<f64> {
    let v: Vec<f64> = v.map(|x| x as f64).collect();
    (!v.is_empty()).then(|| percentile(&v, 50.0))
}

impl Report {
    fn of(&self, k: Kind) -> impl Iterator<Item = &Turn> {
        self.turns.iter().filter(move |t| t.0 == k).map(|t| &t.1)
    }
    pub fn ttft_ms(&self, k: Kind) -> Summary {
        Summary::of_secs(&self.of(k).map(|t| t.ttft).collect::<Vec<_>>())
    }
    /// Median TTFT continued over median TTFT cold.
    pub fn ratio(&self) -> f64 {
        self.ttft_ms(Kind::Continued).p50 / self.ttft_ms(Kind::Cold).p50
    }

    pub fn to_json(&self, cfg: &ConversationConfig, model: Option<&str>) -> Value {
        let mut kinds = serde_json::Map::new();
        for k in Kind::ALL {
            kinds.insert(
                k.name().into(),
                json!({
                    "count": self.of(k).count(),
                    "ttft_ms": self.ttft_ms(k).to_json(),
                    "prompt_tokens_p50": median_of(self.of(k).filter_map(|t| t.prompt_tokens)),
                    "cached_tokens_p50": median_of(self.of(k).filter_map(|t| t.cached_tokens)),
                }),
            );
        }
        json!({
            "scenario": "conversation",
            "endpoint": Endpoint::Responses.name(),
            "model": model,
            "history_tokens": cfg.history_tokens,
            "history_prompt_tokens_p50": median_of(self.history_prompt_tokens.iter().copied()),
            "answer_tokens": cfg.answer_tokens,
            "followup_tokens": cfg.followup_tokens,
            "output_tokens": cfg.output_tokens,
            "samples": cfg.samples,
            "kinds": kinds,
            "ratio_p50": num(self.ratio()),
            "target_ratio": cfg.target_ratio,
            "failed": self.failed,
        })
    }

    pub fn table(&self, cfg: &ConversationConfig, model: Option<&str>) -> String {
        let mut s = String::new();
        let line = |s: &mut String, k: &str, v: String| s.push_str(&format!("{k:<40}{v}\n"));
        line(
            &mut s,
            "Scenario:",
            format!(
                "conversation on /v1/responses, model {}",
                model.unwrap_or("(none)")
            ),
        );
        let hist = median_of(self.history_prompt_tokens.iter().copied());
        line(
            &mut s,
            "First turn:",
            format!(
                "{} prompt tokens (median), {}-token answer; follow-up ~{} words, {} output tokens",
                hist.map_or("?".into(), |h| format!("{h:.0}")),
                cfg.answer_tokens,
                cfg.followup_tokens,
                cfg.output_tokens
            ),
        );
        line(
            &mut s,
            "Follow-up sent as",
            "TTFT p50 ms (min-max)   prompt tokens   cached".into(),
        );
        for k in Kind::ALL {
            let t = self.ttft_ms(k);
            let ms: Vec<f64> = self.of(k).map(|t| t.ttft * 1e3).collect();
            let min = ms.iter().copied().fold(f64::NAN, f64::min);
            let max = ms.iter().copied().fold(f64::NAN, f64::max);
            let p = median_of(self.of(k).filter_map(|t| t.prompt_tokens));
            let c = median_of(self.of(k).filter_map(|t| t.cached_tokens));
            let f = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.0}"));
            line(
                &mut s,
                &format!("  {}:", k.label()),
                format!(
                    "{:>8.1} ({:.1}-{:.1}){:>12}{:>10}",
                    t.p50,
                    min,
                    max,
                    f(p),
                    f(c)
                ),
            );
        }
        let r = self.ratio();
        line(
            &mut s,
            "continued / cold TTFT:",
            format!(
                "{r:.3}x (target <= {}x: {})",
                cfg.target_ratio,
                if r <= cfg.target_ratio {
                    "met"
                } else {
                    "missed"
                }
            ),
        );
        line(
            &mut s,
            "continued / resent TTFT:",
            format!(
                "{:.3}x",
                self.ttft_ms(Kind::Continued).p50 / self.ttft_ms(Kind::Resent).p50
            ),
        );
        line(
            &mut s,
            "Samples:",
            format!("{} conversations, {} failed", cfg.samples, self.failed),
        );
        s
    }
}

async fn one_conversation(
    client: &Client,
    mut bodies: Bodies,
    report: &mut Report,
    record: bool,
) -> std::result::Result<(), String> {
    let (first, _) = client.stream_body(&bodies.first, Instant::now()).await?;
    let id = first
        .response_id
        .clone()
        .ok_or("the first turn's stream gave no response id")?;
    if record {
        if let Some(p) = first.usage_prompt {
            report.history_prompt_tokens.push(p);
        }
    }
    for (kind, body) in bodies.after_first(&id, &first.text) {
        let (acc, _) = client.stream_body(&body, Instant::now()).await?;
        let ttft = acc
            .first_token
            .ok_or_else(|| format!("{}: no content in the stream", kind.name()))?;
        if record {
            report.turns.push((
                kind,
                Turn {
                    ttft,
                    prompt_tokens: acc.usage_prompt,
                    cached_tokens: acc.usage_cached,
                },
            ));
        }
    }
    Ok(())
}

/// Runs the scenario and prints its report.
pub fn run_conversation(cfg: &ConversationConfig) -> Result<()> {
    if cfg.history_tokens == 0 || cfg.followup_tokens == 0 {
        bail!("--history-tokens and --short-prompt-tokens must be positive");
    }
    if cfg.answer_tokens == 0 || cfg.output_tokens == 0 || cfg.samples == 0 {
        bail!("--output-tokens, --short-output-tokens and --samples must be positive");
    }
    runtime()?.block_on(async {
        let (client, model) = connect(
            &cfg.url,
            cfg.api_key.clone(),
            cfg.model.clone(),
            None,
            Endpoint::Responses,
            cfg.temperature,
            cfg.timeout,
        )
        .await?;
        // The histories must be new to the server, whose prefix cache outlives a run: the
        // seed is mixed with the clock, so that a second run's "cold" history is not the
        // first run's.
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let mut rng = StdRng::seed_from_u64(cfg.seed ^ nonce);
        let mut report = Report::default();
        let pb = ProgressBar::new(cfg.samples as u64 + 1);
        pb.set_style(
            ProgressStyle::with_template("conversations {bar:30} {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        for i in 0..=cfg.samples {
            let history = build_prompt(&mut rng, cfg.history_tokens);
            let cold = build_prompt(&mut rng, cfg.history_tokens);
            let q: Vec<String> = (0..3)
                .map(|_| build_prompt(&mut rng, cfg.followup_tokens))
                .collect();
            let questions = [q[0].as_str(), &q[1], &q[2]];
            let bodies = Bodies::new(model.as_deref(), &history, &cold, questions, cfg);
            // The first conversation warms up and is not recorded.
            let record = i > 0;
            if let Err(e) = tokio::time::timeout(
                cfg.timeout * 4,
                one_conversation(&client, bodies, &mut report, record),
            )
            .await
            .unwrap_or_else(|_| Err("timed out".into()))
            {
                report.failed += 1;
                report.first_error.get_or_insert(e);
            }
            pb.inc(1);
        }
        pb.finish_and_clear();
        if cfg.json {
            println!("{}", report.to_json(cfg, model.as_deref()));
        } else {
            print!("{}", report.table(cfg, model.as_deref()));
        }
        if report.failed > 0 {
            eprintln!(
                "{} conversations failed; first error: {}",
                report.failed,
                report.first_error.as_deref().unwrap_or("?")
            );
        }
        if Kind::ALL.iter().any(|&k| report.of(k).next().is_none()) {
            bail!("the scenario measured nothing to compare (see the errors above)");
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> ConversationConfig {
        ConversationConfig {
            url: "http://h:1".into(),
            model: None,
            api_key: None,
            temperature: 0.0,
            timeout: Duration::from_secs(1),
            seed: 1,
            json: true,
            history_tokens: 2000,
            answer_tokens: 32,
            followup_tokens: 20,
            output_tokens: 4,
            samples: 3,
            target_ratio: 0.3,
        }
    }

    #[test]
    fn bodies_continue_resend_and_go_cold() {
        let mut b = Bodies::new(
            Some("m"),
            "old words",
            "new words",
            ["why?", "how?", "when?"],
            &cfg(),
        );
        assert_eq!(b.first["input"], "old words");
        assert_eq!(
            (&b.first["store"], &b.first["max_output_tokens"]),
            (&json!(true), &json!(32))
        );
        let [(k0, c), (k1, r), (k2, cold)] = b.after_first("resp_9", "an answer");
        assert_eq!([k0, k1, k2], Kind::ALL);
        assert_eq!(c["previous_response_id"], "resp_9");
        assert_eq!(c["input"], "why?");
        assert_eq!(
            (&c["store"], &c["max_output_tokens"]),
            (&json!(false), &json!(4))
        );
        let roles = |v: &Value| -> Vec<String> {
            v["input"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["role"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(roles(&r), ["user", "assistant", "user"]);
        assert_eq!(
            (&r["input"][0]["content"], &r["input"][1]["content"]),
            (&json!("old words"), &json!("an answer"))
        );
        assert_eq!(r["input"][2]["content"], "how?");
        assert_eq!(
            (&cold["input"][0]["content"], &cold["input"][2]["content"]),
            (&json!("new words"), &json!("when?"))
        );
        assert!(
            r.get("previous_response_id").is_none() && cold.get("previous_response_id").is_none()
        );
        for body in [&c, &r, &cold, &b.first] {
            assert_eq!(
                (&body["model"], &body["ignore_eos"], &body["stream"]),
                (&json!("m"), &json!(true), &json!(true))
            );
        }
    }

    #[test]
    fn the_report_compares_medians() {
        let turn = |ttft, cached| Turn {
            ttft,
            prompt_tokens: Some(2100),
            cached_tokens: Some(cached),
        };
        let mut r = Report::default();
        for (k, t, c) in [
            (Kind::Continued, 0.05, 2080),
            (Kind::Continued, 0.07, 2080),
            (Kind::Continued, 0.06, 2064),
            (Kind::Resent, 0.06, 2080),
            (Kind::Cold, 0.4, 16),
            (Kind::Cold, 0.3, 16),
            (Kind::Cold, 0.5, 16),
        ] {
            r.turns.push((k, turn(t, c)));
        }
        r.history_prompt_tokens = vec![2010, 2011];
        assert!((r.ratio() - 0.15).abs() < 1e-9);
        let j = r.to_json(&cfg(), Some("m"));
        assert_eq!(j["kinds"]["continued"]["count"], 3);
        assert_eq!(j["kinds"]["continued"]["cached_tokens_p50"], 2080.0);
        assert_eq!(j["kinds"]["cold"]["ttft_ms"]["p50"], 400.0);
        let t = r.table(&cfg(), Some("m"));
        assert!(t.contains("0.150x (target <= 0.3x: met)"), "{t}");
        // Four slow continuations make the median slow: missed.
        for _ in 0..4 {
            r.turns.push((Kind::Continued, turn(0.9, 0)));
        }
        assert!(r.table(&cfg(), None).contains("missed"));
    }
}
