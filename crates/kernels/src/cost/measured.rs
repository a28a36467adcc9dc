//! Cost profiles of CPU classes that have no built-in one (`super::profiles`): measured the
//! first time Tessera plans on such a class, then cached per class and instruction set in
//! `<cache>/cost-profiles.json`.
//!
//! The measurement (`calibrate::measure_profile`, about two seconds) gives every figure of
//! the machine: FMA and integer-dot peaks, DRAM bandwidth, dispatch cost, decode and
//! quantization rates, cache sizes, and the rate of every register tile. Tile rates from
//! small products rank some kernels wrongly against whole products (the built-in tables
//! were fitted to those), so the profile keeps the nearest built-in table's *relative* rates
//! within each kernel family and takes each family's level from the measurement
//! ([`anchor`]); everything else is the measured figure.
//!
//! `TESSERA_KERNEL_CHECK` steers it as it does the kernel variants (`crate::variants`):
//! `remeasure` measures again, `skip` measures nothing (the cached profile, else the nearest
//! built-in table).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use super::{MachineProfile, TileRate};
use crate::variants::{CheckMode, CpuClass, KERNEL_SET};

/// The cache file.
pub fn cache_path() -> PathBuf {
    tessera_core::cache_dir().join("cost-profiles.json")
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    kernel_set: String,
    profile: MachineProfile,
}

/// The cache key of this CPU class running these kernels.
fn key(class: &CpuClass) -> String {
    format!("{} {}", class.key(), crate::Isa::active().name())
}

fn read(path: &Path) -> BTreeMap<String, Entry> {
    crate::variants::read_json(path).unwrap_or_else(|e| {
        eprintln!("warning: cost profile cache {e}; measuring again");
        BTreeMap::new()
    })
}

/// `base`'s tiles at the level `measured` found: each kernel family's rates scaled by the
/// median ratio of measured to built-in rate over the tiles both rate (a family only one of
/// them rates keeps that one's figures). Every other field is `measured`'s.
pub fn anchor(base: &MachineProfile, measured: &MachineProfile) -> MachineProfile {
    let mut out = measured.clone();
    let mut tiles: Vec<TileRate> = Vec::new();
    let families: Vec<&str> = {
        let mut f: Vec<&str> = base.tiles.iter().map(|t| t.family.as_str()).collect();
        f.sort();
        f.dedup();
        f
    };
    for fam in &families {
        let mut ratios: Vec<f64> = base
            .tiles
            .iter()
            .filter(|t| t.family == *fam)
            .filter_map(|b| {
                measured
                    .tiles
                    .iter()
                    .find(|m| m.family == b.family && m.mr == b.mr && m.nr == b.nr)
                    .filter(|m| m.gflops > 0.0 && b.gflops > 0.0)
                    .map(|m| m.gflops / b.gflops)
            })
            .collect();
        ratios.sort_by(f64::total_cmp);
        match ratios.get(ratios.len() / 2) {
            Some(&r) => {
                tiles.extend(
                    base.tiles
                        .iter()
                        .filter(|t| t.family == *fam)
                        .map(|t| TileRate {
                            gflops: t.gflops * r,
                            ..t.clone()
                        }),
                )
            }
            None if measured.tiles.iter().any(|t| t.family == *fam) => {
                tiles.extend(measured.tiles.iter().filter(|t| t.family == *fam).cloned())
            }
            None => tiles.extend(base.tiles.iter().filter(|t| t.family == *fam).cloned()),
        }
    }
    tiles.extend(
        measured
            .tiles
            .iter()
            .filter(|t| !families.contains(&t.family.as_str()))
            .cloned(),
    );
    out.tiles = tiles;
    out
}

/// This class's measured profile: cached, else measured now and cached; `None` under
/// `TESSERA_KERNEL_CHECK=skip` with nothing cached.
pub fn profile() -> Option<&'static MachineProfile> {
    static P: OnceLock<Option<MachineProfile>> = OnceLock::new();
    P.get_or_init(|| {
        let mode = CheckMode::parse(std::env::var("TESSERA_KERNEL_CHECK").ok().as_deref())
            .unwrap_or(CheckMode::Auto);
        let class = CpuClass::detect();
        let path = cache_path();
        let mut file = read(&path);
        let k = key(&class);
        let cached = file
            .get(&k)
            .filter(|e| e.kernel_set == KERNEL_SET)
            .map(|e| e.profile.clone());
        match (mode, cached) {
            (CheckMode::Auto | CheckMode::Skip, Some(p)) => Some(p),
            (CheckMode::Skip, None) => None,
            _ => {
                eprintln!(
                    "measuring the cost profile of {k} (no built-in profile for this CPU class; \
                     once, about two seconds)"
                );
                let t = std::time::Instant::now();
                let units = std::thread::available_parallelism().map_or(1, |n| n.get());
                let pool = tessera_runtime::ThreadPool::new(units);
                let measured = crate::calibrate::measure_profile(&pool, &mut |_| {});
                let base = MachineProfile::nearest_builtin(&measured.cpu);
                let p = anchor(&base, &measured);
                eprintln!("measured in {:.1} s", t.elapsed().as_secs_f64());
                file.insert(
                    k,
                    Entry {
                        kernel_set: KERNEL_SET.to_string(),
                        profile: p.clone(),
                    },
                );
                if let Err(e) = crate::variants::write_json(&path, &file) {
                    eprintln!("warning: cost profile cache {e}");
                }
                Some(p)
            }
        }
    })
    .as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tile(family: &str, mr: usize, nr: usize, gflops: f64) -> TileRate {
        TileRate {
            family: family.into(),
            mr,
            nr,
            gflops,
        }
    }

    #[test]
    fn anchoring_keeps_relative_rates_and_takes_the_measured_level() {
        let mut base = MachineProfile::avx2_default("base");
        base.tiles = vec![
            tile("f32dot", 1, 4, 40.0),
            tile("f32dot", 3, 4, 60.0),
            tile("f32dot", 4, 2, 50.0),
            tile("q8x8", 1, 8, 80.0),
        ];
        let mut measured = MachineProfile::avx2_default("measured");
        measured.dram_gbs = 55.0;
        measured.tiles = vec![
            // Ratios 2.0, 1.5 (mis-ranked against the fitted 3 x 4), 2.0: median 2.0.
            tile("f32dot", 1, 4, 80.0),
            tile("f32dot", 3, 4, 90.0),
            tile("f32dot", 4, 2, 100.0),
            tile("f32stream16", 1, 16, 70.0),
        ];
        let p = anchor(&base, &measured);
        assert_eq!(p.dram_gbs, 55.0);
        let rate = |f: &str, mr, nr| {
            p.tiles
                .iter()
                .find(|t| t.family == f && t.mr == mr && t.nr == nr)
                .map(|t| t.gflops)
        };
        assert_eq!(rate("f32dot", 1, 4), Some(80.0));
        assert_eq!(rate("f32dot", 3, 4), Some(120.0));
        assert_eq!(rate("f32dot", 4, 2), Some(100.0));
        // Only the base rates q8x8: kept; only the measurement rates the stream tile: taken.
        assert_eq!(rate("q8x8", 1, 8), Some(80.0));
        assert_eq!(rate("f32stream16", 1, 16), Some(70.0));
        assert_eq!(p.tiles.len(), 5);
    }

    #[test]
    fn built_in_profiles_cover_the_classes_they_were_measured_on() {
        use super::super::{builtin_for_class, Builtin};
        let c = |vendor: &str, family, model| CpuClass {
            vendor: vendor.into(),
            family,
            model,
            stepping: 1,
        };
        assert_eq!(
            builtin_for_class(&c("GenuineIntel", 6, 207), true),
            Some(Builtin::XeonAvx512)
        );
        assert_eq!(
            builtin_for_class(&c("AuthenticAMD", 25, 17), true),
            Some(Builtin::Zen4)
        );
        // A Xeon model no profile was measured on, or one running the AVX2 kernels: measured.
        assert_eq!(builtin_for_class(&c("GenuineIntel", 6, 167), true), None);
        assert_eq!(builtin_for_class(&c("GenuineIntel", 6, 207), false), None);
        assert_eq!(builtin_for_class(&c("HygonGenuine", 24, 1), false), None);
    }
}
