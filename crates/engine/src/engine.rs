//! A loaded model, its tokenizer, and the compute units it runs on.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tessera_core::Result;
use tessera_kernels::plan::Precision;
use tessera_kernels::planner::Planner;
use tessera_lora::LoraAdapter;
use tessera_model::{
    BatchMeta, ExecCtx, KvStorage, LlamaModel, Logits, LogitsFor, SeqChunk, SubBatching, Workspace,
};
use tessera_runtime::ThreadPool;
use tessera_tokenizer::Tokenizer;

use crate::KV_BLOCK_SIZE;

/// A test-only hook consulted before every step's forward (cargo feature `fault-injection`).
#[cfg(feature = "fault-injection")]
pub type FaultHook =
    Arc<dyn Fn(&tessera_scheduler::StepPlan) -> Option<crate::step::Fault> + Send + Sync>;

pub struct Engine {
    pub name: String,
    pub model: LlamaModel,
    /// Shared with the HTTP handlers, which tokenize and render chat templates.
    pub tokenizer: Arc<Tokenizer>,
    pub pool: ThreadPool,
    pub planner: Planner,
    pub precision: Precision,
    /// How every forward cuts its rows into sub-batches (default: one).
    pub sub_batching: SubBatching,
    /// Bytes of the weights as stored (mapped, not copied).
    pub weight_bytes: usize,
    pub load_secs: f64,
    /// Activation buffers of the one-off forwards ([`Engine::forward`], [`Engine::logits_all`]);
    /// step engines own their own.
    workspace: Mutex<Workspace>,
    #[cfg(feature = "fault-injection")]
    pub fault_hook: Option<FaultHook>,
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
        let t0 = Instant::now();
        let files = tessera_formats::load_model(path)?;
        let tokenizer = Arc::new(Tokenizer::from_spec(&files.tokenizer)?);
        let model = LlamaModel::new(&files, precision)?;
        Ok(Engine {
            name: files.name.clone(),
            weight_bytes: files.weight_bytes(),
            model,
            tokenizer,
            pool: ThreadPool::new(threads),
            planner,
            precision,
            sub_batching: SubBatching::WHOLE,
            load_secs: t0.elapsed().as_secs_f64(),
            workspace: Mutex::new(Workspace::new()),
            #[cfg(feature = "fault-injection")]
            fault_hook: None,
        })
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
        let logits = self.model.forward(
            batch,
            kv,
            &mut ws,
            &self.ctx_with(adapters),
            self.sub_batching,
        )?;
        Ok(logits.to_owned())
    }

    /// Loads a LoRA adapter (PEFT folder or GGUF LoRA file) for this engine's model.
    pub fn load_adapter(&self, path: &Path) -> Result<Arc<LoraAdapter>> {
        Ok(Arc::new(LoraAdapter::load(path, &self.model.config)?))
    }

    /// Logits at every position of `tokens` under `adapter` (or the base model), from an
    /// empty cache in one forward (numerics checks, perplexity).
    pub fn logits_all(&self, tokens: &[u32], adapter: Option<&Arc<LoraAdapter>>) -> Result<Logits> {
        let mut kv = self
            .model
            .new_kv_storage(KV_BLOCK_SIZE, tokens.len().div_ceil(KV_BLOCK_SIZE).max(1))?;
        let mut seq = SeqChunk::new(
            tokens.to_vec(),
            0,
            (0..kv.num_blocks() as u32).collect(),
            LogitsFor::All,
        );
        seq.adapter = adapter.map(|_| 0);
        let table: Vec<Arc<LoraAdapter>> = adapter.into_iter().cloned().collect();
        self.forward_with(&BatchMeta { seqs: vec![seq] }, &mut kv, &table)
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
