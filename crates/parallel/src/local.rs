//! The in-process backend: ranks are thread groups of one process, exchanging through one
//! shared buffer per rank. A collective is a rendezvous: each rank deposits its data and waits
//! (bounded by the timeout) until every rank has, then reads what it needs — for an
//! all-reduce, every rank sums all deposits itself in rank order, so all ranks hold bitwise the
//! same result — and a second rendezvous frees the buffers for the next collective. A rank
//! whose communicator is dropped (its thread ended, e.g. by a panic) makes the others fail at
//! once with [`CommError::RankGone`].

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::{sum_in_rank_order, CommError, Communicator};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    AllReduce,
    AllGather,
    Broadcast,
    Barrier,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all-reduce",
            Op::AllGather => "all-gather",
            Op::Broadcast => "broadcast",
            Op::Barrier => "barrier",
        }
    }
}

struct State {
    /// Collectives completed by each rank (its next collective's sequence number).
    seq: Vec<u64>,
    /// Phases each rank has reached, counted over its whole life: collective `s` phase `p`
    /// (0: deposited, 1: read) is reached when `progress >= 2s + p + 1`. Monotonic, so a
    /// fast rank's later arrivals are never mistaken for a slow rank's.
    progress: Vec<u64>,
    /// What each rank deposited, and for which collective.
    op: Vec<Option<(u64, Op, usize)>>,
    floats: Vec<Vec<f32>>,
    bytes: Vec<Vec<u8>>,
    gone: Vec<bool>,
}

struct Shared {
    state: Mutex<State>,
    cv: Condvar,
    /// Bumped on every arrival: waiters spin on it briefly before sleeping on `cv` (a decode
    /// step's all-reduces are microseconds apart; a condvar wake-up costs more).
    epoch: std::sync::atomic::AtomicU64,
    size: usize,
    timeout: Duration,
}

/// Spin iterations before a waiting rank sleeps (tens of microseconds).
const SPIN_LIMIT: u32 = 1 << 15;

/// One rank of a local group.
pub struct LocalComm {
    rank: usize,
    shared: Arc<Shared>,
}

/// A group of `size` ranks in this process whose collectives time out after `timeout`.
pub fn group(size: usize, timeout: Duration) -> Vec<LocalComm> {
    let size = size.max(1);
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            seq: vec![0; size],
            progress: vec![0; size],
            op: vec![None; size],
            floats: vec![Vec::new(); size],
            bytes: vec![Vec::new(); size],
            gone: vec![false; size],
        }),
        cv: Condvar::new(),
        epoch: std::sync::atomic::AtomicU64::new(0),
        size,
        timeout,
    });
    (0..size)
        .map(|rank| LocalComm {
            rank,
            shared: shared.clone(),
        })
        .collect()
}

impl Drop for LocalComm {
    fn drop(&mut self) {
        let mut st = self.lock();
        st.gone[self.rank] = true;
        self.shared
            .epoch
            .fetch_add(1, std::sync::atomic::Ordering::Release);
        drop(st);
        self.shared.cv.notify_all();
    }
}

impl LocalComm {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks this rank arrived at `phase` (0: data deposited, 1: data read) of its current
    /// collective and waits for every rank, failing on a timeout or a rank gone.
    fn rendezvous<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        phase: u64,
        op: Op,
    ) -> Result<MutexGuard<'a, State>, CommError> {
        let target = 2 * st.seq[self.rank] + phase + 1;
        st.progress[self.rank] = target;
        self.shared
            .epoch
            .fetch_add(1, std::sync::atomic::Ordering::Release);
        self.shared.cv.notify_all();
        let deadline = Instant::now() + self.shared.timeout;
        let mut spun = false;
        loop {
            let missing: Vec<usize> = (0..self.shared.size)
                .filter(|&r| st.progress[r] < target)
                .collect();
            if missing.is_empty() {
                return Ok(st);
            }
            if let Some(&g) = missing.iter().find(|&&r| st.gone[r]) {
                return Err(CommError::RankGone {
                    rank: g,
                    op: op.name(),
                });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(CommError::Timeout {
                    ranks: missing,
                    timeout: self.shared.timeout,
                    op: op.name(),
                });
            }
            // First spin (lock released) until someone arrives, for a little while; then
            // re-check under the lock; sleep only when a spin found nobody.
            if !spun {
                let seen = self.shared.epoch.load(std::sync::atomic::Ordering::Acquire);
                drop(st);
                let mut spins = 0u32;
                while spins < SPIN_LIMIT
                    && self.shared.epoch.load(std::sync::atomic::Ordering::Acquire) == seen
                {
                    std::hint::spin_loop();
                    spins += 1;
                }
                spun = spins == SPIN_LIMIT;
                st = self.lock();
                continue;
            }
            spun = false;
            st = self
                .shared
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Runs one collective: deposit, rendezvous, `read` everyone's deposits, rendezvous.
    fn collective<T>(
        &mut self,
        op: Op,
        len: usize,
        deposit: impl FnOnce(&mut State, usize),
        read: impl FnOnce(&State) -> Result<T, CommError>,
    ) -> Result<T, CommError> {
        let mut st = self.lock();
        let seq = st.seq[self.rank];
        st.op[self.rank] = Some((seq, op, len));
        deposit(&mut st, self.rank);
        let st = self.rendezvous(st, 0, op)?;
        for r in 0..self.shared.size {
            match st.op[r] {
                Some((s, o, l)) if s == seq && o == op && l == len => {}
                Some((s, o, l)) if s == seq => {
                    return Err(CommError::Mismatch {
                        rank: r,
                        reason: format!("{} of {l} against {} of {len}", o.name(), op.name()),
                    })
                }
                _ => {}
            }
        }
        let out = read(&st);
        let mut st = self.rendezvous(st, 1, op)?;
        // Everyone has read: this rank may deposit its next collective.
        st.seq[self.rank] += 1;
        drop(st);
        out
    }
}

impl Communicator for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.shared.size
    }

    fn all_reduce_sum(&mut self, buf: &mut [f32]) -> Result<(), CommError> {
        if self.shared.size == 1 {
            return Ok(());
        }
        let n = buf.len();
        let mine = buf.to_vec();
        self.collective(
            Op::AllReduce,
            n,
            |st, r| st.floats[r] = mine,
            |st| {
                let parts: Vec<&[f32]> = st.floats.iter().map(|v| v.as_slice()).collect();
                sum_in_rank_order(&parts, buf);
                Ok(())
            },
        )
    }

    fn all_gather(
        &mut self,
        mine: &[f32],
        counts: &[usize],
        out: &mut [f32],
    ) -> Result<(), CommError> {
        let total: usize = counts.iter().sum();
        if counts.len() != self.shared.size || counts[self.rank] != mine.len() || out.len() != total
        {
            return Err(CommError::Mismatch {
                rank: self.rank,
                reason: format!(
                    "all-gather of {} with counts {counts:?} into {}",
                    mine.len(),
                    out.len()
                ),
            });
        }
        let mine = mine.to_vec();
        self.collective(
            Op::AllGather,
            total,
            |st, r| st.floats[r] = mine,
            |st| {
                let mut at = 0;
                for (r, &c) in counts.iter().enumerate() {
                    if st.floats[r].len() != c {
                        return Err(CommError::Mismatch {
                            rank: r,
                            reason: format!("sent {} values, {c} expected", st.floats[r].len()),
                        });
                    }
                    out[at..at + c].copy_from_slice(&st.floats[r]);
                    at += c;
                }
                Ok(())
            },
        )
    }

    fn broadcast(&mut self, root: usize, buf: &mut Vec<u8>) -> Result<(), CommError> {
        let me = self.rank;
        let data = if me == root { buf.clone() } else { Vec::new() };
        let got = self.collective(
            Op::Broadcast,
            root,
            |st, r| st.bytes[r] = data,
            |st| Ok(st.bytes[root].clone()),
        )?;
        if me != root {
            *buf = got;
        }
        Ok(())
    }

    fn barrier(&mut self) -> Result<(), CommError> {
        self.collective(Op::Barrier, 0, |_, _| {}, |_| Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run<T: Send + 'static>(
        size: usize,
        timeout: Duration,
        f: impl Fn(LocalComm) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let f = Arc::new(f);
        let handles: Vec<_> = group(size, timeout)
            .into_iter()
            .map(|c| {
                let f = f.clone();
                std::thread::spawn(move || f(c))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn all_reduce_sums_in_rank_order_on_every_rank(size in 1usize..5, n in 0usize..40, rounds in 1usize..4) {
            let out = run(size, Duration::from_secs(10), move |mut c| {
                let mut res = vec![];
                for round in 0..rounds {
                    let mut v: Vec<f32> = (0..n).map(|i| ((c.rank() * 31 + i * 7 + round) % 13) as f32 * 0.1 + 1e-7 * c.rank() as f32).collect();
                    c.all_reduce_sum(&mut v).unwrap();
                    res.push(v);
                }
                res
            });
            for round in 0..rounds {
                let parts: Vec<Vec<f32>> = (0..size).map(|r| (0..n).map(|i| ((r * 31 + i * 7 + round) % 13) as f32 * 0.1 + 1e-7 * r as f32).collect()).collect();
                let refs: Vec<&[f32]> = parts.iter().map(|p| p.as_slice()).collect();
                let mut want = vec![0f32; n];
                if n > 0 { sum_in_rank_order(&refs, &mut want); }
                for r in 0..size {
                    prop_assert_eq!(&out[r][round], &want, "rank {} round {}", r, round);
                }
            }
        }
    }

    #[test]
    fn gather_broadcast_barrier() {
        let out = run(3, Duration::from_secs(10), |mut c| {
            let r = c.rank();
            let mine: Vec<f32> = vec![r as f32; r + 1];
            let mut all = vec![0f32; 6];
            c.all_gather(&mine, &[1, 2, 3], &mut all).unwrap();
            let mut b = if r == 1 { b"plan".to_vec() } else { vec![] };
            c.broadcast(1, &mut b).unwrap();
            c.barrier().unwrap();
            (all, b)
        });
        for (all, b) in out {
            assert_eq!(all, vec![0., 1., 1., 2., 2., 2.]);
            assert_eq!(b, b"plan");
        }
    }

    #[test]
    fn a_stalled_rank_times_out_naming_it() {
        let t0 = Instant::now();
        let out = run(3, Duration::from_millis(200), |mut c| {
            if c.rank() == 2 {
                std::thread::sleep(Duration::from_millis(600));
                return Ok(());
            }
            let mut v = vec![1.0; 4];
            c.all_reduce_sum(&mut v)
        });
        for r in [0, 1] {
            match &out[r] {
                Err(CommError::Timeout { ranks, .. }) => assert_eq!(ranks, &vec![2]),
                o => panic!("rank {r}: {o:?}"),
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_rank_that_dies_fails_the_others_at_once() {
        let t0 = Instant::now();
        let out = run(2, Duration::from_secs(30), |mut c| {
            if c.rank() == 1 {
                drop(c);
                return Err(CommError::RankGone {
                    rank: 1,
                    op: "test",
                });
            }
            c.barrier()
        });
        assert_eq!(
            out[0],
            Err(CommError::RankGone {
                rank: 1,
                op: "barrier"
            })
        );
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "not bounded by the long timeout"
        );
    }

    #[test]
    fn mismatched_sizes_are_reported() {
        let out = run(2, Duration::from_secs(5), |mut c| {
            let mut v = vec![0f32; 3 + c.rank()];
            c.all_reduce_sum(&mut v)
        });
        assert!(
            out.iter()
                .any(|o| matches!(o, Err(CommError::Mismatch { .. }))),
            "{out:?}"
        );
    }
}
