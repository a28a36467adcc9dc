//! The one error type of the KV bookkeeping.

use crate::SeqId;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// Not enough free or evictable blocks; nothing was allocated.
    #[error("out of KV blocks: {needed} needed, {available} available")]
    OutOfBlocks { needed: usize, available: usize },
    #[error("sequence {seq} has no block table")]
    UnknownSeq { seq: SeqId },
    #[error("sequence {seq} already has a block table")]
    SeqExists { seq: SeqId },
    #[error("invalid KV configuration: {reason}")]
    InvalidConfig { reason: String },
    /// `commit_full_blocks` was given more full blocks than the table holds.
    #[error("sequence {seq}: {full_blocks} full blocks to commit, table holds {table_len}")]
    CommitBeyondTable {
        seq: SeqId,
        full_blocks: usize,
        table_len: usize,
    },
    /// A write would touch a block that is shared or registered in the prefix cache.
    #[error("sequence {seq}: block {block} (index {index}) is immutable and cannot be written")]
    ImmutableWrite {
        seq: SeqId,
        block: u32,
        index: usize,
    },
    /// `check()` found a broken invariant (a bug, never user input).
    #[error("KV invariant broken: {0}")]
    Invariant(String),
}
