//! `tessera bench serve`: a load generator for any OpenAI-compatible server (Tessera,
//! llama.cpp's llama-server, vLLM, ...).
//!
//! Every request streams (`stream: true`, `stream_options.include_usage: true`) and asks
//! for exactly its output length (`max_tokens` with `ignore_eos: true`). From the
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

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::ValueEnum;
use futures_util::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

/// Which OpenAI endpoint to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Endpoint {
    /// `/v1/completions` with a text prompt.
    Completions,
    /// `/v1/chat/completions` with one user message.
    Chat,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::Chat => "/v1/chat/completions",
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Endpoint::Completions => "completions",
            Endpoint::Chat => "chat",
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
}

// ---------------------------------------------------------------------------------------
// Pure helpers
// ---------------------------------------------------------------------------------------

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
    fn to_json(self) -> Value {
        json!({"mean": num(self.mean), "p50": num(self.p50), "p90": num(self.p90), "p99": num(self.p99)})
    }
}

/// A JSON number, or null when not finite.
fn num(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        Value::Null
    }
}

/// Offsets in seconds of `n` Poisson arrivals at `rate` per second: the first at 0, then
/// exponential gaps drawn from a generator seeded with `seed`. An infinite rate gives all
/// zeros.
pub fn arrival_offsets(rate: f64, seed: u64, n: usize) -> Vec<f64> {
    let mut a = Arrivals::new(rate, seed);
    let mut t = 0.0;
    (0..n)
        .map(|i| {
            if i > 0 {
                t += a.next_gap();
            }
            t
        })
        .collect()
}

/// Exponential inter-arrival gaps of a Poisson process.
pub struct Arrivals {
    rng: StdRng,
    rate: f64,
}

impl Arrivals {
    pub fn new(rate: f64, seed: u64) -> Self {
        Arrivals {
            rng: StdRng::seed_from_u64(seed),
            rate,
        }
    }
    /// Seconds to the next arrival.
    pub fn next_gap(&mut self) -> f64 {
        let u: f64 = self.rng.gen(); // [0, 1)
        if self.rate.is_infinite() {
            return 0.0;
        }
        -(1.0 - u).ln() / self.rate
    }
}

/// Common English words that most BPE vocabularies (GPT-2, Llama, SmolLM, Qwen) hold as
/// one token each when preceded by a space, so a prompt of N of them is about N tokens.
#[rustfmt::skip]
pub const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "you", "that", "it", "he", "was", "for", "on", "are",
    "as", "with", "his", "they", "at", "be", "this", "have", "from", "or", "one", "had", "by",
    "word", "but", "not", "what", "all", "were", "we", "when", "your", "can", "said", "there",
    "use", "an", "each", "which", "she", "do", "how", "their", "if", "will", "up", "other",
    "about", "out", "many", "then", "them", "these", "so", "some", "her", "would", "make",
    "like", "him", "into", "time", "has", "look", "two", "more", "write", "go", "see", "number",
    "no", "way", "could", "people", "my", "than", "first", "water", "been", "call", "who",
    "its", "now", "find", "long", "down", "day", "did", "get", "come", "made", "may", "part",
    "over", "new", "sound", "take", "only", "little", "work", "know", "place", "year", "live",
    "me", "back", "give", "most", "very", "after", "thing", "our", "just", "name", "good",
    "man", "think", "say", "great", "where", "help", "through", "much", "before", "line",
    "right", "too", "mean", "old", "any", "same", "tell", "boy", "follow", "came", "want",
    "show", "also", "around", "form", "three", "small", "set", "put", "end", "does", "another",
    "well", "large", "must", "big", "even", "such", "because", "turn", "here", "why", "ask",
    "went", "men", "read", "need", "land", "different", "home", "us", "move", "try", "kind",
    "hand", "picture", "again", "change", "off", "play", "spell", "air", "away", "animal",
    "house", "point", "page", "letter", "mother", "answer", "found", "study", "still", "learn",
    "should", "world", "high", "every", "near", "add", "food", "between", "own", "below",
    "country", "plant", "last", "school", "father", "keep", "tree", "never", "start", "city",
    "earth", "eye", "light", "thought", "head", "under", "story", "saw", "left", "few", "while",
    "along", "might", "close", "something", "seem", "next", "hard", "open", "example", "begin",
    "life", "always", "those", "both", "paper", "together", "got", "group", "often", "run",
    "important", "until", "children", "side", "feet", "car", "mile", "night", "walk", "white",
    "sea", "began", "grow", "took", "river", "four", "carry", "state", "once", "book", "hear",
    "stop", "without", "second", "later",
];

/// A prompt of about `tokens` tokens: that many random words from [`WORDS`].
pub fn build_prompt(rng: &mut impl Rng, tokens: usize) -> String {
    let mut s = String::with_capacity(tokens * 6);
    for i in 0..tokens {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(WORDS[rng.gen_range(0..WORDS.len())]);
    }
    s
}

/// Rough token count of a text (for prompts from a file when the server sends no usage).
pub fn estimate_tokens(text: &str) -> usize {
    text.split_whitespace().count()
}

/// One request to send.
#[derive(Debug, Clone, PartialEq)]
pub struct ReqSpec {
    pub index: usize,
    pub prompt: String,
    pub prompt_tokens_est: usize,
    pub max_tokens: usize,
}

/// The deterministic sequence of requests of a measurement: request `i` is the same for
/// a given seed whatever the load or timing.
pub struct RequestGen {
    rng: StdRng,
    prompt_tokens: usize,
    file: Option<Arc<Vec<String>>>,
    output: OutputLen,
    next: usize,
    limit: Option<usize>,
}

impl RequestGen {
    pub fn new(
        seed: u64,
        prompt_tokens: usize,
        file: Option<Arc<Vec<String>>>,
        output: OutputLen,
        limit: Option<usize>,
    ) -> Self {
        RequestGen {
            rng: StdRng::seed_from_u64(seed),
            prompt_tokens,
            file,
            output,
            next: 0,
            limit,
        }
    }
}

impl Iterator for RequestGen {
    type Item = ReqSpec;
    fn next(&mut self) -> Option<ReqSpec> {
        if self.limit.is_some_and(|l| self.next >= l) {
            return None;
        }
        let index = self.next;
        self.next += 1;
        let prompt = match &self.file {
            Some(lines) if !lines.is_empty() => lines[index % lines.len()].clone(),
            _ => build_prompt(&mut self.rng, self.prompt_tokens),
        };
        let max_tokens = match self.output {
            OutputLen::Fixed(n) => n,
            OutputLen::Uniform(lo, hi) => self.rng.gen_range(lo..=hi),
        };
        Some(ReqSpec {
            index,
            prompt_tokens_est: estimate_tokens(&prompt),
            prompt,
            max_tokens,
        })
    }
}

/// The JSON body of a streaming request.
pub fn request_body(
    endpoint: Endpoint,
    model: Option<&str>,
    prompt: &str,
    max_tokens: usize,
    temperature: f64,
) -> Value {
    let mut body = json!({
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": true,
        "stream_options": {"include_usage": true},
        "ignore_eos": true,
    });
    match endpoint {
        Endpoint::Completions => body["prompt"] = json!(prompt),
        Endpoint::Chat => body["messages"] = json!([{"role": "user", "content": prompt}]),
    }
    if let Some(m) = model {
        body["model"] = json!(m);
    }
    body
}

/// One line of a server-sent event stream.
#[derive(Debug, Clone, PartialEq)]
pub enum SseLine {
    /// `data: [DONE]`.
    Done,
    /// `data: <json>`.
    Data(Value),
    /// `data:` with text that is not JSON.
    BadData(String),
    /// An `error:` line (some servers send errors this way).
    Error(String),
    /// Blank lines, comments (`: keep-alive`), `event:`/`id:`/`retry:` fields.
    Other,
}

/// Parses one line (without its line ending) of an event stream.
pub fn parse_sse_line(line: &str) -> SseLine {
    let line = line.trim_end_matches('\r');
    if let Some(rest) = line.strip_prefix("data:") {
        let rest = rest.trim();
        if rest == "[DONE]" {
            return SseLine::Done;
        }
        if rest.is_empty() {
            return SseLine::Other;
        }
        return match serde_json::from_str(rest) {
            Ok(v) => SseLine::Data(v),
            Err(_) => SseLine::BadData(rest.to_string()),
        };
    }
    if let Some(rest) = line.strip_prefix("error:") {
        return SseLine::Error(error_message(rest.trim()));
    }
    SseLine::Other
}

/// What one stream chunk says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChunkInfo {
    /// Length of the first choice's content (`text` or `delta.content`).
    pub content_len: usize,
    pub completion_tokens: Option<usize>,
    pub prompt_tokens: Option<usize>,
    pub error: Option<String>,
}

/// Reads a completions or chat stream chunk.
pub fn chunk_info(v: &Value) -> ChunkInfo {
    let mut info = ChunkInfo::default();
    if let Some(e) = v.get("error") {
        info.error = Some(
            e.get("message")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| e.to_string()),
        );
        return info;
    }
    if let Some(c) = v
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
    {
        let text = c
            .get("text")
            .and_then(Value::as_str)
            .or_else(|| c.pointer("/delta/content").and_then(Value::as_str));
        info.content_len = text.map_or(0, str::len);
    }
    if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
        let n = |k: &str| u.get(k).and_then(Value::as_u64).map(|x| x as usize);
        info.completion_tokens = n("completion_tokens");
        info.prompt_tokens = n("prompt_tokens");
    }
    info
}

/// The message of an OpenAI-style error body (or the text itself, shortened).
pub fn error_message(text: &str) -> String {
    if let Ok(v) = serde_json::from_str::<Value>(text) {
        if let Some(m) = v.pointer("/error/message").and_then(Value::as_str) {
            return m.to_string();
        }
        if let Some(m) = v.get("error").and_then(Value::as_str) {
            return m.to_string();
        }
        if let Some(m) = v.get("message").and_then(Value::as_str) {
            return m.to_string();
        }
    }
    let t = text.trim();
    if t.chars().count() > 300 {
        format!("{}…", t.chars().take(300).collect::<String>())
    } else {
        t.to_string()
    }
}

/// Accumulates a response stream: bytes in, token timings out. Times are seconds since
/// the request was sent.
#[derive(Debug, Default)]
pub struct StreamAcc {
    buf: Vec<u8>,
    pub first_token: Option<f64>,
    pub last_token: Option<f64>,
    pub content_chunks: usize,
    pub usage_completion: Option<usize>,
    pub usage_prompt: Option<usize>,
    pub done: bool,
    pub error: Option<String>,
}

impl StreamAcc {
    /// Feeds bytes received at time `t`; complete lines are parsed, a partial last line
    /// is kept for the next call.
    pub fn feed(&mut self, bytes: &[u8], t: f64) {
        self.buf.extend_from_slice(bytes);
        while let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=pos).collect();
            let line = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
            self.line(&line, t);
            if self.done || self.error.is_some() {
                return;
            }
        }
    }

    /// Parses what is left once the stream has ended (a last line without a newline).
    pub fn finish(&mut self, t: f64) {
        if !self.buf.is_empty() && !self.done && self.error.is_none() {
            let line = String::from_utf8_lossy(&std::mem::take(&mut self.buf)).into_owned();
            self.line(&line, t);
        }
    }

    fn line(&mut self, line: &str, t: f64) {
        match parse_sse_line(line) {
            SseLine::Done => self.done = true,
            SseLine::Error(e) => self.error = Some(e),
            SseLine::BadData(s) => self.error = Some(format!("unparsable stream data: {s}")),
            SseLine::Other => {}
            SseLine::Data(v) => {
                let info = chunk_info(&v);
                if let Some(e) = info.error {
                    self.error = Some(e);
                    return;
                }
                if info.content_len > 0 {
                    self.content_chunks += 1;
                    self.first_token.get_or_insert(t);
                    self.last_token = Some(t);
                }
                if info.completion_tokens.is_some() {
                    self.usage_completion = info.completion_tokens;
                }
                if info.prompt_tokens.is_some() {
                    self.usage_prompt = info.prompt_tokens;
                }
            }
        }
    }

    /// Output tokens: the usage count when the server sent one, else the content chunks.
    pub fn output_tokens(&self) -> usize {
        self.usage_completion.unwrap_or(self.content_chunks)
    }

    /// Seconds per output token after the first; `None` with fewer than two tokens.
    pub fn tpot(&self) -> Option<f64> {
        let n = self.output_tokens();
        match (self.first_token, self.last_token) {
            (Some(a), Some(b)) if n > 1 => Some((b - a) / (n - 1) as f64),
            _ => None,
        }
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

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    pub ttft: f64,
    /// `None` with a single output token.
    pub tpot: Option<f64>,
    pub e2e: f64,
    pub output_tokens: usize,
    pub prompt_tokens: usize,
    /// Whether `prompt_tokens` came from the server's usage (else it is an estimate).
    pub prompt_tokens_exact: bool,
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
        if let Some(e) = &self.first_error {
            s.push_str(&format!("{:<34}{e}\n", "First error:"));
        }
        s
    }
}

/// One decimal, or `-` when not finite.
fn fmt1(x: f64) -> String {
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
    }
    s
}

/// The base URL without a trailing `/` or `/v1`.
pub fn base_url(url: &str) -> String {
    let u = url.trim().trim_end_matches('/');
    u.strip_suffix("/v1").unwrap_or(u).to_string()
}

/// The lines of a prompt file, empty ones skipped.
pub fn prompt_lines(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

// ---------------------------------------------------------------------------------------
// Network
// ---------------------------------------------------------------------------------------

/// An error and its causes, `: `-separated (reqwest's own message omits the cause).
fn err_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        src = c.source();
    }
    s
}

struct Client {
    http: reqwest::Client,
    url: String,
    api_key: Option<String>,
    model: Option<String>,
    endpoint: Endpoint,
    temperature: f64,
    timeout: Duration,
}

impl Client {
    /// Sends one request and reads its stream to the end; never panics.
    async fn send(&self, spec: &ReqSpec, t0: Instant) -> Outcome {
        let start = t0.elapsed().as_secs_f64();
        let sent = Instant::now();
        let result = match tokio::time::timeout(self.timeout, self.stream(spec, sent)).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "timed out after {:.0} s",
                self.timeout.as_secs_f64()
            )),
        };
        Outcome {
            index: spec.index,
            start,
            result,
        }
    }

    async fn stream(&self, spec: &ReqSpec, sent: Instant) -> std::result::Result<Timing, String> {
        let body = request_body(
            self.endpoint,
            self.model.as_deref(),
            &spec.prompt,
            spec.max_tokens,
            self.temperature,
        );
        let mut rb = self.http.post(&self.url).json(&body);
        if let Some(k) = &self.api_key {
            rb = rb.bearer_auth(k);
        }
        let resp = rb
            .send()
            .await
            .map_err(|e| format!("request failed: {}", err_chain(&e)))?;
        let status = resp.status();
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            return Err(format!("HTTP {status}: {}", error_message(&text)));
        }
        let mut acc = StreamAcc::default();
        let mut body = resp.bytes_stream();
        while let Some(item) = body.next().await {
            let bytes = item.map_err(|e| format!("stream failed: {}", err_chain(&e)))?;
            acc.feed(&bytes, sent.elapsed().as_secs_f64());
            if acc.done || acc.error.is_some() {
                break;
            }
        }
        let end = sent.elapsed().as_secs_f64();
        acc.finish(end);
        if let Some(e) = acc.error {
            return Err(format!("stream error: {e}"));
        }
        if !acc.done {
            return Err("the stream ended without data: [DONE]".into());
        }
        let Some(ttft) = acc.first_token else {
            return Err("no content in the response stream".into());
        };
        Ok(Timing {
            ttft,
            tpot: acc.tpot(),
            e2e: end,
            output_tokens: acc.output_tokens(),
            prompt_tokens: acc.usage_prompt.unwrap_or(spec.prompt_tokens_est),
            prompt_tokens_exact: acc.usage_prompt.is_some(),
        })
    }
}

/// The first model id of `GET /v1/models`.
async fn first_model(
    http: &reqwest::Client,
    base: &str,
    api_key: Option<&str>,
) -> std::result::Result<String, String> {
    let mut rb = http.get(format!("{base}/v1/models"));
    if let Some(k) = api_key {
        rb = rb.bearer_auth(k);
    }
    let resp = rb.send().await.map_err(|e| err_chain(&e))?;
    let status = resp.status();
    let text = resp.text().await.map_err(|e| err_chain(&e))?;
    if !status.is_success() {
        return Err(format!("HTTP {status}: {}", error_message(&text)));
    }
    let v: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    v.pointer("/data/0/id")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| "no model listed".to_string())
}

struct Shared {
    client: Client,
    gen: Mutex<RequestGen>,
    deadline: Option<Instant>,
    outcomes: Mutex<Vec<Outcome>>,
    pb: ProgressBar,
}

impl Shared {
    /// The next request, unless the count or the time is used up.
    fn next_spec(&self) -> Option<ReqSpec> {
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return None;
        }
        self.gen.lock().unwrap_or_else(|e| e.into_inner()).next()
    }

    fn record(&self, o: Outcome) {
        let mut v = self.outcomes.lock().unwrap_or_else(|e| e.into_inner());
        v.push(o);
        let failed = v.iter().filter(|o| o.result.is_err()).count();
        self.pb
            .set_message(format!("ok {} failed {failed}", v.len() - failed));
        self.pb.inc(1);
    }
}

fn progress_bar(total: Option<usize>, label: &str) -> ProgressBar {
    let pb = match total {
        Some(n) => {
            let pb = ProgressBar::new(n as u64);
            pb.set_style(
                ProgressStyle::with_template(
                    "{prefix} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            pb
        }
        None => {
            let pb = ProgressBar::new_spinner();
            pb.set_style(
                ProgressStyle::with_template("{prefix} {spinner} [{elapsed_precise}] {pos} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            pb.enable_steady_tick(Duration::from_millis(200));
            pb
        }
    };
    pb.set_prefix(label.to_string());
    pb
}

/// One measurement under `load`; returns the outcomes and the wall time in seconds.
async fn measure(shared: Arc<Shared>, load: Load, seed: u64) -> (Vec<Outcome>, f64) {
    let t0 = Instant::now();
    match load {
        Load::Concurrency(c) => {
            let mut set = tokio::task::JoinSet::new();
            for _ in 0..c.max(1) {
                let sh = shared.clone();
                set.spawn(async move {
                    while let Some(spec) = sh.next_spec() {
                        let o = sh.client.send(&spec, t0).await;
                        sh.record(o);
                    }
                });
            }
            while set.join_next().await.is_some() {}
        }
        Load::Rate {
            rate,
            max_concurrency,
        } => {
            let sem = max_concurrency.map(|c| Arc::new(tokio::sync::Semaphore::new(c.max(1))));
            let mut arrivals = Arrivals::new(rate, seed);
            let mut at = 0.0f64;
            let mut set = tokio::task::JoinSet::new();
            loop {
                let when = t0 + Duration::from_secs_f64(at.min(1e9));
                if shared.deadline.is_some_and(|d| when >= d) {
                    break;
                }
                tokio::time::sleep_until(when.into()).await;
                let Some(spec) = shared.next_spec() else {
                    break;
                };
                let sh = shared.clone();
                let sem = sem.clone();
                set.spawn(async move {
                    let _permit = match &sem {
                        Some(s) => s.clone().acquire_owned().await.ok(),
                        None => None,
                    };
                    let o = sh.client.send(&spec, t0).await;
                    sh.record(o);
                });
                at += arrivals.next_gap();
                // Reap finished tasks so the set does not grow without bound.
                while set.try_join_next().is_some() {}
            }
            while set.join_next().await.is_some() {}
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    shared.pb.finish_and_clear();
    let mut v = std::mem::take(&mut *shared.outcomes.lock().unwrap_or_else(|e| e.into_inner()));
    v.sort_by_key(|o| o.index);
    (v, secs)
}

/// Runs the benchmark as configured.
pub fn run_serve(cfg: &ServeConfig) -> Result<()> {
    if cfg.loads.is_empty() {
        bail!("nothing to run");
    }
    if cfg.requests == Some(0) {
        bail!("--requests must be positive");
    }
    if cfg.output == OutputLen::Fixed(0) {
        bail!("--output-tokens must be positive");
    }
    let file = match &cfg.prompt_file {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("reading --prompt-file {}", p.display()))?;
            let lines = prompt_lines(&text);
            if lines.is_empty() {
                bail!("--prompt-file {} holds no prompts", p.display());
            }
            Some(Arc::new(lines))
        }
        None => {
            if cfg.prompt_tokens == 0 {
                bail!("--prompt-tokens must be positive");
            }
            None
        }
    };
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 4);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()?;
    rt.block_on(run_async(cfg, file))
}

async fn run_async(cfg: &ServeConfig, file: Option<Arc<Vec<String>>>) -> Result<()> {
    let base = base_url(&cfg.url);
    if !base.starts_with("http://") && !base.starts_with("https://") {
        bail!("--url must start with http:// (got {:?})", cfg.url);
    }
    let http = reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(1024)
        .build()
        .context("building the HTTP client")?;
    let model = match &cfg.model {
        Some(m) => Some(m.clone()),
        None => match first_model(&http, &base, cfg.api_key.as_deref()).await {
            Ok(m) => Some(m),
            Err(e) => {
                eprintln!("note: GET {base}/v1/models failed ({e}); sending no model name");
                None
            }
        },
    };
    let client = Client {
        http,
        url: format!("{base}{}", cfg.endpoint.path()),
        api_key: cfg.api_key.clone(),
        model: model.clone(),
        endpoint: cfg.endpoint,
        temperature: cfg.temperature,
        timeout: cfg.timeout,
    };
    let mut client = Some(client);

    if cfg.warmup > 0 {
        let c = client.as_ref().ok_or_else(|| anyhow!("no client"))?;
        let gen = RequestGen::new(
            cfg.seed ^ 0x5eed,
            cfg.prompt_tokens,
            file.clone(),
            cfg.output,
            Some(cfg.warmup),
        );
        let t0 = Instant::now();
        for spec in gen {
            if let Err(e) = c.send(&spec, t0).await.result {
                eprintln!("warning: warm-up request failed: {e}");
            }
        }
    }

    let mut runs = vec![];
    for (i, &load) in cfg.loads.iter().enumerate() {
        let label = if cfg.loads.len() > 1 {
            format!("[{}/{}] {}", i + 1, cfg.loads.len(), load.label())
        } else {
            load.label()
        };
        let shared = Arc::new(Shared {
            client: client.take().ok_or_else(|| anyhow!("no client"))?,
            gen: Mutex::new(RequestGen::new(
                cfg.seed,
                cfg.prompt_tokens,
                file.clone(),
                cfg.output,
                cfg.requests,
            )),
            deadline: cfg.duration.map(|d| Instant::now() + d),
            outcomes: Mutex::new(vec![]),
            pb: progress_bar(cfg.requests, &label),
        });
        let (outcomes, secs) = measure(shared.clone(), load, cfg.seed).await;
        let stats = summarize(load, &outcomes, secs, cfg.slo_ttft_ms, cfg.slo_tpot_ms);
        if cfg.json {
            println!("{}", stats.to_json(cfg.endpoint, model.as_deref()));
        } else {
            if i > 0 {
                println!();
            }
            print!("{}", stats.table(cfg.endpoint, model.as_deref()));
        }
        if stats.failed > 0 {
            eprintln!(
                "{} of {} requests failed; first error: {}",
                stats.failed,
                outcomes.len(),
                stats.first_error.as_deref().unwrap_or("?")
            );
        }
        if cfg.plot.is_some() && cfg.loads.len() == 1 {
            if let Some(path) = &cfg.plot {
                match crate::serve_plot::plot_requests(path, &outcomes, &load.label()) {
                    Ok(()) => eprintln!("wrote {}", path.display()),
                    Err(e) => eprintln!("warning: plot failed: {e:#}"),
                }
            }
        }
        runs.push(stats);
        client = Arc::try_unwrap(shared).ok().map(|s| s.client);
        if client.is_none() {
            bail!("internal: the client is still shared after a measurement");
        }
    }
    if runs.len() > 1 {
        if !cfg.json {
            println!();
            print!("{}", sweep_table(&runs));
        }
        if let Some(path) = &cfg.plot {
            match crate::serve_plot::plot_sweep(path, &runs) {
                Ok(()) => eprintln!("wrote {}", path.display()),
                Err(e) => eprintln!("warning: plot failed: {e:#}"),
            }
        }
    }
    if runs.iter().all(|r| r.completed == 0) {
        bail!("no request completed");
    }
    Ok(())
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
    fn sse_lines() {
        assert_eq!(parse_sse_line("data: [DONE]"), SseLine::Done);
        assert_eq!(parse_sse_line("data:[DONE]\r"), SseLine::Done);
        assert_eq!(
            parse_sse_line(r#"data: {"a":1}"#),
            SseLine::Data(json!({"a": 1}))
        );
        assert_eq!(parse_sse_line(""), SseLine::Other);
        assert_eq!(parse_sse_line(": keep-alive"), SseLine::Other);
        assert_eq!(parse_sse_line("event: message"), SseLine::Other);
        assert_eq!(
            parse_sse_line("data: {oops"),
            SseLine::BadData("{oops".into())
        );
        assert_eq!(
            parse_sse_line(r#"error: {"error":{"message":"boom"}}"#),
            SseLine::Error("boom".into())
        );
    }

    #[test]
    fn chunk_contents() {
        let c =
            chunk_info(&json!({"choices": [{"index": 0, "text": "Hi", "finish_reason": null}]}));
        assert_eq!(c.content_len, 2);
        let c = chunk_info(
            &json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "abc"}}]}),
        );
        assert_eq!(c.content_len, 3);
        // Role-only and finish chunks carry no content.
        let c = chunk_info(&json!({"choices": [{"delta": {"role": "assistant"}}]}));
        assert_eq!(c.content_len, 0);
        let c = chunk_info(&json!({"choices": [{"delta": {"content": null}}]}));
        assert_eq!(c.content_len, 0);
        let c = chunk_info(
            &json!({"object": "usage", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}}),
        );
        assert_eq!((c.prompt_tokens, c.completion_tokens), (Some(7), Some(5)));
        let c = chunk_info(&json!({"choices": [{"text": "x"}], "usage": null}));
        assert_eq!((c.content_len, c.completion_tokens), (1, None));
        let c = chunk_info(&json!({"error": {"message": "bad", "type": "server_error"}}));
        assert_eq!(c.error.as_deref(), Some("bad"));
    }

    #[test]
    fn stream_accumulates_across_split_chunks() {
        let mut a = StreamAcc::default();
        // A line split across two reads, CRLF endings, a keep-alive comment.
        a.feed(b"data: {\"choices\":[{\"te", 0.10);
        a.feed(b"xt\":\"A\"}]}\r\n\r\n: ping\n", 0.20);
        a.feed(b"data: {\"choices\":[{\"text\":\"\"}]}\n\n", 0.25);
        a.feed(b"data: {\"choices\":[{\"text\":\"B\"}]}\n\n", 0.30);
        a.feed(b"data: {\"choices\":[{\"text\":\"C\"}]}\n\n", 0.50);
        assert_eq!(a.content_chunks, 3);
        assert_eq!((a.first_token, a.last_token), (Some(0.20), Some(0.50)));
        assert_eq!(a.output_tokens(), 3);
        assert!((a.tpot().unwrap() - 0.15).abs() < 1e-12);
        // The usage chunk overrides the chunk count.
        a.feed(
            b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":4}}\n\ndata: [DONE]\n\n",
            0.6,
        );
        assert!(a.done);
        assert_eq!(a.output_tokens(), 4);
        assert_eq!(a.usage_prompt, Some(9));
        assert!((a.tpot().unwrap() - 0.1).abs() < 1e-12);

        // A last line without its newline is parsed at the end; errors stop the stream.
        let mut b = StreamAcc::default();
        b.feed(b"data: [DONE]", 1.0);
        assert!(!b.done);
        b.finish(1.0);
        assert!(b.done);
        let mut c = StreamAcc::default();
        c.feed(b"data: {\"error\":{\"message\":\"engine died\"}}\n", 1.0);
        assert_eq!(c.error.as_deref(), Some("engine died"));
        let mut d = StreamAcc::default();
        d.feed(b"data: {\"choices\":[{\"text\":\"x\"}]}\n", 1.0);
        assert_eq!(d.tpot(), None);
    }

    #[test]
    fn poisson_arrivals_are_seeded() {
        let a = arrival_offsets(10.0, 7, 2000);
        assert_eq!(a, arrival_offsets(10.0, 7, 2000));
        assert_ne!(a, arrival_offsets(10.0, 8, 2000));
        assert_eq!(a[0], 0.0);
        assert!(a.windows(2).all(|w| w[1] >= w[0]));
        // Mean gap ≈ 1/rate.
        let mean_gap = a[a.len() - 1] / (a.len() - 1) as f64;
        assert!((mean_gap - 0.1).abs() < 0.01, "{mean_gap}");
        assert!(arrival_offsets(f64::INFINITY, 1, 5)
            .iter()
            .all(|&t| t == 0.0));
    }

    #[test]
    fn prompts_have_the_asked_word_count() {
        let mut r1 = StdRng::seed_from_u64(3);
        let mut r2 = StdRng::seed_from_u64(3);
        let p = build_prompt(&mut r1, 100);
        assert_eq!(p, build_prompt(&mut r2, 100));
        assert_eq!(p.split(' ').count(), 100);
        assert_eq!(estimate_tokens(&p), 100);
        assert!(p.split(' ').all(|w| WORDS.contains(&w)));
        assert!(WORDS
            .iter()
            .all(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_lowercase())));
        assert_eq!(build_prompt(&mut r1, 0), "");
    }

    #[test]
    fn request_sequence_is_deterministic() {
        let g = |seed| {
            RequestGen::new(seed, 20, None, OutputLen::Uniform(32, 128), Some(50))
                .collect::<Vec<_>>()
        };
        let a = g(1);
        assert_eq!(a.len(), 50);
        assert_eq!(a, g(1));
        assert_ne!(a, g(2));
        assert!(a.iter().all(|s| (32..=128).contains(&s.max_tokens)));
        assert!(a.iter().enumerate().all(|(i, s)| s.index == i));
        let lines = Arc::new(vec!["a b".to_string(), "c".to_string()]);
        let f: Vec<_> = RequestGen::new(0, 20, Some(lines), OutputLen::Fixed(4), Some(3)).collect();
        assert_eq!(
            f.iter().map(|s| s.prompt.as_str()).collect::<Vec<_>>(),
            ["a b", "c", "a b"]
        );
        assert_eq!(f[0].prompt_tokens_est, 2);
        assert!(
            RequestGen::new(0, 1, None, OutputLen::Fixed(1), None)
                .take(1000)
                .count()
                == 1000
        );
    }

    #[test]
    fn parsing_options_and_bodies() {
        assert_eq!(parse_range("32:128").unwrap(), OutputLen::Uniform(32, 128));
        assert!(parse_range("0:4").is_err());
        assert!(parse_range("9:4").is_err());
        assert!(parse_range("9").is_err());
        assert_eq!(base_url("http://h:1/"), "http://h:1");
        assert_eq!(base_url("http://h:1/v1/"), "http://h:1");
        assert_eq!(prompt_lines("a\n\n b \r\n"), vec!["a", " b "]);
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
        assert!(sweep_table(&[s, e]).lines().count() == 3);
        assert_eq!(per_request(&outcomes, |t| t.tpot).len(), 3);
    }
}
