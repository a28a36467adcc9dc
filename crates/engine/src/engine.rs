//! A loaded model, its tokenizer, and the compute units it runs on.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tessera_core::Result;
use tessera_formats::{ModelConfig, ModelFiles};
use tessera_kernels::plan::Precision;
use tessera_kernels::planner::Planner;
use tessera_lora::LoraAdapter;
use tessera_model::{
    BatchMeta, ExecCtx, KvDtype, KvStorage, LlamaModel, Logits, LogitsFor, LogitsView, SeqChunk,
    SubBatching, Workspace,
};
use tessera_runtime::ThreadPool;
use tessera_tokenizer::Tokenizer;

use crate::device::{Cpu, Device, DeviceKind, StepKv};
use crate::overlap_plan::{OverlapStats, SubBatchPolicy};
use crate::tp::{StepMode, TpGroup};
use crate::KV_BLOCK_SIZE;

/// A test-only hook consulted before every step's forward (cargo feature `fault-injection`).
#[cfg(feature = "fault-injection")]
pub type FaultHook =
    Arc<dyn Fn(&tessera_scheduler::StepPlan) -> Option<crate::step::Fault> + Send + Sync>;

pub struct Engine {
    pub name: String,
    /// The whole model's configuration (under tensor parallelism `model` is rank 0's shard).
    pub config: ModelConfig,
    pub model: LlamaModel,
    /// Shared with the HTTP handlers, which tokenize and render chat templates.
    pub tokenizer: Arc<Tokenizer>,
    pub pool: ThreadPool,
    pub planner: Planner,
    pub precision: Precision,
    /// How every forward cuts its rows into sub-batches (default: chosen per step under
    /// tensor parallelism, one otherwise).
    pub sub_batching: SubBatchPolicy,
    /// Element type of every KV cache [`Engine::new_kv`] makes, on every rank (default f32).
    pub kv_dtype: KvDtype,
    /// Bytes of the weights as stored (mapped, not copied).
    pub weight_bytes: usize,
    /// Bytes of the weights a decode step reads (`ModelFiles::step_weight_bytes`).
    pub step_weight_bytes: usize,
    pub load_secs: f64,
    /// Activation buffers of the one-off forwards ([`Engine::forward`], [`Engine::logits_all`]);
    /// step engines own their own.
    workspace: Mutex<Vec<Workspace>>,
    /// Ranks 1.. and the communicator under tensor parallelism (`model`, `pool` and
    /// `planner` are rank 0's).
    pub(crate) tp: Option<Arc<Mutex<TpGroup>>>,
    /// The grammar engine for constrained requests, built on the first one.
    grammars: std::sync::OnceLock<std::result::Result<crate::constrain::Grammars, String>>,
    /// The bounds each grammar is built and stepped under.
    grammar_limits: crate::constrain::GrammarLimits,
    /// What runs the step engines' forwards and holds their KV storage ([`crate::device`];
    /// the CPU unless [`Engine::set_device`] installed another).
    device: Arc<dyn Device>,
    #[cfg(feature = "fault-injection")]
    pub fault_hook: Option<FaultHook>,
}

/// Where tensor-parallel ranks run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TpBackend {
    /// Thread groups of this process.
    Local,
    /// Processes of an `mpirun` job (cargo feature `mpi`).
    Mpi,
}

type Parts = (LlamaModel, ThreadPool, Option<Arc<Mutex<TpGroup>>>);

#[cfg(feature = "mpi")]
fn mpi_leader(
    files: &tessera_formats::ModelFiles,
    precision: Precision,
    planner: &Planner,
    tp: usize,
    threads: usize,
    timeout: Duration,
) -> Result<Parts> {
    let crate::tp_mpi::MpiRole::Leader(group, model, pool) =
        crate::tp_mpi::join(files, precision, planner, tp, threads, timeout)?;
    Ok((model, pool, Some(Arc::new(Mutex::new(group)))))
}

#[cfg(not(feature = "mpi"))]
fn mpi_leader(
    _: &tessera_formats::ModelFiles,
    _: Precision,
    _: &Planner,
    _: usize,
    _: usize,
    _: Duration,
) -> Result<Parts> {
    Err(tessera_core::Error::Config(
        "this build has no MPI backend: build with `cargo build --release --features mpi`".into(),
    ))
}

/// Logits of a forward: borrowed from rank 0's workspace, or gathered over the ranks.
pub enum ForwardLogits<'a> {
    View(LogitsView<'a>),
    Owned(Logits),
}

impl ForwardLogits<'_> {
    pub fn last_of(&self, seq: usize) -> Option<&[f32]> {
        match self {
            ForwardLogits::View(v) => v.last_of(seq),
            ForwardLogits::Owned(l) => l.last_of(seq),
        }
    }
    /// Every row of sequence `seq`, in position order.
    pub fn rows_of(&self, seq: usize) -> Vec<&[f32]> {
        match self {
            ForwardLogits::View(v) => v.rows_of(seq),
            ForwardLogits::Owned(l) => l.rows_of(seq),
        }
    }
    pub fn into_owned(self) -> Logits {
        match self {
            ForwardLogits::View(v) => v.to_owned(),
            ForwardLogits::Owned(l) => l,
        }
    }
}

/// Compute units to use when the user does not say: the available parallelism.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

impl Engine {
    /// Loads a GGUF file or Hugging Face folder onto `threads` compute units, exact path.
    pub fn load(path: &Path, threads: usize) -> Result<Self> {
        Self::load_with(
            path,
            threads,
            Precision::Exact,
            crate::tuning::load_planner(),
        )
    }

    /// Loads with a precision and a planner (tuned or not).
    pub fn load_with(
        path: &Path,
        threads: usize,
        precision: Precision,
        planner: Planner,
    ) -> Result<Self> {
        Self::load_tp(
            path,
            threads,
            precision,
            planner,
            1,
            Duration::from_secs(10),
        )
    }

    /// Loads split over `tp` tensor-parallel ranks in this process (1: no split), sharing
    /// `threads` CPUs; a rank that stops answering fails a step within `tp_timeout`.
    pub fn load_tp(
        path: &Path,
        threads: usize,
        precision: Precision,
        planner: Planner,
        tp: usize,
        tp_timeout: Duration,
    ) -> Result<Self> {
        Self::load_parallel(
            path,
            threads,
            precision,
            planner,
            tp,
            TpBackend::Local,
            tp_timeout,
        )
    }

    /// Loads split over `tp` ranks of `backend`. Over MPI every process of the job calls
    /// this; only rank 0 returns (the others serve rank 0's steps, then exit).
    pub fn load_parallel(
        path: &Path,
        threads: usize,
        precision: Precision,
        planner: Planner,
        tp: usize,
        backend: TpBackend,
        tp_timeout: Duration,
    ) -> Result<Self> {
        let t0 = Instant::now();
        let files = tessera_formats::load_model(path)?;
        Self::from_files_parallel(
            files, threads, precision, planner, tp, backend, tp_timeout, t0,
        )
    }

    /// An engine on loaded files (whose config a caller may have adjusted, e.g. the
    /// context length), one rank, `threads` compute units.
    pub fn from_files(
        files: ModelFiles,
        threads: usize,
        precision: Precision,
        planner: Planner,
    ) -> Result<Self> {
        Self::from_files_parallel(
            files,
            threads,
            precision,
            planner,
            1,
            TpBackend::Local,
            Duration::from_secs(10),
            Instant::now(),
        )
    }

    /// [`Engine::load_parallel`] on loaded files (whose config a caller may have adjusted,
    /// e.g. the context length); `t0`: when loading began, for [`Engine::load_secs`].
    #[allow(clippy::too_many_arguments)]
    pub fn from_files_parallel(
        files: ModelFiles,
        threads: usize,
        precision: Precision,
        planner: Planner,
        tp: usize,
        backend: TpBackend,
        tp_timeout: Duration,
        t0: Instant,
    ) -> Result<Self> {
        let tokenizer = Arc::new(Tokenizer::from_spec(&files.tokenizer)?);
        let (model, pool, tp) = if backend == TpBackend::Mpi {
            mpi_leader(&files, precision, &planner, tp, threads, tp_timeout)?
        } else if tp <= 1 {
            (
                LlamaModel::new(&files, precision)?,
                ThreadPool::new(threads),
                None,
            )
        } else {
            let (group, model0, pool0) =
                TpGroup::new(&files, precision, &planner, tp, threads, tp_timeout)?;
            (model0, pool0, Some(Arc::new(Mutex::new(group))))
        };
        if let Some(g) = &tp {
            let ctx = ExecCtx {
                pool: &pool,
                planner: &planner,
                precision,
                adapters: &[],
            };
            let mut g = g.lock().unwrap_or_else(|e| e.into_inner());
            g.calibrate(&files.config, &model, &ctx)?;
        }
        let ranks = tp
            .as_ref()
            .map_or(1, |g| g.lock().map_or(1, |g| g.local_ranks()));
        Ok(Engine {
            name: files.name.clone(),
            config: files.config.clone(),
            weight_bytes: files.weight_bytes(),
            step_weight_bytes: files.step_weight_bytes(),
            model,
            tokenizer,
            pool,
            planner,
            precision,
            sub_batching: SubBatchPolicy::Auto,
            kv_dtype: KvDtype::F32,
            load_secs: t0.elapsed().as_secs_f64(),
            workspace: Mutex::new((0..ranks).map(|_| Workspace::new()).collect()),
            tp,
            grammars: std::sync::OnceLock::new(),
            grammar_limits: Default::default(),
            device: Arc::new(Cpu),
            #[cfg(feature = "fault-injection")]
            fault_hook: None,
        })
    }

    /// Runs the step engines made after this call on `device` (one-off forwards such as
    /// [`Engine::forward`] and [`Engine::logits_all`] stay on the CPU). A device other than
    /// the CPU runs one rank: under tensor parallelism it is refused.
    pub fn set_device(&mut self, device: Arc<dyn Device>) -> Result<()> {
        if self.tp.is_some() {
            return Err(tessera_core::Error::Config(format!(
                "device {} runs one rank; this engine is split over tensor-parallel ranks",
                device.name()
            )));
        }
        self.device = device;
        Ok(())
    }

    /// The device step engines run on.
    pub fn device(&self) -> &dyn Device {
        &*self.device
    }

    /// A step engine's KV storage and forward state on the engine's device
    /// ([`crate::device`]); `window_blocks`: a window group of that many blocks.
    pub fn new_step_kv(
        &self,
        block_size: usize,
        num_blocks: usize,
        window_blocks: Option<usize>,
    ) -> Result<Box<dyn StepKv + '_>> {
        self.device
            .new_kv(self, block_size, num_blocks, window_blocks)
    }

    /// Sets the bounds of constrained requests' grammars (before the first one arrives).
    pub fn set_grammar_limits(&mut self, limits: crate::constrain::GrammarLimits) {
        self.grammar_limits = limits;
        self.grammars = std::sync::OnceLock::new();
    }

    /// The grammar engine for constrained decoding (built once, on first use).
    pub fn grammars(&self) -> Result<&crate::constrain::Grammars> {
        self.grammars
            .get_or_init(|| {
                crate::constrain::Grammars::with_limits(
                    &self.tokenizer,
                    self.config.vocab_size,
                    self.grammar_limits,
                )
                .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| tessera_core::Error::Other(e.clone()))
    }

    /// Tensor-parallel ranks (1 without tensor parallelism).
    pub fn tp_size(&self) -> usize {
        self.tp
            .as_ref()
            .map_or(1, |g| g.lock().unwrap_or_else(|e| e.into_inner()).size())
    }

    /// Why tensor parallelism stopped (a rank died or stalled), if it did.
    pub fn tp_failure(&self) -> Option<String> {
        let g = self.tp.as_ref()?;
        let g = g.lock().unwrap_or_else(|e| e.into_inner());
        g.failure().map(String::from)
    }

    /// Seconds rank 0 spent in collectives since the last call (0 without tensor
    /// parallelism).
    pub fn take_comm_secs(&self) -> f64 {
        self.tp.as_ref().map_or(0.0, |g| {
            g.lock().unwrap_or_else(|e| e.into_inner()).take_comm_secs()
        })
    }

    /// The measured link, the step-time model's choices and its last prediction (empty
    /// without tensor parallelism).
    pub fn overlap_stats(&self) -> OverlapStats {
        self.tp.as_ref().map_or_else(OverlapStats::default, |g| {
            g.lock().unwrap_or_else(|e| e.into_inner()).overlap_stats()
        })
    }

    /// The step-time model of this engine's tensor-parallel group (its measured link and
    /// stage profile), if it has one.
    pub fn step_model(&self) -> Option<tessera_sim::StepModel> {
        let g = self.tp.as_ref()?;
        let g = g.lock().unwrap_or_else(|e| e.into_inner());
        g.step_model().cloned()
    }

    /// Test-only: makes tensor-parallel rank `rank` (1..) stall or die.
    #[cfg(feature = "fault-injection")]
    pub fn inject_rank_fault(&self, rank: usize, fault: crate::tp::RankFault) -> bool {
        self.tp.as_ref().is_some_and(|g| {
            g.lock()
                .unwrap_or_else(|e| e.into_inner())
                .inject(rank, fault)
        })
    }

    /// One forward over every rank's KV storage and workspace (one entry each without
    /// tensor parallelism).
    pub fn forward_ranks<'w>(
        &self,
        batch: &BatchMeta,
        kv: &mut [KvStorage],
        ws: &'w mut [Workspace],
        adapters: &[Arc<LoraAdapter>],
    ) -> Result<ForwardLogits<'w>> {
        self.forward_mode(batch, kv, ws, adapters, StepMode::Full)
    }

    /// [`Engine::forward_ranks`] running `mode` (the benchmarks time compute and
    /// communication apart; only [`StepMode::Full`] gives valid logits).
    pub fn forward_mode<'w>(
        &self,
        batch: &BatchMeta,
        kv: &mut [KvStorage],
        ws: &'w mut [Workspace],
        adapters: &[Arc<LoraAdapter>],
        mode: StepMode,
    ) -> Result<ForwardLogits<'w>> {
        match &self.tp {
            None => {
                let (Some(kv), Some(ws)) = (kv.first_mut(), ws.first_mut()) else {
                    return Err(tessera_core::Error::Other("no KV storage".into()));
                };
                let ctx = self.ctx_with(adapters);
                let split = match self.sub_batching {
                    SubBatchPolicy::Fixed(s) => s,
                    SubBatchPolicy::Auto => SubBatching::WHOLE,
                };
                let v = self.model.forward(batch, kv, ws, &ctx, split)?;
                Ok(ForwardLogits::View(v))
            }
            Some(g) => {
                let mut g = g.lock().unwrap_or_else(|e| e.into_inner());
                let split = g.choose(batch, self.sub_batching);
                let l = g.forward(
                    &self.model,
                    &self.ctx(),
                    batch,
                    adapters,
                    kv,
                    ws,
                    split,
                    mode,
                )?;
                Ok(ForwardLogits::Owned(l))
            }
        }
    }

    /// Seconds of one step of `batch` over every rank's `kv` under `mode`, on the engine's
    /// own workspaces (benchmarks).
    pub fn time_step(
        &self,
        batch: &BatchMeta,
        kv: &mut [KvStorage],
        mode: StepMode,
    ) -> Result<f64> {
        let mut ws = self.workspace.lock().unwrap_or_else(|e| e.into_inner());
        let t0 = Instant::now();
        self.forward_mode(batch, kv, &mut ws, &[], mode)?;
        Ok(t0.elapsed().as_secs_f64())
    }

    /// One forward of `batch` over `kv` with the engine's sub-batching, its logits copied out
    /// (tests, numerics checks).
    pub fn forward(&self, batch: &BatchMeta, kv: &mut KvStorage) -> Result<Logits> {
        self.forward_with(batch, kv, &[])
    }

    /// [`Engine::forward`] with a table of adapters the batch's adapter slots index.
    pub fn forward_with(
        &self,
        batch: &BatchMeta,
        kv: &mut KvStorage,
        adapters: &[Arc<LoraAdapter>],
    ) -> Result<Logits> {
        let mut ws = self.workspace.lock().unwrap_or_else(|e| e.into_inner());
        Ok(self
            .forward_ranks(batch, std::slice::from_mut(kv), &mut ws, adapters)?
            .into_owned())
    }

    /// One forward over every rank's KV storage (from [`Engine::new_kv`]), its logits copied
    /// out (tests, numerics checks; works with and without tensor parallelism).
    pub fn forward_kv(&self, batch: &BatchMeta, kv: &mut [KvStorage]) -> Result<Logits> {
        self.forward_kv_with(batch, kv, &[])
    }

    /// [`Engine::forward_kv`] with a table of adapters the batch's adapter slots index.
    pub fn forward_kv_with(
        &self,
        batch: &BatchMeta,
        kv: &mut [KvStorage],
        adapters: &[Arc<LoraAdapter>],
    ) -> Result<Logits> {
        let mut ws = self.workspace.lock().unwrap_or_else(|e| e.into_inner());
        Ok(self
            .forward_ranks(batch, kv, &mut ws, adapters)?
            .into_owned())
    }

    /// Loads a LoRA adapter (PEFT folder or GGUF LoRA file) for this engine's model. Under
    /// tensor parallelism its part for each rank in this process is made here too (on the
    /// caller's thread, not the step's); ranks in other processes load theirs from the same
    /// path when a step first uses it.
    pub fn load_adapter(&self, path: &Path) -> Result<Arc<LoraAdapter>> {
        let adapter = Arc::new(LoraAdapter::load(path, &self.config)?);
        if let Some(p) = self.adapter_preparer() {
            p.prepare(&adapter)?;
        }
        Ok(adapter)
    }

    /// Under tensor parallelism, what makes a loaded adapter's per-rank parts ahead of its
    /// first step, on any thread (a server loads adapters off the step thread).
    pub fn adapter_preparer(&self) -> Option<AdapterPreparer> {
        self.tp.clone().map(|group| AdapterPreparer { group })
    }

    /// Adapters whose tensor-parallel parts this engine holds (0 without tensor
    /// parallelism): they go once nobody holds the adapter.
    pub fn tp_adapters_held(&self) -> usize {
        self.tp.as_ref().map_or(0, |g| {
            g.lock().unwrap_or_else(|e| e.into_inner()).adapters_held()
        })
    }

    /// Logits at every position of `tokens` under `adapter` (or the base model), from an
    /// empty cache in one forward on the engine's device (numerics checks, perplexity).
    pub fn logits_all(&self, tokens: &[u32], adapter: Option<&Arc<LoraAdapter>>) -> Result<Logits> {
        let blocks = tokens.len().div_ceil(KV_BLOCK_SIZE).max(1);
        let mut seq = SeqChunk::new(
            tokens.to_vec(),
            0,
            (0..blocks as u32).collect(),
            LogitsFor::All,
        );
        seq.adapter = adapter.map(|_| 0);
        let table: Vec<Arc<LoraAdapter>> = adapter.into_iter().cloned().collect();
        let batch = BatchMeta { seqs: vec![seq] };
        if self.device.kind() == DeviceKind::Cpu {
            let mut kv = self.new_kv(KV_BLOCK_SIZE, blocks)?;
            let mut ws = self.workspace.lock().unwrap_or_else(|e| e.into_inner());
            return Ok(self
                .forward_ranks(&batch, &mut kv, &mut ws, &table)?
                .into_owned());
        }
        let mut kv = self.new_step_kv(KV_BLOCK_SIZE, blocks, None)?;
        Ok(kv.forward(&batch, &table)?.into_owned())
    }

    /// The execution context of a base-model forward.
    pub fn ctx(&self) -> ExecCtx<'_> {
        self.ctx_with(&[])
    }

    /// The execution context of a forward whose adapter slots index `adapters`.
    pub fn ctx_with<'a>(&'a self, adapters: &'a [Arc<LoraAdapter>]) -> ExecCtx<'a> {
        ExecCtx {
            pool: &self.pool,
            planner: &self.planner,
            precision: self.precision,
            adapters,
        }
    }
}

/// Makes adapters' tensor-parallel parts for an engine's rank group ([`Engine::adapter_preparer`]).
#[derive(Clone)]
pub struct AdapterPreparer {
    group: Arc<Mutex<TpGroup>>,
}

impl AdapterPreparer {
    /// Makes and keeps `adapter`'s part for every rank in this process; the group is
    /// locked only to read its layout and to keep the parts, not while they are made.
    pub fn prepare(&self, adapter: &Arc<LoraAdapter>) -> Result<()> {
        let lock = || self.group.lock().unwrap_or_else(|e| e.into_inner());
        let make = lock().adapter_parts_maker();
        let parts = make(adapter)?;
        lock().keep_adapter_parts(adapter, parts);
        Ok(())
    }
}
