//! The built-in machine profiles: what the cost model assumes about a CPU of a class it was
//! measured on, one table per class; other classes are measured (`super::measured`).

use super::{MachineProfile, TileRate};
use crate::variants::CpuClass;

/// The CPU classes a built-in profile was measured on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Builtin {
    /// Intel Sapphire and Emerald Rapids (family 6, models 143 and 207) with the AVX-512
    /// kernels: [`MachineProfile::avx512_default`].
    XeonAvx512,
    /// AMD Zen 4 (family 25 with AVX-512) with the AVX-512 kernels:
    /// [`MachineProfile::zen4_default`].
    Zen4,
    /// AMD Zen 3 (family 25 without AVX-512) on the AVX2 kernels:
    /// [`MachineProfile::avx2_default`].
    Zen3,
}

/// The built-in profile measured on `class` running these kernels (`avx512`: the exact
/// path's AVX-512 kernels run), if there is one. Any other class is measured
/// (`super::measured`).
pub fn builtin_for_class(class: &CpuClass, avx512: bool) -> Option<Builtin> {
    match (class.vendor.as_str(), class.family, avx512) {
        ("GenuineIntel", 6, true) if matches!(class.model, 143 | 207) => Some(Builtin::XeonAvx512),
        ("AuthenticAMD", 25, true) => Some(Builtin::Zen4),
        ("AuthenticAMD", 25, false) if !crate::isa::CpuFeatures::detect().avx512 => {
            Some(Builtin::Zen3)
        }
        _ => None,
    }
}

impl MachineProfile {
    /// The cost profile for this CPU and the kernels this process runs: the built-in one
    /// where it was measured on this CPU class ([`builtin_for_class`]), else this class's
    /// own measured profile (`super::measured`: measured on first use and cached). Cache
    /// sizes come from the system where it tells them.
    pub fn default_for(cpu: &str) -> Self {
        let class = crate::variants::CpuClass::detect();
        let builtin = builtin_for_class(&class, crate::isa::avx512_exact());
        match builtin {
            Some(b) => Self::builtin(b, cpu).with_system_caches(),
            None => match super::measured::profile() {
                Some(m) => {
                    let mut m = m.clone();
                    m.cpu = cpu.to_string();
                    m.with_system_caches()
                }
                None => Self::nearest_builtin(cpu),
            },
        }
    }

    /// Cache sizes from the system where it tells them.
    fn with_system_caches(mut self) -> Self {
        self.l1_bytes = crate::calibrate::cache_bytes("L1", self.l1_bytes);
        self.l2_bytes = crate::calibrate::cache_bytes("L2", self.l2_bytes);
        self.l3_bytes = crate::calibrate::cache_bytes("L3", self.l3_bytes);
        self
    }

    /// One built-in profile.
    pub fn builtin(b: Builtin, cpu: &str) -> Self {
        match b {
            Builtin::XeonAvx512 => Self::avx512_default(cpu),
            Builtin::Zen4 => Self::zen4_default(cpu),
            Builtin::Zen3 => Self::avx2_default(cpu),
        }
    }

    /// The built-in profile of the kernels this process runs, whatever the CPU class: where
    /// the AVX-512 kernels run, [`Self::zen4_default`] on AMD (AVX-512 at half the width per
    /// cycle) and [`Self::avx512_default`] elsewhere; else [`Self::avx2_default`]. What a
    /// measured profile starts from (its fitted terms stay; every measured figure replaces
    /// its own), and what `TESSERA_KERNEL_CHECK=skip` takes on a class without a profile.
    pub fn nearest_builtin(cpu: &str) -> Self {
        let p = match (crate::isa::avx512_exact(), crate::isa::cpu_is_amd()) {
            (true, true) => Self::zen4_default(cpu),
            (true, false) => Self::avx512_default(cpu),
            (false, _) => Self::avx2_default(cpu),
        };
        p.with_system_caches()
    }

    /// Measured on 2 vCPUs of an Intel Xeon with AVX-512 (F/BW/DQ/VL/VNNI, 2 MiB L2 per
    /// core), by `calibrate::measure_profile` (the `print_profile` test), rounded.
    pub fn avx512_default(cpu: &str) -> Self {
        let tiles = [
            ("f32dot", 1, 4, 43.0),
            ("f32dot", 2, 4, 60.7),
            ("f32dot", 3, 4, 69.4),
            ("f32dot", 4, 3, 50.6),
            ("f32dot", 2, 2, 46.8),
            ("f32dot", 1, 8, 51.2),
            ("f32dot", 4, 2, 58.8),
            ("f32dot", 1, 1, 21.2),
            // The stream tiles are rated by whole products: rated 42.1, 48.6, 43.9 and 54.0
            // instead, at M = 2-8, 576 × 576 to 4096 × 4096, 2 units, interleaved, they run
            // 1.2-1.4x (Q4_1 2 × 16) and 1.9-2.0x (Q8_0 2 × 16) their predicted time where
            // the outer-product tile runs 0.83-0.95x its own. One-unit whole products at
            // M = 8 are level with `print_tile_rates` for Q4_1 2 × 16 (38.5 against
            // 37.9-39.1) and below it for Q8_0 (29.5 against 34.8-47.3). Two Q4_1 rows run
            // 1.6-1.7x one row (one unit, whole products), two Q8_0 rows 1.22-1.33x.
            ("f32stream16", 1, 16, 22.5),
            ("f32stream16", 2, 16, 36.0),
            ("f32stream16@q8_0", 1, 16, 24.4),
            ("f32stream16@q8_0", 2, 16, 30.0),
            ("f32stream@f32", 1, 8, 38.1),
            ("f32stream@f32", 1, 4, 37.1),
            ("f32stream@f32", 2, 2, 51.3),
            ("f32stream@f32", 3, 2, 61.3),
            ("f32stream@f32", 4, 1, 46.5),
            ("f32packed16", 8, 4, 104.5),
            ("f32packed16", 6, 4, 107.8),
            ("f32packed16", 4, 4, 100.2),
            ("f32packed16", 8, 2, 86.8),
            // The outer-product tile at AVX-512 width (`x86::avx512_outer`), measured on
            // an Emerald Rapids Xeon (one-unit peak 170): 150-170 alone on L1 data
            // (`time_outer_tile`), whole products level with the 6 × 4 macro tile
            // (`time_exact_kernels`, interleaved); the rate fits those with the packing,
            // finish and activation traffic costed apart (`predict_outer_us`).
            ("f32packed16", 12, 32, 105.0),
            ("f32packed16", 8, 32, 105.0),
            ("q8x8", 1, 8, 89.7),
            ("q8x8", 2, 8, 101.6),
            ("q8x8", 3, 8, 94.6),
            ("q8x8", 4, 8, 101.6),
        ];
        MachineProfile {
            cpu: cpu.to_string(),
            f32_gflops_per_core: 70.0,
            q8_gflops_per_core: 102.0,
            dram_gbs: 20.0,
            l2_gbs_per_core: 100.0,
            l3_gbs: 120.0,
            dequant_elems_per_ns: 10.5,
            quant_elems_per_ns: 2.4,
            // Whole products against the model, 2 units, interleaved, without it: the
            // 6 × 4 and 8 × 4 macro tiles run 0.94-1.16x their prediction at K = 576,
            // 1.17-1.25x at K = 1536 and 1.37-1.56x at K = 4096, M = 16-128; the outer
            // tile 0.87-1.10x throughout.
            packed_k_slowdown: 0.15,
            // Without it the macro tile at M = 8 runs 1.3-1.7x its prediction on Q4_1 and
            // Q8_0 weights (576 × 576 to 4096 × 4096, 2 units, interleaved) and 0.9x on f32
            // (a copy); 0.1 ns an element, as the outer tile's strips are charged, matches
            // the difference within 10%.
            packed_quant_pack_ns: 0.1,
            outer_strip_pack_ns: super::default_outer_strip_pack_ns(),
            outer_record_strip_ns: None,
            dispatch_us: 0.7,
            l1_bytes: 48 << 10,
            l2_bytes: 2 << 20,
            l3_bytes: 32 << 20,
            tiles: rates(&tiles),
        }
    }

    /// Measured on 2 vCPUs of an AMD EPYC Zen 4 (AVX-512 on 256-bit units: the same FMA
    /// peak per cycle as AVX2, 32 KiB L1d, 1 MiB L2 per core, 32 MiB L3), by
    /// `calibrate::measure_profile` (`print_profile`, `print_tile_rates`), the mean of two
    /// quiet runs, rounded (the AVX2 f32 stream tiles ordered as the sweeps found them);
    /// the outer-product tile and the macro tile's K slowdown fitted to whole products.
    pub fn zen4_default(cpu: &str) -> Self {
        let tiles = [
            ("f32dot", 1, 4, 36.0),
            ("f32dot", 2, 4, 51.0),
            ("f32dot", 3, 4, 62.0),
            ("f32dot", 4, 3, 37.0),
            ("f32dot", 2, 2, 34.0),
            ("f32dot", 1, 8, 42.0),
            ("f32dot", 4, 2, 55.0),
            ("f32dot", 1, 1, 14.0),
            // The stream kernel with its shift-and-select decode and far prefetch
            // (`print_tile_rates`, the mean of two quiet runs), except the Q4_1 2 × 16 tile,
            // fitted to whole products: rated 64.2, those at M = 8-16, K 1536-11,008, 2
            // units, ran 1.09-1.18x the predicted time. The decodes by the exponent field
            // scale each rate by the ratio `print_tile_rates` reads with them to without
            // (three alternations): Q4_1 1 × 16 48.0 → 49.3, 2 × 16 69.3 → 74.3; Q8_0
            // 1 × 16 41.3 → 48.3, 2 × 16 37.8 → 39.9.
            ("f32stream16", 1, 16, 38.4),
            ("f32stream16", 2, 16, 61.1),
            ("f32stream16@q8_0", 1, 16, 45.4),
            ("f32stream16@q8_0", 2, 16, 36.2),
            // (1x8 and 1x4 swapped places between the two runs; in three sweeps the 1x4
            // tile won M = 1 more often: rated so.)
            ("f32stream@f32", 1, 8, 31.0),
            ("f32stream@f32", 1, 4, 34.0),
            ("f32stream@f32", 2, 2, 39.0),
            ("f32stream@f32", 3, 2, 49.5),
            ("f32stream@f32", 4, 1, 37.5),
            ("f32packed16", 8, 4, 95.0),
            ("f32packed16", 6, 4, 100.0),
            ("f32packed16", 4, 4, 93.0),
            ("f32packed16", 8, 2, 58.0),
            // The outer-product tile (`x86::avx512_outer`), rated here because unrated the
            // fallback estimate ranks it last: 105-111 alone on L1 data (`time_outer_tile`,
            // one-unit peak 115), 85-93 in `print_tile_rates`' small product. Whole
            // products, 2 units, against the macro tile the profile would choose without it:
            // 1.07-1.52x at M = 16-512 and K 1536-11,008 (all three
            // dtypes), 0.94-0.98x at K = 576 (M = 512), where this rating keeps the macro
            // tile; 100 predicts them within 0.92-1.17 (the strips charged as below).
            ("f32packed16", 12, 32, 100.0),
            ("f32packed16", 8, 32, 100.0),
            ("q8x8", 1, 8, 73.0),
            ("q8x8", 2, 8, 77.0),
            ("q8x8", 3, 8, 86.0),
            ("q8x8", 4, 8, 103.0),
        ];
        MachineProfile {
            cpu: cpu.to_string(),
            f32_gflops_per_core: 62.0,
            q8_gflops_per_core: 90.0,
            dram_gbs: 31.7,
            l2_gbs_per_core: 100.0,
            l3_gbs: 120.0,
            dequant_elems_per_ns: 7.5,
            quant_elems_per_ns: 1.96,
            // The 6 × 4 macro tile at M = 512, 2 units: 0.95x its prediction at K = 576,
            // 1.10x at K = 1536, 1.12-1.14x at K = 4096, 1.29x at K = 11,008.
            packed_k_slowdown: 0.07,
            packed_quant_pack_ns: 0.0,
            // The outer tile's whole products at M = 8-64 (Q4_1, Q8_0; 2 units) fit
            // 111 GFLOP/s per unit plus 0.167 ns per strip element: the decode rate below
            // (0.133 ns) and 0.03 more. The Zen3's 0.1 charged 1.2x the measured time at
            // M = 16.
            outer_strip_pack_ns: 0.03,
            // Strips decoded straight from the records, with the next block hinted into
            // L2 (`exact::ahead`): 8-64 × 576 × 1536 Q4_1 from DRAM runs 1.02-1.21x the
            // macro and stream tiles, about 0.05-0.075 ns a weight beyond the tile's FMAs;
            // 8- and 16-client serving runs 1.02-1.12x with it.
            outer_record_strip_ns: Some(0.06),
            dispatch_us: 0.44,
            l1_bytes: 32 << 10,
            l2_bytes: 1 << 20,
            l3_bytes: 32 << 20,
            tiles: rates(&tiles),
        }
    }

    /// Measured on the 2-vCPU Zen3 EPYC this project was first developed on (AVX2+FMA,
    /// 512 KiB L2).
    pub fn avx2_default(cpu: &str) -> Self {
        MachineProfile {
            cpu: cpu.to_string(),
            f32_gflops_per_core: 40.0,
            q8_gflops_per_core: 63.0,
            // `bench gemm` and `print_profile` on the Zen3 read 18-23 GB/s with the record
            // kernels' far prefetch.
            dram_gbs: 22.0,
            l2_gbs_per_core: 100.0,
            l3_gbs: 120.0,
            dequant_elems_per_ns: 6.0,
            quant_elems_per_ns: 1.8,
            packed_k_slowdown: 0.0,
            packed_quant_pack_ns: 0.0,
            outer_strip_pack_ns: super::default_outer_strip_pack_ns(),
            outer_record_strip_ns: None,
            dispatch_us: 0.5,
            l1_bytes: 32 << 10,
            l2_bytes: 512 << 10,
            l3_bytes: 32 << 20,
            // Measured on a Zen3 EPYC vCPU (`tessera tune` replaces them with this machine's).
            tiles: rates(&[
                ("f32dot", 1, 4, 27.6),
                ("f32dot", 2, 4, 35.6),
                ("f32dot", 3, 4, 38.2),
                ("f32dot", 4, 3, 26.1),
                ("f32dot", 2, 2, 26.8),
                ("f32dot", 1, 8, 26.7),
                ("f32dot", 4, 2, 34.7),
                ("f32dot", 1, 1, 8.7),
                // The stream kernel on the repack (`x86::avx2_records`, activation rows
                // expanded), Q4_1 and Q8_0, and on stored f32 rows (`x86::avx2_exact`):
                // `print_tile_rates`, the mean of four runs on a noisy host (±20% between
                // runs, the order of the tiles the same in each).
                ("f32stream", 1, 8, 24.7),
                ("f32stream", 2, 8, 35.6),
                ("f32stream", 3, 8, 36.3),
                ("f32stream", 4, 8, 41.0),
                ("f32stream@q8_0", 1, 8, 23.9),
                ("f32stream@q8_0", 2, 8, 36.0),
                ("f32stream@q8_0", 3, 8, 37.5),
                ("f32stream@q8_0", 4, 8, 41.6),
                ("f32stream@f32", 1, 8, 22.1),
                ("f32stream@f32", 1, 4, 23.6),
                ("f32stream@f32", 2, 2, 29.4),
                ("f32stream@f32", 3, 2, 38.2),
                ("f32stream@f32", 4, 1, 28.2),
                // The packed kernel (panels from the repack): the mean of three runs; 3 × 4
                // re-measured with the macro tile (`x86::avx2_packed`) as its ratio to the
                // unchanged 4 × 3 in the same runs (1.95x, median of eight).
                ("f32packed", 3, 4, 62.6),
                ("f32packed", 2, 4, 44.8),
                ("f32packed", 4, 3, 32.1),
                ("f32packed", 4, 2, 45.3),
                // The outer-product tile (`x86::avx2_outer::lane_tile`): 74-88 alone on L1
                // data (`time_outer_tile`, one-unit peak 90-97); 66 fits whole products
                // with the packing, finish and activation traffic costed apart
                // (`predict_outer_us`). `print_tile_rates`, whose small product includes
                // those, measured it at 0.87-0.9 of the 3 × 4 in the same runs.
                ("f32packed", 6, 16, 66.0),
                ("q8x8", 1, 8, 55.3),
                ("q8x8", 2, 8, 59.2),
                ("q8x8", 3, 8, 63.8),
                ("q8x8", 4, 8, 58.8),
            ]),
        }
    }
}

/// A profile's tile rates from `(name, mr, nr, GFLOP/s)` rows.
fn rates(table: &[(&str, usize, usize, f64)]) -> Vec<TileRate> {
    table
        .iter()
        .map(|&(f, mr, nr, g)| TileRate {
            family: f.into(),
            mr,
            nr,
            gflops: g,
        })
        .collect()
}
