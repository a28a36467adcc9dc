//! The activation buffers of a forward, owned by whoever runs steps and reused from step to
//! step: they grow to the largest step seen and are never freed between steps.

use crate::prepared::PreparedBatch;

/// Scratch of one stage running on one sub-batch (sized for the largest sub-batch).
#[derive(Debug, Default)]
pub struct StageScratch {
    pub(crate) normed: Vec<f32>,
    pub(crate) qkv: Vec<f32>,
    pub(crate) att: Vec<f32>,
    pub(crate) gate_up: Vec<f32>,
    pub(crate) act: Vec<f32>,
}

/// Everything a forward writes besides the KV storage.
#[derive(Debug, Default)]
pub struct Workspace {
    /// The step's batch as flat rows.
    pub batch: PreparedBatch,
    /// The residual stream: step rows × hidden.
    pub(crate) x: Vec<f32>,
    /// Stage outputs before the residual add: step rows × hidden.
    pub(crate) delta: Vec<f32>,
    pub(crate) scratch: StageScratch,
    /// Final-norm rows that want logits, and their logits.
    pub(crate) picked: Vec<f32>,
    pub(crate) head_in: Vec<f32>,
    pub(crate) logits: Vec<f32>,
}

impl Workspace {
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes currently held by the activation buffers.
    pub fn bytes(&self) -> usize {
        let s = &self.scratch;
        4 * [
            &self.x,
            &self.delta,
            &s.normed,
            &s.qkv,
            &s.att,
            &s.gate_up,
            &s.act,
            &self.picked,
            &self.head_in,
            &self.logits,
        ]
        .iter()
        .map(|v| v.capacity())
        .sum::<usize>()
    }
}

/// The first `n` elements of `v`, growing it (zero-filled) if it is shorter.
pub(crate) fn take(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}
