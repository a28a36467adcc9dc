//! The `tessera` command line. Each subcommand is a thin layer over the engine crates;
//! errors are reported in one line and a non-zero exit status, never a panic.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use tessera_engine::engine::default_threads;
use tessera_engine::generate::generate_with;
use tessera_engine::{store, GenerateRequest, SamplingParams};
use tessera_kernels::plan::Precision;
use tessera_kernels::planner::ShapeKey;
use tessera_tokenizer::ChatMessage;

#[cfg(feature = "cuda")]
mod cuda_check;
mod device;
mod model_args;
mod serve;
mod simulate;
mod spec_args;
mod synth;

/// mimalloc rather than glibc's malloc. Under glibc the same engine steps run 5-8% slower
/// after one workload than after another (docs/bench/step-budget.md); fixing glibc's mmap
/// threshold removes the gap, and with mimalloc it is gone. glibc moves its mmap and trim
/// thresholds with the allocation history, which is the likely cause (inferred from those
/// experiments, not traced).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "tessera", version, about = "LLM inference and serving engine")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

pub(crate) use model_args::{adapter, default_model_name, load, load_with_context, ModelArgs};
pub(crate) use spec_args::SpecArgs;

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming it to stdout.
    Generate {
        #[arg(long)]
        prompt: String,
        /// Wrap the prompt as a user message in the model's chat template.
        #[arg(long)]
        chat: bool,
        #[arg(long, default_value_t = 128)]
        max_tokens: usize,
        /// 0 means greedy.
        #[arg(long, default_value_t = 0.8)]
        temperature: f32,
        #[arg(long, default_value_t = 1.0)]
        top_p: f32,
        /// 0 disables.
        #[arg(long, default_value_t = 0)]
        top_k: usize,
        #[arg(long, default_value_t = 0.0)]
        min_p: f32,
        #[arg(long, default_value_t = 1.0)]
        repetition_penalty: f32,
        #[arg(long, default_value_t = 0.0)]
        presence_penalty: f32,
        #[arg(long, default_value_t = 0.0)]
        frequency_penalty: f32,
        #[arg(long)]
        seed: Option<u64>,
        /// Stop when this text is generated (repeatable).
        #[arg(long)]
        stop: Vec<String>,
        /// Keep generating past end-of-sequence tokens.
        #[arg(long)]
        ignore_eos: bool,
        #[command(flatten)]
        spec: SpecArgs,
        #[command(flatten)]
        model: ModelArgs,
    },
    /// Print the argmax at every position and the last position's top-k logits as JSON.
    Logits {
        /// Comma-separated token ids.
        #[arg(long, value_delimiter = ',', required = true)]
        tokens: Vec<u32>,
        #[arg(long, default_value_t = 20)]
        top_k: usize,
        #[command(flatten)]
        model: ModelArgs,
    },
    /// Print the token ids of TEXT as a JSON array.
    Tokenize {
        text: String,
        #[command(flatten)]
        model: ModelArgs,
    },
    /// Perplexity of a text file, computed as llama-perplexity does.
    Perplexity {
        #[arg(long)]
        file: PathBuf,
        #[arg(long, default_value_t = 512)]
        ctx: usize,
        #[command(flatten)]
        model: ModelArgs,
    },
    /// Fetch the default model into the user cache and verify it.
    Pull,
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve(serve::ServeArgs),
    /// Seeded synthetic models at real shapes, for machines the real files cannot reach
    /// (the GPU checks of scripts/device-cuda.sh).
    Synth {
        #[command(subcommand)]
        cmd: synth::SynthCommand,
    },
    /// The GPU against the CPU's exact path on one model: logits and greedy-decode parity,
    /// continuous batching, decode speed against the bandwidth floor (a build with
    /// `--features cuda`, on a machine with an NVIDIA GPU).
    #[cfg(feature = "cuda")]
    CudaCheck(cuda_check::CudaCheckArgs),
    /// Benchmarks: GEMM planner sweep, kernel variants, whole-model throughput.
    Bench {
        #[command(subcommand)]
        cmd: tessera_bench::cli::BenchCommand,
    },
    /// Predict tensor-parallel step times against the number of sub-batches for a model
    /// shape, link and device (or check the predictions against `bench tp` rows).
    Simulate(simulate::SimulateArgs),
    /// Show the plans the planner considers for one matrix product, with predicted times.
    Plan {
        #[arg(long)]
        m: usize,
        #[arg(long)]
        k: usize,
        #[arg(long)]
        n: usize,
        /// Weight format: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs.
        #[arg(long)]
        dtype: String,
        #[arg(long)]
        threads: Option<usize>,
        #[arg(long, default_value = "exact")]
        precision: String,
        /// How many ranked candidates to list.
        #[arg(long, default_value_t = 10)]
        top: usize,
        /// Also time each listed candidate on synthetic data of the shape.
        #[arg(long)]
        measure: bool,
    },
    /// Measure the best plans for the model's shapes and store them in the tuning cache.
    Tune {
        #[arg(long)]
        model: Option<PathBuf>,
        #[arg(long)]
        threads: Option<usize>,
        /// exact, fast, or both.
        #[arg(long, default_value = "both")]
        precision: String,
        /// Comma-separated M values (default 1,2,4,...,1024).
        #[arg(long, value_delimiter = ',')]
        m: Vec<usize>,
        /// Candidates timed per shape.
        #[arg(long, default_value_t = 6)]
        top: usize,
        /// Tune these weights instead of the model's: DTYPE:KxN, comma-separated (e.g.
        /// f32:4096x11008,q4_1:576x49152; `tessera bench gemm` sweeps such shapes).
        #[arg(long, value_delimiter = ',')]
        weights: Vec<String>,
        /// Time every M on one weight warm in the caches. By default M up to 8 is timed
        /// with its weight read from DRAM, as a model step reads it.
        #[arg(long)]
        warm: bool,
    },
}

fn main() {
    // Warnings show without RUST_LOG (a corrupt or outdated tuning cache, a chat template
    // that fails to load, a request's failure in the step loop); RUST_LOG overrides.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = run(Cli::parse()) {
        // Messages may quote model files; escaped once more as a whole.
        let msg = tessera_core::untrusted::sanitize(&format!("{e:#}"), 4000);
        eprintln!("error: {msg}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Plan {
            m,
            k,
            n,
            dtype,
            threads,
            precision,
            top,
            measure,
        } => {
            let dtype = tessera_core::DType::parse(&dtype).with_context(|| {
                format!("--dtype {dtype:?}: expected f32, f16, bf16, q8_0, q4_0 or q4_1")
            })?;
            let precision = Precision::parse(&precision)
                .with_context(|| format!("--precision {precision:?}"))?;
            if m == 0 || k == 0 || n == 0 {
                bail!("--m, --k and --n must be positive");
            }
            if dtype.is_quantized() && k % dtype.block_len() != 0 {
                bail!(
                    "--k {k} is not a multiple of the {dtype} block size {}",
                    dtype.block_len()
                );
            }
            let threads = threads.unwrap_or_else(default_threads).max(1);
            let planner = tessera_engine::tuning::load_planner();
            let key = ShapeKey::new(m, k, n, dtype, precision, threads);
            let chosen = planner.plan(&key);
            let tuned = planner
                .cache
                .plans
                .contains_key(&key.bucket().to_text(&planner.profile.cpu));
            println!(
                "m={m} k={k} n={n} {dtype} {precision}, {threads} units on {}",
                planner.profile.cpu
            );
            println!(
                "chosen ({}): {chosen}",
                if tuned { "tuning cache" } else { "cost model" }
            );
            println!("candidates by predicted time:");
            let timing = measure.then(|| {
                let pool = tessera_runtime::ThreadPool::new(threads);
                let w = tessera_engine::tune::synthetic_weight(
                    dtype,
                    k,
                    n,
                    precision == Precision::Fast,
                );
                let x: Vec<f32> = (0..m * k)
                    .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
                    .collect();
                (pool, w, x, vec![0f32; m * n])
            });
            let mut timing = timing;
            for (i, p) in planner.candidates(&key).iter().take(top).enumerate() {
                match timing.as_mut() {
                    Some((pool, w, x, out)) => {
                        let secs = tessera_engine::tune::time_plan(pool, p, x, m, w, out);
                        let gflops = 2.0 * (m * k * n) as f64 / secs / 1e9;
                        println!(
                            "{:>3}. {p} | measured {:.1} us ({gflops:.1} GFLOP/s)",
                            i + 1,
                            secs * 1e6
                        );
                    }
                    None => println!("{:>3}. {p}", i + 1),
                }
            }
        }
        Command::Tune {
            model,
            threads,
            precision,
            m,
            top,
            weights,
            warm,
        } => {
            let shapes = if weights.is_empty() {
                let path = store::resolve_model(model.as_deref())?;
                let files = tessera_formats::load_model(&path)
                    .with_context(|| format!("loading {}", path.display()))?;
                tessera_engine::tune::model_shapes(&files)
            } else {
                weights
                    .iter()
                    .map(|w| tessera_engine::tune::parse_weight_shape(w))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| anyhow::anyhow!("--weights: {e}"))?
            };
            let precisions = match precision.as_str() {
                "both" => vec![Precision::Exact, Precision::Fast],
                p => vec![Precision::parse(p)
                    .with_context(|| format!("--precision {p:?}: exact, fast or both"))?],
            };
            let (threads, note) = tessera_engine::resources::choose_threads(threads, false)?;
            if let Some(note) = note {
                eprintln!("{note}");
            }
            let pool = tessera_runtime::ThreadPool::new(threads);
            let mut cache = tessera_engine::tuning::read_cache()?;
            let m_list = if m.is_empty() {
                tessera_engine::tune::M_LADDER.to_vec()
            } else {
                m
            };
            for precision in precisions {
                let bar = indicatif::ProgressBar::new((shapes.len() * m_list.len()) as u64);
                bar.set_style(indicatif::ProgressStyle::with_template(
                    "tuning {prefix} {bar:30} {pos}/{len} {msg} ({eta})",
                )?);
                bar.set_prefix(precision.to_string());
                let opts = tessera_engine::tune::TuneOptions {
                    precision,
                    m_list: m_list.clone(),
                    top,
                    cold_max_m: if warm {
                        0
                    } else {
                        tessera_engine::cold_weights::STEP_COLD_MAX_M
                    },
                };
                tessera_engine::tune::tune(
                    &pool,
                    &shapes,
                    &opts,
                    &mut cache,
                    &mut |done, _total, label| {
                        bar.set_position(done as u64);
                        bar.set_message(label.to_string());
                    },
                );
                bar.finish();
            }
            let p = tessera_engine::tuning::write_cache(&cache)?;
            println!("{} tuned plans saved to {}", cache.plans.len(), p.display());
        }
        Command::Bench { cmd } => tessera_bench::cli::run(cmd)?,
        Command::Synth { cmd } => synth::synth(cmd)?,
        #[cfg(feature = "cuda")]
        Command::CudaCheck(args) => cuda_check::run(args)?,
        Command::Serve(args) => serve::run(args)?,
        Command::Simulate(args) => simulate::run(args)?,
        Command::Pull => {
            let p = store::pull_default()?;
            println!("{}", p.display());
        }
        Command::Tokenize { text, model } => {
            let engine = load(&model, Precision::Exact)?;
            let ids = engine.tokenizer.encode(&text)?;
            println!("{}", serde_json::to_string(&ids)?);
        }
        Command::Logits {
            tokens,
            top_k,
            model,
        } => {
            let engine = load(&model, Precision::Exact)?;
            let lora = adapter(&model, &engine)?;
            let n = tokens.len();
            let logits = engine.logits_all(&tokens, lora.as_ref())?;
            let argmax: Vec<u32> = (0..n)
                .map(|i| tessera_engine::sampling::argmax(logits.row(i)))
                .collect();
            let last = logits.row(n - 1);
            let mut idx: Vec<usize> = (0..last.len()).collect();
            idx.sort_by(|&a, &b| last[b].total_cmp(&last[a]).then(a.cmp(&b)));
            let top: Vec<(usize, f32)> =
                idx.into_iter().take(top_k).map(|i| (i, last[i])).collect();
            println!("{}", serde_json::json!({ "argmax": argmax, "top_k": top }));
        }
        Command::Perplexity { file, ctx, model } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let engine = load(&model, Precision::Exact)?;
            let lora = adapter(&model, &engine)?;
            let tokens = engine.tokenizer.encode(&text)?;
            eprintln!("{} tokens, chunks of {ctx}", tokens.len());
            let report = tessera_engine::perplexity::perplexity(
                &engine,
                &tokens,
                ctx,
                lora.as_ref(),
                &mut |i, n, ppl| {
                    eprint!("[{}/{n}]{ppl:.4} ", i + 1);
                    let _ = std::io::stderr().flush();
                },
            )?;
            eprintln!();
            println!(
                "PPL = {:.4} over {} chunks of {ctx} ({} scored tokens), {:.1} tokens/s",
                report.ppl, report.chunks, report.scored_tokens, report.tokens_per_sec
            );
        }
        Command::Generate {
            prompt,
            chat,
            max_tokens,
            temperature,
            top_p,
            top_k,
            min_p,
            repetition_penalty,
            presence_penalty,
            frequency_penalty,
            seed,
            stop,
            ignore_eos,
            spec,
            model,
        } => {
            device::check(model.device, model.tp, 0, spec.speculative.is_some())?;
            let engine = load(&model, Precision::Exact)?;
            let mut speculation = match spec.config(model.tp)? {
                None => None,
                Some(c) => {
                    let draft = match &c.drafter {
                        tessera_engine::spec::DrafterSpec::Model(p) => {
                            Some(tessera_engine::draft::DraftModel::load(
                                p,
                                engine.pool.units(),
                                &engine,
                                engine.config.max_position.min(1 << 16),
                            )?)
                        }
                        _ => None,
                    };
                    Some((c, draft))
                }
            };
            let lora = adapter(&model, &engine)?;
            let prompt_ids = if chat {
                // The prompt is the user's text: special tokens in it stay text.
                engine
                    .tokenizer
                    .encode_chat(&[ChatMessage::new("user", &prompt)], true)?
            } else {
                engine.tokenizer.encode(&prompt)?
            };
            let params = SamplingParams {
                temperature,
                top_k,
                top_p,
                min_p,
                repetition_penalty,
                presence_penalty,
                frequency_penalty,
                seed,
            };
            let req = GenerateRequest {
                prompt_ids,
                max_tokens,
                params,
                stop,
                ignore_eos,
                adapter: lora,
                ..Default::default()
            };
            let mut out = std::io::stdout().lock();
            let stats = generate_with(&engine, &req, &mut speculation, &mut |t| {
                let _ = out.write_all(t.as_bytes());
                let _ = out.flush();
            })?;
            let _ = writeln!(out);
            eprintln!(
                "prompt: {} tokens, {:.1} tokens/s | generation: {} tokens, {:.1} tokens/s | finish: {}",
                stats.prompt_tokens,
                stats.prefill_tok_s(),
                stats.tokens.len(),
                stats.decode_tok_s(),
                stats.finish
            );
            if let Some(s) = stats.spec {
                eprintln!(
                    "speculative: {} of {} drafted tokens accepted ({:.0}%), {:.2} tokens per verification",
                    s.accepted,
                    s.drafted,
                    100.0 * s.acceptance(),
                    s.tokens_per_verification()
                );
            }
        }
    }
    Ok(())
}
