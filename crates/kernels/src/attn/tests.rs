//! The tiled attention against the f64 definition on awkward shapes (head_dim 1/7/64 and
//! others, 1..4 query heads per KV head, prime and block-straddling lengths, shuffled paged
//! block tables, f32 and f16 storage), and bitwise batch invariance: a row's output is the
//! same alone as inside any tile, on both ISAs.

use half::f16;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};

use super::*;
use crate::generic::dot_f32;

/// A paged K/V buffer (one layer, `kv_heads` heads of `hd`), a block table and a tile of
/// `tokens × group` query rows at consecutive positions from `start`.
struct Case {
    hd: usize,
    k: Vec<f32>,
    v: Vec<f32>,
    offs: Vec<usize>,
    q: Vec<f32>,
    limits: Vec<usize>,
}

#[allow(clippy::too_many_arguments)]
fn case(
    hd: usize,
    group: usize,
    tokens: usize,
    start: usize,
    block: usize,
    kv_heads: usize,
    head: usize,
    q_scale: f32,
    seed: u64,
) -> Case {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let n = start + tokens;
    let blocks = n.div_ceil(block) + 2;
    // A shuffled block table over more blocks than needed.
    let mut table: Vec<usize> = (0..blocks).collect();
    for i in (1..blocks).rev() {
        table.swap(i, rng.gen_range(0..=i));
    }
    let kv_dim = kv_heads * hd;
    let len = blocks * block * kv_dim;
    let mut vals = |len: usize, s: f32| -> Vec<f32> {
        (0..len).map(|_| rng.gen_range(-1.0f32..1.0) * s).collect()
    };
    let (k, v) = (vals(len, 1.0), vals(len, 1.0));
    let q = vals(tokens * group * hd, q_scale);
    let offs = (0..n)
        .map(|p| (table[p / block] * block + p % block) * kv_dim + head * hd)
        .collect();
    let limits = (0..tokens)
        .flat_map(|t| std::iter::repeat_n(start + t + 1, group))
        .collect();
    Case {
        hd,
        k,
        v,
        offs,
        q,
        limits,
    }
}

impl Case {
    fn tile<'a>(&'a self, k: KvRows<'a>, v: KvRows<'a>) -> Tile<'a> {
        Tile {
            head_dim: self.hd,
            scale: 1.0 / (self.hd as f32).sqrt(),
            softcap: None,
            q: &self.q,
            limits: &self.limits,
            starts: &[],
            k,
            v,
            offs: &self.offs,
            first_key: 0,
        }
    }
    fn f32_tile(&self) -> Tile<'_> {
        self.tile(KvRows::F32(&self.k), KvRows::F32(&self.v))
    }
    /// Rows `rows` of the tile as a tile of their own.
    fn sub<'a>(&self, t: &Tile<'a>, q: &'a [f32], limits: &'a [usize]) -> Tile<'a> {
        Tile { q, limits, ..*t }
    }
    /// Each row's window start for a window of `w` keys.
    fn starts(&self, w: usize) -> Vec<usize> {
        self.limits.iter().map(|&n| n.saturating_sub(w)).collect()
    }
}

fn isas() -> Vec<Isa> {
    let mut v = vec![Isa::Generic];
    if Isa::detect() == Isa::Avx2Fma {
        v.push(Isa::Avx2Fma);
    }
    v
}

/// The crate's canonical dot product on `isa` (whatever `TESSERA_ISA` says).
fn canonical_dot(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2Fma {
        // SAFETY: `isas()` lists Avx2Fma only when the CPU has it; equal lengths.
        return unsafe { crate::x86::avx2::dot_f32(a.as_ptr(), b.as_ptr(), a.len()) };
    }
    let _ = isa;
    dot_f32(a, b)
}

fn run(isa: Isa, t: &Tile) -> Vec<f32> {
    let mut out = vec![f32::NAN; t.limits.len() * t.head_dim];
    attend_on(isa, t, &mut out, &mut AttnScratch::default());
    out
}

fn to_f16(x: &[f32]) -> Vec<f16> {
    x.iter().map(|&v| f16::from_f32(v)).collect()
}

fn assert_close(got: &[f32], want: &[f64], tol: f64) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len());
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        prop_assert!(
            (g as f64 - w).abs() <= tol,
            "element {}: {} vs reference {} (tol {})",
            i,
            g,
            w,
            tol
        );
    }
    Ok(())
}

fn head_dim() -> impl Strategy<Value = usize> {
    prop_oneof![Just(1usize), Just(7), Just(64), 1usize..80]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Both ISAs, f32 and f16 storage, stay within rounding of the f64 definition.
    #[test]
    fn matches_the_reference(
        hd in head_dim(),
        group in 1usize..5,
        tokens in 1usize..12,
        start in prop_oneof![
            Just(0usize),
            0usize..100,
            Just(KEY_BLOCK - 1),
            Just(3 * KEY_BLOCK),
            Just(SEGMENT - 5),
            Just(2 * SEGMENT + 3),
        ],
        block in prop_oneof![Just(1usize), Just(16), 1usize..40],
        kv_heads in 1usize..4,
        seed in 0u64..1000,
    ) {
        let c = case(hd, group, tokens, start, block, kv_heads, seed as usize % kv_heads, 1.0, seed);
        let t = c.f32_tile();
        let want = attend_reference(&t);
        for isa in isas() {
            assert_close(&run(isa, &t), &want, 1e-5)?;
        }
        let (kh, vh) = (to_f16(&c.k), to_f16(&c.v));
        let th = c.tile(KvRows::F16(&kh), KvRows::F16(&vh));
        let want = attend_reference(&th);
        for isa in isas() {
            assert_close(&run(isa, &th), &want, 1e-5)?;
        }
    }

    /// Sharp softmaxes (large scores) and long contexts stay stable: the running max
    /// rescales without overflow.
    #[test]
    fn large_scores_and_long_contexts(
        hd in prop_oneof![Just(7usize), Just(64)],
        start in prop_oneof![Just(500usize), 200usize..700],
        q_scale in prop_oneof![Just(1.0f32), Just(30.0)],
        seed in 0u64..1000,
    ) {
        let c = case(hd, 3, 3, start, 16, 3, 1, q_scale, seed);
        let t = c.f32_tile();
        let want = attend_reference(&t);
        for isa in isas() {
            assert_close(&run(isa, &t), &want, 5e-5)?;
        }
    }

    /// A row's output is bitwise the same alone (a decode step) as inside the whole tile or
    /// any contiguous part of it, and f16 storage gives exactly the f32 arithmetic of the
    /// rounded values.
    #[test]
    fn rows_are_batch_invariant(
        hd in head_dim(),
        group in 1usize..5,
        tokens in 1usize..10,
        start in prop_oneof![0usize..90, SEGMENT - 9..SEGMENT + 9],
        a in 0usize..1000,
        b in 0usize..1000,
        seed in 0u64..1000,
    ) {
        let c = case(hd, group, tokens, start, 16, 2, 1, 1.0, seed);
        let (kh, vh) = (to_f16(&c.k), to_f16(&c.v));
        let (kr, vr): (Vec<f32>, Vec<f32>) =
            (kh.iter().map(|x| x.to_f32()).collect(), vh.iter().map(|x| x.to_f32()).collect());
        let rows = c.limits.len();
        let (lo, hi) = {
            let (x, y) = (a % rows, b % rows);
            (x.min(y), x.max(y) + 1)
        };
        for isa in isas() {
            for (k, v) in [
                (KvRows::F32(&c.k), KvRows::F32(&c.v)),
                (KvRows::F16(&kh), KvRows::F16(&vh)),
            ] {
                let t = c.tile(k, v);
                let all = run(isa, &t);
                let part = run(isa, &c.sub(&t, &c.q[lo * hd..hi * hd], &c.limits[lo..hi]));
                prop_assert_eq!(&all[lo * hd..hi * hd], &part[..]);
                for r in [lo, hi - 1] {
                    let one = run(isa, &c.sub(&t, &c.q[r * hd..(r + 1) * hd], &c.limits[r..r + 1]));
                    prop_assert_eq!(&all[r * hd..(r + 1) * hd], &one[..], "row {}", r);
                }
            }
            let from_f16 = run(isa, &c.tile(KvRows::F16(&kh), KvRows::F16(&vh)));
            let rounded = run(isa, &c.tile(KvRows::F32(&kr), KvRows::F32(&vr)));
            prop_assert_eq!(from_f16, rounded);
        }
    }

    /// Sliding windows (any width, straddling blocks and segments) and soft-capped scores
    /// stay within rounding of the definition, and a row's output is bitwise the same alone
    /// as in the tile, or with offsets listed only from the first key walked.
    #[test]
    fn windows_and_softcap(
        hd in head_dim(),
        group in 1usize..4,
        tokens in 1usize..10,
        start in prop_oneof![0usize..90, SEGMENT - 9..SEGMENT + 40, Just(2 * SEGMENT + 3)],
        w in prop_oneof![Just(1usize), 1usize..20, Just(KEY_BLOCK), KEY_BLOCK - 3..KEY_BLOCK + 3, Just(SEGMENT + 1)],
        cap in prop_oneof![Just(None), Just(Some(0.5f32)), Just(Some(50.0f32))],
        q_scale in prop_oneof![Just(1.0f32), Just(20.0)],
        seed in 0u64..1000,
    ) {
        let c = case(hd, group, tokens, start, 16, 2, 1, q_scale, seed);
        let starts = c.starts(w);
        let t = Tile { starts: &starts, softcap: cap, ..c.f32_tile() };
        let want = attend_reference(&t);
        let first = t.first_walked();
        let listed = Tile { offs: &c.offs[first..], first_key: first, ..t };
        for isa in isas() {
            let all = run(isa, &t);
            assert_close(&all, &want, 2e-5)?;
            prop_assert_eq!(&run(isa, &listed), &all);
            let r = seed as usize % c.limits.len();
            let one = Tile {
                q: &c.q[r * hd..(r + 1) * hd],
                limits: &c.limits[r..r + 1],
                starts: &starts[r..r + 1],
                ..t
            };
            prop_assert_eq!(&run(isa, &one)[..], &all[r * hd..(r + 1) * hd], "row {}", r);
        }
    }

    /// The F16C conversion is exact (equal to `half`'s) for every row length and offset.
    #[test]
    fn f16_conversion_is_exact(
        x in proptest::collection::vec(-7e4f32..7e4, 1..90),
        hd in 1usize..20,
        picks in proptest::collection::vec(0usize..1000, 0..6),
    ) {
        let h = to_f16(&x);
        let hd = hd.min(h.len());
        let offs: Vec<usize> = picks.iter().map(|p| p % (h.len() - hd + 1)).collect();
        let want: Vec<f32> = offs
            .iter()
            .flat_map(|&o| h[o..o + hd].iter().map(|v| v.to_f32()))
            .collect();
        for isa in isas() {
            let mut got = vec![f32::NAN; 3];
            convert_rows(isa, KvRows::F16(&h), &offs, hd, &mut got);
            prop_assert_eq!(&got, &want);
        }
    }
}

#[test]
fn one_key_returns_its_value() {
    let c = case(5, 2, 1, 0, 4, 1, 0, 1.0, 7);
    for isa in isas() {
        let out = run(isa, &c.f32_tile());
        let v0 = &c.v[c.offs[0]..c.offs[0] + 5];
        assert_eq!(&out[..5], v0);
        assert_eq!(&out[5..], v0);
    }
}

#[test]
#[should_panic(expected = "outside K or V")]
fn key_rows_outside_the_buffer_are_refused() {
    let mut c = case(4, 1, 2, 3, 4, 1, 0, 1.0, 1);
    c.offs[1] = c.k.len();
    run(Isa::Generic, &c.f32_tile());
}

#[test]
#[should_panic(expected = "attends no key")]
fn rows_without_keys_are_refused() {
    let mut c = case(4, 1, 2, 3, 4, 1, 0, 1.0, 1);
    c.limits[0] = 0;
    run(Isa::Generic, &c.f32_tile());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Segments computed apart ([`attend_segment`], as when one long row is split over
    /// units) and folded in order give exactly one call's bits.
    #[test]
    fn segments_apart_equal_one_call(
        hd in prop_oneof![Just(1usize), Just(7), Just(64)],
        group in 1usize..4,
        tokens in 1usize..6,
        start in prop_oneof![0usize..SEGMENT, SEGMENT - 3..3 * SEGMENT],
        f16 in any::<bool>(),
        seed in 0u64..1000,
    ) {
        let c = case(hd, group, tokens, start, 16, 2, 0, 1.0, seed);
        let (kh, vh) = (to_f16(&c.k), to_f16(&c.v));
        let t = if f16 {
            c.tile(KvRows::F16(&kh), KvRows::F16(&vh))
        } else {
            c.f32_tile()
        };
        let rows = c.limits.len();
        let mut one = vec![f32::NAN; rows * hd];
        attend(&t, &mut one, &mut AttnScratch::default());
        let mut total = Vec::new();
        empty_partial(&mut total, rows * partial_len(hd), hd);
        let mut part = vec![f32::NAN; rows * partial_len(hd)];
        let segs = c.limits.iter().max().unwrap().div_ceil(SEGMENT);
        // Each segment on a fresh scratch, as another unit would run it.
        for seg in 0..segs {
            attend_segment(&t, seg, &mut part, &mut AttnScratch::default());
            // The same segment from a tile listing only its own keys' offsets.
            let keys = seg * SEGMENT..((seg + 1) * SEGMENT).min(t.offs.len());
            let own = Tile { offs: &t.offs[keys.clone()], first_key: keys.start, ..t };
            let mut alone = vec![f32::NAN; part.len()];
            attend_segment(&own, seg, &mut alone, &mut AttnScratch::default());
            prop_assert_eq!(&alone, &part, "segment {} from its own offsets", seg);
            merge_partial(hd, &mut total, &part);
        }
        let mut apart = vec![f32::NAN; rows * hd];
        finish_partial(hd, &total, &mut apart);
        prop_assert_eq!(one, apart);
    }

    /// Block scores are exactly the canonical dot products times the scale, for every run
    /// shape and key count (the tiles' padding writes nothing a row reads).
    #[test]
    fn scores_are_canonical_dots(hd in head_dim(), nr in 1usize..4, c in 1usize..=KEY_BLOCK, seed in 0u64..100) {
        let cs = case(hd, nr, 1, KEY_BLOCK, 3, 2, 1, 1.0, seed);
        let t = cs.f32_tile();
        for isa in isas() {
            let mut sc = vec![f32::NAN; nr * KEY_BLOCK];
            block_scores(isa, &t, (0, nr, c), &cs.k, &cs.offs, &mut sc);
            for r in 0..nr {
                for j in 0..c {
                    let k = &cs.k[cs.offs[j]..cs.offs[j] + hd];
                    let want = canonical_dot(isa, &cs.q[r * hd..(r + 1) * hd], k) * t.scale;
                    prop_assert_eq!(sc[r * KEY_BLOCK + j], want, "row {} key {}", r, j);
                }
            }
        }
    }
}
