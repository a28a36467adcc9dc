//! The stream kernel's prediction: weights decoded in registers per tile, read from DRAM
//! once per call and re-read from cache by every further row tile.

use tessera_core::DType;

use super::{
    bytes_per_weight, first_read_bw, first_read_from_dram, tiles_compute_ns, MachineProfile,
};
use crate::plan::Plan;

/// The stream kernel: weights read from DRAM once (re-read from cache by every further
/// `mr`-row tile when the `nc` block of stored rows fits L2, else from DRAM again), decoded
/// in registers per tile; compute at the tile's measured Q4_1 rate adjusted for the dtype's
/// decode cost.
pub(super) fn predict_stream_us(
    p: &MachineProfile,
    plan: &Plan,
    m: usize,
    k: usize,
    n: usize,
    dtype: DType,
) -> f64 {
    let t = &plan.tile;
    let (mr, nr) = crate::exact::stream_tile_of(dtype, t.mr, t.nr);
    let (mp, np) = plan.parallel.parts();
    let units = (mp * np) as f64;
    let rows = m.div_ceil(mp);
    let nn = (n.div_ceil(np)).div_ceil(8) as f64 * 8.0;
    let kf = k as f64;
    let rate_of = |r: usize| {
        let (r, q) = crate::exact::stream_tile_of(dtype, r, nr);
        p.stream_tile_gflops(dtype, r, q, k)
    };
    let compute_ns = tiles_compute_ns(rows, mr, nn * kf, rate_of);
    let bpw = bytes_per_weight(dtype);
    let weight_bytes = nn * kf * bpw;
    let tiles_m = rows.div_ceil(mr) as f64;
    let dram_bw = p.dram_gbs / units;
    // A tile reading one stored row at a time gives the prefetchers one stream: a sweep on
    // an Intel Xeon measured about 0.7 times the bandwidth of tiles reading two or more.
    let streams = if nr == 1 { 0.7 } else { 1.0 };
    // Short tiles read slower from DRAM. The model reads a unit's weights from DRAM once
    // they pass half its L2, as a model step does (its weights pass L3 between one use and
    // the next). From L3 the 1x4 runs level with the 1x8 or up to 4% ahead, but charging
    // the share only past L3 would keep the 1x4 at 1 × 576 × 576 and 1 × 576 × 1536 f32,
    // where it runs 0.78-0.80 of the 1x8 from DRAM.
    let share = if first_read_from_dram(p, weight_bytes) {
        short_tile_share(dtype, mr, nr, kf)
    } else {
        1.0
    };
    let first_bw = first_read_bw(p, weight_bytes, units);
    let first_ns = weight_bytes / (first_bw * streams * share);
    let block = t.nc.max(1) as f64 * kf * bpw;
    let block_in_l2 = block <= p.l2_bytes as f64 * 0.5;
    let reread_bw = if block_in_l2 {
        p.l2_gbs_per_core
    } else {
        dram_bw
    };
    let reread_ns = (tiles_m - 1.0).max(0.0) * weight_bytes / (reread_bw * streams);
    // Per tile: lane trees, writes and row setup (~3 ns).
    let tiles = tiles_m * (nn / nr as f64).ceil();
    let tiles_ns = tiles * 3.0;
    if first_read_from_dram(p, weight_bytes) && block_in_l2 && tiles_m > 1.0 {
        // Weights from DRAM, each `nc` block re-read from L2 by the later row tiles: only
        // the first tile's pass overlaps the DRAM read (its far prefetch); the later passes
        // run on cached rows at the FMAs' pace, after it. (One sum over the passes predicts
        // 8 × 1536 × 576 f32 from DRAM on the 3 × 2 tile 1.55x too fast, Zen 4.)
        let first_rows = rows.min(mr);
        let compute_first = 2.0 * first_rows as f64 * nn * kf / rate_of(first_rows);
        let later = (compute_ns - compute_first).max(reread_ns);
        let body = compute_first.max(first_ns) + later;
        let extra_ns = tiles_ns + 0.3 * compute_first.min(first_ns);
        return (body + extra_ns) / 1000.0 + p.dispatch_us;
    }
    let mem_ns = first_ns + reread_ns;
    // The re-reads of every further row tile overlap the FMAs only in part.
    let extra_ns = tiles_ns + 0.3 * compute_ns.min(mem_ns);
    (compute_ns.max(mem_ns) + extra_ns) / 1000.0 + p.dispatch_us
}

/// A stored row shorter than this many bytes is short (see [`short_tile_share`]).
const SHORT_ROW_BYTES: f64 = 16384.0;

/// The share of the DRAM bandwidth a one-activation-row stream tile of `nr` stored rows of
/// `k` elements reaches: its rows are `nr` interleaved streams, and over short rows
/// ([`SHORT_ROW_BYTES`]) fewer than 8 of them keep fewer misses in flight than the memory
/// system takes. Zen 4, 2 units, f32 from DRAM (cold copies), the 1x4 tile against the
/// 1x8: 0.78-0.80 at K = 576 (576 × 576, 576 × 1536; 0.87 at 576 × 49,152), 0.85 at
/// K = 1536, level at K = 4096, and 1.1x at K = 11,008 (which the model leaves level);
/// the 1x8 read at the full rate. Tiles over records (16 rows each) and tiles of several
/// activation rows, whose weight bytes are spread over more FMAs, are left at 1.
fn short_tile_share(dtype: DType, mr: usize, nr: usize, kf: f64) -> f64 {
    if mr > 1 || crate::exact::stream_on_records(dtype) {
        return 1.0;
    }
    if kf * bytes_per_weight(dtype) >= SHORT_ROW_BYTES {
        return 1.0;
    }
    0.6 + 0.4 * (nr as f64 / 8.0).min(1.0)
}
