//! Benchmarks behind `tessera bench`.
//!
//! - `gemm`: sweeps the matrix products of SmolLM2-135M and of one Llama-7B layer over a
//!   range of M and compares, per shape, the planner's choice with the best of its top
//!   candidates (the oracle), with the single best fixed strategy, and with OpenBLAS sgemm
//!   (f32, loaded at run time when installed), against the machine's measured peak FMA
//!   throughput and DRAM bandwidth.
//! - `kernels`: every kernel variant on this CPU beside its portable twin, and whether the
//!   variant the CPU class chose (`tessera_kernels::variants`) is the fastest.
//! - `model`: llama-bench-style prompt processing and generation throughput of a model.
//! - `serve`: a load generator for OpenAI-compatible servers (TTFT, TPOT, throughput,
//!   goodput), with concurrency sweeps and requests spread over LoRA adapters
//!   (`--adapters`, figures per adapter).
//! - `make-adapters`: seeded random PEFT LoRA folders that fit a base model.
//! - `plot-lora`: the summary and chart of a multi-LoRA serving benchmark
//!   (scripts/bench-lora.sh).
//!
//! [`cli`] holds the argument definitions and the entry point; the pure helpers (medians,
//! geometric means, the best-fixed-strategy choice) live in [`stats`].

pub mod cli;
pub mod gemm;
pub mod kernels;
pub mod lora_report;
pub mod make_adapters;
pub mod model;
pub mod openblas;
pub mod plot;
pub mod serve;
pub mod serve_args;
pub mod serve_plot;
pub mod spec;
pub mod stats;
pub mod tp;
