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
pub use crate::serve_args::ServeArgs;
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
    Serve(ServeArgs),
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
        BenchCommand::Serve(args) => args.run(),
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
