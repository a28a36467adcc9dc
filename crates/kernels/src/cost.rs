//! The analytic cost model that ranks plans.
//!
//! A unit's time is the larger of its compute time (FLOPs at the kernel family's measured
//! throughput, scaled by the register tile's efficiency) and its memory time (bytes that
//! must come from DRAM at the unit's share of measured bandwidth, plus bytes re-read from
//! L2/L3), plus the dequantization of weight panels, per-tile overheads, and one dispatch.
//! The inputs are a [`MachineProfile`]: built-in defaults for a Zen3-class core, or figures
//! measured by `tessera tune` and stored in the tuning cache.

use serde::{Deserialize, Serialize};
use tessera_core::DType;

use crate::plan::{F32Kernel, KernelFamily, Plan};

mod measured;
mod profiles;
pub use profiles::{builtin_for_class, Builtin};
mod stream;

use stream::predict_stream_us;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MachineProfile {
    pub cpu: String,
    /// f32 dot-tile throughput of one core with L1-resident data (3×4 tile), GFLOP/s.
    pub f32_gflops_per_core: f64,
    /// Integer-dot tile throughput of one core (4-row tile), GFLOP/s (2 per MAC).
    pub q8_gflops_per_core: f64,
    /// Streaming read bandwidth from DRAM, all units together, GB/s.
    pub dram_gbs: f64,
    /// Read bandwidth of one core from its L2, GB/s.
    pub l2_gbs_per_core: f64,
    /// Read bandwidth from L3, all units together, GB/s.
    pub l3_gbs: f64,
    /// Weight dequantization to f32 on one core, elements per ns.
    pub dequant_elems_per_ns: f64,
    /// Activation quantization to 8-bit blocks on one core, elements per ns.
    pub quant_elems_per_ns: f64,
    /// Cost of one parallel operation on the pool (dispatch + join), microseconds.
    pub dispatch_us: f64,
    /// The macro packed tile's slowdown in a whole product per doubling of K past 576, on
    /// top of its modelled traffic: its compute time is taken `1 + s · log2(K / 576)` times
    /// (0 where not measured, and in profiles written before it was recorded).
    #[serde(default)]
    pub packed_k_slowdown: f64,
    /// What the macro packed tile's panel costs per quantized weight element beyond the
    /// decode rate, ns (0 where not measured, and in profiles written before it was
    /// recorded).
    #[serde(default)]
    pub packed_quant_pack_ns: f64,
    /// What the outer-product tile's strips cost per weight element beyond the decode rate,
    /// ns (0.1, fitted on a Zen3 and kept on the Xeon, where not measured and in profiles
    /// written before it was recorded).
    #[serde(default = "default_outer_strip_pack_ns")]
    pub outer_strip_pack_ns: f64,
    /// What the outer-product tile's strips cost per weight element when they decode
    /// straight from the repacked records (block-quantized weights, AVX-512), ns, in place
    /// of the decode rate plus `outer_strip_pack_ns` (none where not measured, and in
    /// profiles written before it was recorded).
    #[serde(default)]
    pub outer_record_strip_ns: Option<f64>,
    /// L1 data cache of one core (profiles written before it was recorded: 32 KiB).
    #[serde(default = "default_l1_bytes")]
    pub l1_bytes: usize,
    pub l2_bytes: usize,
    pub l3_bytes: usize,
    /// Measured throughput of each register tile on cache-resident data, one unit.
    #[serde(default)]
    pub tiles: Vec<TileRate>,
}

fn default_l1_bytes() -> usize {
    32 << 10
}

fn default_outer_strip_pack_ns() -> f64 {
    0.1
}

/// One register tile's measured throughput.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TileRate {
    pub family: String,
    pub mr: usize,
    pub nr: usize,
    pub gflops: f64,
}

/// Short name of a family (its panel kernel, for F32Dot) in profiles.
pub fn family_name(f: KernelFamily) -> &'static str {
    kernel_name(f, F32Kernel::Panel)
}

/// Short name of a family's kernel in profiles: `f32dot` (panel), `f32stream` (measured on
/// Q4_1 weights, so it includes their in-register dequantization), `f32packed`, `q8x8`.
pub fn kernel_name(f: KernelFamily, kernel: F32Kernel) -> &'static str {
    match (f, kernel) {
        (KernelFamily::F32Dot, F32Kernel::Panel) => "f32dot",
        (KernelFamily::F32Dot, F32Kernel::Stream) => "f32stream",
        (KernelFamily::F32Dot, F32Kernel::Packed) => "f32packed",
        (KernelFamily::Q8Interleaved, _) => "q8x8",
        (KernelFamily::QkDot, _) => "qkdot",
    }
}

/// The profile name of a tile's rate: [`kernel_name`], except for the exact kernels' AVX-512
/// tiles: the stream kernel's 16-row tiles on the repack (`crate::exact::STREAM16_TILES`),
/// `f32stream16`, and the packed kernel's even-`nr` tiles where AVX-512 runs, `f32packed16`.
pub fn tile_rate_name(f: KernelFamily, kernel: F32Kernel, nr: usize) -> &'static str {
    match (f, kernel) {
        (KernelFamily::F32Dot, F32Kernel::Stream) if nr == 16 => "f32stream16",
        (KernelFamily::F32Dot, F32Kernel::Packed)
            if nr.is_multiple_of(2) && crate::isa::avx512_exact() =>
        {
            "f32packed16"
        }
        _ => kernel_name(f, kernel),
    }
}

/// The profile name of the stream kernel's `nr`-wide tiles rated on `dtype` weights
/// (`f32stream16@q8_0`); the plain [`tile_rate_name`] is the Q4_1 rating.
pub fn stream_rate_name(dtype: DType, nr: usize) -> String {
    format!(
        "{}@{}",
        tile_rate_name(KernelFamily::F32Dot, F32Kernel::Stream, nr),
        dtype.to_string().to_ascii_lowercase()
    )
}

/// In-register dequantization cost of 8 elements, in FMA-instruction equivalents (loads,
/// widening, conversion, scale), for the stream kernel's per-dtype rate.
pub fn decode_cost(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 0.5,
        DType::F16 => 1.0,
        DType::BF16 => 1.0,
        DType::Q8_0 => 1.5,
        DType::Q4_0 | DType::Q4_1 => 2.0,
        // Decoded into an L1 buffer first, then the f32 tile reads it back.
        DType::Q5_0 | DType::Q5_1 | DType::Q4_K | DType::Q5_K | DType::Q6_K | DType::Q8_K => 3.0,
        DType::Q2_K | DType::Q3_K | DType::IQ4_NL | DType::IQ4_XS => 3.5,
    }
}

impl MachineProfile {
    /// Throughput of a tile of a family's panel kernel (see [`Self::kernel_tile_gflops`]).
    pub fn tile_gflops(&self, family: KernelFamily, mr: usize, nr: usize, k: usize) -> f64 {
        self.kernel_tile_gflops(family, F32Kernel::Panel, mr, nr, k)
    }

    /// Throughput of a kernel's tile: measured if the profile has it, else the family peak
    /// scaled by the analytic tile efficiency.
    pub fn kernel_tile_gflops(
        &self,
        family: KernelFamily,
        kernel: F32Kernel,
        mr: usize,
        nr: usize,
        k: usize,
    ) -> f64 {
        let name = tile_rate_name(family, kernel, nr);
        if let Some(t) = self
            .tiles
            .iter()
            .find(|t| t.family == name && t.mr == mr && t.nr == nr)
        {
            return t.gflops;
        }
        let peak = match family {
            KernelFamily::F32Dot => self.f32_gflops_per_core,
            KernelFamily::Q8Interleaved | KernelFamily::QkDot => self.q8_gflops_per_core,
        };
        let eff = tile_efficiency(family, mr, nr, k);
        match (family, kernel) {
            // No per-element callback, batched lane trees: about a fifth faster.
            (KernelFamily::F32Dot, F32Kernel::Packed) => peak * eff * 1.2,
            // AVX-512 on the repack: twice the lanes, one shuffle + FMA of decode per 16.
            (KernelFamily::F32Dot, F32Kernel::Stream) if nr == 16 => {
                2.0 * peak * mr as f64 / (mr as f64 + 1.0)
            }
            // Q4_1 decode (2 FMA-equivalents per 8 elements) shared by `mr` rows.
            (KernelFamily::F32Dot, F32Kernel::Stream) => peak * mr as f64 / (mr as f64 + 2.0),
            _ => peak * eff,
        }
    }
}

impl MachineProfile {
    /// Throughput of the stream kernel's `mr × nr` tile on `dtype` weights: rated on that
    /// dtype if the profile has it, else the Q4_1 rating adjusted for the dtype's decode cost.
    pub fn stream_tile_gflops(&self, dtype: DType, mr: usize, nr: usize, k: usize) -> f64 {
        let name = stream_rate_name(dtype, nr);
        if let Some(t) = self
            .tiles
            .iter()
            .find(|t| t.family == name && t.mr == mr && t.nr == nr)
        {
            return t.gflops;
        }
        let base = self.kernel_tile_gflops(KernelFamily::F32Dot, F32Kernel::Stream, mr, nr, k);
        let r = mr as f64;
        base * (r + decode_cost(DType::Q4_1)) / (r + decode_cost(dtype))
    }
}

/// Bytes per weight element as stored (the interleaved repack has the same density).
pub fn bytes_per_weight(dtype: DType) -> f64 {
    dtype.block_bytes() as f64 / dtype.block_len() as f64
}

/// Register-tile efficiency relative to the family's measured peak.
pub fn tile_efficiency(family: KernelFamily, mr: usize, nr: usize, k: usize) -> f64 {
    match family {
        KernelFamily::F32Dot => {
            // Per 8-wide K step: mr·nr FMAs (2 per cycle) against mr + nr loads (2 per cycle).
            let fma = (mr * nr) as f64 / 2.0;
            let loads = (mr + nr) as f64 / 2.0;
            let mut eff = fma / fma.max(loads);
            if mr * nr + mr + 1 > 16 {
                eff *= 0.6; // register spills
            }
            // Horizontal sums and tails: ~10 cycles per output element.
            let steps = (k / 8).max(1) as f64;
            let per_elem = steps / (mr * nr) as f64 * fma.max(loads);
            eff * per_elem / (per_elem + 10.0 / (mr * nr) as f64)
        }
        KernelFamily::Q8Interleaved => {
            // Per block: weight unpacking (~12 ops) shared by the rows, ~18 ops per row.
            let r = mr as f64;
            (r * 18.0) / (r * 18.0 + 12.0)
        }
        KernelFamily::QkDot => {
            // Per 32 weights: unpacking and sub-block scales (~16 ops) shared by the rows,
            // ~12 ops of integer dots per row.
            let r = mr as f64;
            (r * 12.0) / (r * 12.0 + 16.0)
        }
    }
}

/// Whether one unit's first read of its share of the weights in a call comes from DRAM: a
/// share that fits half its L2 is taken to be there already (the product ran on these
/// weights just before, as in a sweep or a tight loop of steps on a small model).
fn first_read_from_dram(p: &MachineProfile, unit_weight_bytes: f64) -> bool {
    unit_weight_bytes > p.l2_bytes as f64 * 0.5
}

/// Bytes per ns one unit reads its share of the weights at, the first time in a call: its
/// share of DRAM bandwidth ([`first_read_from_dram`]), else its L2's.
fn first_read_bw(p: &MachineProfile, unit_weight_bytes: f64, units: f64) -> f64 {
    if first_read_from_dram(p, unit_weight_bytes) {
        p.dram_gbs / units
    } else {
        p.l2_gbs_per_core
    }
}

/// Nanoseconds of FMAs for `rows` activation rows against `weights` (N × K) weight elements:
/// whole `mr`-row tiles at `rate(mr)` GFLOP/s, the remainder tile at its own `rate(rem)`.
fn tiles_compute_ns(rows: usize, mr: usize, weights: f64, rate: impl Fn(usize) -> f64) -> f64 {
    let full = (rows / mr) as f64 * 2.0 * mr as f64 * weights / rate(mr);
    let rem = rows % mr;
    let part = if rem > 0 {
        2.0 * rem as f64 * weights / rate(rem)
    } else {
        0.0
    };
    full + part
}

/// Predicted microseconds for `plan` on an `m × k × n` product of `dtype` weights.
pub fn predict_us(
    p: &MachineProfile,
    plan: &Plan,
    m: usize,
    k: usize,
    n: usize,
    dtype: DType,
) -> f64 {
    match (plan.tile.family, plan.tile.kernel) {
        (KernelFamily::F32Dot, F32Kernel::Stream) => predict_stream_us(p, plan, m, k, n, dtype),
        (KernelFamily::F32Dot, F32Kernel::Packed)
            if crate::exact::packed_tile_for(plan.tile.mr, plan.tile.nr).1
                >= crate::exact::OUTER_STRIP =>
        {
            predict_outer_us(p, plan, m, k, n, dtype)
        }
        (KernelFamily::F32Dot, F32Kernel::Packed) => predict_packed_us(p, plan, m, k, n, dtype),
        _ => predict_panel_us(p, plan, m, k, n, dtype),
    }
}

/// The packed kernel (`exact::packed_range`): every weight element dequantized once into a
/// panel (every K block of an `nc` block); tiles at the kernel's measured rate, slowed when
/// the activation tile (`mr × kc`) crowds L1 while the panel streams past it; per tile, the
/// `nc × kc` sub-panel is re-read from L2 when it fits (else L3), and the whole `nc × K`
/// panel comes from L3 once per `mc` block when it does not fit L2; activations re-read once
/// per `nc` block (prefetched, so mostly hidden); lane slots stored and reloaded between K
/// blocks.
fn predict_packed_us(
    p: &MachineProfile,
    plan: &Plan,
    m: usize,
    k: usize,
    n: usize,
    dtype: DType,
) -> f64 {
    let t = &plan.tile;
    let (mr, nr) = crate::exact::packed_tile_for(t.mr, t.nr);
    let kc = crate::exact::packed_kc(t.kc, k, dtype) as f64;
    let (mp, np) = plan.parallel.parts();
    let units = (mp * np) as f64;
    let rows = m.div_ceil(mp);
    let nn = (n.div_ceil(np)).div_ceil(nr) as f64 * nr as f64;
    let kf = k as f64;
    let rate = |r: usize| p.kernel_tile_gflops(KernelFamily::F32Dot, F32Kernel::Packed, r, nr, k);
    let mut compute_ns = tiles_compute_ns(rows, mr, nn * kf, rate);
    // The activation tile stays in L1 while the panel streams past it: past about half of
    // L1 its lines start to be evicted.
    if mr as f64 * kc * 4.0 > p.l1_bytes as f64 * 0.45 {
        compute_ns *= 1.12;
    }
    if k > 576 {
        compute_ns *= 1.0 + p.packed_k_slowdown * (kf / 576.0).log2();
    }
    let bpw = bytes_per_weight(dtype);
    let mut mem_ns = nn * kf * bpw / first_read_bw(p, nn * kf * bpw, units);
    let nc = (t.nc.max(nr) as f64).min(nn);
    let mc = (t.mc.max(mr) as f64).min(rows as f64);
    let half_l2 = p.l2_bytes as f64 * 0.5;
    let l3_bw = p.l3_gbs / units;
    // Activations: each `nc` block's tiles read the unit's rows once (from L2 when they fit).
    let a_bytes = (nn / nc).ceil() * rows as f64 * kf * 4.0;
    let a_bw = if rows as f64 * kf * 4.0 <= half_l2 {
        p.l2_gbs_per_core
    } else {
        l3_bw
    };
    // The panel: every tile streams its K block's sub-panel (with the lane slots of the `mc`
    // block beside it), from L2 when both fit; the whole `nc × K` panel comes from L3 once
    // per `mc` block when it does not fit.
    let tiles_m = (rows as f64 / mr as f64).ceil();
    let blocks_k = (kf / kc).ceil();
    let slot_bytes = if blocks_k > 1.0 { mc * nc * 32.0 } else { 0.0 };
    let sub_panel = nc * kc * 4.0;
    let b_bytes = tiles_m * nn * kf * 4.0;
    // (L2 also holds the activation rows, the panel being packed and what the prefetchers
    // bring: a third of it, not half.)
    let b_bw = if sub_panel + slot_bytes <= p.l2_bytes as f64 * 0.35 {
        p.l2_gbs_per_core * 2.0 // one sequential stream, prefetched
    } else {
        l3_bw
    };
    let mut b_ns = b_bytes / b_bw;
    let panel_bytes = nc * kf * 4.0;
    if panel_bytes > half_l2 {
        // Past L2 the panel lives in L3, as far as this VM's share of it goes (the L3 is
        // the whole CCX's, shared with other tenants): past an eighth of it, with the
        // weights streaming through it as well, the panel is written back to DRAM and read
        // from there (4096 × 11,008 f32 at M = 4-8, `nc = 128`: 2-2.5x the time of
        // `nc = 8-16`).
        let far_bw = if panel_bytes * units > p.l3_bytes as f64 / 8.0 {
            b_ns += nn * kf * 4.0 / (p.dram_gbs / units);
            p.dram_gbs / units
        } else {
            l3_bw
        };
        b_ns += (rows as f64 / mc).ceil() * nn * kf * 4.0 / far_bw;
    }
    mem_ns = mem_ns.max(a_bytes / a_bw + b_ns);
    let tiles = tiles_m * (nn / nr as f64);
    // Every weight dequantized once into the panel, quantized ones at a profile's extra
    // cost per element (see the AVX-512 profile).
    let pack_ns = if dtype.is_quantized() {
        p.packed_quant_pack_ns
    } else {
        0.0
    };
    let mut extra_ns = nn * kf * (1.0 / p.dequant_elems_per_ns + pack_ns);
    if panel_bytes > half_l2 {
        // A panel past L2 makes a round trip through L3 that nothing overlaps: it is written
        // while the weights stream in, then read back by the first tile row. At small M that
        // is most of the call (Emerald Rapids, M = 8-16, K = 1536: `nc` = 256, a 1.5 MB
        // panel, ran 0.7-0.8x of `nc` = 32-128).
        extra_ns += 2.0 * nn * kf * 4.0 / l3_bw;
    }
    if (k * 4).is_multiple_of(4096) {
        // The activation tiles are packed once per call (rows would alias in L1).
        extra_ns += rows as f64 * kf / (p.dequant_elems_per_ns * 0.5);
    }
    if blocks_k > 1.0 {
        // Lane slots: stored and reloaded once per K block (from L2 when they fit).
        let lane_bytes = tiles * (mr * nr) as f64 * 32.0 * 2.0 * (blocks_k - 1.0);
        let bw = if slot_bytes <= half_l2 {
            p.l2_gbs_per_core
        } else {
            l3_bw
        };
        extra_ns += lane_bytes / bw;
    }
    // Per tile and K block: setup (~4 ns); per element: lane tree and store (~0.5 ns).
    extra_ns += tiles * blocks_k * 4.0 + tiles * (mr * nr) as f64 * 0.5;
    // Cache traffic overlaps the FMAs only in part; the activation re-reads, prefetched a
    // tile ahead, mostly.
    extra_ns += 0.3 * compute_ns.min(mem_ns) + 0.2 * a_bytes / a_bw;
    (compute_ns.max(mem_ns) + extra_ns) / 1000.0 + p.dispatch_us
}

/// The packed kernel's outer-product tile (`crate::exact::outer`): each unit packs its
/// activation rows once and dequantizes its weight rows once into 16-row strips; one lane of
/// a strip (`16 · K / 8` values) stays in L1 while an `mc` block of activation tiles streams
/// past it, the block re-read from L2 per strip when it fits there, else from L3.
fn predict_outer_us(
    p: &MachineProfile,
    plan: &Plan,
    m: usize,
    k: usize,
    n: usize,
    dtype: DType,
) -> f64 {
    let t = &plan.tile;
    let (mr, nr) = crate::exact::packed_tile_for(t.mr, t.nr);
    let (mp, np) = plan.parallel.parts();
    let units = (mp * np) as f64;
    let rows = m.div_ceil(mp) as f64;
    let nn = (n.div_ceil(np)).div_ceil(nr) as f64 * nr as f64;
    let kf = k as f64;
    let rate = p.kernel_tile_gflops(KernelFamily::F32Dot, F32Kernel::Packed, mr, nr, k);
    // A partial last tile runs as fast per row (its steps take fewer FMAs and broadcasts).
    let mut compute_ns = 2.0 * rows * nn * kf / rate;
    // A strip's lane past half of L1 streams from L2 in part (sequential, prefetched).
    if nr as f64 * kf / 8.0 * 4.0 > p.l1_bytes as f64 * 0.5 {
        compute_ns *= 1.03;
    }
    let bpw = bytes_per_weight(dtype);
    let mem_ns = nn * kf * bpw / first_read_bw(p, nn * kf * bpw, units);
    let mc = (t.mc.max(mr) as f64).min(rows);
    let nc = (t.nc.max(nr) as f64).min(nn);
    let l3_bw = p.l3_gbs / units;
    // The activations: from L3 once per `nc` block when an `mc` block fits L2 beside the
    // strips, else once per strip (the block is gone by the next strip; the `nc` block's
    // first read is one of those).
    let a_block = mc * kf * 4.0;
    let strips = nn / nr as f64;
    let a_reads = if a_block + nc * kf * 4.0 <= p.l2_bytes as f64 * 0.5 {
        (nn / nc).ceil()
    } else {
        strips
    };
    // Each unit packs its own rows (all of them under an N split): past 0.4 of L3 across the
    // units (the L3 is shared with the weights' traffic and other tenants) the packed rows
    // are re-read from DRAM. (Zen 4, 32 MiB L3, 512 × 4096 × 4096-11,008, 2 units: the N
    // split's two 8 MiB copies ran 0.86-0.91x the M split's two 4 MiB halves on all three
    // dtypes; at M = 256 the two were level.)
    let a_bw = if rows * kf * 4.0 * units > p.l3_bytes as f64 * 0.4 {
        p.dram_gbs / units
    } else {
        l3_bw
    };
    let a_ns = a_reads * rows * kf * 4.0 / a_bw;
    // The weights: an `nc` block of strips that does not fit L2 beside an `mc` block comes
    // from L3 again for every `mc` block, and for the first one too when the strips alone
    // fill L2 (written back by the pack before they are read). At K = 4096, `mc` = 48
    // measured 1.2x `mc` = 24 with `nc` 128; at K = 11,008 one 1.4 MiB strip (`nc` 32) ran
    // 3-12% ahead of `nc` 64-128, and `mc` 48-96 ahead of 24.
    let l2 = p.l2_bytes as f64;
    let b_block = nc * kf * 4.0;
    let b_ns = if b_block + a_block > l2 {
        let first = if b_block >= l2 { 1.0 } else { 0.0 };
        ((rows / mc).ceil() - 1.0 + first) * nn * kf * 4.0 / l3_bw
    } else {
        0.0
    };
    let strip_ns = match p.outer_record_strip_ns {
        Some(ns) if crate::packed::record_layout(dtype).is_some() => ns,
        _ => 1.0 / p.dequant_elems_per_ns + p.outer_strip_pack_ns,
    };
    // Packing: activations transposed once, weights dequantized and transposed once; lane
    // sums stored per tile and lane, then eight loads, the tree and a store per 8 outputs:
    // ~1.5 ns an output. (Fit on a Zen3 to the measured crossover with the macro tiles, 2
    // units, alternating: equal at 512 × 576 × 576 Q4_1, the outer tile 8% ahead at 512 ×
    // 576 × 1536 f32, 20% at K = 1536, 30% at K = 4096.)
    let mut extra_ns =
        rows * kf / (p.dequant_elems_per_ns * 2.0) + nn * kf * strip_ns + rows * nn * 1.5;
    // Per tile, strip and lane: a call of ~25 cycles of setup and stores.
    extra_ns += (rows / mr as f64).ceil() * strips * 8.0 * 8.0;
    extra_ns += 0.3 * (a_ns + b_ns);
    (compute_ns.max(mem_ns) + extra_ns + 0.2 * compute_ns.min(mem_ns)) / 1000.0 + p.dispatch_us
}

/// The panel kernel (and the integer-dot family).
fn predict_panel_us(
    p: &MachineProfile,
    plan: &Plan,
    m: usize,
    k: usize,
    n: usize,
    dtype: DType,
) -> f64 {
    let t = &plan.tile;
    let (mp, np) = plan.parallel.parts();
    let units = (mp * np) as f64;
    let mm = m.div_ceil(mp) as f64;
    let nn = (n.div_ceil(np)).div_ceil(8) as f64 * 8.0;
    let kf = k as f64;
    let flops = 2.0 * mm * nn * kf;
    // Compute: each m block is covered by full `mr`-row tiles plus one narrower remainder
    // tile, each at its own measured rate.
    let rate = p.tile_gflops(t.family, t.mr, t.nr, k);
    let rows = m.div_ceil(mp);
    let mcb = t.mc.clamp(1, rows.max(1));
    let rows_time = |r: usize| -> f64 {
        let full = (r / t.mr) as f64 * 2.0 * (t.mr as f64) * nn * kf / rate;
        let rem = r % t.mr;
        let part = if rem > 0 {
            2.0 * rem as f64 * nn * kf / p.tile_gflops(t.family, rem, t.nr, k)
        } else {
            0.0
        };
        full + part
    };
    let compute_ns = (rows / mcb) as f64 * rows_time(mcb) + rows_time(rows % mcb);

    let bpw = bytes_per_weight(dtype);
    let mc = t.mc.max(1) as f64;
    let nc = t.nc.max(1) as f64;
    let m_blocks = (mm / mc).ceil();
    let n_blocks = (nn / nc).ceil();
    // Weights come from DRAM once per unit; every unit streams its own share.
    let weight_bytes = nn * kf * bpw;
    let dram_bw = p.dram_gbs / units; // bytes per ns per unit
    let mut mem_ns = weight_bytes / dram_bw;
    let act_bytes_per_row = match t.family {
        KernelFamily::F32Dot => kf * 4.0,
        KernelFamily::Q8Interleaved | KernelFamily::QkDot => kf * 1.125,
    };
    // Activations are re-read once per weight block; from L2 if the unit's rows fit.
    let act_bytes = mm * act_bytes_per_row;
    let act_bw = if act_bytes <= p.l2_bytes as f64 * 0.5 {
        p.l2_gbs_per_core
    } else {
        p.l3_gbs / units
    };
    mem_ns += (n_blocks - 1.0).max(0.0) * act_bytes / act_bw;
    let mut extra_ns = 0.0;
    match t.family {
        KernelFamily::F32Dot => {
            // Each weight block is dequantized once into a panel, then re-read per m block.
            extra_ns += nn * kf / p.dequant_elems_per_ns;
            let panel = nc * kf * 4.0;
            let panel_bw = if panel <= p.l2_bytes as f64 * 0.5 {
                p.l2_gbs_per_core
            } else {
                p.l3_gbs / units
            };
            mem_ns += (m_blocks - 1.0).max(0.0) * nn * kf * 4.0 / panel_bw;
            if panel > p.l2_bytes as f64 {
                extra_ns += flops * 0.2 / rate; // the tile streams weights from L3
            }
        }
        KernelFamily::Q8Interleaved | KernelFamily::QkDot => {
            // Weight blocks are re-read per m block (from L2 when the block fits).
            let blk = nc * kf * bpw;
            let bw = if blk <= p.l2_bytes as f64 * 0.5 {
                p.l2_gbs_per_core
            } else {
                p.dram_gbs / units
            };
            mem_ns += (m_blocks - 1.0).max(0.0) * weight_bytes / bw;
            // Activation quantization runs on the calling unit before the parallel part.
            extra_ns += (m * k) as f64 / p.quant_elems_per_ns;
        }
    }
    // Per register tile: loop and write-back overheads (~15 ns).
    let tiles = (mm / t.mr as f64).ceil() * (nn / t.nr as f64).ceil();
    extra_ns += tiles * 15.0;
    (compute_ns.max(mem_ns) + extra_ns) / 1000.0 + p.dispatch_us
}
