//! The step engine's side of speculative decoding ([`crate::spec`]): proposing drafts to the
//! scheduler before each step, and learning from each verification.

use tessera_core::Result;
use tessera_scheduler::StepPlan;

use crate::draft::DraftModel;
use crate::spec::{
    choose_drafts, ngram_draft, Acceptance, Candidate, DrafterSpec, RowCost, SpecConfig, SpecStats,
    SpecTokens,
};
use crate::step::StepEngine;

/// A step engine's speculation state.
pub(crate) struct Speculator {
    pub cfg: SpecConfig,
    pub model: Option<DraftModel>,
    accept: Acceptance,
    /// The target's step time against its rows.
    cost: RowCost,
    /// Rows of the last step that were not decodes (prefill chunks): the next step likely
    /// has as many.
    last_prefill_rows: usize,
    pub stats: SpecStats,
}

/// What one verification did (for the speculator's learning).
pub(crate) struct Verified {
    pub id: u64,
    pub drafted: usize,
    pub accepted: usize,
    pub emitted: usize,
}

impl Speculator {
    fn new(cfg: SpecConfig, model: Option<DraftModel>) -> Self {
        Speculator {
            cfg,
            model,
            accept: Acceptance::default(),
            cost: RowCost::new(),
            last_prefill_rows: 0,
            stats: SpecStats::default(),
        }
    }

    pub fn forget(&mut self, id: u64) {
        self.accept.forget(id);
        if let Some(m) = &mut self.model {
            m.forget(id);
        }
    }

    /// Learns from a step: its time per row and each verification's acceptance.
    pub fn observe(&mut self, plan: &StepPlan, secs: f64, verified: &[Verified]) {
        let rows = plan.num_tokens();
        if rows > 0 {
            self.cost.observe(rows as f64, secs);
        }
        self.last_prefill_rows = plan
            .seqs
            .iter()
            .filter(|s| s.draft == 0 && s.tokens.len() > 1)
            .map(|s| s.tokens.len())
            .sum();
        for v in verified {
            self.accept.observe(v.id, v.drafted, v.accepted);
            self.stats.verifications += 1;
            self.stats.drafted += v.drafted as u64;
            self.stats.accepted += v.accepted as u64;
            self.stats.emitted += v.emitted as u64;
        }
    }
}

impl StepEngine<'_> {
    /// Turns speculative decoding on (`Some`) or off. A draft-model drafter needs its
    /// `model`; the n-gram drafter takes none.
    pub fn set_speculation(
        &mut self,
        cfg: Option<SpecConfig>,
        model: Option<DraftModel>,
    ) -> Result<()> {
        self.spec = match cfg {
            None => None,
            Some(cfg) => {
                if matches!(cfg.drafter, DrafterSpec::Model(_)) != model.is_some() {
                    return Err(tessera_core::Error::Config(
                        "a draft-model drafter needs its loaded model, and only it".into(),
                    ));
                }
                Some(Speculator::new(cfg, model))
            }
        };
        Ok(())
    }

    /// Turns speculative decoding off, handing back its settings and draft model (which
    /// holds no sequence's KV afterwards).
    pub fn take_speculation(&mut self) -> Option<(SpecConfig, Option<DraftModel>)> {
        self.spec.take().map(|s| {
            let mut model = s.model;
            if let Some(m) = &mut model {
                m.reset();
            }
            (s.cfg, model)
        })
    }

    /// The drafter's name and its counters so far, when speculating.
    pub fn spec_stats(&self) -> Option<(&'static str, SpecStats)> {
        self.spec.as_ref().map(|s| (s.cfg.drafter.name(), s.stats))
    }

    /// Feeds a draft model the prompt chunks `plan` prefills (up to the chunk's end, the
    /// last known token left for drafting), for the sequences that may speculate.
    pub(crate) fn prefill_draft(&mut self, plan: &StepPlan) {
        let Some(sp) = self.spec.as_mut() else {
            return;
        };
        let Some(m) = sp.model.as_mut() else {
            return;
        };
        let reqs: Vec<(u64, &[u32])> = plan
            .seqs
            .iter()
            .filter(|s| s.draft == 0 && s.tokens.len() > 1)
            .filter(|s| {
                self.live
                    .get(&s.id)
                    .is_some_and(|l| l.spec_tokens != Some(0))
            })
            .filter_map(|s| {
                let toks = self.sched.tokens(s.id)?;
                let upto = if s.wants_logits {
                    s.end_pos() - 1
                } else {
                    s.end_pos()
                };
                Some((s.id, &toks[..upto.min(toks.len())]))
            })
            .collect();
        if reqs.is_empty() {
            return;
        }
        let t0 = std::time::Instant::now();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| m.prefill(&reqs))) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!("the draft model's prefill failed: {e}");
                m.reset();
            }
            Err(p) => {
                let what = crate::step::panic_message(&*p);
                tracing::error!("the draft model's prefill panicked: {what}");
                m.reset();
            }
        }
        sp.stats.draft_s += t0.elapsed().as_secs_f64();
    }

    /// Proposes drafts for the decoding sequences of the coming step.
    pub(crate) fn propose_drafts(&mut self) {
        let Some(sp) = self.spec.as_mut() else {
            return;
        };
        let ids = self.sched.decoding();
        if ids.is_empty() {
            return;
        }
        // Per sequence: the most it may draft, and whether `auto` decides how many.
        let mut want: Vec<(u64, usize, bool)> = Vec::with_capacity(ids.len());
        for &id in &ids {
            let (k, auto) = match self.live.get(&id).and_then(|l| l.spec_tokens) {
                Some(k) => (k, false),
                None => match sp.cfg.tokens {
                    SpecTokens::Fixed(k) => (k, false),
                    SpecTokens::Auto { max } => (max, true),
                },
            };
            if k > 0 {
                want.push((id, k, auto));
            }
        }
        if want.is_empty() {
            return;
        }
        let rows = ids.len() + sp.last_prefill_rows;
        // Going from a one-row step to two may cost a jump: the drafts of the step's one
        // sequence carry it.
        let (fixed, per_row, jump) = sp.cost.model(rows);
        let decodes = ids.len() as f64;
        let t0 = std::time::Instant::now();
        let drafts: Vec<(u64, Vec<u32>)> = match (&sp.cfg.drafter, &mut sp.model) {
            (DrafterSpec::NGram { min_n, max_n }, _) => {
                let found: Vec<(u64, Vec<u32>, bool)> = want
                    .iter()
                    .filter_map(|&(id, k, auto)| {
                        let toks = self.sched.tokens(id)?;
                        Some((id, ngram_draft(toks, k, *min_n, *max_n), auto))
                    })
                    .collect();
                let cands: Vec<Candidate> = found
                    .iter()
                    .map(|(id, d, auto)| Candidate {
                        alpha: sp.accept.rate(*id),
                        avail: if *auto { d.len() } else { 0 },
                        setup: jump,
                    })
                    .collect();
                let ks = choose_drafts(&cands, fixed, per_row, 0.0, rows, decodes);
                found
                    .into_iter()
                    .zip(ks)
                    .map(|((id, mut d, auto), k)| {
                        if auto {
                            d.truncate(k);
                        }
                        (id, d)
                    })
                    .collect()
            }
            (DrafterSpec::Model(_), Some(m)) => {
                // How many to draft is decided before drafting, which costs a forward per
                // token: a draft's share of those forwards counts against it.
                let drafting = want.len();
                let per_draft = m.cost().predict(drafting) / drafting as f64;
                // A sequence the draft has not caught up on costs its catch-up once, spread
                // over the tokens it has left.
                let cands: Vec<Candidate> = want
                    .iter()
                    .map(|&(id, k, auto)| {
                        let toks = self.sched.tokens(id).unwrap_or(&[]);
                        let left = self.sched.tokens_left(id).unwrap_or(1).clamp(1, 256);
                        let lag = m.lag(id, toks).saturating_sub(1);
                        Candidate {
                            alpha: sp.accept.rate(id),
                            avail: if auto { k } else { 0 },
                            setup: jump + lag as f64 * m.cost().fit().1 / left as f64,
                        }
                    })
                    .collect();
                let ks = choose_drafts(&cands, fixed, per_row, per_draft, rows, decodes);
                let reqs: Vec<(u64, &[u32], usize)> = want
                    .iter()
                    .zip(ks)
                    .filter_map(|(&(id, k, auto), ka)| {
                        let toks = self.sched.tokens(id)?;
                        Some((id, toks, if auto { ka } else { k }))
                    })
                    .collect();
                // The draft model's failure, even a panic, costs this step its drafts and
                // nothing else.
                let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| m.draft(&reqs)));
                match run {
                    Ok(Ok((d, _))) => d.into_iter().collect(),
                    Ok(Err(e)) => {
                        tracing::warn!("the draft model failed, no drafts this step: {e}");
                        m.reset();
                        Vec::new()
                    }
                    Err(p) => {
                        let what = crate::step::panic_message(&*p);
                        tracing::error!("the draft model panicked, no drafts this step: {what}");
                        m.reset();
                        Vec::new()
                    }
                }
            }
            (DrafterSpec::Model(_), None) => Vec::new(),
        };
        sp.stats.draft_s += t0.elapsed().as_secs_f64();
        for (id, d) in drafts {
            if !d.is_empty() {
                self.sched.propose(id, d);
            }
        }
    }
}
