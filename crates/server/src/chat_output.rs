//! A chat answer's text, split into what the client is shown: the model's reasoning
//! (`<think>...</think>`, as `reasoning_content`), its content, and its tool calls, each a
//! call id, a function name and its arguments as JSON text. Whole answers are parsed once at
//! the end; streamed ones as their text arrives, so that a call's id and name go out first
//! and its arguments follow in fragments, as OpenAI streams them.
//!
//! The parsing is the `reasoning-parser` and `tool-parser` crates' (the parsers behind
//! SGLang's model gateway). Which parsers a model gets is decided once, at start, from the
//! flags or the chat template ([`OutputParsers::detect`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use futures_util::FutureExt;
use openai_protocol::common::Tool;
use reasoning_parser::ReasoningParser;
use tool_parser::ToolParser;

use crate::tools::ToolFormat;

/// The server's parsers, by name: the tool-call format and the reasoning parser.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OutputParsers {
    pub tools: Option<ToolFormat>,
    /// A `reasoning-parser` name (`qwen3`, `deepseek_r1`, ...).
    pub reasoning: Option<String>,
}

impl OutputParsers {
    /// The parsers for a model whose chat template is `template` and whose generation
    /// prompt (rendered for one user turn) is `generation_prompt`: a template that writes
    /// `<tool_call>`, `[TOOL_CALLS]` or Llama 3's JSON calls gets that format; one that
    /// thinks in `<think>` gets `qwen3`, or `deepseek_r1` when its generation prompt already
    /// opens the thought (the answer then starts inside it).
    pub fn detect(template: &str, generation_prompt: &str) -> Self {
        let reasoning = if generation_prompt.trim_end().ends_with("<think>") {
            Some("deepseek_r1".to_string())
        } else if template.contains("<think>") {
            Some("qwen3".to_string())
        } else {
            None
        };
        OutputParsers {
            tools: ToolFormat::detect(template),
            reasoning,
        }
    }

    /// The parsers for `tok`'s model: each flag is `None` (read the chat template),
    /// `"none"` (no parsing) or a parser's name.
    pub fn resolve(
        tool_flag: Option<&str>,
        reasoning_flag: Option<&str>,
        tok: &tessera_tokenizer::Tokenizer,
    ) -> Result<Self, String> {
        let template = tok.chat_template_source();
        let prompt = tok
            .apply_chat_template(&[tessera_tokenizer::ChatMessage::new("user", "x")], true)
            .unwrap_or_default();
        let mut p = OutputParsers::detect(template, &prompt);
        match tool_flag {
            None => {}
            Some("none") => p.tools = None,
            Some(name) => {
                p.tools = Some(ToolFormat::from_name(name).ok_or_else(|| {
                    format!(
                        "unknown tool-call parser {name:?} (hermes, qwen, llama3_json, mistral, \
                         or none)"
                    )
                })?)
            }
        }
        match reasoning_flag {
            None => {}
            Some("none") => p.reasoning = None,
            Some(name) if Self::reasoning_exists(name) => p.reasoning = Some(name.to_string()),
            Some(name) => {
                let mut known = reasoning_factory().list_parsers();
                known.sort();
                return Err(format!(
                    "unknown reasoning parser {name:?} (one of {}, or none)",
                    known.join(", ")
                ));
            }
        }
        Ok(p)
    }

    /// Whether `name` is a reasoning parser this build has.
    pub fn reasoning_exists(name: &str) -> bool {
        reasoning_factory().registry().has_parser(name)
    }
}

/// The crates' factories, built once (each registers every parser it knows).
fn reasoning_factory() -> &'static reasoning_parser::ParserFactory {
    static F: OnceLock<reasoning_parser::ParserFactory> = OnceLock::new();
    F.get_or_init(reasoning_parser::ParserFactory::new)
}

fn tool_factory() -> &'static tool_parser::ParserFactory {
    static F: OnceLock<tool_parser::ParserFactory> = OnceLock::new();
    F.get_or_init(tool_parser::ParserFactory::new)
}

/// One piece of a streamed answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Reasoning(String),
    Content(String),
    /// A new call: its index among the answer's calls, its id and the function's name.
    CallStart {
        index: usize,
        id: String,
        name: String,
    },
    /// More of call `index`'s arguments (JSON text).
    CallArgs {
        index: usize,
        args: String,
    },
}

/// A tool call of a whole answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// A whole answer, parsed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Parsed {
    pub reasoning: Option<String>,
    pub content: String,
    pub calls: Vec<Call>,
}

/// A fresh call id (`call_` and 24 hex digits), unique in this process and unpredictable.
pub fn call_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    use std::hash::{BuildHasher, Hasher};
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(n);
    format!("call_{:016x}{:08x}", h.finish(), n as u32)
}

/// Most rounds of a streaming tool parser over one delta.
const MAX_CALLS_PER_DELTA: usize = 64;

/// The parsing state of one choice.
pub struct ChoiceParser {
    reasoning: Option<Box<dyn ReasoningParser>>,
    /// The tool parser, the request's tools, and the text that starts a call.
    tools: Option<(Box<dyn ToolParser>, Vec<Tool>, &'static str)>,
    /// Ids of the calls started so far, by index.
    ids: Vec<String>,
    /// The end of the text so far where it may begin a call marker, not yet parsed.
    held: String,
}

/// Length of the longest proper prefix of `marker` that `text` ends with.
fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len())
        .rev()
        .find(|&n| text.ends_with(&marker[..n]))
        .unwrap_or(0)
}

impl ChoiceParser {
    /// A parser for an answer under `parsers`; `tools` are the request's definitions when
    /// its output is read for calls.
    pub fn new(parsers: &OutputParsers, tools: Option<&[serde_json::Value]>) -> Self {
        let reasoning = parsers
            .reasoning
            .as_deref()
            .and_then(|n| reasoning_factory().registry().create_parser(n));
        let tools = match (parsers.tools, tools) {
            (Some(f), Some(defs)) => tool_factory()
                .registry()
                .create_parser(f.parser_name())
                .map(|p| {
                    let defs = defs
                        .iter()
                        .filter_map(|d| serde_json::from_value(d.clone()).ok())
                        .collect();
                    (p, defs, f.start_marker())
                }),
            _ => None,
        };
        ChoiceParser {
            reasoning,
            tools,
            ids: Vec::new(),
            held: String::new(),
        }
    }

    /// Whether this choice has produced a tool call.
    pub fn made_calls(&self) -> bool {
        !self.ids.is_empty()
    }

    /// The parts of the next piece of streamed text.
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        let mut parts = Vec::new();
        let content = match &mut self.reasoning {
            Some(r) => match r.parse_reasoning_streaming_incremental(text) {
                Ok(res) => {
                    if !res.reasoning_text.is_empty() {
                        parts.push(Part::Reasoning(res.reasoning_text));
                    }
                    res.normal_text
                }
                // Past the parser's buffer bound: the rest is shown as content.
                Err(_) => {
                    self.reasoning = None;
                    text.to_string()
                }
            },
            None => text.to_string(),
        };
        self.content(&content, &mut parts);
        parts
    }

    /// What the parsers still hold when the answer ends.
    pub fn finish(&mut self) -> Vec<Part> {
        let mut parts = Vec::new();
        if let Some(r) = &mut self.reasoning {
            if let Ok(res) = r.flush() {
                if !res.reasoning_text.is_empty() {
                    parts.push(Part::Reasoning(res.reasoning_text));
                }
                self.content(&res.normal_text, &mut parts);
            }
        }
        let held = std::mem::take(&mut self.held);
        self.feed(&held, &mut parts);
        if let Some((p, _, _)) = &mut self.tools {
            for item in p.get_unstreamed_tool_args().unwrap_or_default() {
                if item.tool_index < self.ids.len() && !item.parameters.is_empty() {
                    parts.push(Part::CallArgs {
                        index: item.tool_index,
                        args: item.parameters,
                    });
                }
            }
            let rest = p.take_unstreamed_normal_text();
            if !rest.is_empty() {
                parts.push(Part::Content(rest));
            }
        }
        parts
    }

    fn content(&mut self, text: &str, parts: &mut Vec<Part>) {
        if text.is_empty() {
            return;
        }
        let Some((_, _, marker)) = &self.tools else {
            parts.push(Part::Content(text.to_string()));
            return;
        };
        // The crate's parsers drop text that precedes a call's marker in the same delta,
        // or that ends in a part of one: each marker starts a delta of its own, and a
        // delta's end that may begin a marker waits for the next.
        let mut pending = std::mem::take(&mut self.held) + text;
        let keep = partial_suffix(&pending, marker);
        self.held = pending.split_off(pending.len() - keep);
        self.feed(&pending, parts);
    }

    /// `text` to the tool parser, cut before each call marker.
    fn feed(&mut self, text: &str, parts: &mut Vec<Part>) {
        let Some((_, _, marker)) = &self.tools else {
            return;
        };
        let mut cuts: Vec<usize> = text.match_indices(*marker).map(|(i, _)| i).collect();
        cuts.push(text.len());
        let mut last = 0;
        for c in cuts {
            if c > last {
                self.parse_calls(&text[last..c], parts);
            }
            last = c;
        }
    }

    fn parse_calls(&mut self, text: &str, parts: &mut Vec<Part>) {
        let Some((p, defs, _)) = &mut self.tools else {
            return;
        };
        // A parser takes one call per step: feed it nothing until it has no more to give
        // (a delta may hold the end of one call and the whole next one).
        let mut chunk = text;
        for _ in 0..MAX_CALLS_PER_DELTA {
            // The crate's parsers are async in signature only: they never wait.
            let res = match p.parse_incremental(chunk, defs).now_or_never() {
                Some(Ok(r)) => r,
                _ => {
                    parts.push(Part::Content(chunk.to_string()));
                    return;
                }
            };
            let progressed = !res.normal_text.is_empty() || !res.calls.is_empty();
            if !res.normal_text.is_empty() {
                parts.push(Part::Content(res.normal_text));
            }
            for item in res.calls {
                if let Some(name) = item.name {
                    if item.tool_index == self.ids.len() {
                        let id = call_id();
                        self.ids.push(id.clone());
                        parts.push(Part::CallStart {
                            index: item.tool_index,
                            id,
                            name,
                        });
                    }
                }
                if !item.parameters.is_empty() && item.tool_index < self.ids.len() {
                    parts.push(Part::CallArgs {
                        index: item.tool_index,
                        args: item.parameters,
                    });
                }
            }
            if !progressed {
                break;
            }
            chunk = "";
        }
    }

    /// A whole answer's text, parsed as its stream would be (so an answer reads the same
    /// whole or streamed).
    pub fn parse_whole(&mut self, text: &str) -> Parsed {
        let mut parts = self.push(text);
        parts.extend(self.finish());
        assemble(parts)
    }
}

/// Streamed parts put together.
pub fn assemble(parts: impl IntoIterator<Item = Part>) -> Parsed {
    let mut out = Parsed::default();
    for part in parts {
        match part {
            Part::Reasoning(r) => out.reasoning.get_or_insert_with(String::new).push_str(&r),
            Part::Content(c) => out.content.push_str(&c),
            Part::CallStart { id, name, .. } => out.calls.push(Call {
                id,
                name,
                arguments: String::new(),
            }),
            Part::CallArgs { index, args } => {
                if let Some(c) = out.calls.get_mut(index) {
                    c.arguments.push_str(&args);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn defs() -> Vec<Value> {
        vec![
            json!({"type": "function", "function": {"name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}),
            json!({"type": "function", "function": {"name": "add",
                "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}),
        ]
    }

    fn parsers(tools: ToolFormat, reasoning: Option<&str>) -> OutputParsers {
        OutputParsers {
            tools: Some(tools),
            reasoning: reasoning.map(str::to_string),
        }
    }

    /// The streamed parts of `text` cut at `cuts`, reassembled.
    fn streamed(p: &OutputParsers, text: &str, cuts: &[usize]) -> Parsed {
        let mut cp = ChoiceParser::new(p, Some(&defs()));
        let mut parts = vec![];
        let mut last = 0;
        for &c in cuts.iter().chain([text.len()].iter()) {
            let c = c.clamp(last, text.len());
            if !text.is_char_boundary(c) {
                continue;
            }
            parts.extend(cp.push(&text[last..c]));
            last = c;
        }
        parts.extend(cp.finish());
        let mut out = Parsed::default();
        for part in parts {
            match part {
                Part::Reasoning(r) => out.reasoning.get_or_insert_with(String::new).push_str(&r),
                Part::Content(c) => out.content.push_str(&c),
                Part::CallStart { index, id, name } => {
                    assert_eq!(index, out.calls.len(), "calls start in order");
                    out.calls.push(Call {
                        id,
                        name,
                        arguments: String::new(),
                    });
                }
                Part::CallArgs { index, args } => out.calls[index].arguments.push_str(&args),
            }
        }
        out
    }

    fn args(c: &Call) -> Value {
        serde_json::from_str(&c.arguments).unwrap_or_else(|e| panic!("{:?}: {e}", c.arguments))
    }

    const HERMES: &str = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \
        {\"city\": \"Paris, \\\"FR\\\"\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \
        \"arguments\": {\"a\": 5}}\n</tool_call>";

    #[test]
    fn whole_hermes_answer() {
        let p = parsers(ToolFormat::Hermes, None);
        let got = ChoiceParser::new(&p, Some(&defs())).parse_whole(HERMES);
        assert_eq!(got.calls.len(), 2);
        assert_eq!(got.calls[0].name, "get_weather");
        assert_eq!(args(&got.calls[0]), json!({"city": "Paris, \"FR\""}));
        assert_eq!(args(&got.calls[1]), json!({"a": 5}));
        assert_ne!(got.calls[0].id, got.calls[1].id);
        assert_eq!(got.content.trim(), "Let me look.");
    }

    #[test]
    fn reasoning_is_split_off() {
        let p = OutputParsers {
            tools: None,
            reasoning: Some("qwen3".into()),
        };
        let text = "<think>\nTwo and two.\n</think>\n\nFour.";
        let got = ChoiceParser::new(&p, None).parse_whole(text);
        assert_eq!(
            got.reasoning.as_deref().map(str::trim),
            Some("Two and two.")
        );
        assert_eq!(got.content.trim(), "Four.");
        let s = streamed(&p, text, &[3, 9, 20, 31]);
        assert_eq!(s.reasoning.as_deref().map(str::trim), Some("Two and two."));
        assert_eq!(s.content.trim(), "Four.");
        // R1 distills: the prompt opened the thought.
        let p = OutputParsers {
            tools: None,
            reasoning: Some("deepseek_r1".into()),
        };
        let got = ChoiceParser::new(&p, None).parse_whole("Hmm.\n</think>\n\nYes.");
        assert_eq!(got.reasoning.as_deref().map(str::trim), Some("Hmm."));
        assert_eq!(got.content.trim(), "Yes.");
    }

    #[test]
    fn plain_text_passes_through() {
        let p = parsers(ToolFormat::Hermes, Some("qwen3"));
        let text = "No tools needed: 2 < 3 and {\"a\": 1} is JSON.";
        let got = ChoiceParser::new(&p, Some(&defs())).parse_whole(text);
        assert!(got.calls.is_empty() && got.reasoning.is_none());
        assert_eq!(got.content, text);
        let s = streamed(&p, text, &[1, 5, 30]);
        assert_eq!(s.content, text);
        assert!(s.calls.is_empty());
    }

    #[test]
    fn detects_parsers() {
        let qwen3 = "{% if tools %}<tool_call>{% endif %}{{ '<think>' }}";
        assert_eq!(
            OutputParsers::detect(qwen3, "<|im_start|>assistant\n"),
            parsers(ToolFormat::Hermes, Some("qwen3"))
        );
        let r1 = OutputParsers::detect("{{ '<think>' }}", "<|Assistant|><think>\n");
        assert_eq!(r1.reasoning.as_deref(), Some("deepseek_r1"));
        assert_eq!(r1.tools, None);
        assert!(OutputParsers::reasoning_exists("qwen3"));
        assert!(!OutputParsers::reasoning_exists("no-such-parser"));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// However the text is cut into deltas, the streamed calls reassemble into the
        /// answer's calls (names, and arguments that parse to the JSON written), and into
        /// what the whole answer parses to.
        #[test]
        fn streamed_calls_reassemble(mut cuts in proptest::collection::vec(0usize..200, 0..24),
                                     llama in any::<bool>()) {
            cuts.sort_unstable();
            let (p, text, want) = if llama {
                (parsers(ToolFormat::Llama3, None),
                 "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo; N\\u00f8\"}}",
                 vec![("get_weather", json!({"city": "Oslo; N\u{f8}"}))])
            } else {
                (parsers(ToolFormat::Hermes, None), HERMES,
                 vec![("get_weather", json!({"city": "Paris, \"FR\""})), ("add", json!({"a": 5}))])
            };
            let whole = ChoiceParser::new(&p, Some(&defs())).parse_whole(text);
            let s = streamed(&p, text, &cuts);
            for got in [&s, &whole] {
                prop_assert_eq!(got.calls.len(), want.len());
                for (c, (name, a)) in got.calls.iter().zip(&want) {
                    prop_assert_eq!(&c.name, name);
                    prop_assert_eq!(&args(c), a);
                }
            }
            prop_assert_eq!(s.content.trim(), whole.content.trim());
        }
    }
}
