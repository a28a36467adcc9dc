//! `tessera bench serve`: a load generator for any OpenAI-compatible server (Tessera,
//! llama.cpp's llama-server, vLLM, ...).
//!
//! `--api` picks the dialect: Completions, Chat Completions, Responses or Messages, each
//! request shaped and its stream read as that API does it, so that one server's dialects
//! can be compared under the same load. Every request streams (`stream: true`, with
//! `stream_options.include_usage: true` where the dialect has it) and asks for exactly its
//! output length (`max_tokens` or `max_output_tokens` with the `ignore_eos: true`
//! extension), unless it sends a
//! `response_format` (`--response-format`): then it sends no `ignore_eos`, its output ends
//! when the grammar is complete (or at `max_tokens`), and the output is checked against the
//! format. TPOT stays comparable with a run without the constraint, being a per-token
//! figure; for a fair comparison that run should ask for about the constrained outputs' mean
//! length, so that both decode as many tokens per request and prefill as often
//! (`scripts/bench-structured.sh` does so). From the
//! server-sent events it measures the time to the first non-empty content chunk (TTFT),
//! the time per output token after the first (TPOT = (last − first token time) /
//! (output tokens − 1)) and the end-to-end latency; output tokens are counted from the
//! final chunk's `usage.completion_tokens` when the server sends one, else from the
//! content chunks.
//!
//! Load is either a fixed number of clients sending back-to-back (`--concurrency`), or
//! Poisson arrivals at a given rate (`--rate`, seeded), or a sequence of concurrency
//! levels (`--sweep`). The pure parts (percentiles, SSE parsing, arrivals, prompts,
//! the summary) are unit-tested; the network part never panics: every HTTP, stream or
//! timeout error counts as a failed request and the first message is reported.
//!
//! This module holds the options ([`ServeConfig`], [`Load`], [`Endpoint`], [`OutputLen`]);
//! the work is split by responsibility, and everything is re-exported here:
//! - [`requests`]: prompts, the request sequence, request bodies, Poisson arrivals;
//! - [`sse`]: server-sent event parsing and the per-stream accumulator;
//! - [`stats`]: percentiles, per-measurement figures and their report;
//! - [`adapters`]: `--adapters`, requests spread over model names and per-name figures;
//! - [`response_format`]: `--response-format`, the constraint sent and each output's check;
//! - [`runner`]: the HTTP client, the load of one measurement and [`run_serve`];
//! - [`long_prefill`]: `--scenario long-prefill`, a short request's TTFT while long prompts
//!   prefill against the idle server's;
//! - [`dialects`]: `--api A,B,...`, one server's APIs under the same load, compared;
//! - [`conversation`]: `--scenario conversation`, a turn continued by `previous_response_id`
//!   against the whole history resent without a prefix-cache hit.

pub mod adapters;
pub mod conversation;
pub mod dialects;
pub mod long_prefill;
pub mod requests;
pub mod response_format;
pub mod runner;
pub mod sse;
pub mod stats;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::ValueEnum;

pub use conversation::{run_conversation, ConversationConfig};
pub use dialects::run_dialects;
pub use long_prefill::{run_long_prefill, LongPrefillConfig};
pub use requests::*;
pub use response_format::{ResponseFormat, Validity, Verdict};
pub use runner::{base_url, run_serve};
pub use sse::*;
pub use stats::*;

/// What `tessera bench serve` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// Clients or arrivals as `--concurrency`, `--rate` or `--sweep` say.
    Load,
    /// A continued conversation through `/v1/responses`' `previous_response_id` against the
    /// same history resent cold (see [`conversation`]).
    Conversation,
    /// A short request's TTFT while long prompts prefill, against the idle server's (see
    /// [`long_prefill`]).
    LongPrefill,
}

/// Which API (dialect) to load: each sends the same prompt as its own request shape and
/// reads its own event stream, so that one server's dialects can be compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Endpoint {
    /// `/v1/completions` with a text prompt.
    Completions,
    /// `/v1/chat/completions` with one user message.
    Chat,
    /// OpenAI's `/v1/responses` with the prompt as `input` (`store: false`).
    Responses,
    /// Anthropic's `/v1/messages` with one user message.
    Messages,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Responses => "/v1/responses",
            Endpoint::Messages => "/v1/messages",
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Endpoint::Completions => "completions",
            Endpoint::Chat => "chat",
            Endpoint::Responses => "responses",
            Endpoint::Messages => "messages",
        }
    }
}

/// Output length of each request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputLen {
    Fixed(usize),
    /// Uniform over `lo..=hi`.
    Uniform(usize, usize),
}

/// Parses `LO:HI` (inclusive, 1 ≤ LO ≤ HI).
pub fn parse_range(s: &str) -> Result<OutputLen> {
    let (a, b) = s
        .split_once(':')
        .ok_or_else(|| anyhow!("--output-tokens-range wants LO:HI, got {s:?}"))?;
    let lo: usize = a
        .trim()
        .parse()
        .with_context(|| format!("--output-tokens-range {s:?}"))?;
    let hi: usize = b
        .trim()
        .parse()
        .with_context(|| format!("--output-tokens-range {s:?}"))?;
    if lo == 0 || lo > hi {
        bail!("--output-tokens-range wants 1 <= LO <= HI, got {s:?}");
    }
    Ok(OutputLen::Uniform(lo, hi))
}

/// How load is offered in one measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    /// This many clients, each sending its next request as soon as the last one ends.
    Concurrency(usize),
    /// Poisson arrivals at `rate` requests/s (infinite: all at once), with an optional cap
    /// on requests in flight.
    Rate {
        rate: f64,
        max_concurrency: Option<usize>,
    },
}

impl Load {
    pub fn label(&self) -> String {
        match self {
            Load::Concurrency(c) => format!("concurrency {c}"),
            Load::Rate {
                rate,
                max_concurrency: None,
            } => format!("rate {rate} req/s"),
            Load::Rate {
                rate,
                max_concurrency: Some(c),
            } => format!("rate {rate} req/s, max concurrency {c}"),
        }
    }
}

#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Base URL, e.g. `http://127.0.0.1:8080` (a trailing `/v1` is accepted too).
    pub url: String,
    pub model: Option<String>,
    pub api_key: Option<String>,
    pub endpoint: Endpoint,
    /// One measurement per entry.
    pub loads: Vec<Load>,
    /// Requests per measurement (`None`: unbounded, stop at `duration`).
    pub requests: Option<usize>,
    /// Stop sending new requests after this long (in-flight ones finish).
    pub duration: Option<Duration>,
    pub prompt_tokens: usize,
    pub prompt_file: Option<PathBuf>,
    pub output: OutputLen,
    pub temperature: f64,
    pub slo_ttft_ms: f64,
    pub slo_tpot_ms: f64,
    pub timeout: Duration,
    /// Untimed sequential requests before the first measurement.
    pub warmup: usize,
    pub json: bool,
    pub plot: Option<PathBuf>,
    pub seed: u64,
    /// `--adapters`: model names the requests take in turn (request `i` asks for
    /// `adapters[i % len]`); the report adds figures per name. `None`: every request asks
    /// for `model`.
    pub adapters: Option<Vec<String>>,
    /// `--response-format`: a JSON file holding an OpenAI `response_format` object, sent
    /// with every request; each output is checked against it (see [`response_format`]).
    pub response_format: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsing_options_and_bodies() {
        assert_eq!(parse_range("32:128").unwrap(), OutputLen::Uniform(32, 128));
        assert!(parse_range("0:4").is_err());
        assert!(parse_range("9:4").is_err());
        assert!(parse_range("9").is_err());
        assert_eq!(base_url("http://h:1/"), "http://h:1");
        assert_eq!(base_url("http://h:1/v1/"), "http://h:1");
        assert_eq!(prompt_lines("a\n\n b \r\n"), vec!["a", " b "]);
        assert_eq!(prompt_lines("[\"x\\ny\", \"\", \"z\"]"), vec!["x\ny", "z"]);
        let b = request_body(Endpoint::Chat, Some("m"), "hi", 8, 0.0);
        assert_eq!(b["messages"][0]["content"], "hi");
        assert_eq!(b["model"], "m");
        assert_eq!(b["stream"], true);
        assert_eq!(b["ignore_eos"], true);
        assert_eq!(b["stream_options"]["include_usage"], true);
        let b = request_body(Endpoint::Completions, None, "hi", 8, 0.5);
        assert_eq!(
            (b["prompt"].as_str(), b["max_tokens"].as_u64()),
            (Some("hi"), Some(8))
        );
        assert!(b.get("model").is_none());
        assert_eq!(
            error_message(r#"{"error":{"message":"nope","type":"x"}}"#),
            "nope"
        );
        assert_eq!(error_message("plain text"), "plain text");
    }
}
