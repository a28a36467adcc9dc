//! Tensor parallelism over MPI: every rank is a process of an `mpirun` job running the same
//! command. Rank 0 runs the command (the scheduler, the server) and broadcasts each step's
//! work; ranks 1.. load their shard and follow ([`follow`]), never returning. Each step is a
//! broadcast message (plain bytes: the batch, which KV storage, the sub-batching), then the
//! same staged forward on every rank with the same all-reduces as the local backend, summed
//! in the same rank order, so the two backends agree bitwise at the same R.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tessera_lora::LoraAdapter;

use tessera_core::{Error, Result};
use tessera_formats::ModelFiles;
use tessera_kernels::plan::Precision;
use tessera_kernels::planner::Planner;
use tessera_model::{
    shard_adapter, shard_files_noted, BatchMeta, ExecCtx, KvDtype, KvStorage, LlamaModel,
    LogitsFor, SeqChunk, SplitBy, SubBatching, TpLayout, Workspace,
};
use tessera_parallel::overlap::CommThread;
use tessera_parallel::{CommError, Communicator};
use tessera_runtime::{allowed_cpus, pin_current_thread, ThreadPool};

use crate::tp::TpGroup;
use crate::tp_rank::{rank_forward, StepMode};

const STEP: u8 = 1;
const NEW_KV: u8 = 2;
const SHUTDOWN: u8 = 3;
/// A sequence's adapter slot when it runs the base model.
const NO_ADAPTER: u32 = u32::MAX;

/// Rank 0's side of the follower protocol.
#[derive(Default)]
pub(crate) struct MpiLink {
    next_tag: u64,
    shut: bool,
}

impl MpiLink {
    /// Tells the followers a step: the batch, its adapters (id and file: a follower loads and
    /// shards an adapter the first time it sees its id) and the adapters gone since the last
    /// step (their parts are dropped).
    #[allow(clippy::too_many_arguments)]
    pub fn send_step(
        &mut self,
        comm: &mut dyn Communicator,
        batch: &BatchMeta,
        kv: &KvStorage,
        split: SubBatching,
        mode: StepMode,
        adapters: &[Arc<LoraAdapter>],
        dropped: &[u64],
    ) -> Result<(), CommError> {
        let mut msg = encode_step(batch, kv.tag, split, mode);
        put32(&mut msg, adapters.len() as u32);
        for a in adapters {
            put64(&mut msg, a.id);
            let path = a.path.to_string_lossy();
            put32(&mut msg, path.len() as u32);
            msg.extend_from_slice(path.as_bytes());
        }
        put32(&mut msg, dropped.len() as u32);
        dropped.iter().for_each(|&id| put64(&mut msg, id));
        comm.broadcast(0, &mut msg)
    }

    pub fn send_new_kv(
        &mut self,
        comm: &mut dyn Communicator,
        block_size: usize,
        num_blocks: usize,
        dtype: KvDtype,
    ) -> Result<u64, CommError> {
        self.next_tag += 1;
        let mut msg = vec![NEW_KV];
        put64(&mut msg, self.next_tag);
        put64(&mut msg, block_size as u64);
        put64(&mut msg, num_blocks as u64);
        msg.push(match dtype {
            KvDtype::F32 => 0,
            KvDtype::F16 => 1,
        });
        comm.broadcast(0, &mut msg)?;
        Ok(self.next_tag)
    }

    pub fn send_shutdown(&mut self, comm: &mut dyn Communicator) {
        if !self.shut {
            self.shut = true;
            let _ = comm.broadcast(0, &mut vec![SHUTDOWN]);
        }
    }
}

fn put32(v: &mut Vec<u8>, x: u32) {
    v.extend_from_slice(&x.to_le_bytes());
}
fn put64(v: &mut Vec<u8>, x: u64) {
    v.extend_from_slice(&x.to_le_bytes());
}

fn encode_step(batch: &BatchMeta, tag: u64, split: SubBatching, mode: StepMode) -> Vec<u8> {
    let mut m = vec![STEP];
    put64(&mut m, tag);
    m.push(mode.code());
    put32(&mut m, split.count as u32);
    m.push(matches!(split.split, SplitBy::Tokens) as u8);
    put32(&mut m, batch.seqs.len() as u32);
    for s in &batch.seqs {
        put64(&mut m, s.start_pos as u64);
        m.push(match s.logits {
            LogitsFor::None => 0,
            LogitsFor::Last => 1,
            LogitsFor::All => 2,
        });
        put32(&mut m, s.tokens.len() as u32);
        s.tokens.iter().for_each(|&t| put32(&mut m, t));
        put32(&mut m, s.block_table.len() as u32);
        s.block_table.iter().for_each(|&b| put32(&mut m, b));
        put32(&mut m, s.adapter.unwrap_or(NO_ADAPTER));
    }
    m
}

/// A reader over a message; every read is bounds-checked.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        if self.0.len() < n {
            return Err(Error::Other("truncated tensor-parallel message".into()));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }
    fn u32s(&mut self) -> Result<Vec<u32>> {
        let n = self.u32()? as usize;
        (0..n).map(|_| self.u32()).collect()
    }
}

enum Message {
    Step {
        tag: u64,
        /// The step's adapter table: (rank 0's id, file).
        adapters: Vec<(u64, PathBuf)>,
        /// Adapters gone since the last step.
        dropped: Vec<u64>,
        mode: StepMode,
        split: SubBatching,
        batch: BatchMeta,
    },
    NewKv {
        tag: u64,
        block_size: usize,
        num_blocks: usize,
        dtype: KvDtype,
    },
    Shutdown,
}

fn decode(msg: &[u8]) -> Result<Message> {
    let mut r = Reader(msg);
    match r.u8()? {
        STEP => {
            let tag = r.u64()?;
            let mode = StepMode::from_code(r.u8()?)?;
            let count = r.u32()? as usize;
            let split = if r.u8()? == 1 {
                SplitBy::Tokens
            } else {
                SplitBy::Sequence
            };
            let n = r.u32()? as usize;
            let mut seqs = Vec::with_capacity(n.min(4096));
            for _ in 0..n {
                let start = r.u64()? as usize;
                let logits = match r.u8()? {
                    0 => LogitsFor::None,
                    1 => LogitsFor::Last,
                    _ => LogitsFor::All,
                };
                let tokens = r.u32s()?;
                let table = r.u32s()?;
                let mut seq = SeqChunk::new(tokens, start, table, logits);
                seq.adapter = Some(r.u32()?).filter(|&a| a != NO_ADAPTER);
                seqs.push(seq);
            }
            let n = r.u32()? as usize;
            let mut adapters = Vec::with_capacity(n.min(4096));
            for _ in 0..n {
                let id = r.u64()?;
                let len = r.u32()? as usize;
                let path = String::from_utf8_lossy(r.take(len)?).into_owned();
                adapters.push((id, PathBuf::from(path)));
            }
            let n = r.u32()? as usize;
            let dropped = (0..n).map(|_| r.u64()).collect::<Result<Vec<_>>>()?;
            Ok(Message::Step {
                tag,
                adapters,
                dropped,
                mode,
                split: SubBatching::new(count, split).map_err(Error::Other)?,
                batch: BatchMeta { seqs },
            })
        }
        NEW_KV => Ok(Message::NewKv {
            tag: r.u64()?,
            block_size: r.u64()? as usize,
            num_blocks: r.u64()? as usize,
            dtype: match r.u8()? {
                0 => KvDtype::F32,
                1 => KvDtype::F16,
                d => return Err(Error::Other(format!("unknown KV dtype code {d}"))),
            },
        }),
        SHUTDOWN => Ok(Message::Shutdown),
        k => Err(Error::Other(format!(
            "unknown tensor-parallel message kind {k}"
        ))),
    }
}

/// This process's CPUs: its share of the node's, by its local rank among the job's
/// processes on this node (Open MPI's environment), and the threads per process.
fn node_share(threads: usize) -> (usize, Vec<usize>) {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<usize>().ok());
    let local = env("OMPI_COMM_WORLD_LOCAL_SIZE").unwrap_or(1).max(1);
    let me = env("OMPI_COMM_WORLD_LOCAL_RANK").unwrap_or(0);
    let per = (threads / local).max(1);
    let cpus = allowed_cpus().unwrap_or_default();
    let mine = if cpus.len() >= local * per {
        cpus[me * per..(me + 1) * per].to_vec()
    } else {
        Vec::new()
    };
    (per, mine)
}

/// What loading over MPI gave this process.
pub(crate) enum MpiRole {
    /// Rank 0: the group, its shard and its compute units.
    Leader(TpGroup, LlamaModel, ThreadPool),
}

/// Joins the MPI job as one of `size` ranks. Rank 0 gets its part back; every other rank
/// follows rank 0 until it shuts the job down, then exits the process.
pub(crate) fn join(
    files: &ModelFiles,
    precision: Precision,
    planner: &Planner,
    size: usize,
    threads: usize,
    timeout: Duration,
) -> Result<MpiRole> {
    let comm = tessera_parallel::mpi::init(timeout).map_err(Error::Other)?;
    if comm.size() != size {
        return Err(Error::Config(format!(
            "--tp {size} but the MPI job has {} processes (mpirun -np {size})",
            comm.size()
        )));
    }
    let layout = TpLayout::for_files(files, size)?;
    let rank = comm.rank();
    let (per, cpus) = node_share(threads);
    let pool = if cpus.is_empty() {
        ThreadPool::new(per)
    } else {
        ThreadPool::on_cpus(&cpus)
    };
    let (shard, notes) = shard_files_noted(files, &layout, rank)?;
    if let (0, Some(line)) = (rank, notes.line()) {
        eprintln!("{line}");
    }
    let model = LlamaModel::new_shard(&shard, precision, layout.ranks[rank].vocab.clone())?;
    if rank == 0 {
        let group = TpGroup::over_mpi(
            layout,
            files.config.clone(),
            comm,
            timeout,
            cpus.first().copied(),
        )?;
        return Ok(MpiRole::Leader(group, model, pool));
    }
    // A follower's main thread runs its steps.
    if let Some(&c) = cpus.first() {
        pin_current_thread(c);
    }
    let planner = Planner::new(planner.profile.clone(), planner.cache.clone());
    let mut comm = CommThread::spawn(Box::new(comm), "tessera-comm")
        .map_err(|e| Error::Other(format!("starting the communication thread: {e}")))?;
    // The start-up link measurement, a collective rank 0 makes too.
    crate::overlap_plan::measure_link(&mut comm).map_err(crate::tp::comm_err)?;
    let code = match follow(&model, &pool, &planner, precision, comm, &layout, files) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: tensor-parallel rank {rank}: {e}");
            1
        }
    };
    std::process::exit(code)
}

/// A follower rank's life: take each broadcast message from rank 0 and do it, until told to
/// shut down. Fails (ending the process) on a communication error.
fn follow(
    model: &LlamaModel,
    pool: &ThreadPool,
    planner: &Planner,
    precision: Precision,
    mut comm: CommThread,
    layout: &TpLayout,
    files: &ModelFiles,
) -> Result<()> {
    let c = &files.config;
    let rank = comm.rank();
    // This rank's parts of the adapters rank 0 has used, by rank 0's id.
    let mut parts: HashMap<u64, Arc<LoraAdapter>> = HashMap::new();
    let kv_dim = layout.ranks[comm.rank()].kv_heads.len() * c.head_dim;
    // The few most recent KV storages rank 0 asked for, by tag.
    let mut kvs: Vec<KvStorage> = Vec::new();
    let mut ws = Workspace::new();
    loop {
        let mut msg = Vec::new();
        comm.wait_broadcast(0, &mut msg)
            .map_err(|e| Error::Other(format!("waiting for rank 0: {e}")))?;
        match decode(&msg)? {
            Message::Shutdown => return Ok(()),
            Message::NewKv {
                tag,
                block_size,
                num_blocks,
                dtype,
            } => {
                let mut kv =
                    KvStorage::with_dtype(c.n_layers, kv_dim, block_size, num_blocks, dtype)?;
                kv.tag = tag;
                kvs.push(kv);
                if kvs.len() > 4 {
                    kvs.remove(0);
                }
            }
            Message::Step {
                tag,
                adapters,
                dropped,
                mode,
                split,
                batch,
            } => {
                for id in dropped {
                    parts.remove(&id);
                }
                let mut table = Vec::with_capacity(adapters.len());
                for (id, path) in adapters {
                    let part = match parts.get(&id) {
                        Some(p) => p.clone(),
                        None => {
                            let p = LoraAdapter::load(&path, c)
                                .and_then(|a| shard_adapter(&a, c, layout, rank))
                                .map_err(|e| {
                                    Error::Other(format!(
                                        "loading adapter {} on this rank: {e}",
                                        path.display()
                                    ))
                                })?;
                            let p = Arc::new(p);
                            parts.insert(id, p.clone());
                            p
                        }
                    };
                    table.push(part);
                }
                let ctx = ExecCtx {
                    pool,
                    planner,
                    precision,
                    adapters: &table,
                };
                let Some(kv) = kvs.iter_mut().find(|k| k.tag == tag) else {
                    return Err(Error::Other(format!(
                        "rank 0 used unknown KV storage {tag}"
                    )));
                };
                let mut secs = 0.0;
                match rank_forward(
                    model, &ctx, &mut comm, &mut secs, &batch, kv, &mut ws, split, mode, layout,
                ) {
                    Ok(_) => {}
                    // The same on every rank, before any collective: rank 0 reports it.
                    Err(Error::Sequence { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
}
