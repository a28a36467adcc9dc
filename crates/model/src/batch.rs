//! Batch metadata: what a forward step computes, as plain data.

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
        self.rows
            .iter()
            .rposition(|&(s, _)| s == seq)
            .map(|i| self.row(i))
    }
}
