//! `--device`: which [`tessera_engine::Device`] the step engines run on. The CPU always;
//! CUDA only in a build with the `cuda` feature (`tessera-cuda`, loading the driver at run
//! time), one GPU, the exact path, no adapters or speculative decoding yet.

use std::sync::Arc;

use anyhow::{bail, Result};
use tessera_engine::{Device, DeviceKind};
use tessera_formats::ModelFiles;
use tessera_kernels::plan::Precision;

/// Refuses what `kind` cannot run (before anything is loaded): a device this build lacks,
/// and settings the device does not support yet.
pub(crate) fn check(kind: DeviceKind, tp: usize, loras: usize, speculative: bool) -> Result<()> {
    if kind == DeviceKind::Cuda && !cfg!(feature = "cuda") {
        bail!(
            "--device cuda: this build has no CUDA backend; build it with \
             `cargo build --release --features cuda` (needs no CUDA toolkit, only an NVIDIA \
             driver at run time)"
        );
    }
    tessera_engine::device::check_device_settings(kind, tp, loras, speculative)
        .map_err(anyhow::Error::msg)
}

/// The device for `kind` over `files` (`None`: the CPU, the engine's default).
pub(crate) fn make(
    kind: DeviceKind,
    files: &ModelFiles,
    precision: Precision,
) -> Result<Option<Arc<dyn Device>>> {
    match kind {
        DeviceKind::Cpu => Ok(None),
        DeviceKind::Cuda => {
            if precision != Precision::Exact {
                bail!("--device cuda runs the exact path only: drop --precision {precision}");
            }
            cuda(files)
        }
    }
}

#[cfg(feature = "cuda")]
fn cuda(files: &ModelFiles) -> Result<Option<Arc<dyn Device>>> {
    let d =
        tessera_cuda::CudaDevice::new(files).map_err(|e| anyhow::anyhow!("--device cuda: {e}"))?;
    eprintln!("{}", d.summary());
    Ok(Some(Arc::new(d)))
}

#[cfg(not(feature = "cuda"))]
fn cuda(_: &ModelFiles) -> Result<Option<Arc<dyn Device>>> {
    Err(check(DeviceKind::Cuda, 1, 0, false)
        .err()
        .unwrap_or_else(|| anyhow::anyhow!("--device cuda: no CUDA backend in this build")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_name_the_flag_and_the_way_out() {
        assert!(check(DeviceKind::Cpu, 4, 1, true).is_ok());
        let e = check(DeviceKind::Cuda, 2, 0, false)
            .unwrap_err()
            .to_string();
        if cfg!(feature = "cuda") {
            assert!(e.contains("--tp 2"), "{e}");
        } else {
            assert!(e.contains("--features cuda"), "{e}");
        }
    }
}
