//! Turning logits into the next token.
//!
//! Order, as in transformers' and vLLM's logits processors: repetition penalty (over prompt
//! and output), presence/frequency penalties (over output, OpenAI semantics), the logit bias
//! (OpenAI's `logit_bias`, added as it is), then greedy if
//! `temperature == 0`, else temperature, top-k, top-p, min-p, and a draw from the remaining
//! distribution with the request's own seeded generator (PCG32), so a seed reproduces a run.

use std::collections::HashMap;

#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 means disabled.
    pub top_k: usize,
    /// 1 means disabled.
    pub top_p: f32,
    /// 0 means disabled.
    pub min_p: f32,
    /// 1 means disabled.
    pub repetition_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        }
    }
}

/// PCG-XSH-RR 32 (O'Neill 2014): small, fast, and stable across library versions.
#[derive(Debug, Clone)]
pub struct Pcg32 {
    state: u64,
    inc: u64,
}

impl Pcg32 {
    pub fn new(seed: u64) -> Self {
        let mut r = Pcg32 {
            state: 0,
            inc: (0xda3e39cb94b95bdb << 1) | 1,
        };
        r.next_u32();
        r.state = r.state.wrapping_add(seed);
        r.next_u32();
        r
    }
    pub fn next_u32(&mut self) -> u32 {
        let old = self.state;
        self.state = old.wrapping_mul(6364136223846793005).wrapping_add(self.inc);
        let xorshifted = (((old >> 18) ^ old) >> 27) as u32;
        let rot = (old >> 59) as u32;
        xorshifted.rotate_right(rot)
    }
    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        let hi = (self.next_u32() >> 5) as u64;
        let lo = (self.next_u32() >> 6) as u64;
        ((hi << 26) | lo) as f64 / (1u64 << 53) as f64
    }
}

/// A request's sampler: its parameters, generator and the token counts penalties need.
pub struct Sampler {
    params: SamplingParams,
    rng: Pcg32,
    /// Prompt and output tokens (repetition penalty).
    seen: HashMap<u32, ()>,
    /// Output token counts (presence and frequency penalties).
    output_counts: HashMap<u32, u32>,
    /// Added to these tokens' logits (ids outside the row are skipped).
    logit_bias: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new(params: SamplingParams, prompt: &[u32]) -> Self {
        let seed = params.seed.unwrap_or_else(|| {
            use std::time::{SystemTime, UNIX_EPOCH};
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        });
        let seen = prompt.iter().map(|&t| (t, ())).collect();
        Sampler {
            params,
            rng: Pcg32::new(seed),
            seen,
            output_counts: HashMap::new(),
            logit_bias: Vec::new(),
        }
    }

    /// The same sampler with `bias` added to its tokens' logits before every choice.
    pub fn with_logit_bias(mut self, bias: Vec<(u32, f32)>) -> Self {
        self.logit_bias = bias;
        self
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Records a generated token (for penalties).
    pub fn accept(&mut self, token: u32) {
        self.seen.insert(token, ());
        *self.output_counts.entry(token).or_default() += 1;
    }

    /// Applies penalties and the logit bias to `logits` in place.
    pub fn apply_penalties(&self, logits: &mut [f32]) {
        let p = &self.params;
        if p.repetition_penalty != 1.0 {
            for &t in self.seen.keys() {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 {
                        *l / p.repetition_penalty
                    } else {
                        *l * p.repetition_penalty
                    };
                }
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            for (&t, &c) in &self.output_counts {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l -= p.presence_penalty + p.frequency_penalty * c as f32;
                }
            }
        }
        for &(t, b) in &self.logit_bias {
            if let Some(l) = logits.get_mut(t as usize) {
                *l += b;
            }
        }
    }

    /// Whether any penalty or bias is set (so `sample` must work on a penalized copy).
    fn penalized(&self) -> bool {
        let p = &self.params;
        p.repetition_penalty != 1.0
            || p.presence_penalty != 0.0
            || p.frequency_penalty != 0.0
            || !self.logit_bias.is_empty()
    }

    /// Picks the next token from `logits` (penalties apply to a copy). Greedy decoding
    /// without penalties reads `logits` in place: no per-token copy of a vocabulary row.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        match self.distribution(logits) {
            Dist::Greedy(t) => t,
            Dist::Probs(cand, probs) => cand[draw(&mut self.rng, &probs, None)],
        }
    }

    /// Verifies the drafted token `draft` against `logits`, the target model's row at its
    /// position; returns the token to emit and whether it is the draft. Greedy: the draft
    /// is accepted when it is the argmax, so the output is exactly that of [`Sampler::sample`].
    /// Sampling: the standard speculative rejection step (Leviathan et al. 2023; Chen et
    /// al. 2023) for a drafter that proposes one token with certainty: the draft is kept
    /// with probability p(draft); otherwise the token is drawn from p with the draft taken
    /// out, renormalized. Either way the emitted token is distributed exactly as p, the
    /// distribution [`Sampler::sample`] draws from.
    pub fn verify(&mut self, logits: &[f32], draft: u32) -> (u32, bool) {
        match self.distribution(logits) {
            Dist::Greedy(t) => (t, t == draft),
            Dist::Probs(cand, probs) => {
                let total: f64 = probs.iter().sum();
                let at = cand.iter().position(|&c| c == draft);
                let p_draft = at.map_or(0.0, |i| probs[i] / total);
                // Nothing else to draw from: the draft has all the probability.
                let rest = total - at.map_or(0.0, |i| probs[i]);
                if (p_draft > 0.0 && self.rng.next_f64() < p_draft) || rest <= 0.0 {
                    return (draft, true);
                }
                (cand[draw(&mut self.rng, &probs, at)], false)
            }
        }
    }

    /// The distribution the next token is drawn from: penalties, then greedy, or
    /// temperature, top-k, top-p and min-p over the candidates sorted by logit (ties by id).
    fn distribution(&self, logits: &[f32]) -> Dist {
        if self.params.temperature == 0.0 && !self.penalized() {
            return Dist::Greedy(argmax(logits));
        }
        let mut l = logits.to_vec();
        self.apply_penalties(&mut l);
        let p = &self.params;
        if p.temperature == 0.0 {
            return Dist::Greedy(argmax(&l));
        }
        let mut cand: Vec<(u32, f32)> = l
            .iter()
            .enumerate()
            .map(|(i, &v)| (i as u32, v / p.temperature))
            .collect();
        cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if p.top_k > 0 && p.top_k < cand.len() {
            cand.truncate(p.top_k);
        }
        let max = cand[0].1;
        let mut probs: Vec<f64> = cand.iter().map(|c| ((c.1 - max) as f64).exp()).collect();
        let sum: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= sum);
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            let mut keep = probs.len();
            for (i, &pr) in probs.iter().enumerate() {
                acc += pr;
                if acc >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            probs.truncate(keep);
        }
        if p.min_p > 0.0 {
            let floor = probs[0] * p.min_p as f64;
            let keep = probs.iter().take_while(|&&x| x >= floor).count().max(1);
            probs.truncate(keep);
        }
        cand.truncate(probs.len());
        Dist::Probs(cand.into_iter().map(|c| c.0).collect(), probs)
    }
}

/// What the next token is drawn from: one token, or candidates with (unnormalized)
/// probabilities.
enum Dist {
    Greedy(u32),
    Probs(Vec<u32>, Vec<f64>),
}

/// An index drawn from `probs` (unnormalized), never `skip`.
fn draw(rng: &mut Pcg32, probs: &[f64], skip: Option<usize>) -> usize {
    let weight = |i: usize| if Some(i) == skip { 0.0 } else { probs[i] };
    let total: f64 = (0..probs.len()).map(weight).sum();
    let mut r = rng.next_f64() * total;
    let mut last = 0;
    for i in 0..probs.len() {
        let w = weight(i);
        if w > 0.0 {
            if r < w {
                return i;
            }
            r -= w;
            last = i;
        }
    }
    last
}

/// Index of the largest value (the first on ties).
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// `log_softmax(x)[i]`, computed stably in f64.
pub fn logprob(x: &[f32], i: usize) -> f64 {
    let max = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = x.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln() + max;
    x[i] as f64 - lse
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        vec![1.0, 3.0, 2.0, 0.5, 2.9]
    }

    #[test]
    fn greedy_takes_argmax() {
        let mut s = Sampler::new(SamplingParams::greedy(), &[]);
        assert_eq!(s.sample(&logits()), 1);
    }

    #[test]
    fn seed_reproduces_and_top_k_limits() {
        let p = SamplingParams {
            temperature: 1.0,
            top_k: 2,
            seed: Some(42),
            ..Default::default()
        };
        let draw = |p: &SamplingParams| {
            let mut s = Sampler::new(p.clone(), &[]);
            (0..200).map(|_| s.sample(&logits())).collect::<Vec<_>>()
        };
        let a = draw(&p);
        assert_eq!(a, draw(&p));
        assert!(a.iter().all(|&t| t == 1 || t == 4));
        assert!(a.contains(&1) && a.contains(&4));
    }

    #[test]
    fn top_p_and_min_p_cut_the_tail() {
        let p = SamplingParams {
            temperature: 1.0,
            top_p: 0.5,
            seed: Some(1),
            ..Default::default()
        };
        let mut s = Sampler::new(p, &[]);
        // p(1) ≈ 0.38, p(4) ≈ 0.35: top_p 0.5 keeps {1, 4}.
        assert!((0..100).all(|_| matches!(s.sample(&logits()), 1 | 4)));
        let p = SamplingParams {
            temperature: 1.0,
            min_p: 0.95,
            seed: Some(1),
            ..Default::default()
        };
        let mut s = Sampler::new(p, &[]);
        assert!((0..100).all(|_| s.sample(&logits()) == 1));
    }

    #[test]
    fn penalties_change_the_choice() {
        let p = SamplingParams {
            temperature: 0.0,
            repetition_penalty: 2.0,
            ..Default::default()
        };
        let mut s = Sampler::new(p, &[1]);
        assert_eq!(s.sample(&logits()), 4);
        let p = SamplingParams {
            temperature: 0.0,
            frequency_penalty: 1.0,
            ..Default::default()
        };
        let mut s = Sampler::new(p, &[]);
        s.accept(1);
        assert_eq!(s.sample(&logits()), 4);
    }

    /// The bias moves greedy choices and verification alike, and a masked (-inf) logit
    /// stays out whatever its bias.
    #[test]
    fn logit_bias_moves_greedy_sampling_and_verification() {
        let mut s = Sampler::new(SamplingParams::greedy(), &[]).with_logit_bias(vec![(3, 100.0)]);
        assert_eq!(s.sample(&logits()), 3);
        assert_eq!(s.verify(&logits(), 3), (3, true));
        assert_eq!(s.verify(&logits(), 1), (3, false));
        let mut s = Sampler::new(SamplingParams::greedy(), &[]).with_logit_bias(vec![(1, -100.0)]);
        assert_eq!(s.sample(&logits()), 4);
        // Out-of-row ids are skipped, not a panic.
        let mut s = Sampler::new(SamplingParams::greedy(), &[]).with_logit_bias(vec![(99, 100.0)]);
        assert_eq!(s.sample(&logits()), 1);
        let mut masked = logits();
        masked[3] = f32::NEG_INFINITY;
        let mut s = Sampler::new(SamplingParams::greedy(), &[]).with_logit_bias(vec![(3, 100.0)]);
        assert_eq!(s.sample(&masked), 1);
        let p = SamplingParams {
            temperature: 1.0,
            seed: Some(3),
            ..Default::default()
        };
        let mut s = Sampler::new(p, &[]).with_logit_bias(vec![(0, 100.0)]);
        assert!((0..100).all(|_| s.sample(&logits()) == 0));
    }

    #[test]
    fn validation_names_the_parameter() {
        let p = SamplingParams {
            top_p: 1.5,
            ..Default::default()
        };
        assert!(p.validate().unwrap_err().to_string().contains("top_p"));
        let p = SamplingParams {
            temperature: -1.0,
            ..Default::default()
        };
        assert!(p
            .validate()
            .unwrap_err()
            .to_string()
            .contains("temperature"));
    }

    /// The rejection step emits tokens distributed as `sample` draws them, whatever the
    /// draft: over 200,000 draws with a fixed seed, each token's frequency is within 0.005
    /// of its probability (about five standard deviations for the likeliest token).
    #[test]
    fn verify_keeps_the_target_distribution() {
        let l = logits();
        let p = SamplingParams {
            temperature: 0.8,
            top_k: 4,
            seed: Some(7),
            ..Default::default()
        };
        let want = match Sampler::new(p.clone(), &[]).distribution(&l) {
            Dist::Probs(cand, probs) => {
                let total: f64 = probs.iter().sum();
                let mut w = vec![0.0; l.len()];
                for (c, pr) in cand.iter().zip(&probs) {
                    w[*c as usize] = pr / total;
                }
                w
            }
            Dist::Greedy(_) => unreachable!(),
        };
        // Drafts: likely, unlikely, cut by top-k (probability 0).
        for draft in [1u32, 3, 0] {
            let mut s = Sampler::new(p.clone(), &[]);
            let n = 200_000;
            let mut counts = vec![0usize; l.len()];
            let mut kept = 0;
            for _ in 0..n {
                let (t, ok) = s.verify(&l, draft);
                assert_eq!(ok, t == draft);
                kept += ok as usize;
                counts[t as usize] += 1;
            }
            for (t, &c) in counts.iter().enumerate() {
                let f = c as f64 / n as f64;
                assert!(
                    (f - want[t]).abs() < 0.005,
                    "draft {draft}: token {t} {f} vs {}",
                    want[t]
                );
            }
            let acc = kept as f64 / n as f64;
            assert!(
                (acc - want[draft as usize]).abs() < 0.005,
                "acceptance {acc}"
            );
        }
    }

    #[test]
    fn greedy_verify_accepts_the_argmax_only() {
        let mut s = Sampler::new(SamplingParams::greedy(), &[]);
        assert_eq!(s.verify(&logits(), 1), (1, true));
        assert_eq!(s.verify(&logits(), 4), (1, false));
    }

    #[test]
    fn logprob_is_normalised() {
        let l = logits();
        let s: f64 = (0..l.len()).map(|i| logprob(&l, i).exp()).sum();
        assert!((s - 1.0).abs() < 1e-12);
    }
}
