//! The device boundary at the step: where a step engine's KV storage lives and what runs
//! its forward.
//!
//! A step engine ([`crate::StepEngine`]) asks the engine's [`Device`] once for its
//! [`StepKv`] (the paged KV storage and the activation buffers of its forwards), then each
//! step hands that state the step's [`BatchMeta`] and adapter table and gets the requested
//! logits back on the host. The scheduler, the KV bookkeeping (block tables, prefix cache),
//! sampling and the server are the same whatever the device: only tensors cross the
//! boundary, never scheduling state.
//!
//! [`Cpu`] is today's forward (one rank, or a tensor-parallel group of ranks) on the
//! engine's thread pool, bitwise unchanged. Other devices (the `tessera-cuda` crate, behind
//! the CLI's `cuda` feature) implement the same two traits outside this crate and are
//! installed with [`crate::Engine::set_device`].
//!
//! Invariants every implementation keeps: a forward either fails before changing any KV
//! position it was not asked to write, or writes exactly the batch's new positions; logits
//! rows come back in batch order ([`LogitsView`]'s `rows`); a sequence's error is
//! `Error::Sequence` so the step engine fails that request alone.

use std::sync::Arc;

use tessera_core::Result;
use tessera_lora::LoraAdapter;
use tessera_model::{BatchMeta, KvStorage, Workspace};

use crate::engine::ForwardLogits;
use crate::Engine;

/// What runs a model's forward, and holds its KV storage. Implementations are shared
/// between threads (a server's step thread and its HTTP handlers hold the engine).
pub trait Device: Send + Sync {
    /// A short name for logs and errors (`cpu`, `cuda:0 NVIDIA H100 80GB HBM3`).
    fn name(&self) -> String;

    /// Which kind of device this is.
    fn kind(&self) -> DeviceKind;

    /// The KV storage of `num_blocks` blocks of `block_size` positions for one step engine
    /// over `engine`'s model, and the buffers its forwards use. `window_blocks`: keep the
    /// model's sliding-window layers apart in that many blocks (a window group; a device
    /// that has none says so with an error).
    fn new_kv<'e>(
        &'e self,
        engine: &'e Engine,
        block_size: usize,
        num_blocks: usize,
        window_blocks: Option<usize>,
    ) -> Result<Box<dyn StepKv + 'e>>;
}

/// One step engine's state on a device: its KV storage and activation buffers.
pub trait StepKv: Send {
    /// Bytes of the KV storage (every rank's).
    fn bytes(&self) -> usize;

    /// One forward over `batch`: stores the new tokens' K/V and returns the logits the
    /// batch asked for, on the host, valid until the next forward. `adapters`: the step's
    /// adapter table, which the chunks' adapter slots index.
    fn forward(
        &mut self,
        batch: &BatchMeta,
        adapters: &[Arc<LoraAdapter>],
    ) -> Result<ForwardLogits<'_>>;
}

/// The CPU: the engine's own model on its thread pool (every rank under tensor
/// parallelism). The default device.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu;

impl Device for Cpu {
    fn name(&self) -> String {
        "cpu".into()
    }

    fn kind(&self) -> DeviceKind {
        DeviceKind::Cpu
    }

    fn new_kv<'e>(
        &'e self,
        engine: &'e Engine,
        block_size: usize,
        num_blocks: usize,
        window_blocks: Option<usize>,
    ) -> Result<Box<dyn StepKv + 'e>> {
        let kv = match window_blocks {
            Some(w) => engine.new_kv_windowed(block_size, num_blocks, w)?,
            None => engine.new_kv(block_size, num_blocks)?,
        };
        let ws = (0..kv.len()).map(|_| Workspace::new()).collect();
        Ok(Box::new(CpuKv { engine, kv, ws }))
    }
}

/// [`Cpu`]'s step state: one KV storage and one workspace per rank.
pub struct CpuKv<'e> {
    engine: &'e Engine,
    kv: Vec<KvStorage>,
    ws: Vec<Workspace>,
}

impl StepKv for CpuKv<'_> {
    fn bytes(&self) -> usize {
        self.kv.iter().map(KvStorage::bytes).sum()
    }

    fn forward(
        &mut self,
        batch: &BatchMeta,
        adapters: &[Arc<LoraAdapter>],
    ) -> Result<ForwardLogits<'_>> {
        self.engine
            .forward_ranks(batch, &mut self.kv, &mut self.ws, adapters)
    }
}

/// Which device a front end asked for (`--device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceKind {
    #[default]
    Cpu,
    Cuda,
}

impl std::str::FromStr for DeviceKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "cpu" => Ok(DeviceKind::Cpu),
            "cuda" => Ok(DeviceKind::Cuda),
            _ => Err(format!("unknown device {s:?} (expected cpu or cuda)")),
        }
    }
}

impl std::fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
        })
    }
}

/// Why `kind` cannot run with these settings, if it cannot: the first GPU milestone runs
/// one rank, without adapters or speculative decoding.
pub fn check_device_settings(
    kind: DeviceKind,
    tp: usize,
    loras: usize,
    speculative: bool,
) -> std::result::Result<(), String> {
    if kind == DeviceKind::Cpu {
        return Ok(());
    }
    if tp > 1 {
        return Err(format!(
            "--device {kind} runs on one GPU: --tp {tp} is not supported on it yet \
             (drop --tp, or use --device cpu)"
        ));
    }
    if loras > 0 {
        return Err(format!(
            "--device {kind} does not run LoRA adapters yet (drop --lora, or use --device cpu)"
        ));
    }
    if speculative {
        return Err(format!(
            "--device {kind} does not run speculative decoding yet (drop the speculative \
             options, or use --device cpu)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_parse_and_refusals_are_clear() {
        assert_eq!("cpu".parse::<DeviceKind>(), Ok(DeviceKind::Cpu));
        assert_eq!("cuda".parse::<DeviceKind>(), Ok(DeviceKind::Cuda));
        assert!("gpu"
            .parse::<DeviceKind>()
            .unwrap_err()
            .contains("cpu or cuda"));
        assert_eq!(check_device_settings(DeviceKind::Cpu, 4, 2, true), Ok(()));
        assert_eq!(check_device_settings(DeviceKind::Cuda, 1, 0, false), Ok(()));
        let e = check_device_settings(DeviceKind::Cuda, 2, 0, false).unwrap_err();
        assert!(e.contains("--tp 2") && e.contains("--device cpu"), "{e}");
        let e = check_device_settings(DeviceKind::Cuda, 1, 1, false).unwrap_err();
        assert!(e.contains("LoRA"), "{e}");
        let e = check_device_settings(DeviceKind::Cuda, 1, 0, true).unwrap_err();
        assert!(e.contains("speculative"), "{e}");
    }
}
