//! The MPI backend: ranks are the processes of an `mpirun` job. All MPI calls are made by one
//! communication thread per process (MPI initialised with `MPI_THREAD_MULTIPLE` there); the
//! rank's compute thread hands it each collective and waits for the answer with a deadline.
//!
//! Every collective is one exchange: each rank sends its bytes to every other rank and
//! receives theirs, in rank order; the all-reduce then sums all ranks' buffers itself in rank
//! order, so the result is bitwise the one the local backend gives at the same R. Because the
//! communication thread records whose data has arrived, a rank that stops answering is named
//! when the deadline passes; the communicator is then broken and every later call fails at
//! once. (MPI offers no way to abandon a blocking receive: the stuck thread is left behind,
//! and the process is expected to exit.)

use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mpi::point_to_point::{Destination, MatchedReceiveVec, Source};
use mpi::topology::Communicator as _;
use mpi::Threading;

use crate::{sum_in_rank_order, CommError, Communicator};

/// How the communication thread waits for MPI without spinning a core the rank's compute
/// may share: it polls (each poll also drives MPI's progress), yielding the CPU between
/// polls, then sleeping between them once a wait has gone on for a while (a follower idle
/// between steps), so a blocked receive never keeps a core busy.
struct Backoff {
    since: std::time::Instant,
}

impl Backoff {
    fn new() -> Self {
        Backoff {
            since: std::time::Instant::now(),
        }
    }
    fn pause(&mut self) {
        let waited = self.since.elapsed();
        if waited < Duration::from_micros(200) {
            std::thread::yield_now();
            return;
        }
        let nap = if waited < Duration::from_millis(2) {
            Duration::from_micros(20)
        } else if waited < Duration::from_secs(1) {
            Duration::from_micros(200)
        } else {
            Duration::from_millis(2)
        };
        std::thread::sleep(nap);
    }
}

/// Largest MPI message: bigger buffers go as several.
const CHUNK: usize = 256 << 10;

struct Exchange {
    data: Vec<u8>,
    reply: Sender<Vec<Vec<u8>>>,
}

pub struct MpiComm {
    rank: usize,
    size: usize,
    timeout: Duration,
    jobs: Sender<Exchange>,
    /// For each rank, the number of the last exchange whose data arrived from it, and of the
    /// last whose data it took from us.
    arrived: Arc<Mutex<Vec<(u64, u64)>>>,
    seq: u64,
    broken: Option<CommError>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for MpiComm {
    /// Ends the communication thread, which finalises MPI, and waits for it, unless a
    /// collective timed out (its thread may be stuck in MPI for good; the process exits
    /// without finalising).
    fn drop(&mut self) {
        let (tx, _) = channel();
        drop(std::mem::replace(&mut self.jobs, tx));
        if self.broken.is_none() {
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }
}

/// Initialises MPI (on a communication thread of its own) and joins the job's world.
pub fn init(timeout: Duration) -> Result<MpiComm, String> {
    let (ready_tx, ready_rx) = channel::<Result<(usize, usize), String>>();
    let (jobs, job_rx) = channel::<Exchange>();
    let arrived = Arc::new(Mutex::new(Vec::<(u64, u64)>::new()));
    let arrived_thread = arrived.clone();
    let thread = std::thread::Builder::new()
        .name("tessera-mpi".into())
        .spawn(move || comm_thread(ready_tx, job_rx, arrived_thread))
        .map_err(|e| format!("starting the MPI thread: {e}"))?;
    let (rank, size) = ready_rx
        .recv()
        .map_err(|_| "the MPI thread died while initialising".to_string())??;
    Ok(MpiComm {
        rank,
        size,
        timeout,
        jobs,
        arrived,
        seq: 0,
        broken: None,
        thread: Some(thread),
    })
}

fn comm_thread(
    ready: Sender<Result<(usize, usize), String>>,
    jobs: Receiver<Exchange>,
    arrived: Arc<Mutex<Vec<(u64, u64)>>>,
) {
    let Some((universe, threading)) = mpi::initialize_with_threading(Threading::Multiple) else {
        let _ = ready.send(Err("MPI was already initialised".into()));
        return;
    };
    if threading < Threading::Serialized {
        let _ = ready.send(Err(format!(
            "MPI granted only {threading:?} threading (needs at least Serialized)"
        )));
        return;
    }
    let world = universe.world();
    let (me, size) = (world.rank() as usize, world.size() as usize);
    *arrived.lock().unwrap_or_else(|e| e.into_inner()) = vec![(0, 0); size];
    let _ = ready.send(Ok((me, size)));
    let mut seq = 0u64;
    while let Ok(job) = jobs.recv() {
        seq += 1;
        let mut out: Vec<Vec<u8>> = vec![Vec::new(); size];
        // Each message goes as chunks of at most CHUNK bytes, the last one shorter (empty
        // when the length is a multiple): large single messages over TCP ran at a fraction
        // of the link's rate, chunks of this size run at it. Messages between two ranks are
        // non-overtaking, so the chunks arrive in order.
        let chunks: Vec<&[u8]> = job
            .data
            .chunks(CHUNK)
            .chain((job.data.len() % CHUNK == 0).then_some(&[][..]))
            .collect();
        mpi::request::scope(|scope| {
            let sends: Vec<_> = (0..size)
                .filter(|&r| r != me)
                .map(|r| {
                    let p = world.process_at_rank(r as i32);
                    let reqs: Vec<_> = chunks.iter().map(|c| p.immediate_send(scope, *c)).collect();
                    (r, reqs)
                })
                .collect();
            for (r, slot) in out.iter_mut().enumerate() {
                if r == me {
                    continue;
                }
                let peer = world.process_at_rank(r as i32);
                loop {
                    let mut wait = Backoff::new();
                    let msg = loop {
                        match peer.immediate_matched_probe() {
                            Some(m) => break m,
                            None => wait.pause(),
                        }
                    };
                    let (msg, _status) = msg.matched_receive_vec::<u8>();
                    let last = msg.len() < CHUNK;
                    slot.extend_from_slice(&msg);
                    if last {
                        break;
                    }
                }
                arrived.lock().unwrap_or_else(|e| e.into_inner())[r].0 = seq;
            }
            for (r, reqs) in sends {
                for mut s in reqs {
                    let mut wait = Backoff::new();
                    while let Err(pending) = s.test() {
                        s = pending;
                        wait.pause();
                    }
                }
                arrived.lock().unwrap_or_else(|e| e.into_inner())[r].1 = seq;
            }
        });
        out[me] = job.data;
        if job.reply.send(out).is_err() {
            return;
        }
    }
    // `universe` is dropped here: MPI_Finalize.
}

impl MpiComm {
    /// Every rank's bytes, in rank order; `deadline`: fail naming the missing ranks after
    /// the timeout (otherwise wait as long as it takes: a follower idle between steps).
    fn exchange(
        &mut self,
        data: Vec<u8>,
        op: &'static str,
        deadline: bool,
    ) -> Result<Vec<Vec<u8>>, CommError> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        self.seq += 1;
        let (reply, answer) = channel();
        if self.jobs.send(Exchange { data, reply }).is_err() {
            let e = CommError::RankGone {
                rank: self.rank,
                op,
            };
            self.broken = Some(e.clone());
            return Err(e);
        }
        let got = if deadline {
            answer.recv_timeout(self.timeout)
        } else {
            answer.recv().map_err(|_| RecvTimeoutError::Disconnected)
        };
        match got {
            Ok(v) => Ok(v),
            Err(RecvTimeoutError::Timeout) => {
                let arrived = self.arrived.lock().unwrap_or_else(|e| e.into_inner());
                let mut ranks: Vec<usize> = (0..self.size)
                    .filter(|&r| {
                        r != self.rank
                            && arrived
                                .get(r)
                                .is_some_and(|&(got, took)| got < self.seq || took < self.seq)
                    })
                    .collect();
                if ranks.is_empty() {
                    ranks = (0..self.size).filter(|&r| r != self.rank).collect();
                }
                let e = CommError::Timeout {
                    ranks,
                    timeout: self.timeout,
                    op,
                };
                self.broken = Some(e.clone());
                Err(e)
            }
            Err(RecvTimeoutError::Disconnected) => {
                let e = CommError::RankGone {
                    rank: self.rank,
                    op,
                };
                self.broken = Some(e.clone());
                Err(e)
            }
        }
    }

    /// [`Communicator::broadcast`] without a deadline (a follower waiting for the next
    /// step, which may come after any idle time).
    pub fn broadcast_unbounded(&mut self, root: usize, buf: &mut Vec<u8>) -> Result<(), CommError> {
        let data = if self.rank == root {
            buf.clone()
        } else {
            Vec::new()
        };
        let mut all = self.exchange(data, "broadcast", false)?;
        if self.rank != root {
            *buf = std::mem::take(&mut all[root]);
        }
        Ok(())
    }
}

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

impl Communicator for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }

    fn all_reduce_sum(&mut self, buf: &mut [f32]) -> Result<(), CommError> {
        if self.size == 1 {
            return Ok(());
        }
        let all = self.exchange(bytes(buf), "all-reduce", true)?;
        let parts: Vec<Vec<f32>> = all.iter().map(|b| floats(b)).collect();
        if let Some(r) = parts.iter().position(|p| p.len() != buf.len()) {
            return Err(CommError::Mismatch {
                rank: r,
                reason: format!("all-reduce of {} against {}", parts[r].len(), buf.len()),
            });
        }
        let refs: Vec<&[f32]> = parts.iter().map(|p| p.as_slice()).collect();
        sum_in_rank_order(&refs, buf);
        Ok(())
    }

    fn all_gather(
        &mut self,
        mine: &[f32],
        counts: &[usize],
        out: &mut [f32],
    ) -> Result<(), CommError> {
        let all = self.exchange(bytes(mine), "all-gather", true)?;
        let mut at = 0;
        for (r, b) in all.iter().enumerate() {
            let v = floats(b);
            let want = counts.get(r).copied().unwrap_or(usize::MAX);
            if v.len() != want || at + v.len() > out.len() {
                return Err(CommError::Mismatch {
                    rank: r,
                    reason: format!("sent {} values, {want} expected", v.len()),
                });
            }
            out[at..at + v.len()].copy_from_slice(&v);
            at += v.len();
        }
        Ok(())
    }

    fn broadcast(&mut self, root: usize, buf: &mut Vec<u8>) -> Result<(), CommError> {
        self.broadcast_with(root, buf, true)
    }

    fn barrier(&mut self) -> Result<(), CommError> {
        self.exchange(Vec::new(), "barrier", true).map(|_| ())
    }

    fn wait_broadcast(&mut self, root: usize, buf: &mut Vec<u8>) -> Result<(), CommError> {
        self.broadcast_with(root, buf, false)
    }
}

impl MpiComm {
    /// Rank `root`'s bytes on every rank, with or without the deadline.
    fn broadcast_with(
        &mut self,
        root: usize,
        buf: &mut Vec<u8>,
        deadline: bool,
    ) -> Result<(), CommError> {
        let data = if self.rank == root {
            buf.clone()
        } else {
            Vec::new()
        };
        let mut all = self.exchange(data, "broadcast", deadline)?;
        if self.rank != root {
            *buf = std::mem::take(&mut all[root]);
        }
        Ok(())
    }
}
