//! What one all-reduce costs on this group's link: measured at start-up by timing the
//! all-reduce itself at a few sizes (through the communication thread, the path every step
//! uses), and fitted as a fixed latency plus a time per byte.
//!
//! Every rank must call [`measure`] at the same point (it is a sequence of collectives).

use std::time::Instant;

use crate::overlap::CommThread;
use crate::{CommError, Communicator};

/// The time of one all-reduce of a buffer of `bytes` (each rank's buffer): through the
/// measured `points` where there are two or more (interpolated linearly between them, the
/// last segment's slope beyond them, the first point's time below it: real links are not
/// lines, a token-bucket shaper least of all), else `latency_s + bytes · secs_per_byte`.
/// `latency_s` and `secs_per_byte` always hold the line's figures, for display.
#[derive(Debug, Clone, PartialEq)]
pub struct CommCost {
    pub latency_s: f64,
    pub secs_per_byte: f64,
    /// Measured `(bytes, secs)`, sorted by bytes.
    pub points: Vec<(usize, f64)>,
}

impl CommCost {
    /// Nothing to communicate (one rank).
    pub const FREE: CommCost = CommCost {
        latency_s: 0.0,
        secs_per_byte: 0.0,
        points: Vec::new(),
    };

    pub fn secs(&self, bytes: usize) -> f64 {
        if bytes == 0 {
            return 0.0;
        }
        let p = &self.points;
        if p.len() < 2 {
            return self.latency_s + bytes as f64 * self.secs_per_byte;
        }
        if bytes <= p[0].0 {
            return p[0].1;
        }
        let i = p.partition_point(|q| q.0 < bytes).clamp(1, p.len() - 1);
        let ((xa, ya), (xb, yb)) = (p[i - 1], p[i]);
        let slope = (yb - ya) / (xb - xa) as f64;
        (ya + slope * (bytes as f64 - xa as f64)).max(p[0].1)
    }

    /// Bandwidth the fit implies, GB/s (infinite for a free link).
    pub fn gbytes_per_s(&self) -> f64 {
        1e-9 / self.secs_per_byte
    }

    /// From a latency in microseconds and a bandwidth in GB/s.
    pub fn from_figures(latency_us: f64, gbytes_per_s: f64) -> CommCost {
        CommCost {
            latency_s: latency_us.max(0.0) * 1e-6,
            secs_per_byte: if gbytes_per_s > 0.0 {
                1e-9 / gbytes_per_s
            } else {
                0.0
            },
            points: Vec::new(),
        }
    }

    /// The measured `points` (interpolated by [`CommCost::secs`]), with the display line:
    /// the bandwidth of the largest two sizes, the latency left at the smallest.
    pub fn from_points(points: &[(usize, f64)]) -> CommCost {
        let mut p: Vec<(usize, f64)> = points
            .iter()
            .copied()
            .filter(|(_, t)| *t > 0.0 && t.is_finite())
            .collect();
        p.sort_by_key(|q| q.0);
        p.dedup_by_key(|q| q.0);
        if p.len() < 2 {
            return CommCost {
                points: Vec::new(),
                ..CommCost::fit(&p)
            };
        }
        let ((xa, ya), (xb, yb)) = (p[p.len() - 2], p[p.len() - 1]);
        let spb = ((yb - ya) / (xb - xa) as f64).max(0.0);
        CommCost {
            latency_s: (p[0].1 - p[0].0 as f64 * spb).max(0.0),
            secs_per_byte: spb,
            points: p,
        }
    }

    /// The least-squares line through `(bytes, secs)` points, each weighted by 1/secs² (so
    /// small sizes, where latency dominates, count as much as large ones); latency and time
    /// per byte are kept non-negative.
    pub fn fit(points: &[(usize, f64)]) -> CommCost {
        let pts: Vec<(f64, f64, f64)> = points
            .iter()
            .filter(|(_, t)| *t > 0.0 && t.is_finite())
            .map(|&(b, t)| (b as f64, t, 1.0 / (t * t)))
            .collect();
        if pts.is_empty() {
            return CommCost::FREE;
        }
        let sw: f64 = pts.iter().map(|p| p.2).sum();
        let mx = pts.iter().map(|p| p.2 * p.0).sum::<f64>() / sw;
        let my = pts.iter().map(|p| p.2 * p.1).sum::<f64>() / sw;
        let sxx: f64 = pts.iter().map(|p| p.2 * (p.0 - mx) * (p.0 - mx)).sum();
        let sxy: f64 = pts.iter().map(|p| p.2 * (p.0 - mx) * (p.1 - my)).sum();
        let mut slope = if sxx > 0.0 { (sxy / sxx).max(0.0) } else { 0.0 };
        let mut intercept = my - slope * mx;
        if intercept < 0.0 {
            // Through the origin instead.
            intercept = 0.0;
            let sxx0: f64 = pts.iter().map(|p| p.2 * p.0 * p.0).sum();
            let sxy0: f64 = pts.iter().map(|p| p.2 * p.0 * p.1).sum();
            slope = if sxx0 > 0.0 { sxy0 / sxx0 } else { 0.0 };
        }
        CommCost {
            latency_s: intercept,
            secs_per_byte: slope,
            points: Vec::new(),
        }
    }
}

/// Buffer sizes (bytes) the start-up measurement times.
pub const MEASURE_SIZES: [usize; 6] = [4 << 10, 32 << 10, 256 << 10, 1 << 20, 2 << 20, 4 << 20];

/// Times the all-reduce at each of `sizes` (median of `reps` after one warm-up) in two rounds
/// over the sizes, keeping each size's faster round (a round can catch the threads badly
/// placed by the OS scheduler), and returns the `(bytes, secs)` points. A collective: every
/// rank of the group calls it with the same arguments. A group of one rank returns no points.
pub fn measure(
    comm: &mut CommThread,
    sizes: &[usize],
    reps: usize,
) -> Result<Vec<(usize, f64)>, CommError> {
    if comm.size() <= 1 {
        return Ok(Vec::new());
    }
    let mut points: Vec<(usize, f64)> = sizes.iter().map(|&b| (b, f64::INFINITY)).collect();
    for _round in 0..2 {
        for (bytes, best) in points.iter_mut() {
            let mut buf = vec![0f32; bytes.div_ceil(4)];
            let mut times = Vec::with_capacity(reps);
            for i in 0..reps.max(1) + 1 {
                let t0 = Instant::now();
                let t = comm.start_reduce(&buf)?;
                comm.finish_reduce(t, &mut buf)?;
                if i > 0 {
                    times.push(t0.elapsed().as_secs_f64());
                }
            }
            times.sort_by(f64::total_cmp);
            *best = best.min(times[times.len() / 2]);
        }
    }
    Ok(points)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fit_recovers_a_line() {
        let c = CommCost::from_figures(30.0, 1.25);
        let pts: Vec<(usize, f64)> = MEASURE_SIZES.iter().map(|&b| (b, c.secs(b))).collect();
        let f = CommCost::fit(&pts);
        assert!((f.latency_s - 30e-6).abs() < 1e-9, "{f:?}");
        assert!((f.gbytes_per_s() - 1.25).abs() < 1e-6, "{f:?}");
    }

    #[test]
    fn the_fit_stays_non_negative_and_handles_no_points() {
        assert_eq!(CommCost::fit(&[]), CommCost::FREE);
        // Falling times: the slope is clamped at zero.
        let f = CommCost::fit(&[(1000, 2e-3), (100_000, 1e-3)]);
        assert!(f.secs_per_byte >= 0.0 && f.latency_s >= 0.0, "{f:?}");
        // A line through a negative intercept goes through the origin instead.
        let f = CommCost::fit(&[(1000, 1e-6), (1_000_000, 2e-3)]);
        assert!(f.latency_s == 0.0 && f.secs_per_byte > 0.0, "{f:?}");
    }

    #[test]
    fn measured_points_are_interpolated_and_extrapolated() {
        // A shaper: fast up to its burst, then the rate.
        let pts = [
            (4096, 1e-4),
            (65536, 2e-4),
            (1 << 20, 8e-3),
            (4 << 20, 32e-3),
        ];
        let c = CommCost::from_points(&pts);
        for &(b, t) in &pts {
            assert!((c.secs(b) - t).abs() < 1e-12);
        }
        assert_eq!(c.secs(100), 1e-4);
        assert_eq!(c.secs(0), 0.0);
        let mid = c.secs(2 << 20);
        assert!((mid - 16e-3).abs() < 1e-9, "{mid}");
        assert!((c.secs(8 << 20) - 64e-3).abs() < 1e-9);
        assert!((c.gbytes_per_s() - (3 << 20) as f64 / 24e-3 * 1e-9).abs() < 1e-9);
        // Fewer than two points: the line.
        assert!(CommCost::from_points(&[(4096, 1e-4)]).points.is_empty());
    }

    #[test]
    fn measuring_a_local_group_gives_growing_times() {
        let comms = crate::local::group(2, std::time::Duration::from_secs(10));
        let handles: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(r, c)| {
                std::thread::spawn(move || {
                    let mut t = CommThread::spawn(Box::new(c), &format!("c{r}")).unwrap();
                    measure(&mut t, &[1024, 1 << 20], 3).unwrap()
                })
            })
            .collect();
        for h in handles {
            let pts = h.join().unwrap();
            assert_eq!(pts.len(), 2);
            assert!(pts.iter().all(|p| p.1 > 0.0));
        }
    }
}
