//! The exact path's forward on the GPU: one step engine's paged KV cache (the CPU's block
//! layout, f32), its activation buffers, and the launches of one step.
//!
//! A step is validated and laid out by the CPU path's own [`PreparedBatch::prepare`]
//! (against a KV storage of no layers that holds only the geometry), packed into one
//! upload ([`StepMeta`]), run layer by layer (norm, q/k/v products with biases, RoPE, K/V
//! stored in their slots, paged attention, output product and residual add; norm, gate/up
//! products, SwiGLU, down product and residual add), and only the logits of the rows that
//! want them come back to the host. Weights stay in their stored format; every kernel
//! decodes them in registers and accumulates in f32.
//!
//! Not yet run on a device (see `docs/cuda.md`): CUDA graphs for decode steps are not
//! here yet either.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use tessera_core::{Error, Result};
use tessera_engine::engine::ForwardLogits;
use tessera_engine::StepKv;
use tessera_lora::LoraAdapter;
use tessera_model::{BatchMeta, KvStorage, LogitsView, PreparedBatch};

use crate::device::{addr, drv, CudaDevice, Matrix};
use crate::kernels::{self, MATMUL_ROWS, MATMUL_WARPS};
use crate::meta::StepMeta;
use crate::CudaError;

/// Launches kernel `$f` on `$dev`'s stream with the named arguments, in the kernel's order
/// (each bound to a local first, so that it outlives the launch).
macro_rules! launch {
    ($dev:expr, $f:expr, $grid:expr, $block:expr; $($name:ident = $a:expr),* $(,)?) => {{
        // The grid first: the arguments' names may shadow what it is computed from.
        let cfg = LaunchConfig { grid_dim: $grid, block_dim: $block, shared_mem_bytes: 0 };
        let f = $dev.func($f)?;
        $(#[allow(clippy::redundant_locals)]
        let $name = $a;)*
        let mut b = $dev.stream.launch_builder(f);
        $(b.arg(&$name);)*
        // SAFETY: the arguments are the kernel's parameters in order and type (pointers as
        // u64, `int` as i32, `float` as f32); every pointer is to an allocation of this
        // device large enough for the launch (see `Buffers::ensure`).
        unsafe { b.launch(cfg) }.map_err(drv("launching a kernel"))?;
    }};
}

/// Grows to at least `n` values (powers of two, so a growing batch reallocates rarely).
fn ensure<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    dev: &CudaDevice,
    buf: &mut Option<CudaSlice<T>>,
    n: usize,
) -> Result<(), CudaError> {
    if buf.as_ref().is_some_and(|b| b.len() >= n) {
        return Ok(());
    }
    let n = n.max(1).next_power_of_two();
    *buf = Some(
        dev.stream
            .alloc_zeros::<T>(n)
            .map_err(drv("allocating activations"))?,
    );
    Ok(())
}

/// The activation buffers of a step's forward.
#[derive(Default)]
struct Buffers {
    x: Option<CudaSlice<f32>>,
    delta: Option<CudaSlice<f32>>,
    normed: Option<CudaSlice<f32>>,
    qkv: Option<CudaSlice<f32>>,
    att: Option<CudaSlice<f32>>,
    gu: Option<CudaSlice<f32>>,
    act: Option<CudaSlice<f32>>,
    head_in: Option<CudaSlice<f32>>,
    logits: Option<CudaSlice<f32>>,
    meta: Option<CudaSlice<u32>>,
}

/// One step engine's state on the GPU.
pub struct CudaKv<'d> {
    dev: &'d CudaDevice,
    /// The cache's geometry (no layers: nothing allocated), for the CPU path's checks.
    geometry: KvStorage,
    k: Vec<CudaSlice<f32>>,
    v: Vec<CudaSlice<f32>>,
    prepared: PreparedBatch,
    bufs: Buffers,
    logits: Vec<f32>,
}

impl<'d> CudaKv<'d> {
    pub(crate) fn new(
        dev: &'d CudaDevice,
        block_size: usize,
        num_blocks: usize,
    ) -> Result<Self, CudaError> {
        let c = &dev.config;
        let geometry = KvStorage::new(0, c.kv_dim(), block_size, num_blocks).map_err(|e| {
            CudaError::Unsupported {
                what: e.to_string(),
            }
        })?;
        let per_layer = num_blocks
            .checked_mul(block_size)
            .and_then(|n| n.checked_mul(c.kv_dim()))
            .filter(|&n| n <= u32::MAX as usize)
            .ok_or_else(|| CudaError::Unsupported {
                what: format!(
                    "a KV cache of {num_blocks} blocks: over 2^32 values a layer for the kernels' indices"
                ),
            })?;
        let bytes = 2 * c.n_layers * per_layer * 4;
        let free = dev.free_memory()?;
        if bytes + (512 << 20) > free {
            return Err(CudaError::Memory {
                what: format!(
                    "a KV cache of {num_blocks} blocks of {block_size} positions takes {:.0} MB; \
                     {:.0} MB of GPU memory are free (lower --kv-memory-mb or --kv-blocks)",
                    bytes as f64 / 1e6,
                    free as f64 / 1e6
                ),
            });
        }
        let alloc = || {
            dev.stream
                .alloc_zeros::<f32>(per_layer)
                .map_err(drv("allocating the KV cache"))
        };
        let k = (0..c.n_layers).map(|_| alloc()).collect::<Result<_, _>>()?;
        let v = (0..c.n_layers).map(|_| alloc()).collect::<Result<_, _>>()?;
        Ok(CudaKv {
            dev,
            geometry,
            k,
            v,
            prepared: PreparedBatch::default(),
            bufs: Buffers::default(),
            logits: Vec::new(),
        })
    }

    /// `y[.., col0 + n]` (rows `ldy` apart) = `x · Wᵀ (+ bias)` for `m` rows of `x`.
    #[allow(clippy::too_many_arguments)]
    fn matmul(
        &self,
        w: &Matrix,
        x: u64,
        m: usize,
        y: u64,
        ldy: usize,
        col0: usize,
    ) -> Result<(), CudaError> {
        let s = &self.dev.stream;
        let grid = (
            w.rows.div_ceil(MATMUL_WARPS) as u32,
            m.div_ceil(MATMUL_ROWS) as u32,
            1,
        );
        launch!(self.dev, w.fmt.matmul, grid, (32, MATMUL_WARPS as u32, 1);
            w_ptr = addr(&w.buf, s),
            x_ptr = x,
            y_ptr = y + 4 * col0 as u64,
            bias = w.bias.as_ref().map_or(0u64, |b| addr(b, s)),
            k = w.cols as i32,
            n = w.rows as i32,
            m = m as i32,
            ldx = w.cols as i32,
            ldy = ldy as i32,
        );
        Ok(())
    }

    fn rms_norm(
        &self,
        x: u64,
        w: &CudaSlice<f32>,
        out: u64,
        rows: u64,
        n: usize,
    ) -> Result<(), CudaError> {
        let c = &self.dev.config;
        launch!(self.dev, kernels::RMS_NORM, (n as u32, 1, 1), (256, 1, 1);
            x = x,
            w = addr(w, &self.dev.stream),
            out = out,
            rows = rows,
            h = c.hidden_size as i32,
            eps = c.rms_eps,
        );
        Ok(())
    }

    fn add(&self, x: u64, d: u64, n: usize) -> Result<(), CudaError> {
        launch!(self.dev, kernels::ADD_ASSIGN, (n.div_ceil(256) as u32, 1, 1), (256, 1, 1);
            x = x, d = d, n = n as i32,
        );
        Ok(())
    }

    /// The whole forward of the prepared batch; returns the number of logit rows, left in
    /// `bufs.logits`.
    fn run(&mut self, meta: &StepMeta) -> Result<usize, CudaError> {
        let dev = self.dev;
        let c = &dev.config;
        let s = &dev.stream;
        let m = meta.rows();
        let r = meta.logit_rows.len();
        let (h, qd, kvd, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        let qkvd = qd + 2 * kvd;
        let vocab = c.vocab_size;
        let b = &mut self.bufs;
        ensure(dev, &mut b.x, m * h)?;
        ensure(dev, &mut b.delta, m * h)?;
        ensure(dev, &mut b.normed, m * h)?;
        ensure(dev, &mut b.qkv, m * qkvd)?;
        ensure(dev, &mut b.att, m * qd)?;
        ensure(dev, &mut b.gu, m * 2 * ff)?;
        ensure(dev, &mut b.act, m * ff)?;
        ensure(dev, &mut b.head_in, r.max(1) * h)?;
        ensure(dev, &mut b.logits, r.max(1) * vocab)?;
        ensure(dev, &mut b.meta, meta.data.len())?;
        let p = |o: &Option<CudaSlice<f32>>| o.as_ref().map_or(0, |b| addr(b, s));
        let (x, delta, normed, qkv, att, gu, act, head_in, logits) = (
            p(&b.x),
            p(&b.delta),
            p(&b.normed),
            p(&b.qkv),
            p(&b.att),
            p(&b.gu),
            p(&b.act),
            p(&b.head_in),
            p(&b.logits),
        );
        let meta_buf = b.meta.as_mut().ok_or(CudaError::Driver {
            op: "metadata",
            msg: "no buffer".into(),
        })?;
        s.memcpy_htod(&meta.data, meta_buf)
            .map_err(drv("uploading the step"))?;
        let mb = addr(meta_buf, s);
        let at = |range: &std::ops::Range<usize>| mb + 4 * range.start as u64;
        let w = &dev.w;
        launch!(dev, w.embed.fmt.embed, (m as u32, 1, 1), (128, 1, 1);
            w_ptr = addr(&w.embed.buf, s),
            tokens = at(&meta.tokens),
            out = x,
            k = h as i32,
            scale = c.block.embed_scale,
        );
        let attn = kernels::attention(c.head_dim).ok_or_else(|| CudaError::Unsupported {
            what: format!("heads of {}", c.head_dim),
        })?;
        let rows = m as i32;
        for (l, lw) in w.layers.iter().enumerate() {
            self.rms_norm(x, &lw.attn_norm, normed, 0, m)?;
            self.matmul(&lw.q, normed, m, qkv, qkvd, 0)?;
            self.matmul(&lw.k, normed, m, qkv, qkvd, qd)?;
            self.matmul(&lw.v, normed, m, qkv, qkvd, qd + kvd)?;
            launch!(dev, kernels::ROPE, (m as u32, 1, 1), (128, 1, 1);
                qkv_ptr = qkv,
                stride = qkvd as i32,
                heads = (c.n_heads + c.n_kv_heads) as i32,
                head_dim = c.head_dim as i32,
                positions = at(&meta.positions),
                inv_freq = addr(&w.inv_freq, s),
                half = (c.rope_dim / 2) as i32,
                mscale = w.mscale,
                neox = w.neox as i32,
            );
            let (kc, vc) = (addr(&self.k[l], s), addr(&self.v[l], s));
            launch!(dev, kernels::KV_WRITE, (m as u32, 1, 1), (128, 1, 1);
                qkv_ptr = qkv,
                stride = qkvd as i32,
                q_dim = qd as i32,
                kv_dim = kvd as i32,
                k = kc,
                v = vc,
                slots = at(&meta.slots),
            );
            let items = m * c.n_heads;
            launch!(dev, attn, (items.div_ceil(4) as u32, 1, 1), (32, 4, 1);
                qkv_ptr = qkv,
                qkv_stride = qkvd as i32,
                k = kc,
                v = vc,
                out = att,
                positions = at(&meta.positions),
                row_table = at(&meta.row_table),
                tables = at(&meta.tables),
                n_heads = c.n_heads as i32,
                group = (c.n_heads / c.n_kv_heads) as i32,
                kv_dim = kvd as i32,
                block_size = self.geometry.block_size() as i32,
                scale = c.attn_scale(),
                rows = rows,
            );
            self.matmul(&lw.o, att, m, delta, h, 0)?;
            self.add(x, delta, m * h)?;
            self.rms_norm(x, &lw.ffn_norm, normed, 0, m)?;
            self.matmul(&lw.gate, normed, m, gu, 2 * ff, 0)?;
            self.matmul(&lw.up, normed, m, gu, 2 * ff, ff)?;
            launch!(dev, kernels::SILU_MUL, ((m * ff).div_ceil(256) as u32, 1, 1), (256, 1, 1);
                gu_ptr = gu, act_ptr = act, ff = ff as i32, rows = rows,
            );
            self.matmul(&lw.down, act, m, delta, h, 0)?;
            self.add(x, delta, m * h)?;
        }
        if r == 0 {
            return Ok(0);
        }
        self.rms_norm(x, &w.norm, head_in, at(&meta.logit_rows), r)?;
        self.matmul(
            w.output.as_ref().unwrap_or(&w.embed),
            head_in,
            r,
            logits,
            vocab,
            0,
        )?;
        Ok(r)
    }
}

impl StepKv for CudaKv<'_> {
    fn bytes(&self) -> usize {
        self.k.iter().chain(&self.v).map(|b| b.len() * 4).sum()
    }

    fn forward(
        &mut self,
        batch: &BatchMeta,
        adapters: &[Arc<LoraAdapter>],
    ) -> Result<ForwardLogits<'_>> {
        if let Some(i) = batch.seqs.iter().position(|s| s.adapter.is_some()) {
            return Err(Error::sequence(
                i,
                "LoRA adapters do not run on the cuda device yet",
            ));
        }
        let c = &self.dev.config;
        self.prepared.prepare(
            batch,
            &self.geometry,
            c.max_position,
            c.vocab_size,
            adapters.len(),
        )?;
        let meta = StepMeta::pack(&self.prepared)?;
        let r = if meta.rows() == 0 {
            0
        } else {
            self.run(&meta)?
        };
        let n = r * c.vocab_size;
        self.logits.resize(n, 0.0);
        if n > 0 {
            let src =
                self.bufs
                    .logits
                    .as_ref()
                    .map(|b| b.slice(0..n))
                    .ok_or(CudaError::Driver {
                        op: "logits",
                        msg: "no buffer".into(),
                    })?;
            self.dev
                .stream
                .memcpy_dtoh(&src, &mut self.logits[..])
                .map_err(drv("copying the logits back"))?;
            self.dev.stream.synchronize().map_err(drv("the step"))?;
        }
        Ok(ForwardLogits::View(LogitsView {
            vocab: c.vocab_size,
            data: &self.logits,
            rows: &self.prepared.logit_ids[..r],
        }))
    }
}
