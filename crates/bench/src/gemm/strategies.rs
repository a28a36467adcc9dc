//! The shape sets the GEMM sweep runs and the single fixed strategies the planner is
//! compared with.

use anyhow::Result;
use tessera_kernels::plan::{KernelFamily, ParallelPlan, ParallelSplit, Plan};

/// A set of weight shapes `(K, N)` with the M values swept over them.
#[derive(Debug, Clone, PartialEq)]
pub struct ShapeFamily {
    pub name: &'static str,
    pub shapes: Vec<(usize, usize)>,
    pub ms: Vec<usize>,
}

/// The known shape families: `smollm` (SmolLM2-135M) and `llama7b` (one Llama-7B layer).
pub fn shape_family(name: &str) -> Option<ShapeFamily> {
    match name {
        "smollm" => Some(ShapeFamily {
            name: "smollm",
            shapes: vec![
                (576, 576),
                (576, 192),
                (576, 1536),
                (1536, 576),
                (576, 49152),
            ],
            ms: vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 512],
        }),
        "llama7b" => Some(ShapeFamily {
            name: "llama7b",
            shapes: vec![(4096, 4096), (4096, 11008), (11008, 4096)],
            ms: vec![1, 4, 16, 64, 256, 512],
        }),
        _ => None,
    }
}

/// How a fixed strategy spreads work over the units (always all of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitKind {
    N,
    M,
    /// A 2 × (units / 2) grid; only for an even number of at least 4 units.
    Grid2,
}

/// One strategy applied unchanged to every shape: register tile, cache blocks, split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedStrategy {
    pub mr: usize,
    pub nr: usize,
    pub mc: usize,
    pub nc: usize,
    pub split: SplitKind,
}

impl FixedStrategy {
    const fn new(mr: usize, nr: usize, mc: usize, nc: usize, split: SplitKind) -> Self {
        FixedStrategy {
            mr,
            nr,
            mc,
            nc,
            split,
        }
    }

    pub fn name(&self) -> String {
        let split = match self.split {
            SplitKind::N => "N",
            SplitKind::M => "M",
            SplitKind::Grid2 => "G2",
        };
        format!(
            "{}x{} mc{} nc{} {split}",
            self.mr, self.nr, self.mc, self.nc
        )
    }

    pub fn valid_for_units(&self, units: usize) -> bool {
        match self.split {
            SplitKind::Grid2 => units >= 4 && units & 1 == 0,
            _ => true,
        }
    }

    pub fn parallel(&self, units: usize) -> ParallelPlan {
        let units = units.max(1);
        match self.split {
            SplitKind::N => ParallelPlan {
                split: ParallelSplit::N,
                units,
            },
            SplitKind::M => ParallelPlan {
                split: ParallelSplit::M,
                units,
            },
            SplitKind::Grid2 => ParallelPlan {
                split: ParallelSplit::Grid {
                    m_parts: 2,
                    n_parts: units / 2,
                },
                units,
            },
        }
    }

    /// The strategy as a plan for one shape, from a plan of that shape's family (which
    /// supplies everything the strategy does not fix: family, packing, K extent).
    pub fn apply(&self, template: &Plan, units: usize) -> Plan {
        let mut p = *template;
        p.tile.mr = self.mr;
        p.tile.nr = self.nr;
        p.tile.mc = self.mc;
        p.tile.nc = self.nc;
        p.parallel = self.parallel(units);
        p.predicted_us = 0.0;
        p
    }
}

/// The fixed strategies of a kernel family that run on `units` units. Every one is valid for
/// every shape (the executor clamps blocks and tiles to the shape's edges).
pub fn fixed_strategies(family: KernelFamily, units: usize) -> Vec<FixedStrategy> {
    use SplitKind::*;
    let all: &[FixedStrategy] = match family {
        KernelFamily::F32Dot => &[
            FixedStrategy::new(1, 4, 64, 16, N),
            FixedStrategy::new(2, 4, 64, 32, N),
            FixedStrategy::new(3, 4, 64, 32, N),
            FixedStrategy::new(3, 4, 256, 64, N),
            FixedStrategy::new(4, 3, 128, 32, N),
            FixedStrategy::new(1, 8, 16, 64, N),
            FixedStrategy::new(3, 4, 64, 32, M),
            FixedStrategy::new(2, 2, 32, 16, N),
            FixedStrategy::new(3, 4, 64, 32, Grid2),
        ],
        KernelFamily::Q8Interleaved | KernelFamily::QkDot => &[
            FixedStrategy::new(1, 8, 4, 64, N),
            FixedStrategy::new(2, 8, 16, 128, N),
            FixedStrategy::new(4, 8, 16, 64, N),
            FixedStrategy::new(4, 8, 64, 256, N),
            FixedStrategy::new(4, 8, 256, 512, N),
            FixedStrategy::new(3, 8, 32, 128, N),
            FixedStrategy::new(4, 8, 64, 64, M),
            FixedStrategy::new(2, 8, 8, 32, N),
            FixedStrategy::new(4, 8, 64, 128, Grid2),
        ],
    };
    all.iter()
        .copied()
        .filter(|s| family.tiles().contains(&(s.mr, s.nr)) && s.valid_for_units(units))
        .collect()
}

/// Parses shape family names.
pub fn parse_families(list: &[String]) -> Result<Vec<ShapeFamily>> {
    list.iter()
        .map(|s| {
            shape_family(s.trim())
                .ok_or_else(|| anyhow::anyhow!("unknown shape set {s:?} (known: smollm, llama7b)"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_have_the_documented_shapes() {
        let s = shape_family("smollm").unwrap();
        assert_eq!(s.shapes.len(), 5);
        assert_eq!(s.ms, vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 512]);
        let l = shape_family("llama7b").unwrap();
        assert_eq!(l.shapes, vec![(4096, 4096), (4096, 11008), (11008, 4096)]);
        assert!(shape_family("gpt").is_none());
    }

    #[test]
    fn fixed_strategies_use_family_tiles_and_all_units() {
        for family in [KernelFamily::F32Dot, KernelFamily::Q8Interleaved] {
            for units in [1, 2, 3, 4, 8] {
                let s = fixed_strategies(family, units);
                assert!(
                    s.len() >= 6 && s.len() <= 9,
                    "{family:?} {units}: {}",
                    s.len()
                );
                for f in &s {
                    assert!(family.tiles().contains(&(f.mr, f.nr)));
                    let (mp, np) = f.parallel(units).parts();
                    assert_eq!(mp * np, units);
                }
                assert_eq!(
                    s.iter().any(|f| f.split == SplitKind::Grid2),
                    units >= 4 && units & 1 == 0
                );
            }
        }
    }
}
