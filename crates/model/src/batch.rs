//! Batch metadata: what a forward step computes, as plain data.

use std::ops::Range;

/// Which positions of a chunk need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsFor {
    /// None (an intermediate prefill chunk).
    None,
    /// The chunk's last token (generation).
    Last,
    /// Every token (perplexity, numerics checks).
    All,
}

/// One sequence's share of a step: `tokens` at positions `start_pos..start_pos + len`.
#[derive(Debug, Clone, PartialEq)]
pub struct SeqChunk {
    pub tokens: Vec<u32>,
    /// Position of `tokens[0]`; positions `0..start_pos` are already in the KV storage.
    pub start_pos: usize,
    /// Physical KV blocks holding positions `[i * block_size, (i + 1) * block_size)`; must
    /// cover `start_pos + tokens.len()` positions.
    pub block_table: Vec<u32>,
    pub logits: LogitsFor,
    /// The step's adapter slot whose weights these tokens use (`None`: the base model).
    pub adapter: Option<u32>,
    /// Blocks of the window group (the sliding-window layers, when the KV storage keeps
    /// them apart: [`crate::KvStorage::with_window_group`]), by block index like
    /// `block_table`; `tessera_kv::DROPPED` where the sequence no longer attends the block.
    /// `None`: those layers use `block_table`.
    pub window_table: Option<Vec<u32>>,
}

impl SeqChunk {
    /// A base-model chunk.
    pub fn new(
        tokens: Vec<u32>,
        start_pos: usize,
        block_table: Vec<u32>,
        logits: LogitsFor,
    ) -> Self {
        SeqChunk {
            tokens,
            start_pos,
            block_table,
            logits,
            adapter: None,
            window_table: None,
        }
    }
}

/// Everything one forward step computes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BatchMeta {
    pub seqs: Vec<SeqChunk>,
}

impl BatchMeta {
    pub fn num_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.tokens.len()).sum()
    }
}

/// How a step's rows are cut into sub-batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitBy {
    /// Whole sequences per sub-batch (each sub-batch's tokens independent of the others').
    Sequence,
    /// Near-equal token counts, cutting sequences between whole tokens where needed.
    Tokens,
}

impl std::str::FromStr for SplitBy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sequence" | "sequences" => Ok(SplitBy::Sequence),
            "tokens" | "token" => Ok(SplitBy::Tokens),
            _ => Err(format!("{s:?}: expected sequence or tokens")),
        }
    }
}

impl std::fmt::Display for SplitBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SplitBy::Sequence => "sequence",
            SplitBy::Tokens => "tokens",
        })
    }
}

/// The sub-batching of a forward: every layer's stages run over `count` sub-batches in turn.
/// At most `count` sub-batches are made (fewer when the step has fewer sequences or tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubBatching {
    pub count: usize,
    pub split: SplitBy,
}

impl SubBatching {
    /// One sub-batch: the whole step.
    pub const WHOLE: SubBatching = SubBatching {
        count: 1,
        split: SplitBy::Sequence,
    };

    pub fn new(count: usize, split: SplitBy) -> Result<Self, String> {
        if count == 0 {
            return Err("the number of sub-batches must be at least 1".into());
        }
        Ok(SubBatching { count, split })
    }
}

impl Default for SubBatching {
    fn default() -> Self {
        SubBatching::WHOLE
    }
}

/// Logits rows in batch order: for each sequence, its requested positions in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Logits {
    pub vocab: usize,
    pub data: Vec<f32>,
    /// `(sequence index in the batch, position)` of each row.
    pub rows: Vec<(usize, usize)>,
}

impl Logits {
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.vocab..(i + 1) * self.vocab]
    }

    /// The last row belonging to sequence `seq`.
    pub fn last_of(&self, seq: usize) -> Option<&[f32]> {
        self.view().last_of(seq)
    }

    /// Every row of sequence `seq`, in position order.
    pub fn rows_of(&self, seq: usize) -> Vec<&[f32]> {
        self.view().rows_of(seq)
    }

    pub fn view(&self) -> LogitsView<'_> {
        LogitsView {
            vocab: self.vocab,
            data: &self.data,
            rows: &self.rows,
        }
    }
}

/// Logits rows borrowed from a forward's workspace (valid until its next step).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogitsView<'a> {
    pub vocab: usize,
    pub data: &'a [f32],
    /// `(sequence index in the batch, position)` of each row.
    pub rows: &'a [(usize, usize)],
}

impl<'a> LogitsView<'a> {
    pub fn row(&self, i: usize) -> &'a [f32] {
        &self.data[i * self.vocab..(i + 1) * self.vocab]
    }

    /// The last row belonging to sequence `seq`.
    pub fn last_of(&self, seq: usize) -> Option<&'a [f32]> {
        self.rows
            .iter()
            .rposition(|&(s, _)| s == seq)
            .map(|i| self.row(i))
    }

    /// Every row of sequence `seq`, in position order.
    pub fn rows_of(&self, seq: usize) -> Vec<&'a [f32]> {
        self.rows
            .iter()
            .enumerate()
            .filter(|(_, &(s, _))| s == seq)
            .map(|(i, _)| self.row(i))
            .collect()
    }

    pub fn to_owned(&self) -> Logits {
        Logits {
            vocab: self.vocab,
            data: self.data.to_vec(),
            rows: self.rows.to_vec(),
        }
    }
}

/// A contiguous run of rows that use the same adapter, relative to the first row of the
/// matrix product it is passed to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowSegment {
    pub rows: Range<usize>,
    pub adapter: Option<u32>,
}
