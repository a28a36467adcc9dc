//! Property tests of the LoRA kernels against the f64 reference, and of their bitwise
//! batch invariance.
use super::*;
use half::{bf16, f16};
use proptest::prelude::*;
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::sync::OnceLock;

fn pool(units: usize) -> &'static ThreadPool {
    static POOLS: [OnceLock<ThreadPool>; 2] = [OnceLock::new(), OnceLock::new()];
    POOLS[units - 1].get_or_init(|| ThreadPool::new(units))
}

/// Both splits on 1, 2 and 3 parts (3 parts on a 2-unit pool run round-robin).
const PLANS: [LoraPlan; 6] = [
    plan(LoraSplit::Rows, 1),
    plan(LoraSplit::Rows, 2),
    plan(LoraSplit::Rows, 3),
    plan(LoraSplit::Cols, 1),
    plan(LoraSplit::Cols, 2),
    plan(LoraSplit::Cols, 3),
];
const KS: [usize; 13] = [1, 2, 3, 5, 7, 8, 13, 16, 17, 31, 33, 64, 67];
const NS: [usize; 14] = [1, 2, 3, 7, 8, 9, 15, 16, 17, 24, 31, 33, 40, 67];

/// A segment: `len` rows, and an adapter (seed, one rank per part) or none.
type Seg = (usize, Option<(u64, Vec<usize>)>);
/// An owned task: (rows, rank, A, Bᵀ, scale, col0, n).
type Own = (Range<usize>, usize, Vec<f32>, Vec<f32>, f32, usize, usize);

/// Factor values held in one element type.
#[derive(Clone, Debug)]
enum Held {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
}

impl Held {
    /// `v` rounded to `kind` and held as `kind`.
    fn new(v: &[f32], kind: ElemKind) -> Held {
        match kind {
            ElemKind::F32 => Held::F32(v.to_vec()),
            ElemKind::F16 => Held::F16(v.iter().map(|&x| f16::from_f32(x)).collect()),
            ElemKind::BF16 => Held::BF16(v.iter().map(|&x| bf16::from_f32(x)).collect()),
        }
    }

    fn view(&self) -> FactorView<'_> {
        match self {
            Held::F32(v) => FactorView::F32(v),
            Held::F16(v) => FactorView::F16(v),
            Held::BF16(v) => FactorView::BF16(v),
        }
    }
}

/// `v` rounded to `kind`, as f32 values.
fn round_to(v: &[f32], kind: ElemKind) -> Vec<f32> {
    let h = Held::new(v, kind);
    (0..v.len()).map(|i| h.view().get(i)).collect()
}

const KINDS: [ElemKind; 3] = [ElemKind::F32, ElemKind::F16, ElemKind::BF16];

#[derive(Clone)]
struct Batch {
    k: usize,
    stride: usize,
    x: Vec<f32>,
    out: Vec<f32>,
    owned: Vec<Own>,
    /// Per task, A and Bᵀ held in another element type than f32 (the same values as
    /// `owned`'s), or none.
    held: Option<Vec<(Held, Held)>>,
}

fn rand(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

impl Batch {
    /// Parts of widths `ns` side by side in each row, one untouched column after each.
    fn new(k: usize, ns: &[usize], segs: &[Seg], seed: u64) -> Batch {
        let stride = ns.iter().map(|n| n + 1).sum::<usize>() + 1;
        let m: usize = segs.iter().map(|s| s.0).sum();
        let mut rng = StdRng::seed_from_u64(seed);
        let (x, out) = (rand(&mut rng, m * k), rand(&mut rng, m * stride));
        let (mut owned, mut start) = (Vec::new(), 0);
        for (len, adapter) in segs {
            let mut col0 = 0;
            for (p, &n) in ns.iter().enumerate() {
                if let Some((s, ranks)) = adapter {
                    let r = ranks[p];
                    let mut arng = StdRng::seed_from_u64(s.wrapping_add(p as u64));
                    let (a, b) = (rand(&mut arng, r * k), rand(&mut arng, r * n));
                    let scale = [0.5, 2.0, -1.25, 0.125][(*s % 4) as usize];
                    owned.push((start..start + len, r, a, b, scale, col0, n));
                }
                col0 += n + 1;
            }
            start += len;
        }
        Batch {
            k,
            stride,
            x,
            out,
            owned,
            held: None,
        }
    }

    /// Task `i`'s A and Bᵀ rounded to `kind(i, false)` and `kind(i, true)`: held in those
    /// types when `held`, else (the same values) as f32.
    fn rounded(&self, kind: impl Fn(usize, bool) -> ElemKind, held: bool) -> Batch {
        let mut b = self.clone();
        for (i, o) in b.owned.iter_mut().enumerate() {
            (o.2, o.3) = (
                round_to(&o.2, kind(i, false)),
                round_to(&o.3, kind(i, true)),
            );
        }
        b.held = held.then(|| {
            let owned = b.owned.iter().enumerate();
            owned
                .map(|(i, o)| {
                    (
                        Held::new(&o.2, kind(i, false)),
                        Held::new(&o.3, kind(i, true)),
                    )
                })
                .collect()
        });
        b
    }

    /// Every factor rounded to and held in `kind`.
    fn held_as(&self, kind: ElemKind) -> Batch {
        self.rounded(|_, _| kind, true)
    }

    fn tasks(&self) -> Vec<LoraTask<'_>> {
        let tasks = self.owned.iter().enumerate();
        tasks
            .map(|(i, (rows, rank, a, b_t, scale, col0, n))| {
                let (a, b_t) = match &self.held {
                    Some(h) => (h[i].0.view(), h[i].1.view()),
                    None => (FactorView::F32(a), FactorView::F32(b_t)),
                };
                LoraTask {
                    rows: rows.clone(),
                    rank: *rank,
                    a,
                    b_t,
                    scale: *scale,
                    col0: *col0,
                    n: *n,
                }
            })
            .collect()
    }

    fn run(&self, units: usize, plan: &LoraPlan, scratch: &mut Vec<f32>) -> Vec<f32> {
        let (mut out, tasks, pool) = (self.out.clone(), self.tasks(), pool(units));
        lora_apply(
            pool,
            plan,
            &self.x,
            self.k,
            &tasks,
            &mut out,
            self.stride,
            scratch,
        );
        out
    }

    fn reference(&self) -> Vec<f64> {
        lora_apply_reference(&self.x, self.k, &self.tasks(), &self.out, self.stride)
    }

    /// Every value replaced by its magnitude: its reference bounds the rounding error.
    fn abs(&self) -> Batch {
        let abs = |v: &Vec<f32>| v.iter().map(|x| x.abs()).collect();
        let mut b = self.clone();
        (b.x, b.out, b.held) = (abs(&self.x), abs(&self.out), None);
        for o in &mut b.owned {
            (o.2, o.3, o.4) = (abs(&o.2), abs(&o.3), o.4.abs());
        }
        b
    }
}

fn seg() -> impl Strategy<Value = Seg> {
    let len = prop_oneof![Just(1usize), 1usize..5, 20usize..70];
    let ranks = prop::collection::vec(1usize..=17, 3);
    (len, prop::option::weighted(0.8, (any::<u64>(), ranks)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Every plan on 1 and 2 units against the f64 reference, and bitwise equal to each
    /// other (with a scratch left dirty by the previous call).
    #[test]
    fn every_plan_matches_reference_and_each_other(
        k in prop::sample::select(&KS[..]),
        ns in prop::collection::vec(prop::sample::select(&NS[..]), 1..=3),
        segs in prop::collection::vec(seg(), 1..7),
        seed in any::<u64>(),
        kind in prop::sample::select(&KINDS[..]),
    ) {
        let b = Batch::new(k, &ns, &segs, seed).held_as(kind);
        let mut scratch = vec![f32::NAN; 7];
        let first = b.run(1, &PLANS[0], &mut scratch);
        for ((g, r), m) in first.iter().zip(b.reference()).zip(b.abs().reference()) {
            let tol = m * (k + 20) as f64 * 2.0 * f32::EPSILON as f64;
            prop_assert!((*g as f64 - r).abs() <= tol, "k={} ns={:?}: {} vs {}", k, ns, g, r);
        }
        for units in [1, 2] {
            let planned = plan_lora(&b.tasks(), k, units);
            for plan in PLANS.iter().chain([&planned]) {
                let got = b.run(units, plan, &mut scratch);
                prop_assert_eq!(&got, &first, "{:?} on {} units", plan, units);
            }
        }
    }

    /// A row's output alone (one 1-row task per part) is bitwise its output inside a mixed
    /// batch (1-row segments of other adapters, then the row's segment of 1 or `big` rows,
    /// an adapter-less segment, a long one), for every plan on 1 and 2 units.
    #[test]
    fn row_alone_equals_row_in_batch(
        k in prop::sample::select(&KS[..]),
        ns in prop::collection::vec(prop::sample::select(&NS[..]), 1..=3),
        ranks in prop::collection::vec(1usize..=17, 3),
        big in 2usize..80,
        pos in any::<usize>(),
        seed in any::<u64>(),
        kind in prop::sample::select(&KINDS[..]),
    ) {
        let other = |i: usize| Some((seed ^ (100 + i as u64), vec![1 + i * 5 % 17; 3]));
        let seg_len = if pos % 2 == 0 { 1 } else { big };
        let mut segs: Vec<Seg> = (1..6).map(|i| (1, other(i))).collect();
        segs.extend([(seg_len, Some((seed, ranks))), (3, None), (big, other(7))]);
        let b = Batch::new(k, &ns, &segs, seed).held_as(kind);
        let row = 5 + pos % seg_len;
        let mut alone = b.clone();
        alone.x = b.x[row * k..(row + 1) * k].to_vec();
        alone.out = b.out[row * b.stride..(row + 1) * b.stride].to_vec();
        let mine = 5 * ns.len()..6 * ns.len();
        alone.owned = b.owned[mine.clone()].to_vec();
        alone.owned.iter_mut().for_each(|o| o.0 = 0..1);
        alone.held = b.held.as_ref().map(|h| h[mine].to_vec());
        let mut scratch = Vec::new();
        let want = alone.run(1, &PLANS[0], &mut scratch);
        for units in [1, 2] {
            let planned = [b.tasks(), alone.tasks()].map(|t| plan_lora(&t, k, units));
            for plan in PLANS.iter().chain(&planned) {
                let got = alone.run(units, plan, &mut scratch);
                prop_assert_eq!(&got, &want, "alone, {:?}", plan);
                let got = b.run(units, plan, &mut scratch);
                let got = &got[row * b.stride..(row + 1) * b.stride];
                prop_assert_eq!(got, &want[..], "{:?} on {} units", plan, units);
            }
        }
    }

    /// Factors held in f16 or bf16 (each task's A and Bᵀ its own type, mixed in one call)
    /// give bitwise the result of the same values held as f32, for every plan on 1 and 2
    /// units, and agree with the f64 reference of those values.
    #[test]
    fn halves_equal_their_values_held_as_f32(
        k in prop::sample::select(&KS[..]),
        ns in prop::collection::vec(prop::sample::select(&NS[..]), 1..=3),
        segs in prop::collection::vec(seg(), 1..7),
        seed in any::<u64>(),
        mix in any::<u64>(),
    ) {
        let b = Batch::new(k, &ns, &segs, seed);
        let kind = |i: usize, is_b: bool| KINDS[((mix >> (2 * (i % 16))) as usize + is_b as usize) % 3];
        let (held, as_f32) = (b.rounded(kind, true), b.rounded(kind, false));
        let mut scratch = Vec::new();
        let want = as_f32.run(1, &PLANS[0], &mut scratch);
        for ((g, r), m) in want.iter().zip(held.reference()).zip(as_f32.abs().reference()) {
            let tol = m * (k + 20) as f64 * 2.0 * f32::EPSILON as f64;
            prop_assert!((*g as f64 - r).abs() <= tol, "k={} ns={:?}: {} vs {}", k, ns, g, r);
        }
        for units in [1, 2] {
            let planned = plan_lora(&held.tasks(), k, units);
            for plan in PLANS.iter().chain([&planned]) {
                prop_assert_eq!(&held.run(units, plan, &mut scratch), &want, "{:?}", plan);
            }
        }
    }
}

/// Halves and f32 twins of each tile shape: bitwise the same dot products, and the portable
/// expand of halves bitwise that of their f32 values.
#[test]
fn half_tiles_equal_f32_tiles() {
    let mut rng = StdRng::seed_from_u64(3);
    for k in [1, 7, 8, 9, 16, 31, 67, 576] {
        let xs: Vec<Vec<f32>> = (0..4).map(|_| rand(&mut rng, k)).collect();
        let ws: Vec<Vec<f32>> = (0..4).map(|_| rand(&mut rng, k)).collect();
        for kind in [ElemKind::F16, ElemKind::BF16] {
            let wr: Vec<Vec<f32>> = ws.iter().map(|w| round_to(w, kind)).collect();
            let held: Vec<Held> = ws.iter().map(|w| Held::new(w, kind)).collect();
            for (mr, nr) in (1..=4).flat_map(|m| (1..=4).map(move |n| (m, n))) {
                let x: Vec<&[f32]> = xs[..mr].iter().map(|v| v.as_slice()).collect();
                let f: Vec<&[f32]> = wr[..nr].iter().map(|v| v.as_slice()).collect();
                let mut want = vec![f32::NAN; 16];
                crate::dot_tile(&x, &f, &mut |a, b, v| want[a * 4 + b] = v);
                let mut got = vec![f32::NAN; 16];
                match kind {
                    ElemKind::F16 => {
                        let h: Vec<&[f16]> = held[..nr]
                            .iter()
                            .map(|h| match h {
                                Held::F16(v) => v.as_slice(),
                                _ => unreachable!(),
                            })
                            .collect();
                        f16::dot_tile(
                            &x,
                            &h,
                            &mut |a, b, v| got[a * 4 + b] = v,
                            &mut Ahead::none(),
                        );
                    }
                    _ => {
                        let h: Vec<&[bf16]> = held[..nr]
                            .iter()
                            .map(|h| match h {
                                Held::BF16(v) => v.as_slice(),
                                _ => unreachable!(),
                            })
                            .collect();
                        bf16::dot_tile(
                            &x,
                            &h,
                            &mut |a, b, v| got[a * 4 + b] = v,
                            &mut Ahead::none(),
                        );
                    }
                }
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{kind:?} k={k} {mr}x{nr}");
                for (a, b) in (0..mr).flat_map(|a| (0..nr).map(move |b| (a, b))) {
                    assert_eq!(want[a * 4 + b], crate::dot(x[a], f[b]));
                }
            }
            // The portable expand.
            let (rank, len) = (5, k);
            let t = rand(&mut rng, rank);
            let b = round_to(&rand(&mut rng, rank * len), kind);
            let mut want = vec![0.25f32; len];
            expand_row_generic(&mut want, &t, &b, len, 0.5);
            let mut got = vec![0.25f32; len];
            match Held::new(&b, kind) {
                Held::F16(h) => expand_row_generic(&mut got, &t, &h, len, 0.5),
                Held::BF16(h) => expand_row_generic(&mut got, &t, &h, len, 0.5),
                Held::F32(_) => unreachable!(),
            }
            assert_eq!(got, want, "{kind:?} k={k}");
        }
    }
}

/// The cost model charges 2 bytes a value for halves: the same shapes read half the bytes.
#[test]
fn planner_prices_halves_at_two_bytes() {
    let segs: Vec<Seg> = (0..16).map(|i| (1, Some((i, vec![16; 2])))).collect();
    let b = Batch::new(576, &[576, 192], &segs, 0);
    let h = b.held_as(ElemKind::BF16);
    for plan in PLANS {
        for p in 0..plan.units {
            let (wf, wh) = (
                part_work(&plan, &b.tasks(), 576, p),
                part_work(&plan, &h.tasks(), 576, p),
            );
            for (f, h) in wf.iter().zip(&wh) {
                assert_eq!((f.0, f.1), (h.0, 2 * h.1), "{plan:?}");
            }
        }
    }
}

#[test]
fn empty_and_degenerate_tasks_change_nothing() {
    let b = Batch::new(5, &[3], &[(2, Some((1, vec![2; 3])))], 9);
    let (mut none, mut no_rows, mut rank0) = (b.clone(), b.clone(), b.clone());
    none.owned.clear();
    no_rows.owned[0].0 = 1..1;
    rank0.owned[0] = (0..2, 0, vec![], vec![], 1.0, 0, 3);
    for c in [none, no_rows, rank0] {
        for plan in &PLANS {
            let mut scratch = Vec::new();
            assert!(c.run(2, plan, &mut scratch) == b.out && scratch.is_empty());
        }
    }
}

#[test]
fn planner_keeps_both_units_busy_and_balanced() {
    // A real model's shapes: k = 4096, a fused q/k/v of widths 4096/1024/1024.
    let ns = [4096, 1024, 1024];
    let decode: Vec<Seg> = (0..16)
        .map(|i| (1, Some((i, vec![[8, 16, 32, 64][i as usize % 4]; 3]))))
        .collect();
    let prefill: Vec<Seg> = [(300, 16), (200, 64), (120, 8)]
        .map(|(len, r)| (len, Some((r as u64, vec![r; 3]))))
        .to_vec();
    let single: Vec<Seg> = vec![(1, Some((0, vec![16; 3])))];
    for (segs, split) in [
        (decode, LoraSplit::Rows),
        (prefill, LoraSplit::Rows),
        (single, LoraSplit::Cols),
    ] {
        let b = Batch::new(4096, &ns, &segs, 0);
        let tasks = b.tasks();
        assert_eq!(plan_lora(&tasks, 4096, 1), PLANS[0]);
        let total: usize = tasks
            .iter()
            .map(|t| t.rows.len() * t.rank * (4096 + t.n))
            .sum();
        let macs = |plan, p| {
            part_work(&plan, &tasks, 4096, p)
                .iter()
                .map(|w| w.0)
                .sum::<usize>()
        };
        for plan in PLANS {
            // Every multiply-add is done once: by exactly one part.
            assert_eq!(
                (0..plan.units).map(|p| macs(plan, p)).sum::<usize>(),
                total,
                "{plan:?}"
            );
        }
        let chosen = plan_lora(&tasks, 4096, 2);
        assert_eq!(chosen, plan(split, 2), "{segs:?}");
        let (m0, m1) = (macs(chosen, 0), macs(chosen, 1));
        assert!(
            m0.min(m1) as f64 >= 0.9 * m0.max(m1) as f64,
            "{chosen:?}: {m0} {m1}"
        );
    }
    // Tiny work stays on the calling thread: a dispatch costs more than it saves.
    let tiny = Batch::new(8, &[8], &[(1, Some((1, vec![1; 3])))], 0);
    assert_eq!(plan_lora(&tiny.tasks(), 8, 2).units, 1);
}
