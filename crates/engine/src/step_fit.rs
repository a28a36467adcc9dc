//! The step cost refitted online to the steps the engine measures ([`OnlineFit`]): the
//! start-up calibration ([`crate::step_cost`]) is a few seconds of one machine state, and a
//! shared machine drifts from it.

use tessera_scheduler::StepCost;

/// Weight of the past in [`OnlineFit`]: each step's information decays by this factor per
/// step (a memory of about 50 steps).
pub const FORGET: f64 = 0.98;
/// Ranges of [`OnlineFit`]'s factors on the fixed and on the other parts.
pub const FIXED_SCALES: (f64, f64) = (0.01, 10.0);
pub const SCALES: (f64, f64) = (0.1, 10.0);
/// Each step the factors move this share of the way back to 1, so directions the steps do
/// not tell apart drift back to the calibration.
const PULL: f64 = 0.0005;
/// A step counts as at most this many times its prediction, and at least its inverse (a
/// step the OS held up does not swing the fit).
const CLIP: f64 = 3.0;
/// Initial (and largest) variance of each factor.
const P0: f64 = 4.0;

/// The step cost refitted to measured steps: `base` with its fixed parts (`fixed_s`, and
/// `head_fixed_s` in steps with logits) times one factor and everything else (per token,
/// per key, per logits row) times another. The start-up profile times one layer's stages in
/// isolation, on a machine others may share at that moment: both the size of the fixed
/// parts (thread wake-ups dominate the smallest steps) and the speed of the rest drift from
/// it. The factors are fitted by recursive least squares with forgetting on relative errors
/// (each step weighted by its prediction, so small and large steps count alike), starting
/// at 1 and pulled slowly back to it.
#[derive(Debug, Clone, PartialEq)]
pub struct OnlineFit {
    base: StepCost,
    theta: [f64; 2],
    p: [[f64; 2]; 2],
    steps: u64,
}

impl OnlineFit {
    pub fn new(base: StepCost) -> Self {
        OnlineFit {
            base,
            theta: [1.0; 2],
            p: [[P0, 0.0], [0.0, P0]],
            steps: 0,
        }
    }

    /// The fixed and the other seconds of a step of `(start, len, logits)` chunks under the
    /// base cost (both zero for no chunks).
    pub fn parts<I: IntoIterator<Item = (usize, usize, bool)>>(&self, chunks: I) -> [f64; 2] {
        let c = &self.base;
        let (mut rest, mut logits, mut any) = (0.0, false, false);
        for (start, len, l) in chunks {
            if len > 0 {
                any = true;
                logits |= l;
                rest += c.chunk(start, len, l);
            }
        }
        if !any {
            return [0.0; 2];
        }
        [c.fixed_s + if logits { c.head_fixed_s } else { 0.0 }, rest]
    }

    /// Takes a step whose base-cost parts were `x` and that took `secs`.
    pub fn observe(&mut self, x: [f64; 2], secs: f64) {
        let pred = x[0] * self.theta[0] + x[1] * self.theta[1];
        if !(pred > 0.0 && pred.is_finite() && secs > 0.0 && secs.is_finite()) {
            return;
        }
        // y / pred regressed on x / pred: relative errors, weighted by the prediction (not
        // by the measurement, which would bias the factors low under noise).
        let y = secs.clamp(pred / CLIP, pred * CLIP) / pred;
        let z = [x[0] / pred, x[1] / pred];
        let pz = [
            self.p[0][0] * z[0] + self.p[0][1] * z[1],
            self.p[1][0] * z[0] + self.p[1][1] * z[1],
        ];
        let denom = FORGET + z[0] * pz[0] + z[1] * pz[1];
        let err = y - (z[0] * self.theta[0] + z[1] * self.theta[1]);
        let ranges = [FIXED_SCALES, SCALES];
        for i in 0..2 {
            let gain = pz[i] / denom;
            let t = self.theta[i] + gain * err;
            self.theta[i] = (t + PULL * (1.0 - t)).clamp(ranges[i].0, ranges[i].1);
            for (pij, pzj) in self.p[i].iter_mut().zip(pz) {
                *pij = (*pij - gain * pzj) / FORGET;
            }
        }
        // Directions the steps do not excite would grow without bound: cap them.
        let top = self.p[0][0].max(self.p[1][1]);
        if top > P0 {
            let f = P0 / top;
            self.p.iter_mut().flatten().for_each(|v| *v *= f);
        }
        self.steps += 1;
    }

    /// The factors on the fixed and on the other parts.
    pub fn scales(&self) -> [f64; 2] {
        self.theta
    }

    /// Steps observed.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The refitted cost.
    pub fn cost(&self) -> StepCost {
        let (c, [f, v]) = (&self.base, self.theta);
        StepCost {
            fixed_s: c.fixed_s * f,
            head_fixed_s: c.head_fixed_s * f,
            per_token_s: c.per_token_s * v,
            per_key_s: c.per_key_s * v,
            per_key2_s: c.per_key2_s * v,
            per_logit_row_s: c.per_logit_row_s * v,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::step_cost::tests::base;

    /// A mix of step shapes: prompts, decodes, deep chunks.
    fn shapes(n: usize) -> Vec<Vec<(usize, usize, bool)>> {
        (0..n)
            .map(|i| match i % 4 {
                0 => vec![(0, 30 + i % 17, true)],
                1 => (0..16).map(|s| (100 + 10 * s + i % 7, 1, true)).collect(),
                2 => vec![(2000 + 7 * i, 12, false), (50, 1, true)],
                _ => vec![(500, 40, false), (3000, 3, true)],
            })
            .collect()
    }

    /// Feeds `f` the steps of `shapes(n)` as a machine with cost `truth` would run them,
    /// each off by `noise(i)` times; returns the predictions over the truth after `warm`.
    fn feed(
        f: &mut OnlineFit,
        truth: &StepCost,
        n: usize,
        warm: usize,
        noise: impl Fn(usize) -> f64,
    ) -> Vec<f64> {
        let mut ratios = Vec::new();
        for (i, chunks) in shapes(n).into_iter().enumerate() {
            let want = truth.step(chunks.iter().copied());
            if i >= warm {
                ratios.push(f.cost().step(chunks.iter().copied()) / want);
            }
            let x = f.parts(chunks.iter().copied());
            f.observe(x, want * noise(i));
        }
        ratios
    }

    #[test]
    fn the_fit_finds_a_wrong_intercept_and_a_slower_machine() {
        // Calibrated on a moment when every step paid 100 ms of thread wake-ups; the machine
        // really pays 3 ms, and is 1.5 times slower per token and key.
        let prior = StepCost {
            fixed_s: 100e-3,
            ..base()
        };
        let truth = StepCost {
            per_token_s: 1.5 * base().per_token_s,
            per_key_s: 1.5 * base().per_key_s,
            per_key2_s: 1.5 * base().per_key2_s,
            per_logit_row_s: 1.5 * base().per_logit_row_s,
            ..base()
        };
        let mut f = OnlineFit::new(prior);
        assert_eq!(f.cost(), prior);
        let ratios = feed(&mut f, &truth, 400, 200, |_| 1.0);
        let worst = ratios.iter().map(|r| (r - 1.0).abs()).fold(0.0, f64::max);
        assert!(worst < 0.1, "predictions off by up to {worst}");
        let [fx, v] = f.scales();
        assert!(fx < 0.1 && (v - 1.5).abs() < 0.1, "{:?}", f.scales());
        assert_eq!(f.steps(), 400);
    }

    #[test]
    fn noisy_steps_leave_the_fit_close() {
        let truth = StepCost {
            per_token_s: 2.0 * base().per_token_s,
            ..base()
        };
        let mut f = OnlineFit::new(base());
        // Each step off by a factor of exp(u), u uniform in ±0.5 (a spread like a shared
        // machine's), and one step in 50 held up ten times as long.
        let rng = std::cell::Cell::new(0x9e37_79b9_7f4a_7c15u64);
        let mut ratios = feed(&mut f, &truth, 800, 200, |i| {
            let mut r = rng.get();
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            rng.set(r);
            let u = (r >> 11) as f64 / (1u64 << 53) as f64 - 0.5;
            u.exp() * if i % 50 == 49 { 10.0 } else { 1.0 }
        });
        ratios.sort_by(f64::total_cmp);
        let median = ratios[ratios.len() / 2];
        assert!(
            (median - 1.0).abs() < 0.15,
            "median prediction / truth {median}"
        );
    }

    #[test]
    fn the_fit_stays_in_range_and_ignores_nonsense() {
        let mut f = OnlineFit::new(base());
        let x = f.parts([(0, 30, true)]);
        for secs in [f64::NAN, -1.0, 0.0, f64::INFINITY] {
            f.observe(x, secs);
        }
        f.observe([0.0; 2], 0.1);
        assert_eq!((f.scales(), f.steps()), ([1.0; 2], 0));
        for chunks in shapes(400) {
            let x = f.parts(chunks.iter().copied());
            f.observe(x, 1000.0 * base().step(chunks));
        }
        let [fx, v] = f.scales();
        assert!((FIXED_SCALES.0..=FIXED_SCALES.1).contains(&fx));
        assert!((SCALES.0..=SCALES.1).contains(&v));
        assert!(f.cost().validate().is_ok());
    }
}
