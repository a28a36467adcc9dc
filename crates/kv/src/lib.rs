//! KV-cache bookkeeping for a paged cache: which physical blocks each sequence's positions
//! live in, reference counts, and prefix caching of full blocks. No tensors: the storage
//! (`tessera_model::KvStorage`) receives block tables with each batch.
//!
//! - [`pool`]: the block pool (free stack, refcounts, LRU of cached blocks, content index).
//! - [`manager`]: per-sequence tables, prefix lookup on admission, commits of full blocks.
//! - `hash`: chained block hashes with full-content verification.
//! - `window`: the window group, blocks of sliding-window layers held only while attended.
//!
//! Positions `[i * block_size, (i + 1) * block_size)` of a sequence live in its table's
//! block `i`.

mod error;
mod hash;
mod lru;
pub mod manager;
pub mod pool;
mod window;

pub use error::KvError;
pub use hash::BlockHash;
pub use manager::{KvManager, KvMetrics, SeqId, DROPPED};
pub use pool::BlockPool;
