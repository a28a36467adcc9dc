//! The speculative decoding flags `generate` and `serve` share.

use anyhow::{bail, Result};

/// Speculative decoding flags (`generate`, `serve`).
#[derive(clap::Args, Clone)]
pub(crate) struct SpecArgs {
    /// Speculative decoding: `ngram` (prompt lookup: drafts copied from earlier in the
    /// prompt and output) or `draft:PATH` (a smaller model with the same vocabulary drafts).
    /// Greedy outputs stay bitwise those of plain decoding; sampled ones keep their
    /// distribution.
    #[arg(long, value_name = "ngram|draft:PATH")]
    pub speculative: Option<String>,
    /// Drafted tokens verified per step: a number, or `auto` (chosen per sequence and step
    /// from the measured acceptance and step time; none where drafting does not pay).
    /// Requests may override it with `spec_tokens`.
    #[arg(long, default_value = "auto", value_name = "K|auto")]
    pub spec_tokens: String,
}

impl SpecArgs {
    /// The settings, if speculating.
    pub fn config(&self, tp: usize) -> Result<Option<tessera_engine::spec::SpecConfig>> {
        use tessera_engine::spec::{DrafterSpec, SpecConfig, SpecTokens};
        let Some(s) = &self.speculative else {
            return Ok(None);
        };
        if tp > 1 {
            bail!("--speculative does not run under --tp yet");
        }
        let drafter = DrafterSpec::parse(s).map_err(|e| anyhow::anyhow!("--speculative: {e}"))?;
        if let DrafterSpec::Model(p) = &drafter {
            if !p.exists() {
                bail!(
                    "--speculative draft:{}: no such file or folder",
                    p.display()
                );
            }
        }
        let tokens = SpecTokens::parse(&self.spec_tokens)
            .map_err(|e| anyhow::anyhow!("--spec-tokens: {e}"))?;
        Ok(Some(SpecConfig { drafter, tokens }))
    }
}
