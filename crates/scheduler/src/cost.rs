//! The step-cost predictor the scheduler consults: a step's predicted time as plain data,
//! fitted by the engine from its measured stage profile (`tessera_engine::step_cost`).
//!
//! A step of chunks `(start, len, logits)` is predicted to take
//!
//! ```text
//! fixed + per_token × Σ len + per_key × Σ keys(start, len) + per_key2 × Σ keys2(start, len)
//!       + [any logits row] head_fixed + per_logit_row × (chunks with logits)
//! ```
//!
//! where `keys(start, len) = Σ_{j<len} (start + j)` counts the earlier positions the
//! chunk's query rows attend (row `j` sees every position before its own, and itself, whose
//! cost is in the per-token term: as in the stage profile) and `keys2` sums their squares.
//! The per-token term is the matrix products and everything else linear in rows; the
//! per-key terms are attention's score and value work over the context: the cost of one key
//! grows with the context (`per_key + per_key2 × position`: once a sequence's keys outgrow
//! the caches they come from memory), so a chunk deep in a long prompt costs several times
//! more per token than one near its start. The head (final norm and vocabulary product)
//! costs once per logits row plus a fixed part whenever a step has any.

use crate::SchedError;

/// Seconds of the parts of a step, for the whole model (every layer).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepCost {
    /// Every step: dispatch, embedding and per-step overhead, the rows' fit's intercept.
    pub fixed_s: f64,
    /// Per computed token (row), every layer's products and norms.
    pub per_token_s: f64,
    /// Per (query token × earlier position it attends), every layer.
    pub per_key_s: f64,
    /// Per (query token × earlier position it attends) × the query's position: how much
    /// dearer a key is deep in a long context.
    pub per_key2_s: f64,
    /// Once in a step with at least one logits row (the head's weights read once).
    pub head_fixed_s: f64,
    /// Per logits row.
    pub per_logit_row_s: f64,
}

/// Earlier positions attended by `len` rows at positions `start..start + len` (the row at
/// `p` attends `p` of them besides itself).
pub fn keys(start: usize, len: usize) -> f64 {
    let (s, n) = (start as f64, len as f64);
    n * s + n * (n - 1.0) / 2.0
}

/// Σ p² over the positions `start..start + len` of `len` rows (each row at `p` attends `p`
/// earlier positions, each costing `per_key2 × p` more).
pub fn keys2(start: usize, len: usize) -> f64 {
    // Σ_{p<n} p² = (n − 1) n (2n − 1) / 6.
    let s2 = |n: f64| (n - 1.0) * n * (2.0 * n - 1.0) / 6.0;
    let (s, n) = (start as f64, len as f64);
    if len == 0 {
        return 0.0;
    }
    s2(s + n) - s2(s)
}

impl StepCost {
    /// A chunk's own cost (without the step's fixed parts and the head's fixed part).
    pub fn chunk(&self, start: usize, len: usize, logits: bool) -> f64 {
        if len == 0 {
            return 0.0;
        }
        let head = if logits { self.per_logit_row_s } else { 0.0 };
        self.per_token_s * len as f64
            + self.per_key_s * keys(start, len)
            + self.per_key2_s * keys2(start, len)
            + head
    }

    /// Predicted seconds of a step of `(start, len, wants_logits)` chunks (0 for none).
    pub fn step<I: IntoIterator<Item = (usize, usize, bool)>>(&self, chunks: I) -> f64 {
        let (mut t, mut any, mut logits) = (0.0, false, false);
        for (start, len, l) in chunks {
            if len == 0 {
                continue;
            }
            any = true;
            logits |= l;
            t += self.chunk(start, len, l);
        }
        if !any {
            return 0.0;
        }
        t + self.fixed_s + if logits { self.head_fixed_s } else { 0.0 }
    }

    /// Predicted seconds of a plan.
    pub fn plan(&self, plan: &crate::StepPlan) -> f64 {
        self.step(
            plan.seqs
                .iter()
                .map(|s| (s.start_pos, s.tokens.len(), s.wants_logits)),
        )
    }

    /// The most tokens, at most `max`, of a chunk from `start` whose cost is at most `secs`;
    /// `logits_at` is the length at which the chunk reaches its last known token and wants
    /// logits, which costs `logit_cost` more (the row, and the head's fixed part if it is
    /// the step's first); no chunk goes past `logits_at`. Monotone in `secs`.
    pub fn max_tokens(
        &self,
        start: usize,
        max: usize,
        logits_at: usize,
        logit_cost: f64,
        secs: f64,
    ) -> usize {
        let fits = |n: usize| {
            let extra = if n == logits_at { logit_cost } else { 0.0 };
            self.chunk(start, n, false) + extra <= secs
        };
        let max = max.min(logits_at);
        if max == 0 || !fits(1) {
            return 0;
        }
        if fits(max) {
            return max;
        }
        // Largest n in [1, max) with fits(n); fits is monotone (costs only grow with n).
        let (mut lo, mut hi) = (1usize, max);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }

    pub fn validate(&self) -> Result<(), SchedError> {
        let parts = [
            self.fixed_s,
            self.per_token_s,
            self.per_key_s,
            self.per_key2_s,
            self.head_fixed_s,
            self.per_logit_row_s,
        ];
        if parts.iter().any(|p| !p.is_finite() || *p < 0.0) {
            return Err(SchedError::InvalidConfig {
                reason: format!("step cost parts must be finite and non-negative: {self:?}"),
            });
        }
        if self.per_token_s <= 0.0 {
            return Err(SchedError::InvalidConfig {
                reason: "the step cost's per-token part must be positive".into(),
            });
        }
        Ok(())
    }
}

/// The largest share of a step its fixed parts may take: steps are filled to at least
/// `(fixed_s + head_fixed_s) / MAX_FIXED_SHARE`, so a budget below what the machine needs to
/// run any step (a slow or busy machine, where every step pays a large fixed cost) never
/// shrinks steps to a few tokens each.
pub const MAX_FIXED_SHARE: f64 = 0.25;

/// What a step is filled to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Budget {
    /// This many seconds.
    Secs(f64),
    /// `factor` times the predicted step of a fresh prompt of `prompt_tokens` tokens: it
    /// follows the cost model (a slower machine, or one refitted to slower steps, gets a
    /// larger budget), so a prompt that long always completes in one step.
    Relative { factor: f64, prompt_tokens: usize },
}

/// Steps filled by predicted time: `cost` predicts each step, and a step is filled until its
/// prediction reaches the budget (the token budget stays an upper limit), or
/// [`TimeBudget::effective_s`] when the fixed parts need more.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimeBudget {
    pub cost: StepCost,
    pub budget: Budget,
}

impl TimeBudget {
    /// A budget of `secs` seconds.
    pub fn secs(cost: StepCost, secs: f64) -> Self {
        TimeBudget {
            cost,
            budget: Budget::Secs(secs),
        }
    }

    /// A budget of `factor` times the predicted step of a fresh `prompt_tokens`-token prompt.
    pub fn relative(cost: StepCost, factor: f64, prompt_tokens: usize) -> Self {
        TimeBudget {
            cost,
            budget: Budget::Relative {
                factor,
                prompt_tokens,
            },
        }
    }

    /// The budget in seconds under the current cost.
    pub fn budget_s(&self) -> f64 {
        match self.budget {
            Budget::Secs(s) => s,
            Budget::Relative {
                factor,
                prompt_tokens,
            } => factor * self.cost.step([(0, prompt_tokens, true)]),
        }
    }

    /// The budget steps are filled to: [`TimeBudget::budget_s`], raised so the fixed parts
    /// take at most [`MAX_FIXED_SHARE`] of a step.
    pub fn effective_s(&self) -> f64 {
        let fixed = self.cost.fixed_s + self.cost.head_fixed_s;
        self.budget_s().max(fixed / MAX_FIXED_SHARE)
    }

    pub fn validate(&self) -> Result<(), SchedError> {
        self.cost.validate()?;
        if let Budget::Relative {
            factor,
            prompt_tokens,
        } = self.budget
        {
            if !(factor > 0.0 && factor.is_finite()) || prompt_tokens == 0 {
                return Err(SchedError::InvalidConfig {
                    reason: format!(
                        "a relative step-time budget needs a positive factor and prompt, got \
                         {factor} x {prompt_tokens} tokens"
                    ),
                });
            }
        }
        let b = self.budget_s();
        if !(b > 0.0 && b.is_finite()) {
            return Err(SchedError::InvalidConfig {
                reason: format!(
                    "the step-time budget must be a positive number of seconds, got {b}"
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn cost() -> StepCost {
        StepCost {
            fixed_s: 0.01,
            per_token_s: 0.002,
            per_key_s: 1e-6,
            per_key2_s: 0.0,
            head_fixed_s: 0.005,
            per_logit_row_s: 0.0001,
        }
    }

    #[test]
    fn keys_count_every_rows_context() {
        assert_eq!(keys(0, 1), 0.0);
        assert_eq!(keys(0, 3), 3.0);
        assert_eq!(keys(10, 2), 10.0 + 11.0);
        assert_eq!(keys(5, 0), 0.0);
        assert_eq!(keys2(0, 1), 0.0);
        assert_eq!(keys2(0, 4), 1.0 + 4.0 + 9.0);
        assert_eq!(keys2(10, 2), 100.0 + 121.0);
        assert_eq!(keys2(7, 0), 0.0);
        for (s, n) in [(0usize, 1usize), (3, 17), (1000, 64), (4095, 1)] {
            let naive: f64 = (s..s + n).map(|p| (p * p) as f64).sum();
            assert_eq!(keys2(s, n), naive);
        }
    }

    #[test]
    fn step_adds_fixed_parts_once() {
        let c = cost();
        assert_eq!(c.step([]), 0.0);
        let one = c.step([(0, 4, false)]);
        assert!((one - (0.01 + 4.0 * 0.002 + 6.0 * 1e-6)).abs() < 1e-12);
        let two = c.step([(0, 4, false), (100, 1, true)]);
        let want = one + 0.002 + 100.0 * 1e-6 + 0.005 + 0.0001;
        assert!((two - want).abs() < 1e-12, "{two} {want}");
    }

    #[test]
    fn deep_chunks_get_fewer_tokens() {
        let c = cost();
        let shallow = c.max_tokens(0, 10_000, 10_000, 0.0, 0.05);
        let deep = c.max_tokens(3000, 10_000, 10_000, 0.0, 0.05);
        assert!(deep < shallow, "{deep} {shallow}");
        for (start, n) in [(0, shallow), (3000, deep)] {
            assert!(c.chunk(start, n, false) <= 0.05);
            assert!(c.chunk(start, n + 1, false) > 0.05);
        }
        assert_eq!(c.max_tokens(0, 7, 7, 0.0, 1.0), 7, "capped by max");
        assert_eq!(c.max_tokens(0, 7, 7, 0.0, 0.0), 0);
        assert_eq!(c.max_tokens(0, 0, 0, 0.0, 1.0), 0);
        // The last token's logits can tip it: one short of the end then.
        let end = c.chunk(0, 7, false);
        assert_eq!(c.max_tokens(0, 7, 7, 1.0, end), 6);
        assert_eq!(c.max_tokens(0, 7, 7, 1.0, end + 1.0), 7);
    }

    #[test]
    fn invalid_parts_are_refused() {
        let mut c = cost();
        assert!(c.validate().is_ok());
        c.per_key_s = f64::NAN;
        assert!(c.validate().is_err());
        let mut c = cost();
        c.per_token_s = 0.0;
        assert!(c.validate().is_err());
        assert!(TimeBudget::secs(cost(), 0.0).validate().is_err());
        assert!(TimeBudget::relative(cost(), 1.5, 0).validate().is_err());
        assert!(TimeBudget::relative(cost(), -1.0, 32).validate().is_err());
        assert!(TimeBudget::relative(cost(), 1.5, 32).validate().is_ok());
    }

    #[test]
    fn the_fixed_parts_take_at_most_a_quarter() {
        assert_eq!(TimeBudget::secs(cost(), 0.1).effective_s(), 0.1);
        let b = TimeBudget::secs(cost(), 0.02);
        assert!((b.effective_s() - 0.015 / MAX_FIXED_SHARE).abs() < 1e-12);
        // A relative budget follows the cost.
        let r = TimeBudget::relative(cost(), 2.0, 10);
        assert!((r.budget_s() - 2.0 * cost().step([(0, 10, true)])).abs() < 1e-12);
        let mut slow = cost();
        slow.per_token_s *= 3.0;
        assert!(TimeBudget::relative(slow, 2.0, 10).budget_s() > r.budget_s());
    }

    /// Naive reference: the cost summed row by row, the longest fitting length by scanning.
    fn naive_max(c: &StepCost, start: usize, max: usize, at: usize, lc: f64, secs: f64) -> usize {
        let row = |p: usize| c.per_token_s + c.per_key_s * p as f64 + c.per_key2_s * (p * p) as f64;
        let mut best = 0;
        let mut t = 0.0;
        for n in 1..=max.min(at) {
            t += row(start + n - 1);
            let extra = if n == at { lc } else { 0.0 };
            if t + extra <= secs * (1.0 + 1e-12) {
                best = n;
            }
        }
        best
    }

    proptest! {
        #[test]
        fn max_tokens_matches_a_scan(
            start in 0usize..5000,
            max in 0usize..700,
            extra in 0usize..3,
            per_token in 1e-5f64..1e-2,
            per_key in prop_oneof![Just(0.0f64), 1e-9f64..1e-5],
            per_key2 in prop_oneof![Just(0.0f64), 1e-13f64..1e-9],
            lc in 0.0f64..1e-2,
            secs in 0.0f64..0.5,
        ) {
            let c = StepCost {
                fixed_s: 1e-3,
                per_token_s: per_token,
                per_key_s: per_key,
                per_key2_s: per_key2,
                head_fixed_s: 0.0,
                per_logit_row_s: 0.0,
            };
            let at = max + extra;
            let got = c.max_tokens(start, max, at, lc, secs);
            let want = naive_max(&c, start, max, at, lc, secs);
            // Float sums in a different order may disagree at the very edge by one token.
            prop_assert!(got.abs_diff(want) <= 1, "{} vs {}", got, want);
            if got > 0 {
                let extra_cost = if got == at { lc } else { 0.0 };
                prop_assert!(c.chunk(start, got, false) + extra_cost <= secs);
            }
        }
    }
}
