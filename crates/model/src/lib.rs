//! The Llama-family decoder (Llama 2/3, SmolLM, Mistral, Qwen2) as a function of its weights,
//! the step's batch metadata and a view of the KV storage:
//! `forward(&self, &BatchMeta, &mut KvStorage, &mut Workspace, &ExecCtx, SubBatching)`.
//!
//! The model owns no cache, no sequence state and no activation buffers. A batch is any mix
//! of sequences, each contributing a run of new tokens at its own positions (a prefill chunk,
//! or one decode token), with its own block table into the paged [`KvStorage`]. The batch is
//! prepared once into flat rows ([`prepared`]); each layer is an attention stage and an MLP
//! stage running on any contiguous range of rows ([`stages`]). Every matrix product goes
//! through a [`Linear`], the one trait a LoRA delta ([`adapted`]) or a tensor-parallel shard
//! wraps; the adapters themselves are the step's, passed in [`ExecCtx`].

pub mod adapted;
pub mod attention;
pub mod batch;
pub mod kv;
pub mod linear;
pub mod llama;
pub mod prepared;
pub mod profile;
pub mod rope;
pub mod shard;
pub mod stages;
pub mod workspace;

pub use adapted::AdaptedLinear;
pub use batch::{
    BatchMeta, Logits, LogitsFor, LogitsView, RowSegment, SeqChunk, SplitBy, SubBatching,
};
pub use kv::{KvDtype, KvStorage};
pub use linear::{DenseLinear, ExecCtx, Linear};
pub use llama::LlamaModel;
pub use prepared::{PreparedBatch, SubBatch};
pub use shard::{shard_adapter, shard_files, shard_files_noted, RankShard, ShardNotes, TpLayout};
pub use stages::StageReduce;
pub use workspace::{StageScratch, Workspace};
