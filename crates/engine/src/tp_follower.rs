//! A follower rank of the in-process tensor-parallel group: its means ([`Rank`]), the
//! orders rank 0 sends it ([`Order`], [`Job`]) and what it sends back ([`Done`]), and its
//! thread ([`spawn_follower`]).

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
#[cfg(feature = "fault-injection")]
use std::time::Duration;

use tessera_core::{Error, Result};
use tessera_kernels::plan::Precision;
use tessera_kernels::planner::Planner;
use tessera_lora::LoraAdapter;
use tessera_model::{
    BatchMeta, ExecCtx, KvStorage, LlamaModel, Logits, SubBatching, TpLayout, Workspace,
};
use tessera_parallel::overlap::CommThread;
use tessera_runtime::{pin_current_thread, ThreadPool};

use crate::overlap_plan;
use crate::tp_rank::{rank_forward, StepMode};

/// One rank's means: its shard, compute units, planner and communicator.
pub(crate) struct Rank {
    pub(crate) model: LlamaModel,
    pub(crate) pool: ThreadPool,
    pub(crate) planner: Planner,
    pub(crate) precision: Precision,
    pub(crate) comm: CommThread,
}

/// What a follower is told to do.
#[allow(clippy::large_enum_variant)] // one order at a time goes through a channel
pub(crate) enum Order {
    Step(Job),
    /// Test-only: stop answering for a while, or die.
    #[cfg(feature = "fault-injection")]
    Fault(RankFault),
}

/// A test-only fault of a follower rank (cargo feature `fault-injection`).
#[cfg(feature = "fault-injection")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankFault {
    /// The rank sleeps this long before its next step.
    Stall(Duration),
    /// The rank's thread panics.
    Die,
    /// The rank's thread panics in its next step, when it starts its all-reduce number
    /// n + 1 (in the middle of the pipeline).
    DieAfter(usize),
}

pub(crate) struct Job {
    pub(crate) batch: Arc<BatchMeta>,
    /// The step's adapter table, this rank's parts.
    pub(crate) adapters: Vec<Arc<LoraAdapter>>,
    pub(crate) kv: KvStorage,
    pub(crate) ws: Workspace,
    pub(crate) split: SubBatching,
    pub(crate) mode: StepMode,
}

pub(crate) struct Done {
    pub(crate) kv: KvStorage,
    pub(crate) ws: Workspace,
    pub(crate) result: Result<()>,
}

pub(crate) struct Follower {
    pub(crate) jobs: Sender<Order>,
    pub(crate) done: Receiver<Done>,
    pub(crate) handle: Option<JoinHandle<()>>,
}

impl Rank {
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &mut self,
        batch: &BatchMeta,
        adapters: &[Arc<LoraAdapter>],
        kv: &mut KvStorage,
        ws: &mut Workspace,
        split: SubBatching,
        mode: StepMode,
        layout: &TpLayout,
    ) -> Result<Logits> {
        let ctx = ExecCtx {
            pool: &self.pool,
            planner: &self.planner,
            precision: self.precision,
            adapters,
        };
        let mut secs = 0.0;
        rank_forward(
            &self.model,
            &ctx,
            &mut self.comm,
            &mut secs,
            batch,
            kv,
            ws,
            split,
            mode,
            layout,
        )
    }
}

/// Starts follower rank `index` on its own thread (pinned to the first of `rank_cpus`):
/// it makes the start-up link measurement with the others, then runs each step it is sent
/// until its order channel closes.
pub(crate) fn spawn_follower(
    index: usize,
    mut rank: Rank,
    rank_cpus: Vec<usize>,
    layout: TpLayout,
) -> Result<Follower> {
    let (jobs, job_rx) = channel::<Order>();
    let (done_tx, done) = channel::<Done>();
    let layout = layout.clone();
    let handle = std::thread::Builder::new()
        .name(format!("tessera-rank-{index}"))
        .spawn(move || {
            if let Some(&c) = rank_cpus.first() {
                pin_current_thread(c);
            }
            // The start-up link measurement, a collective rank 0 makes too.
            if overlap_plan::measure_link(&mut rank.comm).is_err() {
                return;
            }
            while let Ok(order) = job_rx.recv() {
                // Without fault injection `Order` has one variant.
                #[allow(clippy::infallible_destructuring_match)]
                let mut job = match order {
                    Order::Step(job) => job,
                    #[cfg(feature = "fault-injection")]
                    Order::Fault(RankFault::Stall(d)) => {
                        std::thread::sleep(d);
                        continue;
                    }
                    #[cfg(feature = "fault-injection")]
                    Order::Fault(RankFault::Die) => panic!("injected death of a rank"),
                    #[cfg(feature = "fault-injection")]
                    Order::Fault(RankFault::DieAfter(n)) => {
                        crate::tp_rank::die_after(n);
                        continue;
                    }
                };
                let result = rank
                    .forward(
                        &job.batch,
                        &job.adapters,
                        &mut job.kv,
                        &mut job.ws,
                        job.split,
                        job.mode,
                        &layout,
                    )
                    .map(|_| ());
                if done_tx
                    .send(Done {
                        kv: job.kv,
                        ws: job.ws,
                        result,
                    })
                    .is_err()
                {
                    return;
                }
            }
        })
        .map_err(|e| Error::Other(format!("starting a rank thread: {e}")))?;
    Ok(Follower {
        jobs,
        done,
        handle: Some(handle),
    })
}
