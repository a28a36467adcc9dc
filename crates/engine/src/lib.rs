//! Running a model: loading it with its tokenizer ([`Engine`]), sampling ([`sampling`]),
//! stop conditions ([`stop`]), single-request generation ([`generate`]), perplexity
//! ([`perplexity`]), and fetching the default model ([`store`]).

pub mod engine;
pub mod generate;
pub mod perplexity;
pub mod sampling;
pub mod stop;
pub mod store;
pub mod tune;
pub mod tuning;

pub use engine::Engine;
pub use generate::{FinishReason, GenerateRequest, GenerationStats};
pub use sampling::{Sampler, SamplingParams};

/// Name of the instruction set the kernels run on in this process.
pub fn isa_name() -> &'static str {
    tessera_kernels::Isa::active().name()
}
