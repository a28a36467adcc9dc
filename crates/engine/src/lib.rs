//! Running a model: loading it with its tokenizer ([`Engine`]), the step engine every front end
//! drives ([`step`]) on a [`device`] (the CPU, or a GPU crate's) with its per-request pipeline ([`live`]: sampling, stop strings,
//! streaming detokenization), the accepted range of every generation parameter ([`params`]),
//! single-request generation ([`generate`]), perplexity ([`perplexity`]), fetching the default
//! model ([`store`]), start-up resource checks ([`resources`]: threads, KV memory, context),
//! the per-step choice of sub-batching under tensor parallelism ([`overlap_plan`]), the
//! scheduler's step-cost predictor calibrated from the model ([`step_cost`]) and refitted to
//! measured steps ([`step_fit`]), and tuning
//! ([`tune`], timing small M on weights from DRAM as a step reads them: [`cold_weights`]).

pub mod cold_weights;
pub mod constrain;
pub mod device;
pub mod draft;
pub mod engine;
mod engine_kv;
pub mod generate;
mod live;
pub mod overlap_plan;
pub mod params;
pub mod perplexity;
pub mod request;
pub mod resources;
pub mod sampling;
pub mod spec;
mod speculate;
pub mod step;
pub mod step_cost;
pub mod step_fit;
pub mod stop;
pub mod store;
pub mod tp;
mod tp_adapters;
mod tp_follower;
#[cfg(feature = "mpi")]
mod tp_mpi;
mod tp_rank;
pub mod tune;
pub mod tuning;
mod window;

pub use device::{Device, DeviceKind, StepKv};
pub use engine::{AdapterPreparer, Engine, TpBackend};
pub use generate::GenerationStats;
pub use live::token_logprob;
pub use overlap_plan::{OverlapStats, SubBatchPolicy};
pub use params::ParamError;
pub use request::{FinishReason, GenerateRequest, RequestEvent, SubmitError, TokenLogprob};
pub use sampling::{Sampler, SamplingParams};
pub use step::{StepEngine, StepOutcome};
pub use tessera_model::{KvDtype, SplitBy, SubBatching};
pub use tp::StepMode;

/// KV positions per block, everywhere: the step engines, one-off forwards and `serve`.
pub const KV_BLOCK_SIZE: usize = 16;

/// Name of the instruction set the kernels run on in this process.
pub fn isa_name() -> &'static str {
    tessera_kernels::Isa::active().name()
}

/// The start-up line on kernel variants: which this CPU class runs and which it refused,
/// with their measured speed against their portable twins (`tessera_kernels::variants`;
/// measured on first use and cached per CPU class).
pub fn kernel_variants_line() -> String {
    tessera_kernels::variants::selection().summary()
}
