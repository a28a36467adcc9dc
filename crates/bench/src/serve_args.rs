//! `tessera bench serve`'s arguments and their checks, before the load generator
//! ([`crate::serve`]) runs.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::serve::adapters::parse_adapters;
use crate::serve::{
    parse_range, run_conversation, run_dialects, run_long_prefill, run_serve, ConversationConfig,
    Endpoint, Load, LongPrefillConfig, OutputLen, Scenario, ServeConfig,
};

/// Load generator for an OpenAI-compatible server (Tessera, llama-server, vLLM):
/// streaming requests; TTFT, TPOT, latency, throughput and goodput.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Base URL of the server, e.g. http://127.0.0.1:8080.
    #[arg(long)]
    pub url: String,
    /// Model name to send (default: the first id of GET /v1/models, else none).
    #[arg(long, conflicts_with = "adapters")]
    pub model: Option<String>,
    /// Model names requests take in turn, comma-separated: a server's LoRA adapters
    /// and/or the base model's name. The report adds requests, output tokens/s and
    /// TTFT/TPOT percentiles per name.
    #[arg(long, value_delimiter = ',', value_name = "NAME,NAME,...")]
    pub adapters: Option<Vec<String>>,
    /// Bearer key for the server.
    #[arg(long)]
    pub api_key: Option<String>,
    /// The API (dialect) requests use. Several, comma-separated (e.g.
    /// chat,responses,messages): each is measured in turn under the same load for
    /// --rounds rounds, and the report compares their throughput, TPOT and TTFT.
    #[arg(
        long = "api",
        visible_alias = "endpoint",
        value_enum,
        value_delimiter = ',',
        default_value = "completions"
    )]
    pub endpoint: Vec<Endpoint>,
    /// With several --api values: rounds of measurements (each round measures every
    /// API once; the report gives medians over rounds).
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Clients sending requests back-to-back (default 1). With --rate: the most
    /// requests in flight.
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Poisson arrivals at this many requests/s ("inf": all at once).
    #[arg(long, conflicts_with = "sweep")]
    pub rate: Option<f64>,
    /// One measurement per concurrency level, comma-separated (e.g. 1,2,4,8,16).
    #[arg(long, value_delimiter = ',', conflicts_with = "concurrency")]
    pub sweep: Option<Vec<usize>>,
    /// Requests per measurement (default 64 unless --duration is given).
    #[arg(long)]
    pub requests: Option<usize>,
    /// Stop sending new requests after this many seconds (in-flight ones finish).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Approximate prompt length: that many random common words.
    #[arg(long, default_value_t = 100)]
    pub prompt_tokens: usize,
    /// Prompts from a file, one per line or a JSON array of strings, used in turn
    /// (instead of random words).
    #[arg(long)]
    pub prompt_file: Option<PathBuf>,
    /// Output tokens per request (max_tokens with ignore_eos; with --response-format,
    /// the most, without ignore_eos).
    #[arg(long, default_value_t = 64)]
    pub output_tokens: usize,
    /// Output tokens drawn uniformly from LO:HI (inclusive) instead.
    #[arg(long, value_name = "LO:HI")]
    pub output_tokens_range: Option<String>,
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// A JSON file holding an OpenAI response_format object (json_object, or json_schema
    /// with a schema), sent with every request; each output is checked against it
    /// (valid / invalid / cut by max_tokens).
    #[arg(long, value_name = "FILE.json")]
    pub response_format: Option<PathBuf>,
    /// Time-to-first-token objective for goodput, in ms.
    #[arg(long, default_value_t = 1000.0)]
    pub slo_ttft_ms: f64,
    /// Time-per-output-token objective for goodput, in ms.
    #[arg(long, default_value_t = 100.0)]
    pub slo_tpot_ms: f64,
    /// Per-request timeout in seconds (a timed-out request counts as failed).
    #[arg(long, default_value_t = 300.0)]
    pub timeout: f64,
    /// Untimed sequential requests before measuring.
    #[arg(long, default_value_t = 0)]
    pub warmup: usize,
    /// One JSON object per measurement on stdout.
    #[arg(long)]
    pub json: bool,
    /// Write an SVG chart (default file: bench-serve.svg): latency and throughput vs
    /// concurrency for --sweep, else per-request TTFT/TPOT over time.
    #[arg(long, num_args = 0..=1, default_missing_value = "bench-serve.svg")]
    pub plot: Option<PathBuf>,
    /// Seed of the prompts, output lengths and arrivals.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// `load`: the clients or arrivals above. `long-prefill`: a short request's TTFT
    /// while long prompts prefill against the idle server's (the --long-*, --short-*
    /// and --idle-samples flags; --url, --model, --api-key, --api, --temperature,
    /// --timeout, --json and --seed apply too). `conversation`: a follow-up's TTFT on
    /// /v1/responses continued by previous_response_id against the whole history
    /// resent cold (--history-tokens, --samples, --output-tokens, --short-*).
    #[arg(long, value_enum, default_value = "load")]
    pub scenario: Scenario,
    /// long-prefill: long prompts sent at once.
    #[arg(long, default_value_t = 3)]
    pub long_prompts: usize,
    /// long-prefill: approximate tokens of each long prompt.
    #[arg(long, default_value_t = 3600)]
    pub long_prompt_tokens: usize,
    /// long-prefill: approximate tokens of the short request's prompt.
    #[arg(long, default_value_t = 30)]
    pub short_prompt_tokens: usize,
    /// long-prefill: output tokens of every request (the long prompts' too).
    #[arg(long, default_value_t = 4)]
    pub short_output_tokens: usize,
    /// conversation: approximate tokens of the first turn's history (its answer has
    /// --output-tokens tokens; the follow-up question --short-prompt-tokens words and
    /// --short-output-tokens output tokens).
    #[arg(long, default_value_t = 2000)]
    pub history_tokens: usize,
    /// conversation: conversations measured (after one untimed).
    #[arg(long, default_value_t = 5)]
    pub samples: usize,
    /// long-prefill: short requests on the idle server.
    #[arg(long, default_value_t = 8)]
    pub idle_samples: usize,
    /// long-prefill: while the long prompts run, a short request arrives every this many
    /// milliseconds on average (0.5 to 1.5 times it apart, finished or not).
    #[arg(long, default_value_t = 1000.0)]
    pub short_gap_ms: f64,
}

impl ServeArgs {
    pub fn run(self) -> anyhow::Result<()> {
        let ServeArgs {
            url,
            model,
            api_key,
            endpoint,
            concurrency,
            rate,
            sweep,
            requests,
            duration,
            prompt_tokens,
            prompt_file,
            output_tokens,
            output_tokens_range,
            temperature,
            response_format,
            slo_ttft_ms,
            slo_tpot_ms,
            timeout,
            warmup,
            json,
            plot,
            seed,
            adapters,
            scenario,
            long_prompts,
            long_prompt_tokens,
            short_prompt_tokens,
            short_output_tokens,
            idle_samples,
            short_gap_ms,
            history_tokens,
            samples,
            rounds,
        } = self;
        let apis = endpoint;
        let endpoint = *apis
            .first()
            .ok_or_else(|| anyhow::anyhow!("--api needs a value"))?;
        if apis.len() > 1 && scenario != Scenario::Load {
            anyhow::bail!("several --api values compare dialects under --scenario load only");
        }
        if !(timeout.is_finite() && timeout > 0.0) {
            anyhow::bail!("--timeout must be a positive number of seconds");
        }
        if scenario == Scenario::Conversation {
            if endpoint != Endpoint::Responses {
                anyhow::bail!("--scenario conversation runs on --api responses");
            }
            return run_conversation(&ConversationConfig {
                url,
                model,
                api_key,
                temperature,
                timeout: Duration::from_secs_f64(timeout),
                seed,
                json,
                history_tokens,
                answer_tokens: output_tokens,
                followup_tokens: short_prompt_tokens,
                output_tokens: short_output_tokens,
                samples,
                target_ratio: 0.3,
            });
        }
        if scenario == Scenario::LongPrefill {
            return run_long_prefill(&LongPrefillConfig {
                url,
                model,
                api_key,
                endpoint,
                temperature,
                timeout: Duration::from_secs_f64(timeout),
                seed,
                json,
                long_prompts,
                long_prompt_tokens,
                short_prompt_tokens,
                output_tokens: short_output_tokens,
                idle_samples,
                gap_ms: short_gap_ms,
                target_ratio: 2.0,
            });
        }
        let adapters = adapters.as_deref().map(parse_adapters).transpose()?;
        if concurrency == Some(0) {
            anyhow::bail!("--concurrency must be positive");
        }
        let loads = match (sweep, rate) {
            (Some(levels), _) => {
                if levels.is_empty() || levels.contains(&0) {
                    anyhow::bail!("--sweep needs positive concurrency levels");
                }
                levels.into_iter().map(Load::Concurrency).collect()
            }
            (None, Some(rate)) => {
                if rate.is_nan() || rate <= 0.0 {
                    anyhow::bail!("--rate must be positive");
                }
                vec![Load::Rate {
                    rate,
                    max_concurrency: concurrency,
                }]
            }
            (None, None) => vec![Load::Concurrency(concurrency.unwrap_or(1))],
        };
        let duration = match duration {
            Some(d) if d.is_finite() && d > 0.0 => Some(Duration::from_secs_f64(d)),
            Some(_) => anyhow::bail!("--duration must be a positive number of seconds"),
            None => None,
        };
        let output = match output_tokens_range {
            Some(r) => parse_range(&r)?,
            None => OutputLen::Fixed(output_tokens),
        };
        let cfg = ServeConfig {
            url,
            model,
            api_key,
            endpoint,
            loads,
            requests: match (requests, duration) {
                (None, None) => Some(64),
                (r, _) => r,
            },
            duration,
            prompt_tokens,
            prompt_file,
            output,
            temperature,
            slo_ttft_ms,
            slo_tpot_ms,
            timeout: Duration::from_secs_f64(timeout),
            warmup,
            json,
            plot,
            seed,
            adapters,
            response_format,
        };
        if apis.len() > 1 {
            run_dialects(&cfg, &apis, rounds)
        } else {
            run_serve(&cfg)
        }
    }
}
