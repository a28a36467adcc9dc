//! `tessera bench <gemm|model|serve|tp|make-adapters|plot-lora>`: argument definitions and the
//! entry point.
//!
//! Wire into the main command as a variant `Bench { #[command(subcommand)] cmd: BenchCommand }`
//! and call [`run`].

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::{Subcommand, ValueEnum};
use tessera_kernels::plan::Precision;

use crate::gemm::{parse_dtypes, parse_families, run_gemm, GemmConfig};
use crate::make_adapters::{parse_targets, run_make_adapters, FactorDtype, MakeAdaptersConfig};
use crate::model::{run_model, ModelConfig};
use crate::serve::adapters::parse_adapters;
use crate::serve::{
    parse_range, run_conversation, run_dialects, run_long_prefill, run_serve, ConversationConfig,
    Endpoint, Load, LongPrefillConfig, OutputLen, Scenario, ServeConfig,
};
use crate::stats::Repeat;

/// Which arithmetic to benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PrecisionArg {
    /// f32 dot products over exactly dequantized weights.
    Exact,
    /// Integer dot products of block-quantized weights with 8-bit activations.
    Fast,
}

impl From<PrecisionArg> for Precision {
    fn from(p: PrecisionArg) -> Self {
        match p {
            PrecisionArg::Exact => Precision::Exact,
            PrecisionArg::Fast => Precision::Fast,
        }
    }
}

// Parsed once per run: the size of the largest variant (`serve`'s flags) does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Subcommand)]
pub enum BenchCommand {
    /// Sweep matrix-product shapes: the planner's choice vs the best of its top candidates
    /// (oracle), the best single fixed strategy, and OpenBLAS sgemm (f32).
    Gemm {
        /// Compute units (default: available parallelism).
        #[arg(long)]
        threads: Option<usize>,
        #[arg(long, value_enum, default_value = "exact")]
        precision: PrecisionArg,
        /// Weight formats, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "f32,q4_1,q8_0")]
        dtypes: Vec<String>,
        /// Shape sets, comma-separated: smollm (SmolLM2-135M), llama7b (one Llama-7B layer).
        #[arg(long, value_delimiter = ',', default_value = "smollm,llama7b")]
        shapes: Vec<String>,
        /// Activation rows, comma-separated (default: per shape set).
        #[arg(long, value_delimiter = ',')]
        m: Option<Vec<usize>>,
        /// One JSON object per shape on stdout, then a summary object.
        #[arg(long)]
        json: bool,
        /// Write an SVG chart (default file: bench-gemm.svg).
        #[arg(long, num_args = 0..=1, default_missing_value = "bench-gemm.svg")]
        plot: Option<PathBuf>,
        /// Top candidates by predicted time measured for the oracle.
        #[arg(long, default_value_t = 8)]
        candidates: usize,
        /// Minimum milliseconds of timed runs per measurement (at least 3 runs).
        #[arg(long, default_value_t = 30)]
        min_ms: u64,
        /// Seed of the random weights and activations.
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Skip the cold measurement of rows with M <= 4 (the planned plan run over copies of
        /// the weight that together exceed twice the last-level cache, so they come from DRAM).
        #[arg(long)]
        no_cold: bool,
    },
    /// Every kernel variant of the exact and fast paths on this CPU beside its portable twin
    /// (the default model's and a Llama-7B layer's products, M = 1 and a large M): GFLOP/s,
    /// GB/s, and whether the variant this CPU runs is the fastest.
    Kernels {
        /// Compute units (default: available parallelism).
        #[arg(long)]
        threads: Option<usize>,
        /// Weight formats, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "q4_1,q8_0")]
        dtypes: Vec<String>,
        /// Shape sets, comma-separated: smollm (SmolLM2-135M), llama7b (one Llama-7B layer).
        #[arg(long, value_delimiter = ',', default_value = "smollm,llama7b")]
        shapes: Vec<String>,
        /// The large M (prompt tokens of a step) timed beside M = 1.
        #[arg(long, default_value_t = 128)]
        large_m: usize,
        /// Minimum milliseconds of timed runs per product (at least 3 runs).
        #[arg(long, default_value_t = 30)]
        min_ms: u64,
        /// One JSON object per product and variant on stdout instead of the table.
        #[arg(long)]
        json: bool,
        /// Seed of the random weights and activations.
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Internal: time one variant (`precision/name`) and print its figures as JSON.
        #[arg(long, hide = true)]
        child: Option<String>,
    },
    /// llama-bench-style throughput: prompt processing (pp) and token generation (tg).
    Model {
        /// GGUF file or Hugging Face folder (default: $TESSERA_MODEL or the default model).
        #[arg(long)]
        model: Option<PathBuf>,
        #[arg(long, default_value_t = 512)]
        prompt_tokens: usize,
        #[arg(long, default_value_t = 128)]
        gen_tokens: usize,
        /// Compute units (default: available parallelism).
        #[arg(long)]
        threads: Option<usize>,
        #[arg(long, value_enum, default_value = "exact")]
        precision: PrecisionArg,
        /// Repetitions; each is printed and the median reported.
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// One JSON object on stdout (pp_tok_s, tg_tok_s, threads, precision, model).
        #[arg(long)]
        json: bool,
        /// Generate right after the prompt instead of from an empty context (llama-bench's
        /// tg test starts from an empty context).
        #[arg(long)]
        tg_after_prompt: bool,
        /// Skip the warm-up run.
        #[arg(long)]
        no_warmup: bool,
        /// Seed of the random prompt.
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Run every layer's stages over this many sub-batches of each step (default: chosen
        /// per step by the step-time model under tensor parallelism, one otherwise).
        #[arg(long)]
        sub_batches: Option<usize>,
        /// How sub-batches are cut: sequence (whole sequences) or tokens.
        #[arg(long, default_value = "sequence")]
        split_by: tessera_engine::SplitBy,
        /// Tensor-parallel ranks in this process, comma-separated to measure several in one
        /// run (e.g. 1,2); prints the share of the time spent in communication.
        #[arg(long, value_delimiter = ',', default_value = "1")]
        tp: Vec<usize>,
        /// `local` (threads of this process) or `mpi` (run under `mpirun -np R`, one --tp
        /// value, a build with --features mpi).
        #[arg(long, default_value = "local")]
        tp_backend: String,
        /// KV cache element type: f32 or f16.
        #[arg(long, default_value = "f32")]
        kv_dtype: tessera_engine::KvDtype,
        /// Measure speculative decoding instead: `ngram` (prompt lookup) or `draft:PATH` (a
        /// draft model with the same vocabulary), against plain decoding in the same run,
        /// on the code-editing, summarizing and chat workloads (greedy; outputs checked
        /// identical). --gen-tokens bounds each output.
        #[arg(long, value_name = "ngram|draft:PATH")]
        speculative: Option<String>,
        /// Drafted tokens per verification with --speculative: a number or `auto`.
        #[arg(long, default_value = "auto")]
        spec_tokens: String,
        /// Sequences batched in the second measurement of --speculative (0: single stream
        /// only).
        #[arg(long, default_value_t = 16)]
        clients: usize,
        /// With --speculative: only these workloads (code, summary, chat), comma-separated.
        #[arg(long, value_delimiter = ',')]
        workloads: Vec<String>,
        /// With --speculative: a JSON file of workloads ({"name": ["prompt", ...]}) instead of
        /// the built-in ones (docs/bench/spec/workloads.json).
        #[arg(long)]
        workload_file: Option<PathBuf>,
    },
    /// Load generator for an OpenAI-compatible server (Tessera, llama-server, vLLM):
    /// streaming requests; TTFT, TPOT, latency, throughput and goodput.
    Serve {
        /// Base URL of the server, e.g. http://127.0.0.1:8080.
        #[arg(long)]
        url: String,
        /// Model name to send (default: the first id of GET /v1/models, else none).
        #[arg(long, conflicts_with = "adapters")]
        model: Option<String>,
        /// Model names requests take in turn, comma-separated: a server's LoRA adapters
        /// and/or the base model's name. The report adds requests, output tokens/s and
        /// TTFT/TPOT percentiles per name.
        #[arg(long, value_delimiter = ',', value_name = "NAME,NAME,...")]
        adapters: Option<Vec<String>>,
        /// Bearer key for the server.
        #[arg(long)]
        api_key: Option<String>,
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
        endpoint: Vec<Endpoint>,
        /// With several --api values: rounds of measurements (each round measures every
        /// API once; the report gives medians over rounds).
        #[arg(long, default_value_t = 1)]
        rounds: usize,
        /// Clients sending requests back-to-back (default 1). With --rate: the most
        /// requests in flight.
        #[arg(long)]
        concurrency: Option<usize>,
        /// Poisson arrivals at this many requests/s ("inf": all at once).
        #[arg(long, conflicts_with = "sweep")]
        rate: Option<f64>,
        /// One measurement per concurrency level, comma-separated (e.g. 1,2,4,8,16).
        #[arg(long, value_delimiter = ',', conflicts_with = "concurrency")]
        sweep: Option<Vec<usize>>,
        /// Requests per measurement (default 64 unless --duration is given).
        #[arg(long)]
        requests: Option<usize>,
        /// Stop sending new requests after this many seconds (in-flight ones finish).
        #[arg(long)]
        duration: Option<f64>,
        /// Approximate prompt length: that many random common words.
        #[arg(long, default_value_t = 100)]
        prompt_tokens: usize,
        /// Prompts from a file, one per line or a JSON array of strings, used in turn
        /// (instead of random words).
        #[arg(long)]
        prompt_file: Option<PathBuf>,
        /// Output tokens per request (max_tokens with ignore_eos; with --response-format,
        /// the most, without ignore_eos).
        #[arg(long, default_value_t = 64)]
        output_tokens: usize,
        /// Output tokens drawn uniformly from LO:HI (inclusive) instead.
        #[arg(long, value_name = "LO:HI")]
        output_tokens_range: Option<String>,
        #[arg(long, default_value_t = 0.0)]
        temperature: f64,
        /// A JSON file holding an OpenAI response_format object (json_object, or json_schema
        /// with a schema), sent with every request; each output is checked against it
        /// (valid / invalid / cut by max_tokens).
        #[arg(long, value_name = "FILE.json")]
        response_format: Option<PathBuf>,
        /// Time-to-first-token objective for goodput, in ms.
        #[arg(long, default_value_t = 1000.0)]
        slo_ttft_ms: f64,
        /// Time-per-output-token objective for goodput, in ms.
        #[arg(long, default_value_t = 100.0)]
        slo_tpot_ms: f64,
        /// Per-request timeout in seconds (a timed-out request counts as failed).
        #[arg(long, default_value_t = 300.0)]
        timeout: f64,
        /// Untimed sequential requests before measuring.
        #[arg(long, default_value_t = 0)]
        warmup: usize,
        /// One JSON object per measurement on stdout.
        #[arg(long)]
        json: bool,
        /// Write an SVG chart (default file: bench-serve.svg): latency and throughput vs
        /// concurrency for --sweep, else per-request TTFT/TPOT over time.
        #[arg(long, num_args = 0..=1, default_missing_value = "bench-serve.svg")]
        plot: Option<PathBuf>,
        /// Seed of the prompts, output lengths and arrivals.
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// `load`: the clients or arrivals above. `long-prefill`: a short request's TTFT
        /// while long prompts prefill against the idle server's (the --long-*, --short-*
        /// and --idle-samples flags; --url, --model, --api-key, --api, --temperature,
        /// --timeout, --json and --seed apply too). `conversation`: a follow-up's TTFT on
        /// /v1/responses continued by previous_response_id against the whole history
        /// resent cold (--history-tokens, --samples, --output-tokens, --short-*).
        #[arg(long, value_enum, default_value = "load")]
        scenario: Scenario,
        /// long-prefill: long prompts sent at once.
        #[arg(long, default_value_t = 3)]
        long_prompts: usize,
        /// long-prefill: approximate tokens of each long prompt.
        #[arg(long, default_value_t = 3600)]
        long_prompt_tokens: usize,
        /// long-prefill: approximate tokens of the short request's prompt.
        #[arg(long, default_value_t = 30)]
        short_prompt_tokens: usize,
        /// long-prefill: output tokens of every request (the long prompts' too).
        #[arg(long, default_value_t = 4)]
        short_output_tokens: usize,
        /// conversation: approximate tokens of the first turn's history (its answer has
        /// --output-tokens tokens; the follow-up question --short-prompt-tokens words and
        /// --short-output-tokens output tokens).
        #[arg(long, default_value_t = 2000)]
        history_tokens: usize,
        /// conversation: conversations measured (after one untimed).
        #[arg(long, default_value_t = 5)]
        samples: usize,
        /// long-prefill: short requests on the idle server.
        #[arg(long, default_value_t = 8)]
        idle_samples: usize,
        /// long-prefill: while the long prompts run, a short request arrives every this many
        /// milliseconds on average (0.5 to 1.5 times it apart, finished or not).
        #[arg(long, default_value_t = 1000.0)]
        short_gap_ms: f64,
    },
    /// Write seeded random PEFT LoRA folders (DIR/a0 .. DIR/a{N-1}) that fit a base model,
    /// for `tessera serve --lora NAME=PATH`; prints each folder and its size, then the
    /// `--lora` flags.
    MakeAdapters {
        /// Folder the adapter folders are written into (created if missing).
        #[arg(long)]
        out: PathBuf,
        /// Adapters to write.
        #[arg(long, default_value_t = 1)]
        count: usize,
        /// LoRA rank r (lora_alpha is 2·r).
        #[arg(long, default_value_t = 8)]
        rank: usize,
        /// Adapted projections, comma-separated (q, k, v, o, gate, up, down), or all.
        #[arg(long, value_delimiter = ',', default_value = "q,v")]
        targets: Vec<String>,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Base model: GGUF file or Hugging Face folder (default: $TESSERA_MODEL or the
        /// default model).
        #[arg(long)]
        model: Option<PathBuf>,
        /// Element type of the factors in the files (bf16: what PEFT training usually
        /// saves; Tessera holds them as stored).
        #[arg(long, value_enum, default_value = "bf16")]
        dtype: FactorDtype,
    },
    /// Sub-batch pipelining under tensor parallelism: for each step size and each
    /// sub-batching (S = 1, 2, 4 by tokens and by sequence, and the step-time model's
    /// choice), the step time, compute alone, communication alone and the share hidden.
    Tp {
        /// GGUF file or Hugging Face folder (default: $TESSERA_MODEL or the default model).
        #[arg(long)]
        model: Option<PathBuf>,
        /// Compute threads in all (split over the ranks; default: all available cores).
        #[arg(long)]
        threads: Option<usize>,
        #[arg(long, value_enum, default_value = "exact")]
        precision: PrecisionArg,
        /// Tensor-parallel ranks.
        #[arg(long, default_value_t = 2)]
        tp: usize,
        /// `local` (threads of this process) or `mpi` (run under `mpirun -np R`, a build with
        /// --features mpi).
        #[arg(long, default_value = "local")]
        tp_backend: String,
        /// Step sizes in tokens, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "16,64,256,1024")]
        tokens: Vec<usize>,
        /// Runs per measurement (the median is reported; halved from 512 tokens up).
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// One JSON object per row (keys tokens, s, split, step_ms, compute_ms, comm_ms,
        /// hidden, chosen, and the measured link).
        #[arg(long)]
        json: bool,
        /// Free text copied into every JSON row (e.g. the link shaped by scripts/tp-netns.sh).
        #[arg(long)]
        label: Option<String>,
    },
    /// Summarize a multi-LoRA benchmark (one JSON object per line, as written by
    /// scripts/bench-lora.sh): output tokens/s per adapter kind, batching and count, ratios
    /// to base-only and co-batching / serial; optionally an SVG chart.
    PlotLora {
        /// The results file.
        file: PathBuf,
        /// Write an SVG chart of output tokens/s against the adapter count.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

/// Runs a benchmark command.
pub fn run(cmd: BenchCommand) -> Result<()> {
    let default_threads = tessera_engine::engine::default_threads;
    match cmd {
        BenchCommand::Gemm {
            threads,
            precision,
            dtypes,
            shapes,
            m,
            json,
            plot,
            candidates,
            min_ms,
            seed,
            no_cold,
        } => {
            if let Some(ms) = &m {
                if ms.is_empty() || ms.contains(&0) {
                    anyhow::bail!("--m needs positive values");
                }
            }
            let cfg = GemmConfig {
                threads: threads.unwrap_or_else(default_threads).max(1),
                precision: precision.into(),
                dtypes: parse_dtypes(&dtypes)?,
                families: parse_families(&shapes)?,
                ms: m,
                candidates,
                repeat: Repeat {
                    min_time: Duration::from_millis(min_ms),
                    ..Repeat::default()
                },
                json,
                plot,
                seed,
                cold: !no_cold,
            };
            run_gemm(&cfg)
        }
        BenchCommand::Kernels {
            threads,
            dtypes,
            shapes,
            large_m,
            min_ms,
            json,
            seed,
            child,
        } => {
            if large_m == 0 {
                anyhow::bail!("--large-m needs a positive value");
            }
            crate::kernels::run_kernels(&crate::kernels::KernelsConfig {
                threads: threads.unwrap_or_else(default_threads).max(1),
                families: parse_families(&shapes)?,
                dtypes: parse_dtypes(&dtypes)?,
                large_m,
                min_ms,
                json,
                seed,
                child,
            })
        }
        BenchCommand::Model {
            model,
            gen_tokens,
            threads,
            precision,
            reps,
            json,
            speculative: Some(drafter),
            spec_tokens,
            clients,
            workloads,
            workload_file,
            ..
        } => crate::spec::run_spec(&crate::spec::SpecBenchConfig {
            model,
            threads: threads.unwrap_or_else(default_threads).max(1),
            precision: precision.into(),
            drafter: tessera_engine::spec::DrafterSpec::parse(&drafter)
                .map_err(|e| anyhow::anyhow!("--speculative: {e}"))?,
            tokens: tessera_engine::spec::SpecTokens::parse(&spec_tokens)
                .map_err(|e| anyhow::anyhow!("--spec-tokens: {e}"))?,
            gen_tokens,
            reps,
            clients,
            workloads,
            workload_file,
            json,
        }),
        BenchCommand::Model {
            model,
            prompt_tokens,
            gen_tokens,
            threads,
            precision,
            reps,
            json,
            tg_after_prompt,
            no_warmup,
            seed,
            sub_batches,
            split_by,
            tp,
            tp_backend,
            kv_dtype,
            speculative: None,
            ..
        } => run_model(&ModelConfig {
            model,
            prompt_tokens,
            gen_tokens,
            threads: threads.unwrap_or_else(default_threads).max(1),
            precision: precision.into(),
            reps,
            json,
            tg_after_prompt,
            warmup: !no_warmup,
            seed,
            sub_batching: match sub_batches {
                None => tessera_engine::SubBatchPolicy::Auto,
                Some(n) => tessera_engine::SubBatching::new(n, split_by)
                    .map_err(|e| anyhow::anyhow!("--sub-batches: {e}"))?
                    .into(),
            },
            tp,
            tp_backend: match tp_backend.as_str() {
                "local" => tessera_engine::TpBackend::Local,
                "mpi" => tessera_engine::TpBackend::Mpi,
                o => anyhow::bail!("--tp-backend {o:?}: expected local or mpi"),
            },
            kv_dtype,
        }),
        BenchCommand::Serve {
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
        } => {
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
        BenchCommand::MakeAdapters {
            out,
            count,
            rank,
            targets,
            seed,
            model,
            dtype,
        } => run_make_adapters(&MakeAdaptersConfig {
            out,
            count,
            rank,
            targets: parse_targets(&targets)?,
            seed,
            model,
            dtype,
        }),
        BenchCommand::Tp {
            model,
            threads,
            precision,
            tp,
            tp_backend,
            tokens,
            reps,
            json,
            label,
        } => crate::tp::run_tp(&crate::tp::TpBenchConfig {
            model,
            threads: threads.unwrap_or_else(default_threads).max(1),
            precision: precision.into(),
            tp,
            backend: match tp_backend.as_str() {
                "local" => tessera_engine::TpBackend::Local,
                "mpi" => tessera_engine::TpBackend::Mpi,
                o => anyhow::bail!("--tp-backend {o:?}: expected local or mpi"),
            },
            tokens,
            reps,
            json,
            label,
        }),
        BenchCommand::PlotLora { file, out } => {
            crate::lora_report::run_plot_lora(&file, out.as_deref())
        }
    }
}

#[cfg(test)]
#[path = "cli_tests.rs"]
mod tests;
