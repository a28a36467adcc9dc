//! The GPU as a [`Device`]: the driver opened at run time, the embedded PTX loaded, and the
//! model's weights uploaded once in their stored formats.
//!
//! Not yet run on a device: everything here builds and its host-side parts are tested
//! without a GPU, but no kernel launch has been checked on real hardware (the device script,
//! `scripts/device-cuda.sh`, is what checks it).

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DriverError};
use tessera_core::WeightTensor;
use tessera_engine::{Device, DeviceKind, Engine, KvDtype, StepKv};
use tessera_formats::{ModelConfig, ModelFiles, RopeStyle};
use tessera_model::rope::Rope;

use crate::formats::Format;
use crate::forward::CudaKv;
use crate::{ptx, support, CudaError};

/// A driver error in `op`, as a [`CudaError`].
pub(crate) fn drv(op: &'static str) -> impl Fn(DriverError) -> CudaError {
    move |e| CudaError::Driver {
        op,
        msg: format!("{e:?}"),
    }
}

/// The device address of `s` (event tracking is off: one stream orders everything).
pub(crate) fn addr<T>(s: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    s.device_ptr(stream).0
}

/// A matrix in its stored format, with its optional f32 bias.
pub(crate) struct Matrix {
    pub buf: CudaSlice<u8>,
    pub fmt: &'static Format,
    pub rows: usize,
    pub cols: usize,
    pub bias: Option<CudaSlice<f32>>,
}

pub(crate) struct LayerWeights {
    pub attn_norm: CudaSlice<f32>,
    pub ffn_norm: CudaSlice<f32>,
    pub q: Matrix,
    pub k: Matrix,
    pub v: Matrix,
    pub o: Matrix,
    pub gate: Matrix,
    pub up: Matrix,
    pub down: Matrix,
}

pub(crate) struct Weights {
    pub embed: Matrix,
    pub layers: Vec<LayerWeights>,
    pub norm: CudaSlice<f32>,
    /// The output head; `None`: the embedding (tied).
    pub output: Option<Matrix>,
    pub inv_freq: CudaSlice<f32>,
    pub mscale: f32,
    pub neox: bool,
}

/// One NVIDIA GPU holding a model's weights.
pub struct CudaDevice {
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) funcs: HashMap<String, CudaFunction>,
    pub(crate) w: Weights,
    pub(crate) config: ModelConfig,
    name: String,
    weight_bytes: usize,
    ctx: Arc<CudaContext>,
}

/// Whether the CUDA driver library (`libcuda.so.1`) can be loaded on this machine.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library (cudarc's own check; it panics elsewhere when
    // the library is missing, so every entry point checks this first).
    unsafe { cudarc::driver::sys::is_culib_present() }
}

impl CudaDevice {
    /// Checks the model is one the GPU forward runs, opens GPU 0, loads the kernels and
    /// uploads the weights.
    pub fn new(files: &ModelFiles) -> Result<Self, CudaError> {
        support::check_config(&files.config)?;
        let mats = support::matrices(files)?;
        if !driver_present() {
            return Err(CudaError::NoDriver);
        }
        let ctx = CudaContext::new(0).map_err(drv("opening GPU 0"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(drv("compute capability"))?;
        if major < 9 {
            return Err(CudaError::Unsupported {
                what: format!(
                    "a GPU of compute capability {major}.{minor}: the kernels are compiled for \
                     sm_90 (Hopper) and later"
                ),
            });
        }
        // SAFETY: called before any allocation or launch; one stream orders every operation
        // of this device, so cudarc's per-allocation events are not needed.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        let mut funcs = HashMap::new();
        for (_, text) in ptx::MODULES {
            let m = ctx
                .load_module(cudarc::nvrtc::Ptx::from_src(text))
                .map_err(drv(
                    "loading the PTX (does the driver support PTX ISA 8.8?)",
                ))?;
            for name in ptx::entry_points(text) {
                let f = m.load_function(name).map_err(drv("loading a kernel"))?;
                funcs.insert(name.to_string(), f);
            }
        }
        let weight_bytes: usize = mats
            .iter()
            .filter_map(|(n, _)| files.tensors.get(n))
            .map(|t| t.data().len())
            .sum();
        let (free, total) = ctx.mem_get_info().map_err(drv("memory info"))?;
        if weight_bytes + (256 << 20) > free {
            return Err(CudaError::Memory {
                what: format!(
                    "the weights take {:.0} MB; {:.0} MB of {:.0} MB are free",
                    weight_bytes as f64 / 1e6,
                    free as f64 / 1e6,
                    total as f64 / 1e6
                ),
            });
        }
        let w = upload(&stream, files)?;
        let name = format!(
            "cuda:0 {} (sm_{major}{minor})",
            ctx.name().unwrap_or_else(|_| "GPU".into())
        );
        Ok(CudaDevice {
            stream,
            funcs,
            w,
            config: files.config.clone(),
            name,
            weight_bytes,
            ctx,
        })
    }

    /// One line for the start-up log.
    pub fn summary(&self) -> String {
        let (free, total) = self.ctx.mem_get_info().unwrap_or((0, 0));
        format!(
            "device {}: {:.1} MB of weights uploaded as stored, {:.0} of {:.0} MB free",
            self.name,
            self.weight_bytes as f64 / 1e6,
            free as f64 / 1e6,
            total as f64 / 1e6
        )
    }

    /// Bytes of the weights on the GPU.
    pub fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    /// Bytes of GPU memory free now.
    pub fn free_memory(&self) -> Result<usize, CudaError> {
        Ok(self.ctx.mem_get_info().map_err(drv("memory info"))?.0)
    }

    pub(crate) fn func(&self, name: &str) -> Result<&CudaFunction, CudaError> {
        self.funcs.get(name).ok_or_else(|| CudaError::Unsupported {
            what: format!("kernel {name} is not in the embedded PTX"),
        })
    }

    /// A step engine's KV cache of `num_blocks` blocks of `block_size` positions on this
    /// GPU (f32, every layer).
    pub fn new_cuda_kv(
        &self,
        block_size: usize,
        num_blocks: usize,
    ) -> Result<CudaKv<'_>, CudaError> {
        CudaKv::new(self, block_size, num_blocks)
    }
}

impl Device for CudaDevice {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn kind(&self) -> DeviceKind {
        DeviceKind::Cuda
    }

    fn new_kv<'e>(
        &'e self,
        engine: &'e Engine,
        block_size: usize,
        num_blocks: usize,
        window_blocks: Option<usize>,
    ) -> tessera_core::Result<Box<dyn StepKv + 'e>> {
        if window_blocks.is_some() {
            return Err(CudaError::Unsupported {
                what: "a KV window group (sliding-window layers)".into(),
            }
            .into());
        }
        if engine.kv_dtype != KvDtype::F32 {
            return Err(CudaError::Unsupported {
                what: format!("a KV cache of {} (use --kv-dtype f32)", engine.kv_dtype),
            }
            .into());
        }
        Ok(Box::new(self.new_cuda_kv(block_size, num_blocks)?))
    }
}

fn f32s(stream: &Arc<CudaStream>, v: &[f32]) -> Result<CudaSlice<f32>, CudaError> {
    stream.clone_htod(v).map_err(drv("uploading"))
}

fn matrix(stream: &Arc<CudaStream>, files: &ModelFiles, name: &str) -> Result<Matrix, CudaError> {
    let t: &WeightTensor =
        files
            .tensor(&format!("{name}.weight"))
            .map_err(|e| CudaError::Unsupported {
                what: e.to_string(),
            })?;
    let fmt = crate::formats::check_matrix(t)?;
    let bias = match files.tensors.get(&format!("{name}.bias")) {
        Some(b) if b.numel() == t.shape[0] => Some(f32s(stream, &b.to_f32_vec())?),
        Some(b) => {
            return Err(CudaError::Unsupported {
                what: format!(
                    "bias {} of {} values for {} rows",
                    b.name,
                    b.numel(),
                    t.shape[0]
                ),
            })
        }
        None => None,
    };
    Ok(Matrix {
        buf: stream
            .clone_htod(t.data())
            .map_err(drv("uploading weights"))?,
        fmt,
        rows: t.shape[0],
        cols: t.shape[1],
        bias,
    })
}

fn vector(
    stream: &Arc<CudaStream>,
    files: &ModelFiles,
    name: &str,
    len: usize,
) -> Result<CudaSlice<f32>, CudaError> {
    let t = files.tensor(name).map_err(|e| CudaError::Unsupported {
        what: e.to_string(),
    })?;
    if t.numel() != len {
        return Err(CudaError::Unsupported {
            what: format!("{name} has {} values, expected {len}", t.numel()),
        });
    }
    f32s(stream, &t.to_f32_vec())
}

fn upload(stream: &Arc<CudaStream>, files: &ModelFiles) -> Result<Weights, CudaError> {
    let c = &files.config;
    let h = c.hidden_size;
    let mut layers = Vec::with_capacity(c.n_layers);
    for l in 0..c.n_layers {
        let p = |s: &str| format!("blk.{l}.{s}");
        layers.push(LayerWeights {
            attn_norm: vector(stream, files, &p("attn_norm.weight"), h)?,
            ffn_norm: vector(stream, files, &p("ffn_norm.weight"), h)?,
            q: matrix(stream, files, &p("attn_q"))?,
            k: matrix(stream, files, &p("attn_k"))?,
            v: matrix(stream, files, &p("attn_v"))?,
            o: matrix(stream, files, &p("attn_output"))?,
            gate: matrix(stream, files, &p("ffn_gate"))?,
            up: matrix(stream, files, &p("ffn_up"))?,
            down: matrix(stream, files, &p("ffn_down"))?,
        });
    }
    let output = if files.tensors.contains_key("output.weight") && !c.tie_embeddings {
        Some(matrix(stream, files, "output")?)
    } else {
        None
    };
    let rope = Rope::new(c);
    Ok(Weights {
        embed: matrix(stream, files, "token_embd")?,
        layers,
        norm: vector(stream, files, "output_norm.weight", h)?,
        output,
        inv_freq: f32s(stream, rope.inv_freq())?,
        mscale: rope.mscale(),
        neox: rope.style() == RopeStyle::Neox,
    })
}
