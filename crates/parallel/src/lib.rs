//! Collective communication between the ranks of a tensor-parallel group.
//!
//! [`Communicator`] is what a rank sees: all-reduce (sum), all-gather, broadcast and barrier,
//! each bounded by a timeout, failing with a [`CommError`] that names the rank at fault. The
//! sum of an all-reduce is taken in rank order (rank 0 + rank 1 + ...) whatever the arrival
//! order and whatever the backend, so results are bitwise reproducible run to run.
//!
//! Backends: [`local`] (ranks are thread groups of one process, reducing through shared
//! memory) and, with the cargo feature `mpi`, `mpi` (ranks are processes started by
//! `mpirun`).

#![allow(clippy::needless_range_loop)]

pub mod link;
pub mod local;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod overlap;

use std::time::Duration;

/// Why a collective failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommError {
    /// The ranks listed did not reach the collective within the timeout.
    #[error("rank(s) {ranks:?} did not answer within {timeout:?} ({op})")]
    Timeout {
        ranks: Vec<usize>,
        timeout: Duration,
        op: &'static str,
    },
    /// A rank left the group (its process or thread ended).
    #[error("rank {rank} has left the group ({op})")]
    RankGone { rank: usize, op: &'static str },
    /// Ranks called different collectives or passed different sizes.
    #[error("rank {rank} disagrees: {reason}")]
    Mismatch { rank: usize, reason: String },
}

impl CommError {
    /// The rank at fault, when one is known.
    pub fn rank(&self) -> Option<usize> {
        match self {
            CommError::Timeout { ranks, .. } => ranks.first().copied(),
            CommError::RankGone { rank, .. } | CommError::Mismatch { rank, .. } => Some(*rank),
        }
    }
}

/// One rank's end of a group of `size()` ranks. Every rank must make the same sequence of
/// calls with the same sizes.
pub trait Communicator: Send {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// `buf` becomes the element-wise sum of every rank's `buf`, added in rank order.
    fn all_reduce_sum(&mut self, buf: &mut [f32]) -> Result<(), CommError>;
    /// `out` becomes every rank's `mine`, concatenated in rank order; `counts[r]` is rank `r`'s
    /// length (the same on every rank) and `out.len()` their sum.
    fn all_gather(
        &mut self,
        mine: &[f32],
        counts: &[usize],
        out: &mut [f32],
    ) -> Result<(), CommError>;
    /// Every rank's `buf` becomes rank `root`'s.
    fn broadcast(&mut self, root: usize, buf: &mut Vec<u8>) -> Result<(), CommError>;
    fn barrier(&mut self) -> Result<(), CommError>;
    /// [`Communicator::broadcast`] without a deadline, for a rank idling until the next step
    /// (which may come after any time). Backends without deadlines of their own keep this.
    fn wait_broadcast(&mut self, root: usize, buf: &mut Vec<u8>) -> Result<(), CommError> {
        self.broadcast(root, buf)
    }
}

/// The sum of `parts` (one slice per rank, equal lengths) in rank order into `out`.
pub fn sum_in_rank_order(parts: &[&[f32]], out: &mut [f32]) {
    out.copy_from_slice(parts[0]);
    for p in &parts[1..] {
        for (o, x) in out.iter_mut().zip(p.iter()) {
            *o += *x;
        }
    }
}
