//! Constrained decoding with llguidance: a request's output held to a JSON schema, any JSON
//! object, a regular expression, a Lark grammar or a choice of strings. Each constrained
//! request owns a matcher; before each of its tokens is sampled, the matcher's mask of the
//! tokens that keep the output inside the grammar is applied to the logits (the others get
//! -inf), and the sampled token is fed back to it. The mask lets EOS through only where the
//! grammar can end, so a finished output always parses.
//!
//! The mask depends only on the grammar's state after the last accepted token, so the step
//! engine computes it ahead ([`Constraint::prepare`]), on a helper thread while the step's
//! forward runs; [`Constraint::masked`] then only applies it, or computes it there when none
//! was prepared. It stays llguidance's bitset, applied to the logits a 32-token word at a time.
//!
//! The parser factory (the tokenizer's token trie) is built once per engine, on the first
//! constrained request. Grammars are bounded: the limits below refuse a schema whose grammar
//! would take too much time or memory to build or to step, with an error, never a hang.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::SimpleVob;
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use tessera_core::{Error, Result};
use tessera_tokenizer::Tokenizer;

/// What a request's output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum ConstraintSpec {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// A JSON value valid against this schema (`response_format` `json_schema`).
    JsonSchema(Value),
    /// Text matching a regular expression (llguidance's syntax, anchored at both ends).
    Regex(String),
    /// Text of a Lark grammar (llguidance's dialect).
    Lark(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
}

/// JSON is written compactly (`{"a": 1, "b": [2, 3]}`): no free whitespace between tokens,
/// which a weak model could otherwise emit without end. A schema's own `x-guidance` options
/// win.
fn compact(mut schema: Value) -> Value {
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({"whitespace_flexible": false, "item_separator": ", ",
                               "key_separator": ": "})
        });
    }
    schema
}

impl ConstraintSpec {
    fn grammar(&self) -> Result<TopLevelGrammar> {
        Ok(match self {
            ConstraintSpec::JsonObject => {
                TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"})))
            }
            ConstraintSpec::JsonSchema(s) => {
                if !s.is_object() && !s.is_boolean() {
                    return Err(Error::Other(
                        "the JSON schema must be an object (or true/false)".into(),
                    ));
                }
                TopLevelGrammar::from_json_schema(compact(s.clone()))
            }
            ConstraintSpec::Regex(r) => TopLevelGrammar::from_regex(r),
            ConstraintSpec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
            ConstraintSpec::Choice(options) => {
                if options.is_empty() {
                    return Err(Error::Other("a choice needs at least one option".into()));
                }
                let alts: Vec<String> = options.iter().map(|o| regex_escape(o)).collect();
                TopLevelGrammar::from_regex(&format!("({})", alts.join("|")))
            }
        })
    }
}

/// `s` as a regular expression matching exactly `s`.
fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The bounds of building and stepping one grammar (llguidance's units): a schema past them
/// is refused when the request arrives, or fails its request mid-way, not the server.
/// `tessera serve --grammar-*` sets them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrammarLimits {
    /// Size of the grammar after expansion (rules and symbols).
    pub max_grammar_size: usize,
    /// Lexer states built in all (the regular part of the grammar).
    pub max_lexer_states: usize,
    /// Lexer work to build the grammar's first mask.
    pub initial_lexer_fuel: u64,
    /// Lexer work per token's mask.
    pub step_lexer_fuel: u64,
    /// Earley items per token.
    pub step_max_items: usize,
}

impl Default for GrammarLimits {
    fn default() -> Self {
        GrammarLimits {
            max_grammar_size: 500_000,
            max_lexer_states: 250_000,
            initial_lexer_fuel: 2_000_000,
            step_lexer_fuel: 400_000,
            step_max_items: 100_000,
        }
    }
}

impl GrammarLimits {
    fn parser_limits(&self) -> ParserLimits {
        ParserLimits {
            initial_lexer_fuel: self.initial_lexer_fuel,
            step_lexer_fuel: self.step_lexer_fuel,
            step_max_items: self.step_max_items,
            max_lexer_states: self.max_lexer_states,
            max_grammar_size: self.max_grammar_size,
            ..ParserLimits::default()
        }
    }
}

/// The engine's parser factory: its tokenizer's token trie, shared by every matcher.
#[derive(Clone)]
pub struct Grammars {
    factory: Arc<ParserFactory>,
    vocab: usize,
}

impl Grammars {
    /// The factory for `tok`, for logits `vocab` wide (the model's vocabulary, which may be
    /// padded past the tokenizer's).
    pub fn new(tok: &Tokenizer, vocab: usize) -> Result<Self> {
        Self::with_limits(tok, vocab, GrammarLimits::default())
    }

    /// [`Grammars::new`] under `limits`.
    pub fn with_limits(tok: &Tokenizer, vocab: usize, limits: GrammarLimits) -> Result<Self> {
        let bad = |e: String| Error::Tokenizer(format!("building the grammar engine: {e}"));
        let json = tok
            .inner()
            .to_string(false)
            .map_err(|e| bad(e.to_string()))?;
        let mut bt = toktrie_hf_tokenizers::ByteTokenizer::from_json_bytes(json.as_bytes())
            .map_err(|e| bad(e.to_string()))?;
        if !tok.eos_ids().is_empty() {
            bt.set_eos_tokens(tok.eos_ids());
        }
        let env = bt
            .into_tok_env(Some(vocab))
            .map_err(|e| bad(e.to_string()))?;
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| bad(e.to_string()))?;
        factory.quiet();
        *factory.limits_mut() = limits.parser_limits();
        Ok(Grammars {
            factory: Arc::new(factory),
            vocab,
        })
    }

    /// A matcher for `spec`, or why the grammar is refused.
    pub fn matcher(&self, spec: &ConstraintSpec) -> Result<Constraint> {
        let grammar = spec.grammar()?;
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| Error::Other(format!("invalid constraint: {e}")))?;
        let m = Matcher::new(Ok(parser));
        if let Some(e) = m.get_error() {
            return Err(Error::Other(format!("invalid constraint: {e}")));
        }
        Ok(Constraint {
            m,
            vocab: self.vocab,
            next: None,
        })
    }
}

/// One request's grammar state.
pub struct Constraint {
    m: Matcher,
    vocab: usize,
    /// The mask for the next token, computed ahead by [`Constraint::prepare`]; cleared by
    /// [`Constraint::accept`], which moves the grammar on.
    next: Option<Result<SimpleVob>>,
}

impl Constraint {
    /// Computes the mask of the tokens the grammar allows next and keeps it (or its error)
    /// for the next [`Constraint::masked`]. The step engine calls this while the forward runs.
    pub fn prepare(&mut self) {
        self.next = Some(self.compute());
    }

    /// The allowed tokens in the grammar's current state. A panic inside the grammar
    /// engine is this request's error, like any other.
    fn compute(&mut self) -> Result<SimpleVob> {
        match catch_unwind(AssertUnwindSafe(|| self.m.compute_mask())) {
            Ok(Ok(mask)) => Ok(mask),
            Ok(Err(e)) => Err(Error::Other(format!("constraint: {e}"))),
            Err(p) => Err(Error::Other(format!(
                "constraint: computing the token mask panicked ({})",
                crate::step::panic_message(&*p)
            ))),
        }
    }

    /// `row` with every token the grammar does not allow next set to -inf, into `out`: the
    /// prepared mask, else one computed now.
    pub fn masked(&mut self, row: &[f32], out: &mut Vec<f32>) -> Result<()> {
        let mask = match self.next.take() {
            Some(m) => m?,
            None => self.compute()?,
        };
        if !apply_mask(&mask, row, self.vocab, out) {
            return Err(Error::Other(
                "constraint: no token can continue the output".into(),
            ));
        }
        Ok(())
    }

    /// Feeds the sampled `token` to the grammar.
    pub fn accept(&mut self, token: u32) -> Result<()> {
        self.next = None;
        self.m
            .consume_token(token)
            .map_err(|e| Error::Other(format!("constraint: {e}")))
    }

    /// Whether the grammar allows nothing more (the output is complete).
    pub fn is_done(&self) -> bool {
        self.m.is_stopped()
    }

    /// Puts the grammar engine in its error state, as a bug inside it would (tests).
    #[cfg(test)]
    pub(crate) fn break_for_test(&mut self) {
        let _ = self.m.test_trigger_lexer_error();
    }
}

/// `row` into `out` with the tokens not in `mask`, and those at or past `vocab`, at -inf;
/// false if none is left. Goes a 32-token word of the bitset at a time: a word of zeros is a
/// run of -inf, a full word a plain copy.
fn apply_mask(mask: &SimpleVob, row: &[f32], vocab: usize, out: &mut Vec<f32>) -> bool {
    out.clear();
    out.resize(row.len(), f32::NEG_INFINITY);
    let n = row.len().min(vocab).min(mask.len());
    let mut any = false;
    for (w, &bits) in mask.as_slice().iter().enumerate() {
        let base = w * 32;
        if base >= n {
            break;
        }
        if bits == 0 {
            continue;
        }
        let end = (base + 32).min(n);
        if bits == u32::MAX {
            out[base..end].copy_from_slice(&row[base..end]);
            any = true;
            continue;
        }
        let mut b = bits;
        while b != 0 {
            let i = base + b.trailing_zeros() as usize;
            if i >= end {
                break;
            }
            out[i] = row[i];
            any = true;
            b &= b - 1;
        }
    }
    any
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Engine, GenerateRequest, RequestEvent, SamplingParams, StepEngine};
    use proptest::prelude::*;
    use tessera_scheduler::SchedulerConfig;

    proptest! {
        /// The word-wise mask equals the plain one: each token below `vocab` allowed by its
        /// bit keeps its logit, every other is -inf.
        #[test]
        fn apply_mask_keeps_exactly_the_allowed_tokens(
            bits in proptest::collection::vec(
                prop_oneof![Just(0u32), Just(u32::MAX), any::<u32>()], 0..8),
            len in 0usize..260,
            vocab in 0usize..260,
        ) {
            let mut mask = SimpleVob::alloc(bits.len() * 32);
            for (w, b) in bits.iter().enumerate() {
                for j in 0..32 {
                    mask.set(w * 32 + j, b >> j & 1 == 1);
                }
            }
            let row: Vec<f32> = (0..len).map(|i| i as f32 - 100.0).collect();
            let mut out = vec![7.0; 3];
            let any = apply_mask(&mask, &row, vocab, &mut out);
            let want: Vec<f32> = (0..len)
                .map(|i| if i < vocab && i < mask.len() && mask.get(i) { row[i] } else { f32::NEG_INFINITY })
                .collect();
            prop_assert_eq!(&out, &want);
            prop_assert_eq!(any, want.iter().any(|x| x.is_finite()));
        }
    }

    /// A grammar engine that breaks in the middle of a request fails that request alone,
    /// whether its mask was computed beside the forward or after it; the others finish.
    #[test]
    fn a_broken_grammar_fails_only_its_request() {
        let p = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/models/tiny-llama3.gguf"
        );
        let e = Engine::load(std::path::Path::new(p), 2).unwrap();
        let schema = serde_json::json!({"type": "object",
            "properties": {"a": {"type": "string", "maxLength": 8}},
            "required": ["a"], "additionalProperties": false});
        let specs = [
            Some(ConstraintSpec::JsonSchema(schema)),
            Some(ConstraintSpec::Regex("[a-z]{4,12}".into())),
            None,
        ];
        for overlap in [true, false] {
            let mut cfg = SchedulerConfig::new(64, crate::KV_BLOCK_SIZE);
            cfg.max_model_len = 512;
            let mut steps = StepEngine::new(&e, cfg).unwrap();
            steps.overlap_masks(overlap);
            for (id, spec) in specs.iter().enumerate() {
                let req = GenerateRequest {
                    prompt_ids: e.tokenizer.encode("Say something:").unwrap(),
                    max_tokens: 30,
                    params: SamplingParams::greedy(),
                    constraint: spec.clone(),
                    ..Default::default()
                };
                steps.submit(id as u64, &req).unwrap();
            }
            let mut failed = Vec::new();
            let mut finished = Vec::new();
            let mut n = 0;
            while steps.has_work() {
                n += 1;
                if n == 3 {
                    let c = steps.live_mut(1).unwrap().constraint_mut().unwrap();
                    c.break_for_test();
                }
                let out = steps.step();
                for (id, ev) in out.events {
                    match ev {
                        RequestEvent::Failed { message } => failed.push((id, message)),
                        RequestEvent::Finished { .. } => finished.push(id),
                        RequestEvent::Text { .. } => {}
                    }
                }
                steps.check().unwrap();
            }
            assert_eq!(failed.len(), 1, "overlap {overlap}: {failed:?}");
            assert_eq!(failed[0].0, 1);
            assert!(failed[0].1.contains("constraint"), "{}", failed[0].1);
            finished.sort();
            assert_eq!(finished, [0, 2], "overlap {overlap}");
        }
    }
}
