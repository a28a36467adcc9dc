//! The planner's tests: ranking, profiles, and the cost model's choices on measured shapes.

use super::*;

#[test]
fn plans_are_deterministic_and_ranked() {
    let p = Planner::untuned();
    for &(m, k, n) in &[
        (1, 576, 1536),
        (7, 1536, 576),
        (512, 576, 49152),
        (3, 64, 8),
    ] {
        for dtype in [DType::F32, DType::Q4_1, DType::Q8_0] {
            for precision in [Precision::Exact, Precision::Fast] {
                let key = ShapeKey::new(m, k, n, dtype, precision, 2);
                let a = p.candidates(&key);
                let b = Planner::untuned().candidates(&key);
                assert_eq!(a, b);
                assert!(a.windows(2).all(|w| w[0].predicted_us <= w[1].predicted_us));
                assert_eq!(p.plan(&key), a[0]);
                assert_eq!(a[0].tile.family, KernelFamily::for_weight(dtype, precision));
            }
        }
    }
}

/// A profile cached before `outer_strip_pack_ns` was recorded reads back with the 0.1 ns
/// every profile was charged then; the Zen 4 profile's own figure survives a round trip.
#[test]
fn profiles_without_the_strip_charge_read_back_with_the_old_one() {
    let zen4 = MachineProfile::zen4_default("test");
    let mut v = serde_json::to_value(&zen4).unwrap();
    let back: MachineProfile = serde_json::from_value(v.clone()).unwrap();
    assert_eq!(back, zen4);
    v.as_object_mut().unwrap().remove("outer_strip_pack_ns");
    let old: MachineProfile = serde_json::from_value(v).unwrap();
    assert_eq!(old.outer_strip_pack_ns, 0.1);
    assert_ne!(zen4.outer_strip_pack_ns, 0.1);
}

/// The outer-product tile's split in the model: each unit packs its own activation rows,
/// all of them under an N split, and two copies past 0.4 of L3 are re-read from DRAM, so
/// on the Zen 4 profile (32 MiB L3) M = 512 at K = 4096 splits M, while at M = 256 (two
/// 4 MiB copies) the two splits stay within a few percent.
#[test]
fn outer_tile_splits_m_when_two_copies_of_the_activations_overflow_l3() {
    let p = Planner::new(MachineProfile::zen4_default("test"), TuningCache::default());
    let outer = |m: usize, parts: (usize, usize)| {
        let key = ShapeKey::new(m, 4096, 4096, DType::Q8_0, Precision::Exact, 2);
        p.candidates(&key)
            .into_iter()
            .find(|c| {
                c.tile.kernel == F32Kernel::Packed
                    && c.tile.nr >= crate::exact::OUTER_STRIP
                    && (c.tile.mc, c.tile.nc) == (24, 32)
                    && c.parallel.parts() == parts
            })
            .map(|c| c.predicted_us)
    };
    let (Some(n512), Some(m512)) = (outer(512, (1, 2)), outer(512, (2, 1))) else {
        return; // no outer-product tile on this ISA
    };
    assert!(m512 < n512 * 0.97, "M split {m512} us, N split {n512} us");
    let (n256, m256) = (outer(256, (1, 2)).unwrap(), outer(256, (2, 1)).unwrap());
    assert!(
        (n256 / m256 - 1.0).abs() < 0.03,
        "M split {m256} us, N split {n256} us"
    );
}

/// A one-row GEMV over short stored rows from DRAM is predicted faster on 8-row stream
/// tiles than on 4-row ones, whether the weight is past L3 (the 576 × 49,152 f32 lm head)
/// or not (576 × 576, 576 × 1536, 1536 × 576: a model step reads them from DRAM too; the
/// 1x4 ran 0.78-0.85 of the 1x8 there, cold); over long rows (4096 × 4096) the two stay
/// within 2%.
#[test]
fn one_row_gemv_over_short_rows_from_dram_prefers_eight_row_tiles() {
    let p = Planner::new(MachineProfile::zen4_default("test"), TuningCache::default());
    let stream = |k: usize, n: usize, nr: usize| {
        let key = ShapeKey::new(1, k, n, DType::F32, Precision::Exact, 2);
        p.candidates(&key)
            .into_iter()
            .filter(|c| c.tile.kernel == F32Kernel::Stream && c.tile.nr == nr)
            .map(|c| c.predicted_us)
            .fold(f64::INFINITY, f64::min)
    };
    for (k, n) in [(576, 49152), (576, 576), (576, 1536)] {
        let (four, eight) = (stream(k, n, 4), stream(k, n, 8));
        assert!(eight < four * 0.9, "{k}x{n}: 1x8 {eight} us, 1x4 {four} us");
    }
    let (four, eight) = (stream(1536, 576, 4), stream(1536, 576, 8));
    assert!(
        eight < four * 0.97,
        "1536x576: 1x8 {eight} us, 1x4 {four} us"
    );
    let (four, eight) = (stream(4096, 4096, 4), stream(4096, 4096, 8));
    assert!(
        (eight / four - 1.0).abs() < 0.02,
        "4096x4096: 1x8 {eight}, 1x4 {four}"
    );
}

/// f32 weights from DRAM at small M: the stream tile's later row passes run after its
/// first (only that one overlaps the DRAM read), so at M = 8 over 1536 × 576 the macro
/// tile is predicted ahead (it ran 1.15x cold, 1.35-1.6x warm), while at M = 4 the
/// stream tile stays ahead (it ran 1.1x cold).
#[test]
fn stream_tiles_later_passes_follow_the_dram_read() {
    let p = Planner::new(MachineProfile::zen4_default("test"), TuningCache::default());
    let best = |m: usize, kernel: F32Kernel| {
        let key = ShapeKey::new(m, 1536, 576, DType::F32, Precision::Exact, 2);
        p.candidates(&key)
            .into_iter()
            .filter(|c| c.tile.kernel == kernel)
            .map(|c| c.predicted_us)
            .fold(f64::INFINITY, f64::min)
    };
    let (stream8, packed8) = (best(8, F32Kernel::Stream), best(8, F32Kernel::Packed));
    if !packed8.is_finite() {
        return; // no packed tile on this ISA
    }
    assert!(
        packed8 < stream8,
        "M = 8: packed {packed8} us, stream {stream8} us"
    );
    let (stream4, packed4) = (best(4, F32Kernel::Stream), best(4, F32Kernel::Packed));
    assert!(
        stream4 < packed4,
        "M = 4: packed {packed4} us, stream {stream4} us"
    );
}

/// The packed kernel's loop order in the model: with K in several blocks a larger `mc`
/// reads the `nc × K` panel from L3 fewer times (so it is predicted faster), and with K
/// in one block `mc` changes nothing for the macro tiles (one candidate per tile and
/// `nc`); the outer-product tile, which never blocks K, keeps its `mc` ladder.
#[test]
fn packed_predictions_follow_the_loop_order() {
    let p = Planner::new(MachineProfile::zen4_default("test"), TuningCache::default());
    let key = ShapeKey::new(512, 4096, 4096, DType::F32, Precision::Exact, 2);
    // The first packed tile of this process's ISA (6 × 4 where AVX-512 runs).
    let (mr, nr) = crate::exact::packed_tiles()[0];
    let packed = |mc: usize, kc: usize| {
        p.candidates(&key)
            .into_iter()
            .find(|c| {
                let t = &c.tile;
                t.kernel == F32Kernel::Packed
                    && (t.mr, t.nr, t.mc, t.nc, t.kc) == (mr, nr, mc, 64, kc)
                    && c.parallel.parts() == (1, 2)
            })
            .expect("candidate")
            .predicted_us
    };
    assert!(packed(64, 512) < packed(8, 512));
    let one = ShapeKey::new(512, 576, 1536, DType::F32, Precision::Exact, 2);
    let mcs: Vec<usize> = p
        .candidates(&one)
        .iter()
        .filter(|c| c.tile.kernel == F32Kernel::Packed && c.tile.kc >= 576)
        .filter(|c| c.tile.nr < crate::exact::OUTER_STRIP)
        .map(|c| c.tile.mc)
        .collect();
    assert!(
        !mcs.is_empty() && mcs.iter().all(|&mc| mc == 512),
        "{mcs:?}"
    );
}

#[test]
fn tuned_entries_override_the_model() {
    let mut cache = TuningCache::default();
    let key = ShapeKey::new(3, 576, 1536, DType::Q4_1, Precision::Fast, 2);
    let t = TunedPlan {
        kernel: None,
        mr: 2,
        nr: 8,
        mc: 16,
        nc: 64,
        kc: None,
        m_parts: 1,
        n_parts: 2,
        measured_us: 12.5,
    };
    let cpu = cpu_model();
    cache.plans.insert(key.bucket().to_text(&cpu), t.clone());
    let p = Planner::new(MachineProfile::default_for(&cpu), cache);
    let plan = p.plan(&key);
    assert_eq!(
        (plan.tile.mr, plan.tile.nc, plan.parallel.parts()),
        (2, 64, (1, 2))
    );
}

#[test]
fn a_tuned_record_gives_back_its_plan() {
    // Every kernel of the exact family, tile, block and split survives the cache record,
    // and a record from before kernels were stored still loads.
    let untuned = Planner::untuned();
    for (m, k, n) in [(1, 576, 1536), (64, 1536, 576), (300, 4096, 1000)] {
        for (dtype, precision) in [
            (DType::Q4_1, Precision::Exact),
            (DType::F32, Precision::Exact),
            (DType::Q8_0, Precision::Fast),
        ] {
            let key = ShapeKey::new(m, k, n, dtype, precision, 2);
            for plan in untuned.candidates(&key).into_iter().step_by(97).take(20) {
                let rec = TunedPlan::of(&plan, 1.0);
                let text = serde_json::to_string(&rec).unwrap();
                let back: TunedPlan = serde_json::from_str(&text).unwrap();
                assert_eq!(back, rec);
                let got = untuned.from_tuned(&key, &back);
                assert_eq!(
                    (got.tile, got.parallel),
                    (plan.tile, plan.parallel),
                    "{text}"
                );
            }
        }
    }
    let old: TunedPlan = serde_json::from_str(
        r#"{"mr":2,"nr":8,"mc":16,"nc":64,"m_parts":1,"n_parts":2,"measured_us":3.0}"#,
    )
    .unwrap();
    assert_eq!((old.kernel, old.kc), (None, None));
}

/// The outer tile's strips decoded straight from the records (Zen 4 profile: 0.06 ns a
/// weight, where the decode rate and the strip charge made 0.16): with the next block's
/// records hinted into L2 it ran 8-64-row Q4_1 products at K = 576 1.02-1.21x the macro
/// and stream tiles from DRAM, so it takes them; M = 4 stays on the stream tile. A profile
/// without the field keeps the old charge.
#[test]
fn record_strips_put_quantized_m8_to_64_on_the_outer_tile() {
    let zen4 = MachineProfile::zen4_default("test");
    let p = Planner::new(zen4.clone(), TuningCache::default());
    let plan = |m: usize| {
        p.plan(&ShapeKey::new(
            m,
            576,
            1536,
            DType::Q4_1,
            Precision::Exact,
            2,
        ))
    };
    let outer_exists = p
        .candidates(&ShapeKey::new(
            16,
            576,
            1536,
            DType::Q4_1,
            Precision::Exact,
            2,
        ))
        .iter()
        .any(|c| c.tile.nr >= 32);
    if outer_exists {
        for m in [8, 16, 32, 64] {
            assert!(plan(m).tile.nr >= 32, "M = {m}: {}", plan(m));
        }
    }
    assert_eq!(plan(4).tile.kernel, F32Kernel::Stream, "M = 4: {}", plan(4));
    let mut v = serde_json::to_value(&zen4).unwrap();
    v.as_object_mut().unwrap().remove("outer_record_strip_ns");
    let old: MachineProfile = serde_json::from_value(v).unwrap();
    assert_eq!(old.outer_record_strip_ns, None);
    assert!(zen4.outer_record_strip_ns.is_some());
}
