//! One tensor-parallel rank's part of a step: the pipelined forward with its all-reduces on
//! the rank's communication thread, then the gather of every rank's vocabulary slice of the
//! logits. For the benchmarks a step can also run its compute alone (no collective at all)
//! or its communication alone (the same collectives, in the same order and sizes, with no
//! compute), so that each can be timed apart from the other.

use std::time::Instant;

use tessera_core::{Error, Result};
use tessera_model::{
    BatchMeta, ExecCtx, KvStorage, LlamaModel, Logits, StageReduce, SubBatching, TpLayout,
    Workspace,
};
use tessera_parallel::overlap::CommThread;
use tessera_parallel::{CommError, Communicator};

/// What a step runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StepMode {
    /// The step: compute and communication, overlapped.
    #[default]
    Full,
    /// Compute alone: every stage, no collective (the logits are not valid).
    ComputeOnly,
    /// Communication alone: the step's collectives back to back, no compute (the logits
    /// are not valid).
    CommOnly,
}

#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
impl StepMode {
    pub(crate) fn code(self) -> u8 {
        match self {
            StepMode::Full => 0,
            StepMode::ComputeOnly => 1,
            StepMode::CommOnly => 2,
        }
    }
    pub(crate) fn from_code(c: u8) -> Result<Self> {
        match c {
            0 => Ok(StepMode::Full),
            1 => Ok(StepMode::ComputeOnly),
            2 => Ok(StepMode::CommOnly),
            _ => Err(Error::Other(format!("unknown step mode {c}"))),
        }
    }
}

pub(crate) fn comm_err(e: CommError) -> Error {
    Error::Other(format!("tensor parallelism: {e}"))
}

/// A rank's communication thread as a pipelined forward uses it, adding up the time the rank
/// waits for sums (the communication left exposed).
struct Reducer<'a> {
    comm: &'a mut CommThread,
    secs: &'a mut f64,
}

#[cfg(feature = "fault-injection")]
thread_local! {
    /// Test-only: all-reduces this rank thread may still start before it dies.
    static DIE_AFTER: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Test-only: this rank thread dies when it starts its all-reduce number `n + 1`.
#[cfg(feature = "fault-injection")]
pub(crate) fn die_after(n: usize) {
    DIE_AFTER.with(|d| d.set(Some(n)));
}

impl StageReduce for Reducer<'_> {
    fn start(&mut self, buf: &[f32]) -> Result<u64> {
        #[cfg(feature = "fault-injection")]
        DIE_AFTER.with(|d| match d.get() {
            Some(0) => panic!("injected death of a rank in the middle of a step"),
            Some(n) => d.set(Some(n - 1)),
            None => {}
        });
        self.comm.start_reduce(buf).map_err(comm_err)
    }
    fn finish(&mut self, t: u64, out: &mut [f32]) -> Result<()> {
        let t0 = Instant::now();
        let r = self.comm.finish_reduce(t, out).map_err(comm_err);
        *self.secs += t0.elapsed().as_secs_f64();
        r
    }
}

/// No communication after the first reduction (the embedding's, kept so that every row
/// starts from its real embedding): each stage's output stays this rank's partial sum.
struct Skip<'a> {
    first: Option<Reducer<'a>>,
}

impl StageReduce for Skip<'_> {
    fn start(&mut self, buf: &[f32]) -> Result<u64> {
        match &mut self.first {
            Some(r) => r.start(buf),
            None => Ok(u64::MAX),
        }
    }
    fn finish(&mut self, t: u64, out: &mut [f32]) -> Result<()> {
        match self.first.take() {
            Some(mut r) if t != u64::MAX => r.finish(t, out),
            _ => Ok(()),
        }
    }
}

/// One rank's step of `batch` under `mode`: with [`StepMode::Full`], the whole vocabulary's
/// logits on every rank.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rank_forward(
    model: &LlamaModel,
    ctx: &ExecCtx,
    comm: &mut CommThread,
    secs: &mut f64,
    batch: &BatchMeta,
    kv: &mut KvStorage,
    ws: &mut Workspace,
    split: SubBatching,
    mode: StepMode,
    layout: &TpLayout,
) -> Result<Logits> {
    let vocab = model.config.vocab_size;
    match mode {
        StepMode::Full => {
            let local = {
                let mut reducer = Reducer {
                    comm: &mut *comm,
                    secs: &mut *secs,
                };
                model.forward_pipelined(batch, kv, ws, ctx, split, &mut reducer)?
            };
            let rows = local.rows.to_vec();
            gather_logits(comm, secs, local.data, rows, layout, vocab)
        }
        StepMode::ComputeOnly => {
            let mut skip = Skip {
                first: (model.vocab.len() != vocab).then_some(Reducer {
                    comm: &mut *comm,
                    secs: &mut *secs,
                }),
            };
            let local = model.forward_pipelined(batch, kv, ws, ctx, split, &mut skip)?;
            Ok(Logits {
                vocab,
                data: vec![0.0; local.rows.len() * vocab],
                rows: local.rows.to_vec(),
            })
        }
        StepMode::CommOnly => comm_only(model, comm, secs, batch, kv, ws, split, layout),
    }
}

/// The collectives of a step of `batch` cut by `split`, each waited for before the next: the
/// embedding's all-reduce (when the vocabulary is split), one all-reduce per stage per layer
/// per sub-batch, and the logits gather.
#[allow(clippy::too_many_arguments)]
fn comm_only(
    model: &LlamaModel,
    comm: &mut CommThread,
    secs: &mut f64,
    batch: &BatchMeta,
    kv: &mut KvStorage,
    ws: &mut Workspace,
    split: SubBatching,
    layout: &TpLayout,
) -> Result<Logits> {
    let c = &model.config;
    model.prepare(batch, kv, ws, 0)?;
    let (m, h) = (ws.batch.num_rows(), c.hidden_size);
    let rows = ws.batch.logit_ids.clone();
    if m == 0 {
        return Ok(Logits {
            vocab: c.vocab_size,
            data: Vec::new(),
            rows,
        });
    }
    let mut buf = vec![0f32; m * h];
    let mut reduce = |n: usize, secs: &mut f64| -> Result<()> {
        let t0 = Instant::now();
        let t = comm.start_reduce(&buf[..n]).map_err(comm_err)?;
        comm.finish_reduce(t, &mut buf[..n]).map_err(comm_err)?;
        *secs += t0.elapsed().as_secs_f64();
        Ok(())
    };
    if model.vocab.len() != c.vocab_size {
        reduce(m * h, secs)?;
    }
    let subs = ws.batch.split(split);
    for _ in 0..c.n_layers {
        for _stage in 0..2 {
            for r in &subs {
                reduce(r.len() * h, secs)?;
            }
        }
    }
    let local = vec![0f32; rows.len() * model.vocab.len()];
    gather_logits(comm, secs, &local, rows, layout, c.vocab_size)
}

/// Every rank's vocabulary slice of the logits rows (`local`: this rank's, rows × its slice)
/// gathered into whole rows.
fn gather_logits(
    comm: &mut CommThread,
    secs: &mut f64,
    local: &[f32],
    ids: Vec<(usize, usize)>,
    layout: &TpLayout,
    vocab: usize,
) -> Result<Logits> {
    let t0 = Instant::now();
    let rows = ids.len();
    let counts: Vec<usize> = layout.ranks.iter().map(|r| rows * r.vocab.len()).collect();
    let mut gathered = vec![0f32; rows * vocab];
    comm.all_gather(local, &counts, &mut gathered)
        .map_err(comm_err)?;
    *secs += t0.elapsed().as_secs_f64();
    // Rank-major blocks of `rows × |vocab_r|` into row-major logits.
    let mut data = vec![0f32; rows * vocab];
    let mut at = 0;
    for r in &layout.ranks {
        let w = r.vocab.len();
        for i in 0..rows {
            data[i * vocab + r.vocab.start..i * vocab + r.vocab.end]
                .copy_from_slice(&gathered[at + i * w..at + (i + 1) * w]);
        }
        at += rows * w;
    }
    Ok(Logits {
        vocab,
        data,
        rows: ids,
    })
}
