//! The outer-product tile (`super::outer`) against the panel kernel, bitwise, over awkward
//! shapes, and its lane tile timed alone.

use proptest::prelude::*;
use tessera_core::DType;
use tessera_runtime::ThreadPool;

use super::outer;
use super::tests::{acts, k_for, plan, reference, run, weight, DTYPES};
use crate::plan::F32Kernel;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(60))]
    /// The outer-product form (`nr = 16`, `outer`: 16-row strips with AVX2, 32-row ones
    /// where the AVX-512 kernels run): bitwise the reference over awkward shapes, partial
    /// tiles and strips, tiles past 8 rows (transposed in two parts), K tails, K blocks,
    /// bias and every split.
    #[test]
    fn outer_equals_panel_bitwise(
        m in 1usize..31, n in 1usize..72, kb in 1usize..7, odd in 0usize..8, d in 0usize..16,
        mr in 1usize..16, mc in 1usize..30, nc in 1usize..40, kcb in 0usize..4, units in 1usize..4,
    ) {
        // (Under `TESSERA_ISA=generic` the planner never proposes the tile; nothing to run.)
        if !outer::available() {
            return Ok(());
        }
        let dtype = DTYPES[d];
        let k = k_for(dtype, kb, odd);
        let w = weight(dtype, n, k, (n * 29 + k) as u64, 1 + d % 3);
        let x = acts(m, k, (m * 5 + d) as u64);
        let bias = acts(1, n, 3);
        let pool = ThreadPool::new(units);
        let want = reference(&pool, &x, m, &w, Some(&bias));
        let kc = if kcb == 0 { 0 } else { 32 * kcb };
        for par in [(1, units), (units.min(m), 1), (2.min(m), 2)] {
            if par.0 * par.1 > units {
                continue;
            }
            let p = plan(F32Kernel::Packed, mr, 16, mc, nc, kc, par);
            prop_assert_eq!(run(&p, &pool, &x, m, &w, Some(&bias)), want.clone(), "{} {}x16 mc={} nc={} kc={} {:?}", dtype, mr, mc, nc, kc, par);
        }
    }
}

/// The outer-product tile at K below and just past one chunk of 8 (no lane steps, or one
/// and a tail), which the proptests' K (32 and up) does not reach.
#[test]
fn outer_at_tiny_k_equals_panel_bitwise() {
    if !outer::available() {
        return;
    }
    let pool = ThreadPool::new(2);
    for k in [1, 2, 5, 7, 8, 9, 15] {
        for (m, n) in [(1, 1), (7, 20), (13, 33), (27, 65)] {
            let w = weight(DType::F32, n, k, (k * 7 + n) as u64, 1);
            let x = acts(m, k, k as u64);
            let bias = acts(1, n, 4);
            let want = reference(&pool, &x, m, &w, Some(&bias));
            for par in [(1, 2), (2.min(m), 1)] {
                for mr in [6, 12] {
                    let p = plan(F32Kernel::Packed, mr, 16, 24, 32, 0, par);
                    assert_eq!(
                        run(&p, &pool, &x, m, &w, Some(&bias)),
                        want,
                        "k={k} m={m} n={n} mr={mr} {par:?}"
                    );
                }
            }
        }
    }
}

/// The outer-product lane tile alone (`--ignored --nocapture time_outer_tile`): one lane of
/// an `MR × width` block (6 × 16 with AVX2; 8, 12 and 14 × 32 where the AVX-512 kernels
/// run) over `TESSERA_STEPS` chunks (default 72, K = 576), its activations and weights in
/// L1, against the FMA peak.
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore]
fn time_outer_tile() {
    if !outer::available() {
        return;
    }
    let steps: usize = std::env::var("TESSERA_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(72);
    let a = acts(steps, 16, 1);
    let b = acts(steps, 32, 2);
    let mut sums = vec![0f32; 16 * 32];
    let time = |name: &str, mr: usize, width: usize, f: &mut dyn FnMut()| {
        let calls = 400_000_000 / (steps * mr * width);
        for _ in 0..5 {
            let t = std::time::Instant::now();
            for _ in 0..calls {
                f();
            }
            let s = t.elapsed().as_secs_f64();
            println!(
                "{name} {mr}x{width}, {steps} steps: {:.1} GFLOP/s",
                (calls * steps * 2 * mr * width) as f64 / s / 1e9
            );
        }
    };
    let (ap, bp, sp) = (a.as_ptr(), b.as_ptr(), sums.as_mut_ptr());
    // SAFETY (every call below): AVX2+FMA (`available`), AVX-512 where `outer::strip()` is
    // 32; a holds 16 · steps values, b 32 · steps, sums 16 · 32.
    if outer::strip() == 16 {
        time("avx2 lane_tile", 6, 16, &mut || unsafe {
            crate::x86::avx2_outer::lane_tile::<6>(ap, bp, steps, sp, true)
        });
    } else {
        use crate::x86::avx512_outer::lane_tile;
        time("avx512 lane_tile", 8, 32, &mut || unsafe {
            lane_tile::<8>(ap, bp, steps, sp, true)
        });
        time("avx512 lane_tile", 12, 32, &mut || unsafe {
            lane_tile::<12>(ap, bp, steps, sp, true)
        });
        time("avx512 lane_tile", 14, 32, &mut || unsafe {
            lane_tile::<14>(ap, bp, steps, sp, true)
        });
    }
    std::hint::black_box(&sums);
}
