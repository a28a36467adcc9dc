//! A step-time model of tensor-parallel steps pipelined over sub-batches.
//!
//! A step's time is predicted from three plain inputs: what each layer stage costs on one
//! rank for a given number of rows ([`compute`]: measured on this machine, or a roofline from
//! a device's peak FLOP/s and bandwidth), what one all-reduce costs on the link
//! ([`tessera_parallel::link::CommCost`]: measured at start-up, or a [`links`] preset), and
//! the order in which the pipelined forward runs stages and reductions ([`pipeline`]: the
//! same schedule as `LlamaModel::forward_pipelined`, simulated event by event). [`step`] puts
//! them together for a step's shape and chooses the sub-batching; [`shape`] holds model
//! shapes (presets, Hugging Face `config.json`).
//!
//! The engine uses it to choose each step's sub-batching; `tessera simulate` uses it for
//! models and clusters this machine cannot run.

pub mod compute;
pub mod links;
pub mod pipeline;
pub mod plot;
pub mod report;
pub mod shape;
pub mod step;

pub use compute::{MeasuredProfile, Roofline, StageCost, StagePoint};
pub use pipeline::{StepEstimate, SubCost};
pub use shape::ModelShape;
pub use step::{StepModel, StepShape};
pub use tessera_parallel::link::CommCost;
