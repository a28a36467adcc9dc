//! Tokenization and chat-template rendering off the async workers: each request's prompt work
//! runs as one job on tokio's blocking pool, at most `concurrency` jobs at once. A request
//! beyond that waits for a slot, in arrival order; it already holds its places under the
//! admission gate, so the waiting is bounded by the server's capacity. A multi-megabyte prompt
//! costs a blocking thread, never an async worker, so `/health` and streams stay responsive.

use std::sync::Arc;

use tessera_tokenizer::Tokenizer;
use tokio::sync::Semaphore;

use crate::api::ApiError;

pub struct TokenizerPool {
    tokenizer: Arc<Tokenizer>,
    slots: Arc<Semaphore>,
}

impl TokenizerPool {
    pub fn new(tokenizer: Arc<Tokenizer>, concurrency: usize) -> Self {
        TokenizerPool {
            tokenizer,
            slots: Arc::new(Semaphore::new(concurrency.max(1))),
        }
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Runs `job` on the blocking pool once a slot is free. A job whose request has gone
    /// away runs to its end still holding its slot, so the bound is never exceeded.
    pub async fn run<T, F>(&self, job: F) -> Result<T, ApiError>
    where
        F: FnOnce(&Tokenizer) -> Result<T, ApiError> + Send + 'static,
        T: Send + 'static,
    {
        let slot = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| ApiError::new(503, "server_error", "the tokenizer pool is closed"))?;
        let tokenizer = self.tokenizer.clone();
        tokio::task::spawn_blocking(move || {
            let _slot = slot;
            job(&tokenizer)
        })
        .await
        .map_err(|e| {
            ApiError::new(
                500,
                "server_error",
                format!("internal error while tokenizing: {e}"),
            )
        })?
    }
}
