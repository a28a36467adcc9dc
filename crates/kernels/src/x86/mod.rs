//! x86-64 kernels. Each function here is `unsafe` because it requires the CPU features named
//! in its `#[target_feature]`; callers check [`crate::Isa::active`] first.

pub mod avx2;
pub mod avx2_attn;
pub mod avx2_exact;
pub mod avx2_outer;
pub mod avx2_packed;
pub mod avx2_q8;
pub mod avx2_records;
mod avx512_decode;
pub mod avx512_exact;
pub mod avx512_outer;
pub mod avx512_packed;
pub mod ggml_decode;
pub mod lora_avx2;
mod pipe_probe;
