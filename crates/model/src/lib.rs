//! The Llama-family decoder (Llama 2/3, SmolLM, Mistral, Qwen2) as a function of its weights,
//! the step's batch metadata and a view of the KV storage:
//! `forward(&self, &BatchMeta, &mut KvStorage, &ExecCtx) -> Logits`.
//!
//! The model owns no cache and no sequence state. A batch is any mix of sequences, each
//! contributing a run of new tokens at its own positions (a prefill chunk, or one decode
//! token), with its own block table into the paged [`KvStorage`]. Every matrix product goes
//! through a [`Linear`], the one trait a LoRA delta or a tensor-parallel shard will wrap.

pub mod attention;
pub mod batch;
pub mod kv;
pub mod linear;
pub mod llama;
pub mod rope;

pub use batch::{BatchMeta, Logits, LogitsFor, SeqChunk};
pub use kv::KvStorage;
pub use linear::{DenseLinear, ExecCtx, Linear};
pub use llama::LlamaModel;
