//! A loaded model, its tokenizer, and the compute units it runs on.

use std::path::Path;
use std::time::Instant;

use tessera_core::Result;
use tessera_model::{ExecCtx, LlamaModel};
use tessera_runtime::ThreadPool;
use tessera_tokenizer::Tokenizer;

pub struct Engine {
    pub name: String,
    pub model: LlamaModel,
    pub tokenizer: Tokenizer,
    pub pool: ThreadPool,
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
    /// Loads a GGUF file or Hugging Face folder onto `threads` compute units.
    pub fn load(path: &Path, threads: usize) -> Result<Self> {
        let t0 = Instant::now();
        let files = tessera_formats::load_model(path)?;
        let tokenizer = Tokenizer::from_spec(&files.tokenizer)?;
        let model = LlamaModel::new(&files)?;
        Ok(Engine {
            name: files.name.clone(),
            weight_bytes: files.weight_bytes(),
            model,
            tokenizer,
            pool: ThreadPool::new(threads),
            load_secs: t0.elapsed().as_secs_f64(),
        })
    }

    pub fn ctx(&self) -> ExecCtx<'_> {
        ExecCtx { pool: &self.pool }
    }
}
