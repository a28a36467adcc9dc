//! The tuning cache on disk (`<cache>/tuning.json`): the measured best plan per (CPU, units,
//! dtype, precision, shape bucket). `generate`, `serve` and the benchmarks load it; shapes it
//! does not hold, and every shape without it, the cost model alone decides, with the CPU's
//! class profile either way.

use std::path::PathBuf;

use tessera_core::{Error, Result};
use tessera_kernels::cost::MachineProfile;
use tessera_kernels::planner::{cpu_model, Planner, TuningCache};

pub fn tuning_path() -> PathBuf {
    crate::store::cache_dir().join("tuning.json")
}

/// Reads the tuning cache; a missing file is an empty cache, a corrupt one is reported.
pub fn read_cache() -> Result<TuningCache> {
    let p = tuning_path();
    if !p.exists() {
        return Ok(TuningCache::default());
    }
    let s = std::fs::read_to_string(&p).map_err(|e| Error::io(&p, e))?;
    serde_json::from_str(&s)
        .map_err(|e| Error::malformed("tuning cache", format!("{}: {e}", p.display())))
}

pub fn write_cache(cache: &TuningCache) -> Result<PathBuf> {
    let p = tuning_path();
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d).map_err(|e| Error::io(d, e))?;
    }
    let tmp = p.with_extension("json.tmp");
    let s = serde_json::to_string_pretty(cache).expect("tuning cache serialises");
    std::fs::write(&tmp, s).map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, &p).map_err(|e| Error::io(&p, e))?;
    Ok(p)
}

/// A planner from the tuning cache when there is a usable one (`TESSERA_NO_TUNING=1`
/// ignores it), else the cost model alone; the CPU's class profile ranks the shapes the
/// cache does not hold.
pub fn load_planner() -> Planner {
    let cache = if std::env::var_os("TESSERA_NO_TUNING").is_some() {
        TuningCache::default()
    } else {
        match read_cache() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("ignoring the tuning cache: {e}");
                TuningCache::default()
            }
        }
    };
    if cache.legacy_profile.is_some() {
        tracing::warn!(
            "{} was written by an older `tessera tune`, which ranked its candidates with a \
             measured profile that left some kernels out (at large M its plans can run 0.8x \
             the untuned planner's); run `tessera tune` again to replace it",
            tuning_path().display()
        );
    }
    Planner::new(MachineProfile::default_for(&cpu_model()), cache)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caches_with_a_measured_profile_still_load_and_keep_their_plans() {
        // As an older `tessera tune` wrote it, with a measured profile: the profile is skipped.
        let old = r#"{"profile": {"cpu": "AMD EPYC", "f32_gflops_per_core": 54.3,
            "tiles": [{"family": "f32packed16", "mr": 12, "nr": 32, "gflops": 72.8}]},
            "plans": {"AMD EPYC|t2|F32|exact|m512k4096n4096": {"kernel": "packed", "mr": 6,
            "nr": 4, "mc": 8, "nc": 32, "kc": 512, "m_parts": 1, "n_parts": 2,
            "measured_us": 157539.5}}}"#;
        let cache: TuningCache = serde_json::from_str(old).unwrap();
        assert!(cache.legacy_profile.is_some(), "an old cache is told apart");
        assert_eq!(cache.plans.len(), 1);
        let plan = &cache.plans["AMD EPYC|t2|F32|exact|m512k4096n4096"];
        assert_eq!((plan.mr, plan.nr, plan.kc), (6, 4, Some(512)));
        // Written again, it carries no profile.
        let again: TuningCache =
            serde_json::from_str(&serde_json::to_string(&cache).unwrap()).unwrap();
        assert!(again.legacy_profile.is_none());
        assert_eq!(again.plans.len(), 1);
    }
}
