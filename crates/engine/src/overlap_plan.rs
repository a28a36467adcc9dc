//! The per-step choice of sub-batching under tensor parallelism.
//!
//! At start-up every rank times the all-reduce on its link ([`tessera_parallel::link`]) and
//! rank 0 times its layer stages at a ladder of row counts ([`measure_profile`]). Together
//! they make a step-time model ([`tessera_sim::StepModel`]); before each step the engine asks
//! it for the predicted time of every candidate sub-batching of that step's shape and runs
//! the best, one sub-batch when overlapping does not pay. The choices are counted for
//! `/metrics` and the benchmarks.

use std::collections::BTreeMap;
use std::sync::Arc;

use tessera_core::Result;
use tessera_model::{BatchMeta, ExecCtx, LlamaModel, SplitBy, SubBatching};
use tessera_parallel::link::CommCost;
use tessera_sim::step::candidates;
use tessera_sim::{MeasuredProfile, StagePoint, StepEstimate, StepModel, StepShape};

/// How a forward cuts its rows into sub-batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SubBatchPolicy {
    /// Chosen per step by the step-time model under tensor parallelism; one sub-batch
    /// otherwise.
    #[default]
    Auto,
    /// Always this.
    Fixed(SubBatching),
}

impl From<SubBatching> for SubBatchPolicy {
    fn from(s: SubBatching) -> Self {
        SubBatchPolicy::Fixed(s)
    }
}

/// Repetitions of each size in the start-up link measurement.
const LINK_REPS: usize = 7;

/// The start-up link measurement through a rank's communication thread (a collective: every
/// rank calls it at the same point).
pub(crate) fn measure_link(
    comm: &mut tessera_parallel::overlap::CommThread,
) -> std::result::Result<Vec<(usize, f64)>, tessera_parallel::CommError> {
    tessera_parallel::link::measure(comm, &tessera_parallel::link::MEASURE_SIZES, LINK_REPS)
}

/// The link model of the start-up measurement, said on stderr.
pub(crate) fn link_model(points: &[(usize, f64)]) -> CommCost {
    let figures: Vec<String> = points
        .iter()
        .map(|&(b, t)| format!("{} KiB {:.0} µs", b >> 10, t * 1e6))
        .collect();
    let link = CommCost::from_points(points);
    eprintln!(
        "tensor parallelism: all-reduce measured at {} (about {:.0} µs + {:.2} GB/s)",
        figures.join(", "),
        link.latency_s * 1e6,
        link.gbytes_per_s()
    );
    link
}

/// Row counts the start-up profile times.
pub const PROFILE_ROWS: [usize; 6] = [1, 4, 16, 64, 256, 1024];
/// Logits-row counts the head is timed at.
const HEAD_ROWS: [usize; 4] = [1, 4, 16, 64];
/// Largest sub-batch count the planner considers.
pub const MAX_SUB_BATCHES: usize = 4;

/// Times rank 0's stages (this process's shard on its compute units): at each row count of
/// [`PROFILE_ROWS`], the stages on that many one-row sequences (the rows' cost with almost
/// no attention), and once, on one sequence of the largest count, what attention adds per
/// key attended; the head at a few logits-row counts.
pub fn measure_profile(model: &LlamaModel, ctx: &ExecCtx) -> Result<MeasuredProfile> {
    let reps = |rows: usize| if rows >= 256 { 2 } else { 5 };
    let mut points = Vec::new();
    for &rows in &PROFILE_ROWS {
        let t = model.time_stages(ctx, &vec![1; rows], reps(rows))?;
        points.push(StagePoint {
            rows: t.rows,
            attn_s: t.attn_s,
            mlp_s: t.mlp_s,
        });
    }
    // One sequence as long as the ladder's top (or the model's context, if shorter) against
    // the same rows as one-row sequences: what the keys attended add.
    let big = (*PROFILE_ROWS.last().expect("a ladder")).min(model.config.max_position);
    let attn_s_per_key = if big >= 2 {
        let one = model.time_stages(ctx, &[big], reps(big))?;
        let rows = model.time_stages(ctx, &vec![1; big], reps(big))?;
        let extra_keys = (big * (big + 1) / 2 - big) as f64;
        ((one.attn_s - rows.attn_s) / extra_keys).max(0.0)
    } else {
        0.0
    };
    let mut head = Vec::new();
    let mut embed = 0.0;
    for &r in &HEAD_ROWS {
        let (h, e) = model.time_head(ctx, r, 3)?;
        head.push((r, h));
        embed = e / r as f64;
    }
    Ok(MeasuredProfile {
        points,
        attn_s_per_key,
        head,
        embed_s_per_row: embed,
    })
}

/// The model, the choices made, and the last prediction.
pub struct OverlapPlanner {
    pub model: StepModel,
    choices: BTreeMap<(usize, bool), u64>,
    last: Option<(SubBatching, StepEstimate)>,
}

/// What `/metrics` and the benchmarks show of the planner.
#[derive(Debug, Clone, Default)]
pub struct OverlapStats {
    /// The measured all-reduce cost.
    pub link: Option<CommCost>,
    /// How many steps ran with each sub-batching (count, split).
    pub choices: Vec<(SubBatching, u64)>,
    /// The last step's choice and its predicted times.
    pub last: Option<(SubBatching, StepEstimate)>,
}

impl OverlapPlanner {
    pub fn new(model: StepModel) -> Self {
        OverlapPlanner {
            model,
            choices: BTreeMap::new(),
            last: None,
        }
    }

    /// The sub-batching of `batch` under `policy`, counted.
    pub fn choose(&mut self, batch: &BatchMeta, policy: SubBatchPolicy) -> SubBatching {
        let shape = StepShape::of_batch(batch);
        let (spec, est) = match policy {
            SubBatchPolicy::Fixed(s) => (s, self.model.predict(&shape, s)),
            SubBatchPolicy::Auto => self.model.choose(&shape, &candidates(MAX_SUB_BATCHES)),
        };
        *self
            .choices
            .entry((spec.count, spec.split == SplitBy::Tokens))
            .or_default() += 1;
        self.last = Some((spec, est));
        spec
    }

    pub fn stats(&self) -> OverlapStats {
        OverlapStats {
            link: Some(self.model.comm.clone()),
            choices: self
                .choices
                .iter()
                .map(|(&(count, tokens), &n)| {
                    let split = if tokens {
                        SplitBy::Tokens
                    } else {
                        SplitBy::Sequence
                    };
                    (SubBatching { count, split }, n)
                })
                .collect(),
            last: self.last,
        }
    }
}

/// The step-time model of `model` (rank 0's shard, whose config is the whole model's but for
/// split dimensions) over `ranks` ranks with `comm` per all-reduce, of which
/// `comm_cpu_share` is taken from the rank's compute core.
pub fn step_model(
    config: &tessera_formats::ModelConfig,
    ranks: usize,
    profile: MeasuredProfile,
    comm: CommCost,
    comm_cpu_share: f64,
) -> StepModel {
    StepModel {
        layers: config.n_layers,
        hidden: config.hidden_size,
        vocab: config.vocab_size,
        ranks,
        act_bytes: 4,
        compute: Arc::new(profile),
        comm,
        embed_reduced: ranks > 1,
        comm_cpu_share,
    }
}
