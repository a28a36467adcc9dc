//! The tuning cache on disk (`<cache>/tuning.json`): a measured machine profile and the
//! measured best plan per (CPU, units, dtype, precision, shape bucket). `generate`, `serve`
//! and the benchmarks load it; without it the cost model alone decides.

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
/// ignores it), else from the default profile.
pub fn load_planner() -> Planner {
    let cpu = cpu_model();
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
    let profile = cache
        .profile
        .clone()
        .filter(|p| p.cpu == cpu)
        .unwrap_or_else(|| MachineProfile::default_for(&cpu));
    Planner::new(profile, cache)
}
