//! Tensor parallelism in one process: R ranks, each a thread with its own compute units (a
//! disjoint set of the machine's CPUs), its own shard of every split weight and its own
//! heads' KV cache, joined by an in-process [`Communicator`].
//!
//! Rank 0 runs on the caller's thread (the step engine's); ranks 1.. are follower threads.
//! Each step the batch goes to every follower with its KV storage and workspace (moved in and
//! back, so the step engine still owns them); every rank runs the same staged forward with an
//! all-reduce after the embedding and after each stage of each sub-batch, then the ranks'
//! vocabulary slices of the logits are gathered. A rank that dies or stalls makes the others
//! fail within the communicator's timeout, with an error naming it; the group then refuses
//! further steps.

use std::sync::mpsc::{channel, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use tessera_core::{Error, Result};
use tessera_formats::{ModelConfig, ModelFiles};
use tessera_kernels::plan::Precision;
use tessera_kernels::planner::Planner;
use tessera_lora::LoraAdapter;
use tessera_model::{
    shard_files_noted, BatchMeta, ExecCtx, KvDtype, KvStorage, LlamaModel, Logits, SubBatching,
    TpLayout, Workspace,
};
use tessera_parallel::link::CommCost;
use tessera_parallel::local;
use tessera_parallel::overlap::CommThread;

use crate::overlap_plan::{self, OverlapPlanner, OverlapStats, SubBatchPolicy};
use crate::tp_adapters::AdapterParts;
#[cfg(feature = "fault-injection")]
pub use crate::tp_follower::RankFault;
use crate::tp_follower::{spawn_follower, Follower, Job, Order, Rank};
pub(crate) use crate::tp_rank::comm_err;
use crate::tp_rank::rank_forward;
pub use crate::tp_rank::StepMode;
use tessera_runtime::{allowed_cpus, pin_current_thread, ThreadPool};

pub struct TpGroup {
    layout: TpLayout,
    /// The whole model's configuration (adapters are sharded from it).
    config: ModelConfig,
    /// The local ranks' parts of the adapters in use.
    adapters: AdapterParts,
    /// The all-reduce cost measured at start-up.
    link: CommCost,
    /// Share of an all-reduce's time taken from the rank's compute core: 1 for in-process
    /// sums by communication threads that share the ranks' cores, else 0 (over MPI the time
    /// is mostly the wire's; not measured).
    comm_cpu_share: f64,
    /// The step-time model choosing each step's sub-batching (after [`TpGroup::calibrate`]).
    overlap: Option<OverlapPlanner>,
    /// Rank 0's communicator (its model, units and planner are the engine's).
    comm0: CommThread,
    /// Over MPI: followers are other processes, told each step's work by broadcast.
    #[cfg(feature = "mpi")]
    mpi: Option<crate::tp_mpi::MpiLink>,
    followers: Vec<Follower>,
    timeout: Duration,
    /// Why the group stopped, once a rank failed.
    broken: Option<String>,
    /// Seconds rank 0 spent in collectives since the last [`TpGroup::take_comm_secs`].
    comm_secs: f64,
    /// Rank 0's first CPU, and the thread pinned to it: the thread that runs rank 0's steps
    /// (the step engine's), pinned when it first does, so that loading pins nothing else.
    cpu0: Option<usize>,
    pinned: Option<std::thread::ThreadId>,
}

impl TpGroup {
    /// Splits `files` over `size` ranks sharing `threads` CPUs; collectives time out after
    /// `timeout`. Returns the group with rank 0's shard and compute units, which the caller
    /// (the engine) runs rank 0 with, on the calling thread (pinned to rank 0's first CPU).
    pub fn new(
        files: &ModelFiles,
        precision: Precision,
        planner: &Planner,
        size: usize,
        threads: usize,
        timeout: Duration,
    ) -> Result<(Self, LlamaModel, ThreadPool)> {
        let layout = TpLayout::for_files(files, size)?;
        let per_rank = (threads / size).max(1);
        let cpus = allowed_cpus().unwrap_or_default();
        let cpus_of = |r: usize| -> Vec<usize> {
            if cpus.len() >= size * per_rank {
                cpus[r * per_rank..(r + 1) * per_rank].to_vec()
            } else {
                Vec::new()
            }
        };
        // Each rank's communication thread wants a core of its own; say when it must share.
        let comm_shares_cores = cpus.len() < size * (per_rank + 1);
        if comm_shares_cores {
            eprintln!(
                "tensor parallelism: {size} ranks of {per_rank} compute unit(s) on {} CPUs; each \
                 rank's communication thread shares a core with compute",
                cpus.len()
            );
        }
        if cpus.len() < size * per_rank {
            tracing::warn!(
                "{size} ranks of {per_rank} units need {} CPUs, {} are available: ranks share CPUs",
                size * per_rank,
                cpus.len()
            );
        }
        let mut comms = local::group(size, timeout);
        let mut ranks = Vec::with_capacity(size);
        for (r, comm) in comms.drain(..).enumerate() {
            let (shard, notes) = shard_files_noted(files, &layout, r)?;
            if let (0, Some(line)) = (r, notes.line()) {
                eprintln!("{line}");
            }
            let rank_cpus = cpus_of(r);
            let pool = if rank_cpus.is_empty() {
                ThreadPool::new(per_rank)
            } else {
                ThreadPool::on_cpus(&rank_cpus)
            };
            ranks.push((
                Rank {
                    model: LlamaModel::new_shard(&shard, precision, layout.ranks[r].vocab.clone())?,
                    pool,
                    planner: Planner::new(planner.profile.clone(), planner.cache.clone()),
                    precision,
                    comm: CommThread::spawn(Box::new(comm), &format!("tessera-comm-{r}")).map_err(
                        |e| Error::Other(format!("starting a communication thread: {e}")),
                    )?,
                },
                rank_cpus,
            ));
        }
        let mut ranks = ranks.into_iter();
        let (rank0, cpus0) = ranks.next().expect("size >= 1");
        let Rank {
            model: model0,
            pool: pool0,
            comm: comm0,
            ..
        } = rank0;
        let mut followers = Vec::new();
        for (i, (rank, rank_cpus)) in ranks.enumerate() {
            followers.push(spawn_follower(i + 1, rank, rank_cpus, layout.clone())?);
        }
        // Rank 0 measures from a thread pinned where its steps will run, as the followers do.
        let mut comm0 = comm0;
        let cpu = cpus0.first().copied();
        let points = std::thread::scope(|s| {
            s.spawn(|| {
                if let Some(c) = cpu {
                    pin_current_thread(c);
                }
                overlap_plan::measure_link(&mut comm0)
            })
            .join()
        })
        .map_err(|_| Error::Other("the link measurement panicked".into()))?
        .map_err(comm_err)?;
        Ok((
            TpGroup {
                link: overlap_plan::link_model(&points),
                config: files.config.clone(),
                adapters: AdapterParts::default(),
                comm_cpu_share: if comm_shares_cores { 1.0 } else { 0.0 },
                overlap: None,
                layout,
                comm0,
                #[cfg(feature = "mpi")]
                mpi: None,
                followers,
                timeout,
                broken: None,
                comm_secs: 0.0,
                cpu0: cpus0.first().copied(),
                pinned: None,
            },
            model0,
            pool0,
        ))
    }

    pub fn size(&self) -> usize {
        self.layout.size()
    }

    /// Ranks in this process (all of them with the local backend, rank 0 alone over MPI).
    pub fn local_ranks(&self) -> usize {
        self.followers.len() + 1
    }

    /// A group whose ranks 1.. are other processes of an MPI job, rank 0 being this one.
    #[cfg(feature = "mpi")]
    pub(crate) fn over_mpi(
        layout: TpLayout,
        config: ModelConfig,
        comm0: tessera_parallel::mpi::MpiComm,
        timeout: Duration,
        cpu0: Option<usize>,
    ) -> Result<Self> {
        let mut comm0 = CommThread::spawn(Box::new(comm0), "tessera-comm-0")
            .map_err(|e| Error::Other(format!("starting the communication thread: {e}")))?;
        let points = overlap_plan::measure_link(&mut comm0).map_err(comm_err)?;
        Ok(TpGroup {
            link: overlap_plan::link_model(&points),
            config,
            adapters: AdapterParts::default(),
            comm_cpu_share: 0.0,
            overlap: None,
            cpu0,
            pinned: None,
            layout,
            comm0,
            mpi: Some(crate::tp_mpi::MpiLink::default()),
            followers: Vec::new(),
            timeout,
            broken: None,
            comm_secs: 0.0,
        })
    }

    pub fn layout(&self) -> &TpLayout {
        &self.layout
    }
    /// Floats per position and layer of the KV storage of each rank held in this process
    /// (every rank locally; rank 0's only over MPI).
    pub fn local_kv_dims(&self, head_dim: usize) -> Vec<usize> {
        #[cfg(feature = "mpi")]
        if self.mpi.is_some() {
            return vec![self.layout.ranks[0].kv_heads.len() * head_dim];
        }
        self.layout
            .ranks
            .iter()
            .map(|r| r.kv_heads.len() * head_dim)
            .collect()
    }

    /// One KV storage of `dtype` per rank (all ranks the same dtype), each for that rank's
    /// KV heads, for a model of `c`.
    pub fn new_kv(
        &mut self,
        c: &tessera_formats::ModelConfig,
        block_size: usize,
        num_blocks: usize,
        dtype: KvDtype,
    ) -> Result<Vec<KvStorage>> {
        #[cfg(feature = "mpi")]
        if let Some(link) = &mut self.mpi {
            // Rank 0 keeps its shard; the followers allocate theirs under the same tag.
            let mut kv = KvStorage::with_dtype(
                c.n_layers,
                self.layout.ranks[0].kv_heads.len() * c.head_dim,
                block_size,
                num_blocks,
                dtype,
            )?;
            kv.tag = link
                .send_new_kv(&mut self.comm0, block_size, num_blocks, dtype)
                .map_err(comm_err)?;
            return Ok(vec![kv]);
        }
        self.layout
            .ranks
            .iter()
            .map(|r| {
                KvStorage::with_dtype(
                    c.n_layers,
                    r.kv_heads.len() * c.head_dim,
                    block_size,
                    num_blocks,
                    dtype,
                )
            })
            .collect()
    }

    /// The local ranks' parts of `adapter`, made without the group (off the step thread)
    /// and kept with [`TpGroup::keep_adapter_parts`].
    pub fn adapter_parts_maker(
        &self,
    ) -> impl FnOnce(&LoraAdapter) -> Result<Vec<Arc<LoraAdapter>>> + Send + 'static {
        let (config, layout, local) =
            (self.config.clone(), self.layout.clone(), self.local_ranks());
        move |a| crate::tp_adapters::make_parts(a, &config, &layout, local)
    }

    /// Keeps the parts of `adapter` made by [`TpGroup::adapter_parts_maker`].
    pub fn keep_adapter_parts(&mut self, adapter: &Arc<LoraAdapter>, parts: Vec<Arc<LoraAdapter>>) {
        self.adapters.insert(adapter, parts);
    }

    /// Adapters whose per-rank parts this process holds.
    pub fn adapters_held(&self) -> usize {
        self.adapters.len()
    }

    /// One step over every rank, rank 0 being `model0` on `ctx0`; `kv` and `ws` hold one
    /// entry per rank; the batch's adapter slots index `adapters` (whole adapters: each rank
    /// runs its part).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &mut self,
        model0: &LlamaModel,
        ctx0: &ExecCtx,
        batch: &BatchMeta,
        adapters: &[Arc<LoraAdapter>],
        kv: &mut [KvStorage],
        ws: &mut [Workspace],
        split: SubBatching,
        mode: StepMode,
    ) -> Result<Logits> {
        if let Some(why) = &self.broken {
            return Err(Error::Other(format!(
                "tensor parallelism has stopped: {why}"
            )));
        }
        if let Some(c) = self.cpu0 {
            let me = std::thread::current().id();
            if self.pinned != Some(me) {
                pin_current_thread(c);
                self.pinned = Some(me);
            }
        }
        let n = self.followers.len() + 1;
        if kv.len() != n || ws.len() != n {
            return Err(Error::Other(format!(
                "{n} ranks need {n} KV storages and workspaces, got {} and {}",
                kv.len(),
                ws.len()
            )));
        }
        let dropped = self.adapters.prune();
        #[cfg(not(feature = "mpi"))]
        let _ = &dropped;
        let local = self.local_ranks();
        let mut tables = self
            .adapters
            .tables(adapters, &self.config, &self.layout, local)?
            .into_iter();
        let table0 = tables.next().unwrap_or_default();
        let batch = Arc::new(batch.clone());
        for ((i, f), table) in self.followers.iter().enumerate().zip(tables) {
            let job = Job {
                batch: batch.clone(),
                adapters: table,
                kv: std::mem::take(&mut kv[i + 1]),
                ws: std::mem::take(&mut ws[i + 1]),
                split,
                mode,
            };
            if f.jobs.send(Order::Step(job)).is_err() {
                return Err(self.fail(format!("rank {} has stopped", i + 1)));
            }
        }
        #[cfg(feature = "mpi")]
        if let Some(link) = &mut self.mpi {
            if let Err(e) = link.send_step(
                &mut self.comm0,
                &batch,
                &kv[0],
                split,
                mode,
                adapters,
                &dropped,
            ) {
                return Err(self.fail(e.to_string()));
            }
        }
        let ctx0 = ExecCtx {
            adapters: &table0,
            ..*ctx0
        };
        let mut secs = 0.0;
        let mine = rank_forward(
            model0,
            &ctx0,
            &mut self.comm0,
            &mut secs,
            &batch,
            &mut kv[0],
            &mut ws[0],
            split,
            mode,
            &self.layout,
        );
        self.comm_secs += secs;
        let mut first_err: Option<String> = None;
        for (i, f) in self.followers.iter().enumerate() {
            // Bounded: a follower's collectives time out too, so it answers within about
            // twice the timeout unless its thread is gone.
            match f
                .done
                .recv_timeout(self.timeout * 2 + Duration::from_secs(1))
            {
                Ok(d) => {
                    kv[i + 1] = d.kv;
                    ws[i + 1] = d.ws;
                    if let (Err(e), None) = (d.result, &first_err) {
                        first_err = Some(format!("rank {}: {e}", i + 1));
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    let why = format!("rank {} did not finish the step in time", i + 1);
                    return Err(self.fail(why));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let why = format!("rank {} has died", i + 1);
                    return Err(self.fail(why));
                }
            }
        }
        // A communication failure breaks the group; anything else (a sequence that does not
        // validate, the same on every rank) is the step's.
        let comm_failure = |e: &str| e.contains("tensor parallelism:");
        match (mine, first_err) {
            (Ok(l), None) => Ok(l),
            (Err(e), _) if comm_failure(&e.to_string()) => Err(self.fail(e.to_string())),
            (_, Some(e)) if comm_failure(&e) => Err(self.fail(e)),
            (Err(e), _) => Err(e),
            (Ok(_), Some(e)) => Err(Error::Other(e)),
        }
    }

    /// Times rank 0's stages (`model0` on `ctx0`) and builds the step-time model that
    /// chooses each step's sub-batching from them and the measured link.
    pub fn calibrate(
        &mut self,
        config: &tessera_formats::ModelConfig,
        model0: &LlamaModel,
        ctx0: &ExecCtx,
    ) -> Result<()> {
        let profile = overlap_plan::measure_profile(model0, ctx0)?;
        let model = overlap_plan::step_model(
            config,
            self.size(),
            profile,
            self.link.clone(),
            self.comm_cpu_share,
        );
        self.overlap = Some(OverlapPlanner::new(model));
        Ok(())
    }

    /// The sub-batching of `batch` under `policy` (the step-time model's choice for
    /// [`SubBatchPolicy::Auto`]).
    pub fn choose(&mut self, batch: &BatchMeta, policy: SubBatchPolicy) -> SubBatching {
        match (&mut self.overlap, policy) {
            (Some(p), _) => p.choose(batch, policy),
            (None, SubBatchPolicy::Fixed(s)) => s,
            (None, SubBatchPolicy::Auto) => SubBatching::WHOLE,
        }
    }

    /// The measured link, the step-time model and the choices made so far.
    pub fn overlap_stats(&self) -> OverlapStats {
        self.overlap.as_ref().map_or_else(
            || OverlapStats {
                link: Some(self.link.clone()),
                ..OverlapStats::default()
            },
            OverlapPlanner::stats,
        )
    }

    /// The step-time model, once calibrated.
    pub fn step_model(&self) -> Option<&tessera_sim::StepModel> {
        self.overlap.as_ref().map(|p| &p.model)
    }

    /// Why the group stopped, if a rank failed.
    pub fn failure(&self) -> Option<&str> {
        self.broken.as_deref()
    }

    /// Seconds rank 0 spent in collectives (waiting included) since the last call.
    pub fn take_comm_secs(&mut self) -> f64 {
        std::mem::take(&mut self.comm_secs)
    }

    /// Test-only: makes follower `rank` (1..) stall or die.
    #[cfg(feature = "fault-injection")]
    pub fn inject(&self, rank: usize, fault: RankFault) -> bool {
        rank >= 1
            && self
                .followers
                .get(rank - 1)
                .is_some_and(|f| f.jobs.send(Order::Fault(fault)).is_ok())
    }

    fn fail(&mut self, why: String) -> Error {
        tracing::error!("tensor parallelism stopped: {why}");
        self.broken = Some(why.clone());
        Error::Other(format!("tensor parallelism: {why}"))
    }
}

impl Drop for TpGroup {
    fn drop(&mut self) {
        #[cfg(feature = "mpi")]
        if let Some(link) = &mut self.mpi {
            link.send_shutdown(&mut self.comm0);
        }
        for f in &mut self.followers {
            // Closing the job channel ends the follower's loop.
            let (tx, _) = channel();
            drop(std::mem::replace(&mut f.jobs, tx));
            if let Some(h) = f.handle.take() {
                let _ = h.join();
            }
        }
    }
}
