//! A dedicated communication thread per rank: the communication resource of sub-batch
//! pipelining. The rank's compute thread hands it all-reduces to start
//! ([`CommThread::start_reduce`]) and goes on computing; it collects each sum when the next
//! stage needs it ([`CommThread::finish_reduce`]). Every collective of the rank, blocking ones
//! included (it implements [`Communicator`]), goes through the same first-in first-out queue,
//! so all ranks issue their collectives in one order and the sums are exactly those of the
//! blocking path.

use std::collections::BTreeMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;

use crate::{CommError, Communicator};

enum Op {
    Reduce(Vec<f32>),
    Gather(Vec<f32>, Vec<usize>, usize),
    Broadcast(usize, Vec<u8>, bool),
    Barrier,
}

enum Done {
    Floats(Result<Vec<f32>, CommError>),
    Bytes(Result<Vec<u8>, CommError>),
}

pub struct CommThread {
    rank: usize,
    size: usize,
    ops: Option<Sender<Op>>,
    done: Receiver<Done>,
    /// Tickets handed out, and answers received but not yet collected.
    issued: u64,
    received: u64,
    parked: BTreeMap<u64, Done>,
    thread: Option<JoinHandle<()>>,
}

impl CommThread {
    /// Moves `comm` onto a thread of its own named `name`.
    pub fn spawn(mut comm: Box<dyn Communicator>, name: &str) -> std::io::Result<Self> {
        let (rank, size) = (comm.rank(), comm.size());
        let (ops, op_rx) = channel::<Op>();
        let (done_tx, done) = channel::<Done>();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                while let Ok(op) = op_rx.recv() {
                    let d = match op {
                        Op::Reduce(mut v) => Done::Floats(comm.all_reduce_sum(&mut v).map(|_| v)),
                        Op::Gather(mine, counts, total) => {
                            let mut out = vec![0f32; total];
                            Done::Floats(comm.all_gather(&mine, &counts, &mut out).map(|_| out))
                        }
                        Op::Broadcast(root, mut b, deadline) => Done::Bytes(
                            if deadline {
                                comm.broadcast(root, &mut b)
                            } else {
                                comm.wait_broadcast(root, &mut b)
                            }
                            .map(|_| b),
                        ),
                        Op::Barrier => Done::Bytes(comm.barrier().map(|_| Vec::new())),
                    };
                    if done_tx.send(d).is_err() {
                        return;
                    }
                }
            })?;
        Ok(CommThread {
            rank,
            size,
            ops: Some(ops),
            done,
            issued: 0,
            received: 0,
            parked: BTreeMap::new(),
            thread: Some(thread),
        })
    }

    fn submit(&mut self, op: Op) -> Result<u64, CommError> {
        let gone = CommError::RankGone {
            rank: self.rank,
            op: "communication thread",
        };
        self.ops
            .as_ref()
            .ok_or(gone.clone())?
            .send(op)
            .map_err(|_| gone)?;
        self.issued += 1;
        Ok(self.issued)
    }

    /// The answer to ticket `t`, waiting for it (answers arrive in ticket order).
    fn answer(&mut self, t: u64) -> Result<Done, CommError> {
        while self.received < t {
            let d = self.done.recv().map_err(|_| CommError::RankGone {
                rank: self.rank,
                op: "communication thread",
            })?;
            self.received += 1;
            self.parked.insert(self.received, d);
        }
        self.parked.remove(&t).ok_or(CommError::Mismatch {
            rank: self.rank,
            reason: format!("ticket {t} collected twice"),
        })
    }

    /// Starts the all-reduce of a copy of `buf`; returns its ticket.
    pub fn start_reduce(&mut self, buf: &[f32]) -> Result<u64, CommError> {
        self.submit(Op::Reduce(buf.to_vec()))
    }

    /// Waits for ticket `t`'s sum and writes it into `out`.
    pub fn finish_reduce(&mut self, t: u64, out: &mut [f32]) -> Result<(), CommError> {
        match self.answer(t)? {
            Done::Floats(r) => {
                let v = r?;
                out.copy_from_slice(&v);
                Ok(())
            }
            Done::Bytes(_) => Err(CommError::Mismatch {
                rank: self.rank,
                reason: format!("ticket {t} is not an all-reduce"),
            }),
        }
    }
}

impl Drop for CommThread {
    fn drop(&mut self) {
        self.ops = None;
        if let Some(t) = self.thread.take() {
            // Let the thread drop its communicator (MPI finalises there), but never wait long
            // for one stuck in a collective with a dead peer.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while !t.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }
}

impl Communicator for CommThread {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn all_reduce_sum(&mut self, buf: &mut [f32]) -> Result<(), CommError> {
        let t = self.start_reduce(buf)?;
        self.finish_reduce(t, buf)
    }
    fn all_gather(
        &mut self,
        mine: &[f32],
        counts: &[usize],
        out: &mut [f32],
    ) -> Result<(), CommError> {
        let t = self.submit(Op::Gather(mine.to_vec(), counts.to_vec(), out.len()))?;
        match self.answer(t)? {
            Done::Floats(r) => {
                out.copy_from_slice(&r?);
                Ok(())
            }
            Done::Bytes(_) => unreachable!("a gather's answer is floats"),
        }
    }
    fn broadcast(&mut self, root: usize, buf: &mut Vec<u8>) -> Result<(), CommError> {
        self.broadcast_with(root, buf, true)
    }
    fn wait_broadcast(&mut self, root: usize, buf: &mut Vec<u8>) -> Result<(), CommError> {
        self.broadcast_with(root, buf, false)
    }
    fn barrier(&mut self) -> Result<(), CommError> {
        let t = self.submit(Op::Barrier)?;
        self.answer(t).map(|_| ())
    }
}

impl CommThread {
    fn broadcast_with(
        &mut self,
        root: usize,
        buf: &mut Vec<u8>,
        deadline: bool,
    ) -> Result<(), CommError> {
        let t = self.submit(Op::Broadcast(root, std::mem::take(buf), deadline))?;
        match self.answer(t)? {
            Done::Bytes(r) => {
                *buf = r?;
                Ok(())
            }
            Done::Floats(_) => unreachable!("a broadcast's answer is bytes"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn overlapped_reduces_equal_blocking_ones() {
        let comms = crate::local::group(3, Duration::from_secs(10));
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                std::thread::spawn(move || {
                    let r = c.rank() as f32;
                    let mut ct = CommThread::spawn(Box::new(c), "test-comm").unwrap();
                    let bufs: Vec<Vec<f32>> = (0..5).map(|i| vec![r * 0.1 + i as f32; 7]).collect();
                    let tickets: Vec<u64> =
                        bufs.iter().map(|b| ct.start_reduce(b).unwrap()).collect();
                    let mut out = vec![];
                    // Collected out of order, with a blocking gather in between.
                    for &t in tickets.iter().rev() {
                        let mut o = vec![0f32; 7];
                        ct.finish_reduce(t, &mut o).unwrap();
                        out.push(o);
                    }
                    let mut g = vec![0f32; 3];
                    ct.all_gather(&[r], &[1, 1, 1], &mut g).unwrap();
                    (out, g)
                })
            })
            .collect();
        for h in handles {
            let (out, g) = h.join().unwrap();
            assert_eq!(g, vec![0.0, 1.0, 2.0]);
            for (k, o) in out.iter().enumerate() {
                let i = 4 - k;
                let want = (0.0f32 * 0.1 + i as f32)
                    + (1.0f32 * 0.1 + i as f32)
                    + (2.0f32 * 0.1 + i as f32);
                assert!(o.iter().all(|&x| x == want), "{o:?} vs {want}");
            }
        }
    }
}
