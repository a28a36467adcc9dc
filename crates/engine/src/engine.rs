//! A loaded model, its tokenizer, and the compute units it runs on.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use tessera_core::Result;
use tessera_kernels::plan::Precision;
use tessera_kernels::planner::Planner;
use tessera_model::{BatchMeta, ExecCtx, LlamaModel, Logits, LogitsFor, SeqChunk};
use tessera_runtime::ThreadPool;
use tessera_tokenizer::Tokenizer;

pub struct Engine {
    pub name: String,
    pub model: LlamaModel,
    /// Shared with the HTTP handlers, which tokenize and render chat templates.
    pub tokenizer: Arc<Tokenizer>,
    pub pool: ThreadPool,
    pub planner: Planner,
    pub precision: Precision,
    /// Bytes of the weights as stored (mapped, not copied).
    pub weight_bytes: usize,
    pub load_secs: f64,
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
            load_secs: t0.elapsed().as_secs_f64(),
        })
    }

    /// Logits at every position of `tokens`, from an empty cache in one forward (numerics
    /// checks, perplexity).
    pub fn logits_all(&self, tokens: &[u32]) -> Result<Logits> {
        const BLOCK: usize = 16;
        let mut kv = self
            .model
            .new_kv_storage(BLOCK, tokens.len().div_ceil(BLOCK).max(1))?;
        let seq = SeqChunk {
            tokens: tokens.to_vec(),
            start_pos: 0,
            block_table: (0..kv.num_blocks() as u32).collect(),
            logits: LogitsFor::All,
        };
        self.model
            .forward(&BatchMeta { seqs: vec![seq] }, &mut kv, &self.ctx())
    }

    pub fn ctx(&self) -> ExecCtx<'_> {
        ExecCtx {
            pool: &self.pool,
            planner: &self.planner,
            precision: self.precision,
        }
    }
}
