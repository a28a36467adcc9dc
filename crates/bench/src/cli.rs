//! `tessera bench <gemm|model>`: argument definitions and the entry point.
//!
//! Wire into the main command as a variant `Bench { #[command(subcommand)] cmd: BenchCommand }`
//! and call [`run`].

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::{Subcommand, ValueEnum};
use tessera_kernels::plan::Precision;

use crate::gemm::{parse_dtypes, parse_families, run_gemm, GemmConfig};
use crate::model::{run_model, ModelConfig};
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

#[derive(Debug, Clone, Subcommand)]
pub enum BenchCommand {
    /// Sweep matrix-product shapes: the planner's choice vs the best of its top candidates
    /// (oracle), the best single fixed strategy, and OpenBLAS sgemm (f32).
    Gemm {
        /// Compute units (default: available parallelism).
        #[arg(long)]
        threads: Option<usize>,
        #[arg(long, value_enum, default_value = "fast")]
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
        #[arg(long, value_enum, default_value = "fast")]
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
            };
            run_gemm(&cfg)
        }
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
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: BenchCommand,
    }

    #[test]
    fn gemm_defaults_and_lists() {
        let c = Cli::parse_from(["x", "gemm"]);
        match c.cmd {
            BenchCommand::Gemm {
                precision,
                dtypes,
                shapes,
                m,
                candidates,
                plot,
                ..
            } => {
                assert_eq!(precision, PrecisionArg::Fast);
                assert_eq!(dtypes, vec!["f32", "q4_1", "q8_0"]);
                assert_eq!(shapes, vec!["smollm", "llama7b"]);
                assert_eq!(m, None);
                assert_eq!(candidates, 8);
                assert_eq!(plot, None);
            }
            _ => panic!("not gemm"),
        }
        let c = Cli::parse_from(["x", "gemm", "--m", "1,8", "--dtypes", "q4_1", "--plot"]);
        match c.cmd {
            BenchCommand::Gemm {
                m, dtypes, plot, ..
            } => {
                assert_eq!(m, Some(vec![1, 8]));
                assert_eq!(dtypes, vec!["q4_1"]);
                assert_eq!(plot, Some(PathBuf::from("bench-gemm.svg")));
            }
            _ => panic!("not gemm"),
        }
    }

    #[test]
    fn model_defaults() {
        let c = Cli::parse_from(["x", "model", "--precision", "exact"]);
        match c.cmd {
            BenchCommand::Model {
                prompt_tokens,
                gen_tokens,
                reps,
                precision,
                ..
            } => {
                assert_eq!((prompt_tokens, gen_tokens, reps), (512, 128, 3));
                assert_eq!(precision, PrecisionArg::Exact);
            }
            _ => panic!("not model"),
        }
    }
}
