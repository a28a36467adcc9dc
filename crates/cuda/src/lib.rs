//! Tessera's step engine on one NVIDIA GPU: a [`tessera_engine::Device`] whose forward is the
//! exact path's, run by CUDA kernels on weights kept on the GPU in their stored formats.
//!
//! - [`ptx`]: the kernels (`kernels/*.cu`), compiled ahead to PTX for sm_90 by
//!   `scripts/cuda-ptx.sh` (NVRTC 12.9 from NVIDIA's pip wheel) and embedded, so a machine
//!   running Tessera needs only the driver, `libcuda.so.1`, which cudarc loads at run time
//!   (`dynamic-loading`): building needs no CUDA toolkit and links nothing.
//! - [`formats`]: the weight formats the kernels read as stored (F32, F16, BF16, Q8_0,
//!   Q4_0, Q4_1, Q4_K, Q5_K, Q6_K), each decoded in registers exactly as the CPU decodes it.
//! - [`support`]: the models the GPU forward runs (the Llama family so far), refused up front
//!   otherwise.
//! - [`meta`]: a step's batch packed for the kernels; [`forward`]: the step itself;
//!   [`device`]: the driver, the kernels and the weights.
//! - [`reference`]: the naive twin of every kernel, which the GPU tests hold them to.
//!
//! Status: builds and its host-side parts are tested on machines without a GPU; the kernels
//! and the forward have not yet run on a device. `scripts/device-cuda.sh` is the check that
//! does (parity with the CPU's exact path, decode speed); see `docs/cuda.md`.

pub mod device;
pub mod formats;
pub mod forward;
pub mod kernels;
pub mod meta;
pub mod ptx;
pub mod reference;
pub mod support;

pub use device::{driver_present, CudaDevice};
pub use forward::CudaKv;

/// What can go wrong on the GPU side.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error(
        "no CUDA driver: libcuda.so.1 could not be loaded (an NVIDIA driver is needed to run \
         --device cuda)"
    )]
    NoDriver,
    #[error("not supported on the GPU yet: {what}")]
    Unsupported { what: String },
    #[error("out of GPU memory: {what}")]
    Memory { what: String },
    #[error("CUDA driver error while {op}: {msg}")]
    Driver { op: &'static str, msg: String },
}

impl From<CudaError> for tessera_core::Error {
    fn from(e: CudaError) -> Self {
        tessera_core::Error::Other(e.to_string())
    }
}
