//! Compute kernels over weights in their stored formats.
//!
//! - [`isa`]: which instruction set the kernels use, detected once at run time.
//! - [`generic`]: portable kernels, always complete; the reference for the SIMD ones.
//! - `x86::avx2`: AVX2+FMA kernels with the same arithmetic (same summation order).
//! - [`matmul`]: `y = x · Wᵀ` for f32 activations and any stored weight format, parallel
//!   over the compute units.
//! - [`ops`]: RMSNorm, SwiGLU, softmax and friends.
//!
//! Numerics contract of the exact path: a weight is dequantized to the f32 value the
//! reference (`tessera_core::blocks`) defines, and each output element is a dot product whose
//! summation order depends only on K (8 lanes, a fixed lane tree, then the tail), never on M,
//! N, the thread count or the other rows. That makes every row's result batch-invariant.

pub mod generic;
pub mod isa;
pub mod matmul;
pub mod ops;
#[cfg(target_arch = "x86_64")]
pub mod x86;

pub use isa::Isa;
pub use matmul::matmul;
