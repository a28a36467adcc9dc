//! What a layer stage costs on one rank: [`MeasuredProfile`] (times measured on this machine
//! at a ladder of row counts, interpolated) or [`Roofline`] (a device's peak FLOP/s and
//! memory bandwidth applied to a model shape's FLOPs and bytes).

use serde::{Deserialize, Serialize};

use crate::shape::ModelShape;

/// One rank's stage costs, in seconds.
pub trait StageCost: Send + Sync {
    /// One layer's attention stage on `rows` rows that together attend `keys` keys (a
    /// prefill of L rows from position 0 attends L(L+1)/2).
    fn attn(&self, rows: usize, keys: usize) -> f64;
    /// One layer's MLP stage on `rows` rows.
    fn mlp(&self, rows: usize) -> f64;
    /// The embedding of `rows` rows.
    fn embed(&self, rows: usize) -> f64;
    /// Final norm and this rank's vocabulary slice of the head on `rows` rows.
    fn head(&self, rows: usize) -> f64;
}

/// Stage times measured at one row count (a fresh prefill of `rows` rows).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StagePoint {
    pub rows: usize,
    pub attn_s: f64,
    pub mlp_s: f64,
}

/// Stage times measured on this machine at a ladder of row counts (rows attending almost
/// nothing), interpolated linearly between them (and extrapolated from the end segments),
/// plus attention's cost per key attended beyond one per row; the head at a few logits-row
/// counts, interpolated the same way.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasuredProfile {
    /// Sorted by rows, at least one point.
    pub points: Vec<StagePoint>,
    /// Attention's time per key attended beyond the first of each row.
    #[serde(default)]
    pub attn_s_per_key: f64,
    /// `(logits rows, seconds)` of the final norm and head, sorted by rows.
    pub head: Vec<(usize, f64)>,
    /// The embedding's time per row.
    pub embed_s_per_row: f64,
}

/// `f` at `x` through `(x, f(x))` points sorted by x: linear between them, the end segments'
/// slopes beyond them, never below zero; 0 at x = 0.
fn interpolate(points: &[(usize, f64)], x: usize) -> f64 {
    if x == 0 || points.is_empty() {
        return 0.0;
    }
    if points.len() == 1 {
        return points[0].1 * x as f64 / points[0].0.max(1) as f64;
    }
    let i = points
        .partition_point(|q| q.0 < x)
        .clamp(1, points.len() - 1);
    let ((xa, ya), (xb, yb)) = (points[i - 1], points[i]);
    (ya + (yb - ya) * (x as f64 - xa as f64) / (xb as f64 - xa as f64)).max(0.0)
}

impl MeasuredProfile {
    fn interp(&self, rows: usize, f: impl Fn(&StagePoint) -> f64) -> f64 {
        let pts: Vec<(usize, f64)> = self.points.iter().map(|p| (p.rows, f(p))).collect();
        interpolate(&pts, rows)
    }
}

impl StageCost for MeasuredProfile {
    fn attn(&self, rows: usize, keys: usize) -> f64 {
        self.interp(rows, |p| p.attn_s) + keys.saturating_sub(rows) as f64 * self.attn_s_per_key
    }
    fn mlp(&self, rows: usize) -> f64 {
        self.interp(rows, |p| p.mlp_s)
    }
    fn embed(&self, rows: usize) -> f64 {
        rows as f64 * self.embed_s_per_row
    }
    fn head(&self, rows: usize) -> f64 {
        interpolate(&self.head, rows)
    }
}

/// A device's figures for the roofline.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Device {
    pub name: &'static str,
    /// Dense matrix-product peak, FLOP/s.
    pub peak_flops: f64,
    /// Memory bandwidth, bytes/s.
    pub mem_bytes_per_s: f64,
    /// Fraction of the peaks a well-tuned kernel reaches.
    pub efficiency: f64,
    /// Fixed cost per stage (kernel launches, dispatch), seconds.
    pub stage_overhead_s: f64,
    /// Bytes per weight and per activation element.
    pub weight_bytes: f64,
    pub act_bytes: usize,
}

impl Device {
    /// Presets: `a100`, `h100` (bf16 tensor-core peaks, HBM bandwidth).
    pub fn preset(name: &str) -> Option<Device> {
        let gpu = |name, tflops: f64, tbs: f64| Device {
            name,
            peak_flops: tflops * 1e12,
            mem_bytes_per_s: tbs * 1e12,
            efficiency: 0.7,
            stage_overhead_s: 30e-6,
            weight_bytes: 2.0,
            act_bytes: 2,
        };
        match name.to_ascii_lowercase().as_str() {
            "a100" => Some(gpu("a100", 312.0, 2.0)),
            "h100" => Some(gpu("h100", 989.0, 3.35)),
            _ => None,
        }
    }

    /// A CPU of `cores` cores at `gflops_per_core` (f32 FMA) and `dram_gbs`.
    pub fn cpu(gflops_per_core: f64, cores: usize, dram_gbs: f64, weight_bytes: f64) -> Device {
        Device {
            name: "cpu",
            peak_flops: gflops_per_core * 1e9 * cores as f64,
            mem_bytes_per_s: dram_gbs * 1e9,
            efficiency: 0.8,
            stage_overhead_s: 20e-6,
            weight_bytes,
            act_bytes: 4,
        }
    }
}

/// A roofline: each stage takes the larger of its FLOPs at the device's (efficient) peak and
/// its bytes (weights, K/V read) at its bandwidth, plus a fixed overhead; one rank holds
/// 1/`ranks` of every split weight and head.
#[derive(Debug, Clone, PartialEq)]
pub struct Roofline {
    pub shape: ModelShape,
    pub ranks: usize,
    pub device: Device,
}

impl Roofline {
    fn time(&self, flops: f64, bytes: f64) -> f64 {
        let d = &self.device;
        (flops / (d.peak_flops * d.efficiency)).max(bytes / (d.mem_bytes_per_s * d.efficiency))
            + d.stage_overhead_s
    }
}

impl StageCost for Roofline {
    fn attn(&self, rows: usize, keys: usize) -> f64 {
        let s = &self.shape;
        let r = self.ranks as f64;
        let (h, q, kv) = (s.hidden as f64, s.q_dim() as f64, s.kv_dim() as f64);
        let weights = h * (q + 2.0 * kv) + q * h;
        let flops = 2.0 * rows as f64 * weights / r + 4.0 * keys as f64 * q / r;
        let bytes = weights / r * self.device.weight_bytes
            + keys as f64 * 2.0 * kv / r * self.device.act_bytes as f64;
        self.time(flops, bytes)
    }
    fn mlp(&self, rows: usize) -> f64 {
        let s = &self.shape;
        let weights = 3.0 * s.hidden as f64 * s.intermediate as f64 / self.ranks as f64;
        self.time(
            2.0 * rows as f64 * weights,
            weights * self.device.weight_bytes,
        )
    }
    fn embed(&self, rows: usize) -> f64 {
        let bytes = (rows * self.shape.hidden) as f64 * self.device.weight_bytes;
        bytes / self.device.mem_bytes_per_s
    }
    fn head(&self, rows: usize) -> f64 {
        if rows == 0 {
            return 0.0;
        }
        let s = &self.shape;
        let weights = s.hidden as f64 * s.vocab as f64 / self.ranks as f64;
        self.time(
            2.0 * rows as f64 * weights,
            weights * self.device.weight_bytes,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile() -> MeasuredProfile {
        MeasuredProfile {
            points: vec![
                StagePoint {
                    rows: 1,
                    attn_s: 1.0,
                    mlp_s: 2.0,
                },
                StagePoint {
                    rows: 16,
                    attn_s: 4.0,
                    mlp_s: 8.0,
                },
                StagePoint {
                    rows: 64,
                    attn_s: 16.0,
                    mlp_s: 32.0,
                },
            ],
            attn_s_per_key: 0.25,
            head: vec![(1, 0.5), (4, 2.0)],
            embed_s_per_row: 0.0,
        }
    }

    #[test]
    fn measured_points_are_met_and_others_interpolated() {
        let p = profile();
        assert_eq!(p.attn(16, 0), 4.0);
        assert_eq!(p.mlp(64), 32.0);
        assert_eq!(p.attn(1, 0), 1.0);
        assert!((p.attn(40, 0) - 10.0).abs() < 1e-12);
        // Beyond the ladder: the last segment's slope.
        assert!((p.mlp(128) - 64.0).abs() < 1e-12);
        assert_eq!(p.mlp(0), 0.0);
        assert_eq!(p.head(4), 2.0);
        assert_eq!(p.head(2), 1.0);
        // Keys beyond one per row cost attention extra.
        assert_eq!(p.attn(16, 16 + 8), 4.0 + 8.0 * 0.25);
    }

    #[test]
    fn the_roofline_is_bandwidth_bound_for_few_rows_and_compute_bound_for_many() {
        let r = Roofline {
            shape: ModelShape::preset("llama-3-8b").unwrap(),
            ranks: 1,
            device: Device::preset("h100").unwrap(),
        };
        // One row: about the weights' bytes over the bandwidth.
        let one = r.mlp(1);
        let four = r.mlp(4);
        assert!((four - one).abs() / one < 0.01, "{one} {four}");
        // Many rows: linear in rows.
        let a = r.mlp(8192);
        let b = r.mlp(16384);
        assert!((b / a - 2.0).abs() < 0.05, "{a} {b}");
        // Halving per rank halves the big-step time.
        let r2 = Roofline {
            ranks: 2,
            ..r.clone()
        };
        assert!((r.mlp(16384) / r2.mlp(16384) - 2.0).abs() < 0.05);
    }
}
