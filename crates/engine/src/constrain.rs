//! Constrained decoding with llguidance: a request's output held to a JSON schema, any JSON
//! object, a regular expression, a Lark grammar or a choice of strings. Each constrained
//! request owns a matcher; before each of its tokens is sampled, the matcher's mask of the
//! tokens that keep the output inside the grammar is applied to the logits (the others get
//! -inf), and the sampled token is fed back to it. The mask lets EOS through only where the
//! grammar can end, so a finished output always parses.
//!
//! The parser factory (the tokenizer's token trie) is built once per engine, on the first
//! constrained request. Grammars are bounded: the limits below refuse a schema whose grammar
//! would take too much time or memory to build or to step, with an error, never a hang.

use std::sync::Arc;

use llguidance::api::{ParserLimits, TopLevelGrammar};
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
fn limits() -> ParserLimits {
    ParserLimits {
        initial_lexer_fuel: 2_000_000,
        step_lexer_fuel: 400_000,
        step_max_items: 100_000,
        max_lexer_states: 250_000,
        max_grammar_size: 500_000,
        ..ParserLimits::default()
    }
}

/// The engine's parser factory: its tokenizer's token trie, shared by every matcher.
pub struct Grammars {
    factory: Arc<ParserFactory>,
    vocab: usize,
}

impl Grammars {
    /// The factory for `tok`, for logits `vocab` wide (the model's vocabulary, which may be
    /// padded past the tokenizer's).
    pub fn new(tok: &Tokenizer, vocab: usize) -> Result<Self> {
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
        *factory.limits_mut() = limits();
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
        })
    }
}

/// One request's grammar state.
pub struct Constraint {
    m: Matcher,
    vocab: usize,
}

impl Constraint {
    /// `row` with every token the grammar does not allow next set to -inf, into `out`.
    pub fn masked(&mut self, row: &[f32], out: &mut Vec<f32>) -> Result<()> {
        let mask = self
            .m
            .compute_mask()
            .map_err(|e| Error::Other(format!("constraint: {e}")))?;
        out.clear();
        out.extend(row.iter().enumerate().map(|(i, &x)| {
            if i < self.vocab && mask.is_allowed(i as u32) {
                x
            } else {
                f32::NEG_INFINITY
            }
        }));
        if out.iter().all(|x| *x == f32::NEG_INFINITY) {
            return Err(Error::Other(
                "constraint: no token can continue the output".into(),
            ));
        }
        Ok(())
    }

    /// Feeds the sampled `token` to the grammar.
    pub fn accept(&mut self, token: u32) -> Result<()> {
        self.m
            .consume_token(token)
            .map_err(|e| Error::Other(format!("constraint: {e}")))
    }

    /// Whether the grammar allows nothing more (the output is complete).
    pub fn is_done(&self) -> bool {
        self.m.is_stopped()
    }
}
