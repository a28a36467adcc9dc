//! The model flags every command shares ([`ModelArgs`]) and loading an engine from them.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use tessera_engine::request::LoraAdapter;
use tessera_engine::{store, DeviceKind, Engine, KvDtype, SplitBy, SubBatchPolicy, SubBatching};
use tessera_kernels::plan::Precision;

use crate::device;

#[derive(clap::Args, Clone)]
pub(crate) struct ModelArgs {
    /// GGUF file or Hugging Face model folder (default: the cached default model, fetched if missing).
    #[arg(long, global = true)]
    pub(crate) model: Option<PathBuf>,
    /// Compute threads (default: all available cores). More than the available cores is
    /// lowered to them, with a note, unless --force-threads.
    #[arg(long, global = true)]
    pub(crate) threads: Option<usize>,
    /// Keep --threads even when it is more than the available cores.
    #[arg(long, global = true)]
    pub(crate) force_threads: bool,
    /// Arithmetic: `exact` (weights dequantized to f32, f32 activations) or `fast`
    /// (8-bit quantized activations meet block-quantized weights in integer dot products).
    /// Default: exact (transformers' answers; fast trades them for a little speed).
    #[arg(long, global = true)]
    pub(crate) precision: Option<String>,
    /// Run every layer's attention and MLP stages over this many sub-batches of each step
    /// (the cut tensor parallelism overlaps communication on). Outputs do not change.
    /// Default: chosen per step by the step-time model under `--tp`, one otherwise.
    #[arg(long, global = true)]
    pub(crate) sub_batches: Option<usize>,
    /// How sub-batches are cut with `--sub-batches`: `sequence` (whole sequences) or
    /// `tokens` (near-equal token counts, keeping whole tokens).
    #[arg(long, global = true, default_value = "sequence")]
    pub(crate) split_by: SplitBy,
    /// A LoRA adapter: a PEFT folder (adapter_config.json + adapter_model.safetensors) or a
    /// llama.cpp GGUF LoRA file. `generate`, `logits`, `perplexity`: `--lora PATH`, once.
    /// `serve`: `--lora NAME=PATH`, repeatable; requests pick one with `"model": NAME`.
    #[arg(long, global = true)]
    pub(crate) lora: Vec<String>,
    /// Tensor parallelism: split the model over this many ranks (each with its share of the
    /// threads, its shard of every split weight and its heads' KV cache).
    #[arg(long, global = true, default_value_t = 1)]
    pub(crate) tp: usize,
    /// Where the ranks run: `local` (thread groups of this process) or `mpi` (the processes
    /// of `mpirun -np R tessera ...`; build with `--features mpi`).
    #[arg(long, global = true, default_value = "local")]
    pub(crate) tp_backend: String,
    /// Seconds a rank may stay silent in a collective before the others stop with an error
    /// naming it.
    #[arg(long, global = true, default_value_t = 10.0)]
    pub(crate) tp_timeout: f64,
    /// KV cache element type: `f32`, or `f16` (half the memory per position; values
    /// rounded to nearest when stored, read back exactly by the attention kernel).
    #[arg(long, global = true, default_value = "f32")]
    pub(crate) kv_dtype: KvDtype,
    /// Where the step engines run (`generate`, `serve`, `logits`): `cpu`, or `cuda` (one
    /// NVIDIA GPU, exact path; a build with `--features cuda`; no --tp or --lora yet).
    #[arg(long, global = true, default_value = "cpu")]
    pub(crate) device: DeviceKind,
}

/// The adapter named by `--lora`, loaded for `engine`'s model.
pub(crate) fn adapter(
    args: &ModelArgs,
    engine: &Engine,
) -> Result<Option<std::sync::Arc<LoraAdapter>>> {
    let p = match args.lora.as_slice() {
        [] => return Ok(None),
        [p] => PathBuf::from(p),
        _ => bail!("--lora is given more than once; this command runs one adapter"),
    };
    let p = &p;
    let a = engine
        .load_adapter(p)
        .with_context(|| format!("--lora {}", p.display()))?;
    eprintln!(
        "adapter {} ({:?}, {} modules adapted, rank up to {}, {:.1} MB)",
        p.display(),
        a.format,
        a.targets().len(),
        a.max_rank(),
        a.bytes() as f64 / 1e6
    );
    Ok(Some(a))
}

pub(crate) fn load(args: &ModelArgs, default_precision: Precision) -> Result<Engine> {
    load_with_context(args, default_precision, None)
}

/// [`load`] with the context cut to `context` tokens (at most the model's), before the
/// model is built: RoPE choices that depend on it (Phi-3's LongRoPE) follow.
pub(crate) fn load_with_context(
    args: &ModelArgs,
    default_precision: Precision,
    context: Option<usize>,
) -> Result<Engine> {
    let precision = match args.precision.as_deref() {
        None => default_precision,
        Some(s) => Precision::parse(s)
            .with_context(|| format!("--precision {s:?}: expected exact or fast"))?,
    };
    let (threads, note) =
        tessera_engine::resources::choose_threads(args.threads, args.force_threads)?;
    if let Some(note) = note {
        eprintln!("{note}");
    }
    let path = store::resolve_model(args.model.as_deref())?;
    let sub_batching = match args.sub_batches {
        None => SubBatchPolicy::Auto,
        Some(n) => SubBatching::new(n, args.split_by)
            .map_err(|e| anyhow::anyhow!("--sub-batches: {e}"))?
            .into(),
    };
    if args.tp == 0 {
        bail!("--tp must be at least 1");
    }
    device::check(args.device, args.tp, args.lora.len(), false)?;
    let backend = match args.tp_backend.as_str() {
        "local" => tessera_engine::TpBackend::Local,
        "mpi" => tessera_engine::TpBackend::Mpi,
        o => bail!("--tp-backend {o:?}: expected local or mpi"),
    };
    if !(args.tp_timeout > 0.0 && args.tp_timeout.is_finite()) {
        bail!("--tp-timeout must be a positive number of seconds");
    }
    eprintln!("{}", tessera_engine::kernel_variants_line());
    let planner = tessera_engine::tuning::load_planner();
    let t0 = std::time::Instant::now();
    let mut files = tessera_formats::load_model(&path)
        .with_context(|| format!("loading {}", path.display()))?;
    if let Some(c) = context {
        files.config.max_position = files.config.max_position.min(c.max(1));
    }
    let device = device::make(args.device, &files, precision)?;
    let mut engine = Engine::from_files_parallel(
        files,
        threads,
        precision,
        planner,
        args.tp,
        backend,
        std::time::Duration::from_secs_f64(args.tp_timeout),
        t0,
    )
    .with_context(|| format!("loading {}", path.display()))?;
    engine.sub_batching = sub_batching;
    engine.kv_dtype = args.kv_dtype;
    if let Some(d) = device {
        engine.set_device(d)?;
    }
    eprintln!(
        "loaded {} ({:.1} MB of weights) in {:.2}s on {threads} threads{} [{}, {precision}, {}, KV {}, device {}]",
        engine.name,
        engine.weight_bytes as f64 / 1e6,
        engine.load_secs,
        if args.tp > 1 {
            format!(", {} tensor-parallel ranks", args.tp)
        } else {
            String::new()
        },
        tessera_engine::isa_name(),
        if engine.planner.cache.plans.is_empty() {
            "cost model"
        } else {
            "tuned"
        },
        engine.kv_dtype,
        engine.device().name()
    );
    Ok(engine)
}

/// The name clients use for the model: the file stem (or folder name) it was loaded from.
pub(crate) fn default_model_name(args: &ModelArgs, engine: &Engine) -> String {
    args.model
        .as_ref()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_else(|| match &args.model {
            None => store::DEFAULT_FILE.trim_end_matches(".gguf").to_string(),
            Some(_) => engine.name.clone(),
        })
}
