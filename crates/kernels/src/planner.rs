//! Chooses a [`Plan`] for every matrix product from its shapes, dtype and precision.
//!
//! Candidates: every kernel of the family (fixed by dtype and precision; the exact family has
//! a streaming and a packed kernel with the same numerics), each kernel's register tiles,
//! cache blocks `mc`/`nc` (and `kc` for the packed kernel) from small ladders, and every
//! parallel split (over N, over M, 2-D grids) on 1..=units compute units. The cost model ranks them; a tuning cache of measured winners
//! (keyed by CPU, units, dtype, precision and shape, M rounded up to a power of two) overrides
//! the model where it has an entry. Choices are memoised, so the forward pays a hash lookup.
//! The result is deterministic for a given shape, profile and cache.

use std::collections::HashMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use tessera_core::DType;

use crate::cost::{bytes_per_weight, predict_us, MachineProfile};
use crate::plan::{
    ActFeed, F32Kernel, KernelFamily, ParallelPlan, ParallelSplit, Plan, Precision, TilePlan,
};

/// What a plan is chosen for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ShapeKey {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub dtype: DTypeName,
    pub precision: PrecisionName,
    pub units: usize,
}

/// Serializable names for the key (DType and Precision stay free of serde).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DTypeName(pub u32);
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PrecisionName(pub bool);

impl ShapeKey {
    pub fn new(
        m: usize,
        k: usize,
        n: usize,
        dtype: DType,
        precision: Precision,
        units: usize,
    ) -> Self {
        ShapeKey {
            m,
            k,
            n,
            dtype: DTypeName(dtype.ggml_type()),
            precision: PrecisionName(precision == Precision::Fast),
            units,
        }
    }
    pub fn dtype(&self) -> DType {
        DType::from_ggml_type(self.dtype.0).expect("valid dtype id")
    }
    pub fn precision(&self) -> Precision {
        if self.precision.0 {
            Precision::Fast
        } else {
            Precision::Exact
        }
    }
    /// The tuning bucket: M rounded up to a power of two, at most 1024.
    pub fn bucket(&self) -> Self {
        ShapeKey {
            m: self.m.next_power_of_two().min(1024),
            ..*self
        }
    }
    /// The key as text, for the tuning cache file.
    pub fn to_text(&self, cpu: &str) -> String {
        format!(
            "{cpu}|t{}|{}|{}|m{}k{}n{}",
            self.units,
            self.dtype(),
            self.precision(),
            self.m,
            self.k,
            self.n
        )
    }
}

/// A measured winner, as stored in the tuning cache.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TunedPlan {
    /// The exact family's kernel ([`F32Kernel::name`]); caches written before kernels were
    /// recorded lack it, and the model then picks the kernel for the record's blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    pub mr: usize,
    pub nr: usize,
    pub mc: usize,
    pub nc: usize,
    /// The packed kernel's K block (absent: whole K).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kc: Option<usize>,
    pub m_parts: usize,
    pub n_parts: usize,
    pub measured_us: f64,
}

impl TunedPlan {
    /// The record of a measured plan.
    pub fn of(plan: &Plan, measured_us: f64) -> Self {
        let (m_parts, n_parts) = plan.parallel.parts();
        let t = &plan.tile;
        TunedPlan {
            kernel: (t.family == KernelFamily::F32Dot).then(|| t.kernel.name().to_string()),
            mr: t.mr,
            nr: t.nr,
            mc: t.mc,
            nc: t.nc,
            kc: (t.kernel == F32Kernel::Packed).then_some(t.kc),
            m_parts,
            n_parts,
            measured_us,
        }
    }
}

/// The tuning cache file: measured winners, one per shape bucket. The planner around it ranks
/// every other shape with the class profile of the CPU (`MachineProfile::default_for`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TuningCache {
    pub plans: HashMap<String, TunedPlan>,
    /// Present in caches written by older versions: the machine profile `tessera tune`
    /// measured and ranked its candidates with. Its contents are not read (its tile
    /// rates came from `calibrate::tile_rates`' small products, which the cost model's
    /// fitted rates do not mean: on the Zen 4 they rated the outer-product tile 0.7x the
    /// macro tile, which whole products run 1.1-1.2x faster at large M, so such a cache's
    /// winners never include it there); its presence says the plans came from that ranking.
    #[serde(default, rename = "profile", skip_serializing)]
    pub legacy_profile: Option<serde::de::IgnoredAny>,
}

pub struct Planner {
    pub profile: MachineProfile,
    pub cache: TuningCache,
    memo: Mutex<HashMap<ShapeKey, Plan>>,
}

/// The CPU's model name (from /proc/cpuinfo), used in tuning keys.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

fn ladder(max: usize, steps: &[usize]) -> Vec<usize> {
    let mut v: Vec<usize> = steps.iter().copied().filter(|&s| s < max).collect();
    v.push(max.max(1));
    v.dedup();
    v
}

impl Planner {
    pub fn new(profile: MachineProfile, cache: TuningCache) -> Self {
        Planner {
            profile,
            cache,
            memo: Mutex::new(HashMap::new()),
        }
    }

    /// A planner with the default profile for this CPU and no tuning cache.
    pub fn untuned() -> Self {
        Self::new(
            MachineProfile::default_for(&cpu_model()),
            TuningCache::default(),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn tile(
        family: KernelFamily,
        kernel: F32Kernel,
        dtype: DType,
        k: usize,
        mr: usize,
        nr: usize,
        mc: usize,
        nc: usize,
        kc: usize,
    ) -> TilePlan {
        TilePlan {
            family,
            kernel,
            mr,
            nr,
            mc,
            nc,
            kc: kc.min(k),
            pack_a: family != KernelFamily::F32Dot,
            pack_b: family == KernelFamily::Q8Interleaved
                || kernel == F32Kernel::Packed
                || (kernel == F32Kernel::Panel && dtype != DType::F32),
            split_k: 1,
            row_block: dtype.block_len(),
            act_feed: if family != KernelFamily::F32Dot {
                ActFeed::Q8
            } else {
                ActFeed::F32
            },
        }
    }

    /// The kernels the planner considers for a family: the exact family's stream and packed
    /// kernels (the panel kernel stays as their reference, runnable but not proposed).
    pub fn kernels(family: KernelFamily) -> &'static [F32Kernel] {
        match family {
            KernelFamily::F32Dot => &[F32Kernel::Stream, F32Kernel::Packed],
            KernelFamily::Q8Interleaved | KernelFamily::QkDot => &[F32Kernel::Panel],
        }
    }

    /// Every candidate plan for a shape, ranked by predicted time (fastest first; ties
    /// broken by the candidate's order, so the ranking is deterministic).
    pub fn candidates(&self, key: &ShapeKey) -> Vec<Plan> {
        let (m, k, n, dtype) = (key.m, key.k, key.n, key.dtype());
        let family = KernelFamily::for_weight(dtype, key.precision());
        let mut out = vec![];
        let n8 = n.div_ceil(8) * 8;
        let l2 = self.profile.l2_bytes;
        let row_bytes = bytes_per_weight(dtype) * k as f64;
        let mut splits = vec![];
        for u in 1..=key.units.max(1) {
            splits.push(ParallelPlan {
                split: ParallelSplit::N,
                units: u,
            });
            if u > 1 && m >= u {
                splits.push(ParallelPlan {
                    split: ParallelSplit::M,
                    units: u,
                });
            }
            for mp in 2..u {
                if u % mp == 0 && m >= mp && u / mp > 1 {
                    splits.push(ParallelPlan {
                        split: ParallelSplit::Grid {
                            m_parts: mp,
                            n_parts: u / mp,
                        },
                        units: u,
                    });
                }
            }
        }
        for &kernel in Self::kernels(family) {
            let tiles = match (family, kernel) {
                (KernelFamily::F32Dot, F32Kernel::Stream) => crate::exact::stream_tiles(dtype),
                (KernelFamily::F32Dot, F32Kernel::Packed) => crate::exact::packed_tiles(),
                (KernelFamily::F32Dot, _) => kernel.tiles(),
                (KernelFamily::Q8Interleaved | KernelFamily::QkDot, _) => family.tiles(),
            };
            // The stream kernel has no activation blocks (mc = M); the packed one blocks K.
            let mcs = match kernel {
                F32Kernel::Stream => vec![m.max(1)],
                _ => ladder(m, &[4, 8, 16, 32, 64, 128, 256]),
            };
            let kcs = match kernel {
                F32Kernel::Packed => ladder(k, &[256, 512, 1024]),
                _ => vec![k],
            };
            for &kc in &kcs {
                let ncs: Vec<usize> = match (family, kernel) {
                    (KernelFamily::Q8Interleaved | KernelFamily::QkDot, _) => {
                        ladder(n8, &[8, 16, 32, 64, 128, 256, 512])
                    }
                    (_, F32Kernel::Stream) => ladder(n8, &[8, 16, 32, 64, 128, 256, 512])
                        .into_iter()
                        .filter(|&nc| nc as f64 * row_bytes <= l2 as f64 || nc <= 8)
                        .collect(),
                    _ => ladder(n8, &[8, 16, 32, 64, 128, 256])
                        .into_iter()
                        .filter(|&nc| nc * kc.min(k) * 4 <= l2 || nc <= 8)
                        .collect(),
                };
                for &(mr, nr) in tiles {
                    if mr > 1 && mr > m {
                        continue;
                    }
                    // The outer-product tile runs K in one block per lane (its lane sums
                    // would otherwise cross K blocks in memory, measured slower); its `mc`
                    // and `nc` size the activation block in L2 and the strips packed at once.
                    let outer = kernel == F32Kernel::Packed && nr >= crate::exact::OUTER_STRIP;
                    if outer && kc < k {
                        continue;
                    }
                    let (mcs, ncs) = if outer {
                        // (`mc` past 96 keeps the block's lane sums, 512 bytes a row,
                        // out of L1: 512 × 4096 × 4096 f32 ran 0.8x of `mc` = 96.)
                        // `nc` past 64 never wins: in sweeps of 204 rows every
                        // outer-tile oracle takes `nc` 32 or 64, and at K = 1536 `nc`
                        // 128 ran 1-10% behind 32 (its strips packed ahead, read from L2).
                        (ladder(m.min(96), &[24, 48]), ladder(n8.min(64), &[32]))
                    } else {
                        (mcs.clone(), ncs.clone())
                    };
                    for &mc in &mcs {
                        if mc < mr {
                            continue;
                        }
                        // With K in one block the packed kernel's `mc` only groups tiles
                        // (nothing lives across them): one candidate, not one per `mc`.
                        if kernel == F32Kernel::Packed && kc >= k && mc != m.max(1) && !outer {
                            continue;
                        }
                        for &nc in &ncs {
                            // (A tile wider than N, the stream kernel's 16 rows, is fine.)
                            if nc < nr.min(n8) {
                                continue;
                            }
                            for par in &splits {
                                let tile = Self::tile(family, kernel, dtype, k, mr, nr, mc, nc, kc);
                                let mut plan = Plan {
                                    tile,
                                    parallel: *par,
                                    predicted_us: 0.0,
                                };
                                plan.predicted_us =
                                    predict_us(&self.profile, &plan, m, k, n, dtype);
                                out.push(plan);
                            }
                        }
                    }
                }
            }
        }
        out.sort_by(|a, b| a.predicted_us.total_cmp(&b.predicted_us));
        out
    }

    /// A plan from a tuning-cache record.
    pub fn from_tuned(&self, key: &ShapeKey, t: &TunedPlan) -> Plan {
        let dtype = key.dtype();
        let family = KernelFamily::for_weight(dtype, key.precision());
        let split = match (t.m_parts, t.n_parts) {
            (1, n) => ParallelSplit::N.with_units(n),
            (mp, 1) => ParallelSplit::M.with_units(mp),
            (mp, np) => ParallelPlan {
                split: ParallelSplit::Grid {
                    m_parts: mp,
                    n_parts: np,
                },
                units: mp * np,
            },
        };
        // A record that names no kernel (or one this family lacks) takes the one the model
        // ranks best for its blocks (the kernels share their numerics: only speed differs).
        let (m, k, n) = (key.m, key.k, key.n);
        let named = t
            .kernel
            .as_deref()
            .and_then(F32Kernel::parse)
            .filter(|kn| Self::kernels(family).contains(kn));
        let kernels: Vec<F32Kernel> = match named {
            Some(kn) => vec![kn],
            None => Self::kernels(family).to_vec(),
        };
        let kc = t.kc.unwrap_or(k);
        let tile = kernels
            .iter()
            .map(|&kernel| Self::tile(family, kernel, dtype, k, t.mr, t.nr, t.mc, t.nc, kc))
            .min_by(|a, b| {
                let cost = |tile: &TilePlan| {
                    let p = Plan {
                        tile: *tile,
                        parallel: split,
                        predicted_us: 0.0,
                    };
                    predict_us(&self.profile, &p, m, k, n, dtype)
                };
                cost(a).total_cmp(&cost(b))
            })
            .expect("every family has a kernel");
        Plan {
            tile,
            parallel: split,
            predicted_us: t.measured_us,
        }
    }

    /// The plan for a shape: tuned if the cache has its bucket, else the model's best.
    pub fn plan(&self, key: &ShapeKey) -> Plan {
        if let Some(p) = self.memo.lock().unwrap_or_else(|e| e.into_inner()).get(key) {
            return *p;
        }
        let tuned = self
            .cache
            .plans
            .get(&key.bucket().to_text(&self.profile.cpu))
            .map(|t| self.from_tuned(key, t));
        let plan = tuned.unwrap_or_else(|| self.candidates(key)[0]);
        self.memo
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(*key, plan);
        plan
    }
}

impl ParallelSplit {
    fn with_units(self, units: usize) -> ParallelPlan {
        ParallelPlan { split: self, units }
    }
}

#[cfg(test)]
mod tests;
