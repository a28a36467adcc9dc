//! Speculative decoding inside the step engine: drafters propose tokens, the scheduler puts
//! each proposal in the step as one verification chunk (the decode token and `k` drafts,
//! `k + 1` rows with logits), and the request's own sampler accepts a prefix of them
//! ([`crate::live::LiveRequest::on_verify`]).
//!
//! The exact path computes every row the same whatever the rows around it, so with greedy
//! sampling a verification emits exactly the tokens plain decoding would, bit for bit; with
//! sampling, the rejection step keeps the target distribution. Drafts only change how many
//! tokens one step makes.
//!
//! Drafters ([`Drafter`]):
//! - **n-gram / prompt lookup** (llama.cpp's n-gram modes, vLLM's `ngram`): the last `n`
//!   tokens (longest `n` first) are looked up earlier in the prompt and output, and what
//!   followed their latest occurrence is proposed. Free to compute.
//! - **a draft model** ([`crate::draft::DraftModel`]): a smaller model with the same
//!   vocabulary decodes `k` tokens greedily, its KV cache kept beside the target's.
//!
//! How many tokens to draft ([`SpecTokens`]): a fixed `k`, or `auto`, where each step picks
//! the drafts that raise expected tokens per second: a draft at depth `j` of a sequence
//! whose drafts are accepted at rate `α` yields `α^j` expected tokens and costs the step
//! its row (and, for a draft model, its share of the draft forwards); drafts are added,
//! likeliest first, while their expected tokens per second of added time beat the step's
//! tokens per second. Acceptance is measured per sequence (smoothed, starting from the
//! drafter's running rate) and the step's time per row is fitted online to the measured
//! steps, so drafting stops where it does not pay: at high load (a step of many rows costs
//! more per added row) or low acceptance.

use std::collections::HashMap;
use std::path::PathBuf;

use tessera_core::{Error, Result};

/// Which drafter proposes tokens.
#[derive(Debug, Clone, PartialEq)]
pub enum DrafterSpec {
    /// Prompt lookup: match the last `max_n` down to `min_n` tokens earlier in the sequence.
    NGram { min_n: usize, max_n: usize },
    /// A draft model (GGUF file or folder) with the target's vocabulary.
    Model(PathBuf),
}

impl DrafterSpec {
    /// `ngram` or `draft:PATH` (the `--speculative` flag).
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim() {
            "ngram" | "prompt-lookup" => Ok(DrafterSpec::NGram { min_n: 1, max_n: 4 }),
            s => match s.strip_prefix("draft:") {
                Some(p) if !p.is_empty() => Ok(DrafterSpec::Model(PathBuf::from(p))),
                _ => Err(Error::Config(format!(
                    "speculative drafter {s:?}: expected ngram or draft:PATH"
                ))),
            },
        }
    }

    /// The drafter's name in metrics and reports.
    pub fn name(&self) -> &'static str {
        match self {
            DrafterSpec::NGram { .. } => "ngram",
            DrafterSpec::Model(_) => "draft",
        }
    }
}

/// How many tokens are drafted per verification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecTokens {
    /// Always up to `k` (what the drafter has).
    Fixed(usize),
    /// Chosen per sequence and step from measured acceptance and step time, at most `max`.
    Auto { max: usize },
}

/// The most tokens `auto` drafts per verification.
pub const AUTO_MAX: usize = 8;

impl SpecTokens {
    /// `K` or `auto` (the `--spec-tokens` flag).
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim() {
            "auto" => Ok(SpecTokens::Auto { max: AUTO_MAX }),
            s => match s.parse::<usize>() {
                Ok(k) if k <= 64 => Ok(SpecTokens::Fixed(k)),
                _ => Err(Error::Config(format!(
                    "speculative tokens {s:?}: expected auto or a number from 0 to 64"
                ))),
            },
        }
    }

    /// The most tokens drafted per verification.
    pub fn max(&self) -> usize {
        match *self {
            SpecTokens::Fixed(k) => k,
            SpecTokens::Auto { max } => max,
        }
    }
}

/// Speculative decoding settings of a step engine.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecConfig {
    pub drafter: DrafterSpec,
    pub tokens: SpecTokens,
}

/// Counters of one drafter's work (cumulative).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SpecStats {
    /// Verification chunks run.
    pub verifications: u64,
    /// Drafted tokens verified.
    pub drafted: u64,
    /// Drafted tokens accepted.
    pub accepted: u64,
    /// Tokens the verifications made known (accepted drafts and the token after them).
    pub emitted: u64,
    /// Seconds spent drafting (a draft model's forwards; lookups).
    pub draft_s: f64,
}

impl SpecStats {
    /// Accepted share of the drafted tokens.
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }
    /// Tokens per verification (1 would be plain decoding).
    pub fn tokens_per_verification(&self) -> f64 {
        if self.verifications == 0 {
            0.0
        } else {
            self.emitted as f64 / self.verifications as f64
        }
    }
    /// What happened since `before` (an earlier copy of these counters).
    pub fn delta(&self, before: &SpecStats) -> SpecStats {
        SpecStats {
            verifications: self.verifications - before.verifications,
            drafted: self.drafted - before.drafted,
            accepted: self.accepted - before.accepted,
            emitted: self.emitted - before.emitted,
            draft_s: self.draft_s - before.draft_s,
        }
    }
    pub fn add(&mut self, o: &SpecStats) {
        self.verifications += o.verifications;
        self.drafted += o.drafted;
        self.accepted += o.accepted;
        self.emitted += o.emitted;
        self.draft_s += o.draft_s;
    }
}

/// Prompt lookup: the tokens that followed an earlier occurrence of the last `n` tokens of
/// `seq`, for `n` from `max_n` down to `min_n`, at most `k` of them (empty if no suffix
/// recurs). Of the occurrences of the longest suffix that recurs, the latest with `k` tokens
/// after it is taken, else the one with the most; the match may overlap the suffix itself,
/// so a repeating pattern continues.
pub fn ngram_draft(seq: &[u32], k: usize, min_n: usize, max_n: usize) -> Vec<u32> {
    let len = seq.len();
    if k == 0 || len < 2 {
        return Vec::new();
    }
    for n in (min_n.max(1)..=max_n.min(len - 1)).rev() {
        let suffix = &seq[len - n..];
        // (start of the continuation, its length) of the best occurrence so far.
        let mut best: Option<(usize, usize)> = None;
        for i in (0..len - n).rev() {
            if &seq[i..i + n] == suffix {
                let from = i + n;
                let avail = (len - from).min(k);
                if best.is_none_or(|b| avail > b.1) {
                    best = Some((from, avail));
                }
                if avail == k {
                    break;
                }
            }
        }
        if let Some((from, avail)) = best {
            return seq[from..from + avail].to_vec();
        }
    }
    Vec::new()
}

/// Online model of a step's seconds against its rows: one-row steps (a lone decode) are
/// timed apart (smoothed), and steps of more rows are fitted as `fixed + per_row × rows`
/// (exponentially weighted least squares, with a faint prior: a step whose rows cost a
/// tenth of its fixed part each, which matters only until two row counts have been seen).
/// Kept apart because the step from one row to two can cost far more than a row: a
/// one-row product reads the weights once as a matrix-vector product, while two rows may
/// take another kernel (on the exact path, one that widens the weights first).
#[derive(Debug, Clone)]
pub struct RowCost {
    /// Seconds of a one-row step, smoothed.
    one: Option<f64>,
    // Weighted sums of 1, x, y, x², xy over the steps of two rows or more.
    s: [f64; 5],
}

impl RowCost {
    const DECAY: f64 = 0.98;

    pub fn new() -> Self {
        // Pseudo-observations: 1 row in 10 ms, 33 rows in 42 ms (per row 1 ms).
        let mut c = RowCost {
            one: None,
            s: [0.0; 5],
        };
        c.add(1.0, 0.010, 1e-3);
        c.add(33.0, 0.042, 1e-3);
        c
    }

    pub fn observe(&mut self, rows: f64, secs: f64) {
        if !(secs.is_finite() && secs > 0.0 && rows > 0.0) {
            return;
        }
        if rows <= 1.0 {
            self.one = Some(self.one.map_or(secs, |t| t + 0.2 * (secs - t)));
            return;
        }
        for v in &mut self.s {
            *v *= Self::DECAY;
        }
        self.add(rows, secs, 1.0);
    }

    fn add(&mut self, x: f64, y: f64, w: f64) {
        self.s[0] += w;
        self.s[1] += w * x;
        self.s[2] += w * y;
        self.s[3] += w * x * x;
        self.s[4] += w * x * y;
    }

    /// `(fixed, per_row)` seconds of steps of several rows, both kept positive.
    pub fn fit(&self) -> (f64, f64) {
        let [n, x, y, xx, xy] = self.s;
        let den = n * xx - x * x;
        let mean = y / n.max(1e-12);
        if den.abs() < 1e-12 {
            return (mean.max(1e-6), mean.max(1e-6) * 0.1);
        }
        let b = (n * xy - x * y) / den;
        let a = (y - b * x) / n;
        let b = b.max(1e-7);
        (a.max(1e-6), b)
    }

    /// Predicted seconds of a step of `rows` rows.
    pub fn predict(&self, rows: usize) -> f64 {
        match (rows, self.one) {
            (1, Some(t)) => t,
            _ => {
                let (a, b) = self.fit();
                a + b * rows as f64
            }
        }
    }

    /// The step of `rows` rows as `(fixed, per_row, jump)`: `fixed + per_row × rows` is its
    /// predicted time, and its first added row costs `jump` more than `per_row` (going from
    /// one row to two).
    pub fn model(&self, rows: usize) -> (f64, f64, f64) {
        let (a, b) = self.fit();
        match (rows, self.one) {
            (1, Some(t)) => ((t - b).max(1e-6), b, (a + b - t).max(0.0)),
            _ => (a, b, 0.0),
        }
    }
}

impl Default for RowCost {
    fn default() -> Self {
        Self::new()
    }
}

/// One sequence's candidate drafts for the step: at most `avail` tokens, accepted at rate
/// `alpha`; its first draft costs `setup` seconds more (a draft model catching up on the
/// sequence, amortized over the tokens it has left).
#[derive(Debug, Clone, Copy)]
pub struct Candidate {
    pub alpha: f64,
    pub avail: usize,
    pub setup: f64,
}

/// How much more a draft must be expected to yield than it costs, at the step's rate.
const MARGIN: f64 = 1.1;

/// How many drafts each candidate gets this step (`auto`): drafts are added likeliest
/// first (the `j`-th of a sequence accepted with probability `alpha^j`) while the expected
/// tokens one adds per second it costs beat the step's expected tokens per second. The
/// step has `rows` rows before drafts and `tokens` expected tokens; a draft costs
/// `per_row` seconds in the verification and `per_draft` more to draft.
pub fn choose_drafts(
    cands: &[Candidate],
    fixed: f64,
    per_row: f64,
    per_draft: f64,
    rows: usize,
    tokens: f64,
) -> Vec<usize> {
    let mut k = vec![0usize; cands.len()];
    let mut time = fixed + per_row * rows as f64;
    let mut gain = tokens;
    let cost = per_row + per_draft;
    loop {
        // The likeliest next draft among the candidates.
        let best = cands
            .iter()
            .enumerate()
            .filter(|(i, c)| k[*i] < c.avail)
            .map(|(i, c)| (i, c.alpha.powi(k[i] as i32 + 1)))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        let Some((i, g)) = best else {
            break;
        };
        let c = cost + if k[i] == 0 { cands[i].setup } else { 0.0 };
        // A tenth of margin: what the fits leave out (sampling each row, switching between
        // the models' threads) is not free.
        if g * time <= MARGIN * gain * c {
            break;
        }
        k[i] += 1;
        gain += g;
        time += c;
    }
    k
}

/// Per-sequence acceptance: each examined draft is a trial, accepted or not, so the rate is
/// kept as decayed counts of trials and acceptances (the estimate a run cut at its first
/// rejection calls for), per sequence starting from the drafter's running rate.
#[derive(Debug, Default)]
pub struct Acceptance {
    /// (accepted, examined), decayed.
    per_seq: HashMap<u64, (f64, f64)>,
    global: Option<(f64, f64)>,
}

impl Acceptance {
    /// Weight kept by the earlier counts at each verification.
    const DECAY: f64 = 0.8;
    /// The drafter's counts decay more slowly.
    const GLOBAL_DECAY: f64 = 0.98;
    /// The rate assumed before anything was measured, and the trials a new sequence's
    /// prior (the drafter's rate) counts as.
    const PRIOR: f64 = 0.5;
    const PRIOR_TRIALS: f64 = 2.0;

    fn global_rate(&self) -> f64 {
        match self.global {
            Some((a, n)) if n > 0.0 => a / n,
            _ => Self::PRIOR,
        }
    }

    pub fn rate(&self, id: u64) -> f64 {
        match self.per_seq.get(&id) {
            Some(&(a, n)) if n > 0.0 => a / n,
            _ => self.global_rate(),
        }
    }

    /// A verification that examined `drafted` drafts and accepted `accepted` of them.
    pub fn observe(&mut self, id: u64, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        let (a, n) = (accepted as f64, drafted as f64);
        let g = self.global_rate();
        let (ga, gn) = self.global.unwrap_or((0.0, 0.0));
        self.global = Some((ga * Self::GLOBAL_DECAY + a, gn * Self::GLOBAL_DECAY + n));
        let e = self
            .per_seq
            .entry(id)
            .or_insert((g * Self::PRIOR_TRIALS, Self::PRIOR_TRIALS));
        *e = (e.0 * Self::DECAY + a, e.1 * Self::DECAY + n);
    }

    pub fn forget(&mut self, id: u64) {
        self.per_seq.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ngram_finds_the_latest_longest_match() {
        // "1 2 3 9 ... 1 2 3" -> what followed "1 2 3": 9 8.
        let s = [1, 2, 3, 9, 8, 5, 1, 2, 3];
        assert_eq!(ngram_draft(&s, 2, 1, 4), vec![9, 8]);
        assert_eq!(ngram_draft(&s, 10, 1, 4), vec![9, 8, 5, 1, 2, 3]);
        // No recurrence: nothing.
        assert!(ngram_draft(&[1, 2, 3, 4], 4, 1, 4).is_empty());
        // A repeating token continues itself.
        assert_eq!(ngram_draft(&[5, 7, 7, 7], 3, 1, 4), vec![7]);
        // The latest occurrence wins: "4" was followed by 1, later by 2.
        assert_eq!(ngram_draft(&[4, 1, 4, 2, 4], 1, 1, 1), vec![2]);
        // ... unless a k-token continuation is only found further back.
        assert_eq!(ngram_draft(&[4, 1, 2, 3, 4, 5, 4], 3, 1, 1), vec![1, 2, 3]);
        assert!(ngram_draft(&[1], 3, 1, 4).is_empty());
        assert!(ngram_draft(&[1, 1], 0, 1, 4).is_empty());
    }

    #[test]
    fn parse_flags() {
        assert_eq!(
            DrafterSpec::parse("ngram").unwrap(),
            DrafterSpec::NGram { min_n: 1, max_n: 4 }
        );
        assert_eq!(
            DrafterSpec::parse("draft:/m/x.gguf").unwrap(),
            DrafterSpec::Model("/m/x.gguf".into())
        );
        assert!(DrafterSpec::parse("eagle").is_err());
        assert!(DrafterSpec::parse("draft:").is_err());
        assert_eq!(SpecTokens::parse("4").unwrap(), SpecTokens::Fixed(4));
        assert_eq!(
            SpecTokens::parse("auto").unwrap(),
            SpecTokens::Auto { max: AUTO_MAX }
        );
        assert!(SpecTokens::parse("-1").is_err());
        assert!(SpecTokens::parse("1000").is_err());
    }

    #[test]
    fn auto_drafts_where_rows_are_cheap_and_acceptance_high() {
        let c = |alpha, avail| Candidate {
            alpha,
            avail,
            setup: 0.0,
        };
        // One sequence, rows a tenth of the fixed part, high acceptance: several drafts.
        let k = choose_drafts(&[c(0.8, 8)], 0.01, 0.001, 0.0, 1, 1.0);
        assert!(k[0] >= 4, "{k:?}");
        // Low acceptance: none.
        let k = choose_drafts(&[c(0.05, 8)], 0.01, 0.001, 0.0, 1, 1.0);
        assert_eq!(k, vec![0]);
        // Rows as dear as the step (compute-bound): none.
        let k = choose_drafts(&[c(0.6, 8)], 0.001, 0.01, 0.0, 16, 16.0);
        assert_eq!(k, vec![0]);
        // The likelier sequence gets its drafts first.
        let k = choose_drafts(&[c(0.9, 8), c(0.3, 8)], 0.01, 0.002, 0.0, 2, 2.0);
        assert!(k[0] > k[1], "{k:?}");
        // Never more than available.
        let k = choose_drafts(&[c(0.99, 2)], 0.01, 0.0001, 0.0, 1, 1.0);
        assert_eq!(k, vec![2]);
        // A catch-up dearer than what drafting saves: none.
        let mut x = c(0.8, 8);
        x.setup = 0.05;
        assert_eq!(choose_drafts(&[x], 0.01, 0.001, 0.0, 1, 1.0), vec![0]);
    }

    #[test]
    fn row_cost_learns_dear_rows_from_few_row_steps() {
        // Decodes of 1 row at 88 ms, verifications of 2-5 rows at 88 + 74 per extra row.
        let mut c = RowCost::new();
        for i in 0..40 {
            c.observe(1.0, 0.088);
            let rows = 2 + i % 4;
            c.observe(rows as f64, 0.088 + 0.074 * (rows - 1) as f64);
        }
        let (a, b) = c.fit();
        assert!(
            (b - 0.074).abs() < 0.003 && (a - 0.014).abs() < 0.004,
            "{a} {b}"
        );
        // Two rows cost far more than one: a jump, on top of the per-row cost.
        let mut c = RowCost::new();
        for i in 0..40 {
            c.observe(1.0, 0.085);
            let rows = 2 + i % 8;
            c.observe(rows as f64, 0.300 + 0.005 * rows as f64);
        }
        assert!((c.predict(1) - 0.085).abs() < 1e-3);
        let (fixed, per_row, jump) = c.model(1);
        assert!((fixed + per_row - 0.085).abs() < 1e-3);
        assert!((jump - 0.215).abs() < 0.01, "{jump}");
    }

    #[test]
    fn row_cost_fits_a_line() {
        let mut c = RowCost::new();
        for _ in 0..300 {
            c.observe(2.0, 0.021);
            c.observe(17.0, 0.036);
        }
        let (a, b) = c.fit();
        assert!(
            (a - 0.019).abs() < 1e-3 && (b - 0.001).abs() < 1e-4,
            "{a} {b}"
        );
    }

    #[test]
    fn acceptance_moves_toward_what_is_seen() {
        let mut a = Acceptance::default();
        assert_eq!(a.rate(1), 0.5);
        for _ in 0..20 {
            a.observe(1, 4, 4);
        }
        assert!(a.rate(1) > 0.95);
        // Runs cut at a rejection: three of four trials accepted is a rate of 0.75, not
        // what a run's length alone would say.
        for _ in 0..40 {
            a.observe(3, 4, 3);
        }
        assert!((a.rate(3) - 0.75).abs() < 0.02, "{}", a.rate(3));
        for _ in 0..20 {
            a.observe(1, 4, 0);
        }
        assert!(a.rate(1) < 0.1);
        // A new sequence starts from the drafter's running rate.
        assert!(a.rate(2) < 0.5 && a.rate(2) > 0.0);
    }
}
