use super::*;

fn t(variant: Variant, variant_ns: f64, twin_ns: f64) -> Timing {
    Timing {
        variant,
        variant_ns,
        twin_ns,
    }
}

/// The exact path's AVX-512 kernels and their low-field decodes.
fn all() -> VariantSet {
    VariantSet::of(&[
        Variant::Avx512,
        Variant::LowFieldQ4_1,
        Variant::LowFieldQ8_0,
    ])
}

#[test]
fn the_ggml_type_variants_stand_on_their_own_timings() {
    let every = VariantSet::of(&Variant::ALL);
    // The exact kernels' AVX-512 lost; the ggml decode's and the integer dots' won: those
    // two run (they are not decodes inside the exact AVX-512 kernels).
    let timings = [
        t(Variant::Avx512, 120.0, 100.0),
        t(Variant::LowFieldQ4_1, 30.0, 40.0),
        t(Variant::LowFieldQ8_0, 30.0, 40.0),
        t(Variant::GgmlAvx512, 70.0, 100.0),
        t(Variant::QkAvx512, 60.0, 100.0),
    ];
    assert_eq!(
        decide(every, &timings),
        VariantSet::of(&[Variant::GgmlAvx512, Variant::QkAvx512])
    );
    let timings = [
        t(Variant::Avx512, 80.0, 100.0),
        t(Variant::GgmlAvx512, 100.0, 100.0),
        t(Variant::QkAvx512, 90.0, 100.0),
    ];
    assert_eq!(
        decide(every, &timings),
        VariantSet::of(&[Variant::Avx512, Variant::QkAvx512])
    );
    for v in Variant::ALL {
        assert_eq!(Variant::from_name(v.name()), Some(v));
    }
}

#[test]
fn a_variant_reported_slower_or_level_is_never_chosen() {
    let timings = [
        t(Variant::Avx512, 80.0, 100.0),
        t(Variant::LowFieldQ4_1, 3800.0, 40.0), // a microcode assist per FMA
        t(Variant::LowFieldQ8_0, 50.0, 50.0),   // level: the portable twin
    ];
    let c = decide(all(), &timings);
    assert!(c.has(Variant::Avx512));
    assert!(!c.has(Variant::LowFieldQ4_1));
    assert!(!c.has(Variant::LowFieldQ8_0));
    let timings = [
        t(Variant::Avx512, 80.0, 100.0),
        t(Variant::LowFieldQ4_1, 30.0, 40.0),
        t(Variant::LowFieldQ8_0, 45.0, 50.0),
    ];
    assert_eq!(decide(all(), &timings), all());
}

#[test]
fn unmeasured_unsupported_and_unusable_variants_are_not_chosen() {
    // No timing for Q8_0's: not chosen.
    let timings = [
        t(Variant::Avx512, 80.0, 100.0),
        t(Variant::LowFieldQ4_1, 30.0, 40.0),
    ];
    let c = decide(all(), &timings);
    assert!(c.has(Variant::LowFieldQ4_1) && !c.has(Variant::LowFieldQ8_0));
    // Not supported: not chosen, however fast.
    let only = VariantSet::of(&[Variant::Avx512]);
    assert_eq!(decide(only, &timings), only);
    // The low-field decodes are AVX-512 code: nothing without it.
    let timings = [
        t(Variant::Avx512, 120.0, 100.0),
        t(Variant::LowFieldQ4_1, 30.0, 40.0),
        t(Variant::LowFieldQ8_0, 30.0, 40.0),
    ];
    assert_eq!(decide(all(), &timings), VariantSet::NONE);
    // A non-finite time is no evidence.
    let timings = [t(Variant::Avx512, f64::NAN, 100.0)];
    assert_eq!(decide(all(), &timings), VariantSet::NONE);
    assert_eq!(decide(VariantSet::NONE, &timings), VariantSet::NONE);
}

#[test]
fn cpuid_signatures_decode_to_family_model_stepping() {
    // AMD EPYC 9004 (Zen 4): family 0x19, model 0x11.
    assert_eq!(decode_signature(0x00A1_0F11), (25, 17, 1));
    // Intel Sapphire Rapids: family 6, model 0x8F, stepping 8.
    assert_eq!(decode_signature(0x0008_06F8), (6, 143, 8));
    // A base family below 15 ignores the extended family; below 6 the extended model.
    assert_eq!(decode_signature(0x0FF0_0543), (5, 4, 3));
}

#[test]
fn check_modes_parse_and_bad_values_are_errors() {
    assert_eq!(CheckMode::parse(None), Ok(CheckMode::Auto));
    assert_eq!(CheckMode::parse(Some("auto")), Ok(CheckMode::Auto));
    assert_eq!(CheckMode::parse(Some(" skip")), Ok(CheckMode::Skip));
    assert_eq!(
        CheckMode::parse(Some("remeasure")),
        Ok(CheckMode::Remeasure)
    );
    let e = CheckMode::parse(Some("fast")).unwrap_err();
    assert!(e.contains("fast") && e.contains("skip"), "{e}");
}

fn class(model: u32) -> CpuClass {
    CpuClass {
        vendor: "GenuineIntel".into(),
        family: 6,
        model,
        stepping: 1,
    }
}

fn tmp_cache(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tessera-variants-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d.join("kernel-variants.json")
}

#[test]
fn choices_are_measured_once_per_cpu_class_and_cached() {
    let path = tmp_cache("once");
    let slow_low = vec![
        t(Variant::Avx512, 80.0, 100.0),
        t(Variant::LowFieldQ4_1, 3800.0, 40.0),
        t(Variant::LowFieldQ8_0, 45.0, 50.0),
    ];
    let calls = std::cell::Cell::new(0);
    let mut measure = || {
        calls.set(calls.get() + 1);
        slow_low.clone()
    };
    let a = select(
        class(167),
        all(),
        CheckMode::Auto,
        Some(&path),
        &mut measure,
    );
    assert!(matches!(a.source, Source::Measured(_)), "{:?}", a.source);
    assert!(a.cache_error.is_none(), "{:?}", a.cache_error);
    let want = VariantSet::of(&[Variant::Avx512, Variant::LowFieldQ8_0]);
    assert_eq!(a.chosen, want);
    let s = a.summary();
    assert!(
        s.contains("refused q4_1-low-field") && s.contains("taken avx512"),
        "{s}"
    );
    // Again on the same class: from the cache, nothing timed.
    let b = select(
        class(167),
        all(),
        CheckMode::Auto,
        Some(&path),
        &mut measure,
    );
    assert_eq!((b.source.clone(), b.chosen), (Source::Cached, want));
    // `skip` takes the cached choice too.
    let c = select(
        class(167),
        all(),
        CheckMode::Skip,
        Some(&path),
        &mut measure,
    );
    assert_eq!((c.source.clone(), c.chosen), (Source::Cached, want));
    assert_eq!(calls.get(), 1);
    // Another class, and `remeasure`, time again.
    select(
        class(207),
        all(),
        CheckMode::Auto,
        Some(&path),
        &mut measure,
    );
    select(
        class(167),
        all(),
        CheckMode::Remeasure,
        Some(&path),
        &mut measure,
    );
    assert_eq!(calls.get(), 3);
    let file = read_cache(&path).unwrap();
    assert_eq!(file.len(), 2);
    // An entry of another kernel set is measured again.
    let mut f = file.clone();
    f.get_mut(&class(167).key()).unwrap().kernel_set = "old".into();
    write_cache(&path, &f).unwrap();
    select(
        class(167),
        all(),
        CheckMode::Auto,
        Some(&path),
        &mut measure,
    );
    assert_eq!(calls.get(), 4);
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[test]
fn skip_without_a_cache_and_a_corrupt_cache_are_handled() {
    let path = tmp_cache("skip");
    let mut measure = || -> Vec<Timing> { panic!("skip must not measure") };
    let s = select(class(1), all(), CheckMode::Skip, Some(&path), &mut measure);
    // Nothing measured on this class: no variant, only the portable twins.
    assert_eq!(s.source, Source::Unmeasured);
    assert_eq!(s.chosen, VariantSet::NONE);
    assert!(s.summary().contains("TESSERA_KERNEL_CHECK=skip"));
    // Nothing supported: nothing measured, nothing chosen.
    let n = select(
        class(1),
        VariantSet::NONE,
        CheckMode::Auto,
        Some(&path),
        &mut measure,
    );
    assert_eq!(
        (n.source, n.chosen),
        (Source::NotApplicable, VariantSet::NONE)
    );
    // A corrupt file is reported, measured over and replaced.
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, "{not json").unwrap();
    let mut measure = || vec![t(Variant::Avx512, 1.0, 2.0)];
    let c = select(class(1), all(), CheckMode::Auto, Some(&path), &mut measure);
    assert!(c.cache_error.is_some());
    assert_eq!(c.chosen, VariantSet::of(&[Variant::Avx512]));
    assert!(read_cache(&path).is_ok());
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// The qualification itself: a timing for every variant where the CPU has AVX-512, finite
/// and positive, and none elsewhere.
#[test]
fn qualification_times_every_variant_against_its_twin() {
    let t = measure();
    #[cfg(target_arch = "x86_64")]
    if super::qualify::has_avx512() {
        for v in Variant::ALL {
            let r = t.iter().find(|x| x.variant == v).expect("timed");
            assert!(r.variant_ns > 0.0 && r.twin_ns > 0.0, "{r:?}");
            assert!(r.variant_ns.is_finite() && r.twin_ns.is_finite(), "{r:?}");
        }
        return;
    }
    assert!(t.is_empty());
}

/// Every variant and twin computes bitwise the same products: the low-field and general
/// decodes of the AVX-512 stream kernel and the AVX2 kernel, on awkward shapes and on
/// scales at the fast decodes' edges.
#[cfg(target_arch = "x86_64")]
mod same_bits {
    use super::super::qualify::{has_avx512, stream16_pass, stream8_pass, test_weight};
    use crate::packed::{PackedWeight, GROUP};
    use proptest::prelude::*;
    use tessera_core::DType;

    fn x_of(k: usize, seed: u64) -> Vec<f32> {
        let mut s = seed | 1;
        (0..k)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// The three kernels' outputs for the weight's real rows, as bits.
    fn outputs(pw: &PackedWeight, x: &[f32]) -> [Vec<u32>; 3] {
        let mut xe = vec![0f32; 8 * x.len()];
        crate::x86::avx2_records::expand(x, &mut xe);
        let len = pw.groups * GROUP;
        let (mut a, mut b, mut c) = (vec![0f32; len], vec![0f32; len], vec![0f32; len]);
        stream16_pass(pw, x, true, &mut a);
        stream16_pass(pw, x, false, &mut b);
        stream8_pass(pw, &xe, &mut c);
        [a, b, c].map(|v| v[..pw.n].iter().map(|f| f.to_bits()).collect())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn variants_agree_on_awkward_shapes(
            n in 1usize..70,
            blocks in 1usize..7,
            dt in 0usize..3,
            seed in 0u64..1000,
        ) {
            if !has_avx512() {
                return Ok(());
            }
            let dtype = [DType::Q4_0, DType::Q4_1, DType::Q8_0][dt];
            let k = 32 * blocks;
            let pw = test_weight(dtype, n, k, seed);
            let x = x_of(k, seed + 1);
            let [low, general, avx2] = outputs(&pw, &x);
            prop_assert_eq!(&low, &general, "{} {}x{}", dtype, n, k);
            prop_assert_eq!(&general, &avx2, "{} {}x{}", dtype, n, k);
        }
    }

    /// Scales at and beside each low-field decode's bounds (the largest f16 each takes, the
    /// smallest it refuses, ±0, ±inf, subnormal f16 and negative scales), mixed in every
    /// record: the low-field decode, the general one and AVX2 give the same bits.
    #[test]
    fn variants_agree_at_every_scale_edge() {
        if !has_avx512() {
            return;
        }
        let edges: [(DType, &[u16]); 2] = [
            (
                DType::Q4_1,
                &[
                    0x37ff, 0x3800, 0x0000, 0x8000, 0x7c00, 0xfc00, 0x0001, 0x8001, 0x0400, 0xb7ff,
                ],
            ),
            (
                DType::Q8_0,
                &[
                    0x27ff, 0x2800, 0x0000, 0x8000, 0x7c00, 0xfc00, 0x0001, 0x0400, 0xa7ff, 0x1000,
                ],
            ),
        ];
        for (dtype, ds) in edges {
            let (n, k) = (37, 32 * 5);
            let bb = dtype.block_bytes();
            let mut s = 0x9e37_79b9_7f4a_7c15u64;
            let rows: Vec<Vec<u8>> = (0..n)
                .map(|r| {
                    let mut row: Vec<u8> = (0..(k / 32) * bb)
                        .map(|_| {
                            s = s.wrapping_mul(6364136223846793005).wrapping_add(1);
                            (s >> 56) as u8
                        })
                        .collect();
                    for (b, blk) in row.chunks_exact_mut(bb).enumerate() {
                        // Groups 0 and 1 (a record pair) at the largest fast scale, the
                        // others with edges mixed into every record.
                        let d = if r >= 16 && (r + b) % 3 == 0 {
                            ds[(r + 2 * b) % ds.len()]
                        } else {
                            ds[0]
                        };
                        blk[0..2].copy_from_slice(&d.to_le_bytes());
                        if dtype == DType::Q4_1 {
                            let m: u16 = if r % 2 == 0 { 0xb266 } else { 0x0000 };
                            blk[2..4].copy_from_slice(&m.to_le_bytes());
                        }
                    }
                    row
                })
                .collect();
            let pw = PackedWeight::pack_rows(dtype, n, k, &|r| &rows[r]).unwrap();
            // Some records fast and some not: both paths run.
            let flags: Vec<bool> = (0..pw.groups * pw.blocks)
                .map(|i| pw.fast[i / 8] >> (i % 8) & 1 == 1)
                .collect();
            assert!(
                flags.iter().any(|&f| f) && flags.iter().any(|&f| !f),
                "{dtype}"
            );
            let x = x_of(k, 5);
            let [low, general, avx2] = outputs(&pw, &x);
            let same = |a: &[u32], b: &[u32]| {
                a.iter().zip(b).all(|(p, q)| {
                    p == q || (f32::from_bits(*p).is_nan() && f32::from_bits(*q).is_nan())
                })
            };
            assert!(same(&low, &general), "{dtype}: low field vs general");
            assert!(same(&general, &avx2), "{dtype}: AVX-512 vs AVX2");
        }
    }
}
