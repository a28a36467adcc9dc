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

use crate::plan::{KernelFamily, Plan};

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
    pub l2_bytes: usize,
    pub l3_bytes: usize,
    /// Measured throughput of each register tile on cache-resident data, one unit.
    #[serde(default)]
    pub tiles: Vec<TileRate>,
}

/// One register tile's measured throughput.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TileRate {
    pub family: String,
    pub mr: usize,
    pub nr: usize,
    pub gflops: f64,
}

/// Short name of a family in profiles.
pub fn family_name(f: KernelFamily) -> &'static str {
    match f {
        KernelFamily::F32Dot => "f32dot",
        KernelFamily::Q8Interleaved => "q8x8",
    }
}

impl MachineProfile {
    /// Throughput of a tile: measured if the profile has it, else the family peak scaled
    /// by the analytic tile efficiency.
    pub fn tile_gflops(&self, family: KernelFamily, mr: usize, nr: usize, k: usize) -> f64 {
        let name = family_name(family);
        if let Some(t) = self
            .tiles
            .iter()
            .find(|t| t.family == name && t.mr == mr && t.nr == nr)
        {
            return t.gflops;
        }
        let peak = match family {
            KernelFamily::F32Dot => self.f32_gflops_per_core,
            KernelFamily::Q8Interleaved => self.q8_gflops_per_core,
        };
        peak * tile_efficiency(family, mr, nr, k)
    }
}

impl MachineProfile {
    /// Defaults measured on the 2-vCPU Zen3 EPYC this project is developed on (AVX2+FMA,
    /// 512 KiB L2), used when no measured profile is cached; `tessera tune` measures the
    /// machine it runs on.
    pub fn default_for(cpu: &str) -> Self {
        MachineProfile {
            cpu: cpu.to_string(),
            f32_gflops_per_core: 40.0,
            q8_gflops_per_core: 63.0,
            dram_gbs: 12.5,
            l2_gbs_per_core: 100.0,
            l3_gbs: 120.0,
            dequant_elems_per_ns: 6.0,
            quant_elems_per_ns: 1.8,
            dispatch_us: 0.6,
            l2_bytes: 512 << 10,
            l3_bytes: 32 << 20,
            // Measured on a Zen3 EPYC vCPU (`tessera tune` replaces them with this machine's).
            tiles: [
                ("f32dot", 1, 4, 27.6),
                ("f32dot", 2, 4, 35.6),
                ("f32dot", 3, 4, 38.2),
                ("f32dot", 4, 3, 26.1),
                ("f32dot", 2, 2, 26.8),
                ("f32dot", 1, 8, 26.7),
                ("f32dot", 4, 2, 34.7),
                ("f32dot", 1, 1, 8.7),
                ("q8x8", 1, 8, 55.3),
                ("q8x8", 2, 8, 59.2),
                ("q8x8", 3, 8, 63.8),
                ("q8x8", 4, 8, 58.8),
            ]
            .iter()
            .map(|&(f, mr, nr, g)| TileRate {
                family: f.into(),
                mr,
                nr,
                gflops: g,
            })
            .collect(),
        }
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
    }
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
        KernelFamily::Q8Interleaved => kf * 1.125,
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
        KernelFamily::Q8Interleaved => {
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
