//! Pure helpers: timing statistics and the choice of the best fixed strategy.

use std::time::{Duration, Instant};

/// Median of the values (mean of the two middle ones for an even count); `NaN` when empty.
pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// Geometric mean of positive values; `NaN` when empty or when any value is not positive.
pub fn geomean(values: &[f64]) -> f64 {
    if values.is_empty() || values.iter().any(|&v| v.is_nan() || v <= 0.0) {
        return f64::NAN;
    }
    (values.iter().map(|v| v.ln()).sum::<f64>() / values.len() as f64).exp()
}

/// Index of the strategy with the best (largest) geometric mean over all shapes:
/// `scores[s][i]` is strategy `s`'s throughput on shape `i`. Strategies with a missing or
/// non-positive score anywhere are skipped; ties go to the earlier strategy. `None` when no
/// strategy has a full row of scores.
pub fn best_by_geomean(scores: &[Vec<f64>]) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (s, row) in scores.iter().enumerate() {
        let g = geomean(row);
        if g.is_nan() {
            continue;
        }
        if best.is_none_or(|(_, b)| g > b) {
            best = Some((s, g));
        }
    }
    best.map(|(s, _)| s)
}

/// Bounds on how often a timed run repeats.
#[derive(Debug, Clone, Copy)]
pub struct Repeat {
    /// At least this many timed runs.
    pub min_runs: usize,
    /// And keep going until this much time has been spent on timed runs...
    pub min_time: Duration,
    /// ...but never more than this many runs.
    pub max_runs: usize,
}

impl Default for Repeat {
    fn default() -> Self {
        Repeat {
            min_runs: 3,
            min_time: Duration::from_millis(30),
            max_runs: 5000,
        }
    }
}

impl Repeat {
    /// Whether another run is needed after `runs` runs taking `spent` in all.
    pub fn wants_more(&self, runs: usize, spent: Duration) -> bool {
        runs < self.min_runs || (spent < self.min_time && runs < self.max_runs)
    }
}

/// Median seconds of `f` after one untimed warm-up run, repeated as `rep` says.
pub fn time_median<F: FnMut()>(rep: &Repeat, mut f: F) -> f64 {
    f();
    let mut samples = Vec::new();
    let mut spent = Duration::ZERO;
    while rep.wants_more(samples.len(), spent) {
        let t = Instant::now();
        f();
        let d = t.elapsed();
        spent += d;
        samples.push(d.as_secs_f64());
    }
    median(&samples)
}

/// Times several contenders in `rounds` interleaved rounds and returns each one's median
/// seconds over all its timed runs. Every round times each contender in turn (round `r`
/// starting at contender `r`, so none is always the first after a pause) for
/// `rep.min_time / rounds` (at least one run, at most `rep.max_runs / rounds`), calling
/// `between(i)` after contender `i`'s share (OpenBLAS uses it to let its spinning threads
/// stop). On a host whose speed changes for seconds at a time, a slow spell then falls on
/// every contender of a comparison alike instead of on whichever one happened to be running.
///
/// Each share starts with one untimed run. The cyclic order never changes, so without it a
/// contender would always run right after the same other one and pay for that one's cache
/// footprint in every round: a plan that always followed OpenBLAS, whose own f32 copy of a
/// large weight pushes the plan's out of the last level cache, would read an M = 1 figure
/// half that of the fixed strategies timed beside it.
pub fn time_interleaved(
    rep: &Repeat,
    rounds: usize,
    contenders: &mut [&mut dyn FnMut()],
    between: &mut dyn FnMut(usize),
) -> Vec<f64> {
    let rounds = rounds.max(1);
    let share = Repeat {
        min_runs: rep.min_runs.div_ceil(rounds).max(1),
        min_time: rep.min_time / rounds as u32,
        max_runs: (rep.max_runs / rounds).max(1),
    };
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); contenders.len()];
    let count = contenders.len();
    for r in 0..rounds {
        for i in (0..count).map(|j| (j + r) % count) {
            let f = &mut contenders[i];
            f();
            let mut spent = Duration::ZERO;
            let mut runs = 0;
            while share.wants_more(runs, spent) {
                let t = Instant::now();
                f();
                let d = t.elapsed();
                spent += d;
                runs += 1;
                samples[i].push(d.as_secs_f64());
            }
            between(i);
        }
    }
    samples.iter().map(|s| median(s)).collect()
}

/// A warning when the 1-minute load average (Linux `/proc/loadavg`) says other work is
/// competing for the CPUs, which makes every figure noisy.
pub fn load_warning() -> Option<String> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let load = parse_loadavg(&text)?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (load >= 0.5 * cpus as f64).then(|| {
        format!(
            "warning: load average {load:.2} on {cpus} CPUs before the run; other work competes \
             with the benchmark and the figures will be noisy"
        )
    })
}

/// The 1-minute load average from the text of `/proc/loadavg`.
pub fn parse_loadavg(text: &str) -> Option<f64> {
    text.split_whitespace().next()?.parse().ok()
}

/// GFLOP/s of an `m × k × n` product that took `secs`.
pub fn gflops(m: usize, k: usize, n: usize, secs: f64) -> f64 {
    2.0 * (m * k * n) as f64 / secs / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaved_rounds_alternate_contenders() {
        use std::cell::RefCell;
        let log = RefCell::new(Vec::new());
        let rep = Repeat {
            min_runs: 3,
            min_time: Duration::ZERO,
            max_runs: 100,
        };
        let (mut a, mut b) = (|| log.borrow_mut().push('a'), || log.borrow_mut().push('b'));
        let t = time_interleaved(&rep, 3, &mut [&mut a, &mut b], &mut |i| {
            log.borrow_mut().push(if i == 0 { '|' } else { '/' })
        });
        assert_eq!(t.len(), 2);
        assert!(t.iter().all(|&s| s >= 0.0 && s.is_finite()));
        // Three rounds of one run each (3 runs split over 3 rounds), each share after an
        // untimed warm-up run, each round starting one contender further on.
        let got: String = log.into_inner().into_iter().collect();
        assert_eq!(got, "aa|bb/bb/aa|aa|bb/");
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[7.0]), 7.0);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn geomean_basics() {
        assert!((geomean(&[1.0, 4.0]) - 2.0).abs() < 1e-12);
        assert!((geomean(&[2.0, 8.0, 4.0]) - 4.0).abs() < 1e-12);
        assert!(geomean(&[]).is_nan());
        assert!(geomean(&[1.0, 0.0]).is_nan());
        assert!(geomean(&[1.0, f64::NAN]).is_nan());
    }

    #[test]
    fn best_fixed_uses_geomean_not_mean() {
        // Strategy 0 has by far the largest arithmetic mean (50.5) but geometric means are
        // 10, 10 and sqrt(108) ≈ 10.39: strategy 2 wins.
        let scores = vec![vec![1.0, 100.0], vec![10.0, 10.0], vec![12.0, 9.0]];
        assert_eq!(best_by_geomean(&scores), Some(2));
        // Ties go to the earlier strategy.
        assert_eq!(best_by_geomean(&scores[..2]), Some(0));
        // A strategy with a missing score is skipped.
        let scores = vec![vec![50.0, f64::NAN], vec![2.0, 3.0]];
        assert_eq!(best_by_geomean(&scores), Some(1));
        assert_eq!(best_by_geomean(&[]), None);
        assert_eq!(best_by_geomean(&[vec![f64::NAN]]), None);
    }

    #[test]
    fn repeat_bounds() {
        let r = Repeat {
            min_runs: 3,
            min_time: Duration::from_millis(30),
            max_runs: 10,
        };
        assert!(r.wants_more(0, Duration::from_secs(1)));
        assert!(r.wants_more(2, Duration::from_secs(1)));
        assert!(!r.wants_more(3, Duration::from_secs(1)));
        assert!(r.wants_more(5, Duration::from_millis(1)));
        assert!(!r.wants_more(10, Duration::from_millis(1)));
    }

    #[test]
    fn time_median_runs_warmup_and_at_least_min_runs() {
        let mut calls = 0;
        let r = Repeat {
            min_runs: 4,
            min_time: Duration::ZERO,
            max_runs: 100,
        };
        let t = time_median(&r, || calls += 1);
        assert_eq!(calls, 5);
        assert!(t >= 0.0);
    }

    #[test]
    fn loadavg_parsing() {
        assert_eq!(parse_loadavg("1.50 0.80 0.40 2/300 1234\n"), Some(1.5));
        assert_eq!(parse_loadavg(""), None);
        assert_eq!(parse_loadavg("x"), None);
    }

    #[test]
    fn gflops_formula() {
        assert!((gflops(1, 1000, 1000, 1e-3) - 2.0).abs() < 1e-12);
    }
}
