//! Tool calling, the request side: `tools` and `tool_choice` checked into a [`ToolSpec`],
//! the tool-call format of the model ([`ToolFormat`], from `--tool-call-parser` or read off
//! its chat template), and for `tool_choice: "required"` or a named function the grammar
//! that holds the output to well-formed calls whose arguments fit each function's JSON
//! schema, in the model's own format, so they always parse.
//!
//! Reading calls back out of the output is [`crate::chat_output`]'s job, with the
//! `tool-parser` crate (SGLang's gateway parsers).

use serde_json::{json, Value};
use tessera_engine::constrain::ConstraintSpec;

use crate::api::ApiError;
use crate::text::quote;

/// What the request lets the model do with its tools.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    /// No calls: the tools are not shown to the model and the output is not parsed.
    None,
    /// The model decides; calls in its output are parsed out.
    Auto,
    /// At least one call (exactly one without `parallel_tool_calls`), constrained.
    Required,
    /// One call of this function, constrained.
    Named(String),
}

/// A request's checked tools.
#[derive(Debug, Clone)]
pub struct ToolSpec {
    /// The definitions as the chat template gets them (`[{"type": "function", "function":
    /// {"name", "description", "parameters"}}]`), `parameters` defaulted to an empty object
    /// schema.
    pub tools: Vec<Value>,
    pub choice: ToolChoice,
    pub parallel: bool,
}

/// Longest function name OpenAI accepts.
const MAX_NAME: usize = 64;
/// Most tools in one request.
pub const MAX_TOOLS: usize = 128;

impl ToolSpec {
    /// Checks `tools`, `tool_choice` and `parallel_tool_calls` as OpenAI does; `None` when
    /// the request has no tools.
    pub fn parse(
        tools: Option<&Value>,
        choice: Option<&Value>,
        parallel: Option<bool>,
    ) -> Result<Option<ToolSpec>, ApiError> {
        let list = match tools {
            None | Some(Value::Null) => {
                return match choice {
                    None | Some(Value::Null) => Ok(None),
                    Some(Value::String(s)) if s == "none" || s == "auto" => Ok(None),
                    Some(_) => Err(ApiError::invalid(
                        "tool_choice",
                        "tool_choice needs tools: give the functions the model may call",
                    )),
                };
            }
            Some(Value::Array(a)) => a,
            Some(_) => return Err(ApiError::invalid("tools", "tools must be a list")),
        };
        if list.is_empty() {
            return Err(ApiError::invalid(
                "tools",
                "tools must not be an empty list",
            ));
        }
        if list.len() > MAX_TOOLS {
            return Err(ApiError::invalid(
                "tools",
                format!(
                    "at most {MAX_TOOLS} tools are accepted (got {})",
                    list.len()
                ),
            ));
        }
        let mut out = Vec::with_capacity(list.len());
        let mut names = std::collections::HashSet::new();
        for (i, t) in list.iter().enumerate() {
            let bad = |m: String| ApiError::invalid(&format!("tools[{i}]"), m);
            let kind = t.get("type").and_then(Value::as_str).unwrap_or("");
            if kind != "function" {
                return Err(bad(format!(
                    "tool type {} is not supported (only \"function\")",
                    quote(kind)
                )));
            }
            let f = t
                .get("function")
                .and_then(Value::as_object)
                .ok_or_else(|| bad("a function tool needs a \"function\" object".into()))?;
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("the function needs a \"name\"".into()))?;
            check_name(name).map_err(bad)?;
            if !names.insert(name.to_string()) {
                return Err(bad(format!("function {} is defined twice", quote(name))));
            }
            let params = match f.get("parameters") {
                None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
                Some(p @ Value::Object(_)) => p.clone(),
                Some(_) => {
                    return Err(bad(
                        "the function's \"parameters\" must be a JSON schema object".into(),
                    ))
                }
            };
            let mut func = f.clone();
            func.insert("parameters".into(), params);
            out.push(json!({"type": "function", "function": Value::Object(func)}));
        }
        let choice = match choice {
            None | Some(Value::Null) => ToolChoice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "none" => ToolChoice::None,
                "auto" => ToolChoice::Auto,
                "required" => ToolChoice::Required,
                other => {
                    return Err(ApiError::invalid(
                        "tool_choice",
                        format!(
                            "tool_choice {} is not one of \"none\", \"auto\", \"required\" or \
                             {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}",
                            quote(other)
                        ),
                    ))
                }
            },
            Some(v) => {
                let name = v
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                    .filter(|_| v.get("type").and_then(Value::as_str) == Some("function"))
                    .ok_or_else(|| {
                        ApiError::invalid(
                            "tool_choice",
                            "a named tool_choice is {\"type\": \"function\", \"function\": \
                             {\"name\": ...}}",
                        )
                    })?;
                if !names.contains(name) {
                    return Err(ApiError::invalid(
                        "tool_choice",
                        format!("tool_choice names {}, which is not in tools", quote(name)),
                    ));
                }
                ToolChoice::Named(name.to_string())
            }
        };
        Ok(Some(ToolSpec {
            tools: out,
            choice,
            parallel: parallel.unwrap_or(true),
        }))
    }

    /// The tool definitions the template gets (none under `tool_choice: "none"`).
    pub fn shown(&self) -> Option<Value> {
        (self.choice != ToolChoice::None).then(|| Value::Array(self.tools.clone()))
    }

    /// Whether the output is read for calls.
    pub fn parses_calls(&self) -> bool {
        self.choice != ToolChoice::None
    }

    fn function(&self, name: &str) -> Option<&Value> {
        self.tools
            .iter()
            .map(|t| &t["function"])
            .find(|f| f["name"] == name)
    }

    /// The constraint of a required or named choice in `format`, `None` for auto and none;
    /// `special` gives the id of a marker (`<tool_call>`, `[TOOL_CALLS]`) that the
    /// vocabulary holds as a token of its own, which the grammar then names by id: that is
    /// the token the model writes it with, and the grammar engine takes such tokens as
    /// special, not as their text.
    pub fn constraint(
        &self,
        format: ToolFormat,
        special: &dyn Fn(&str) -> Option<u32>,
    ) -> Result<Option<ConstraintSpec>, ApiError> {
        let names: Vec<&str> = match &self.choice {
            ToolChoice::None | ToolChoice::Auto => return Ok(None),
            ToolChoice::Required => self
                .tools
                .iter()
                .filter_map(|t| t["function"]["name"].as_str())
                .collect(),
            ToolChoice::Named(n) => vec![n.as_str()],
        };
        let many = self.parallel && self.choice == ToolChoice::Required;
        let args_key = format.arguments_key();
        let one_call = |name: &str| {
            let params = self
                .function(name)
                .map(|f| f["parameters"].clone())
                .unwrap_or_else(|| json!({"type": "object"}));
            json!({"type": "object",
                   "properties": {"name": {"const": name}, args_key: params},
                   "required": ["name", args_key], "additionalProperties": false})
        };
        let call = if names.len() == 1 {
            one_call(names[0])
        } else {
            json!({"anyOf": names.iter().map(|n| one_call(n)).collect::<Vec<_>>()})
        };
        Ok(Some(ConstraintSpec::Lark(
            format.grammar(call, many, special),
        )))
    }
}

/// OpenAI's rule for function names: 1 to 64 of `a-z A-Z 0-9 _ -`.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > MAX_NAME
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(format!(
            "function name {} must be 1 to {MAX_NAME} letters, digits, '_' or '-'",
            quote(name)
        ));
    }
    Ok(())
}

/// How a model writes tool calls, by the `tool-parser` crate's parser names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// Hermes and Qwen2.5/Qwen3: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`,
    /// one block per call.
    Hermes,
    /// Llama 3.1/3.2 JSON: `{"name": ..., "parameters": {...}}`, calls separated by `;`,
    /// optionally after `<|python_tag|>`.
    Llama3,
    /// Mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`.
    Mistral,
}

impl ToolFormat {
    /// The `tool-parser` crate's name for it.
    pub fn parser_name(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "qwen",
            ToolFormat::Llama3 => "llama",
            ToolFormat::Mistral => "mistral",
        }
    }

    /// By `--tool-call-parser` name (vLLM's names and the crate's).
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "hermes" | "qwen" | "qwen25" => ToolFormat::Hermes,
            "llama" | "llama3" | "llama3_json" => ToolFormat::Llama3,
            "mistral" => ToolFormat::Mistral,
            _ => return None,
        })
    }

    /// The format a chat template writes its tool calls in, read off its source; `None`
    /// when the template takes no tools.
    pub fn detect(template: &str) -> Option<Self> {
        if !template.contains("tools") {
            return None;
        }
        if template.contains("<tool_call>") {
            Some(ToolFormat::Hermes)
        } else if template.contains("[TOOL_CALLS]") || template.contains("[AVAILABLE_TOOLS]") {
            Some(ToolFormat::Mistral)
        } else if template.contains("<|python_tag|>") || template.contains("\"parameters\"") {
            Some(ToolFormat::Llama3)
        } else {
            None
        }
    }

    /// The text a call starts with (Llama 3's calls are bare JSON: its object's start).
    pub fn start_marker(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "<tool_call>",
            ToolFormat::Llama3 => "{",
            ToolFormat::Mistral => "[TOOL_CALLS]",
        }
    }

    fn arguments_key(self) -> &'static str {
        match self {
            ToolFormat::Llama3 => "parameters",
            ToolFormat::Hermes | ToolFormat::Mistral => "arguments",
        }
    }

    /// A Lark grammar (llguidance's dialect) of one call (`many`: one or more) whose JSON is
    /// `call`, written compactly as the models write it.
    fn grammar(self, call: Value, many: bool, special: &dyn Fn(&str) -> Option<u32>) -> String {
        let compact = json!({"whitespace_flexible": false, "item_separator": ", ",
                             "key_separator": ": "});
        let schema = |mut v: Value| {
            v["x-guidance"] = compact.clone();
            serde_json::to_string(&v).unwrap_or_default()
        };
        // A marker: its special token by id, or its text.
        let lit = |text: &str| match special(text) {
            Some(id) => format!("<[{id}]>"),
            None => serde_json::to_string(text).unwrap_or_default(),
        };
        match self {
            ToolFormat::Hermes => {
                let rep = if many { " (\"\\n\" call)*" } else { "" };
                format!(
                    "start: call{rep}\ncall: {} \"\\n\" body \"\\n\" {}\nbody: %json {}\n",
                    lit("<tool_call>"),
                    lit("</tool_call>"),
                    schema(call)
                )
            }
            ToolFormat::Llama3 => {
                let rep = if many { " (\"; \" body)*" } else { "" };
                format!("start: body{rep}\nbody: %json {}\n", schema(call))
            }
            ToolFormat::Mistral => {
                let mut list = json!({"type": "array", "items": call, "minItems": 1});
                if !many {
                    list["maxItems"] = json!(1);
                }
                format!(
                    "start: {} body\nbody: %json {}\n",
                    lit("[TOOL_CALLS]"),
                    schema(list)
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather",
            "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}},
               {"type": "function", "function": {"name": "now"}}])
    }

    #[test]
    fn parses_tools_and_choices() {
        let t = ToolSpec::parse(Some(&weather()), None, None)
            .unwrap()
            .unwrap();
        assert_eq!(t.choice, ToolChoice::Auto);
        assert!(t.parallel);
        assert_eq!(
            t.tools[1]["function"]["parameters"],
            json!({"type": "object", "properties": {}})
        );
        for (c, want) in [
            (json!("none"), ToolChoice::None),
            (json!("required"), ToolChoice::Required),
            (
                json!({"type": "function", "function": {"name": "now"}}),
                ToolChoice::Named("now".into()),
            ),
        ] {
            let t = ToolSpec::parse(Some(&weather()), Some(&c), Some(false))
                .unwrap()
                .unwrap();
            assert_eq!(t.choice, want);
            assert!(!t.parallel);
        }
        assert!(ToolSpec::parse(None, Some(&json!("auto")), None)
            .unwrap()
            .is_none());
    }

    #[test]
    fn refuses_bad_tools() {
        for (tools, choice, param) in [
            (json!([]), json!(null), "tools"),
            (json!({"a": 1}), json!(null), "tools"),
            (json!([{"type": "retrieval"}]), json!(null), "tools[0]"),
            (json!([{"type": "function"}]), json!(null), "tools[0]"),
            (
                json!([{"type": "function", "function": {"name": "a b"}}]),
                json!(null),
                "tools[0]",
            ),
            (
                json!([{"type": "function", "function": {"name": "f", "parameters": 3}}]),
                json!(null),
                "tools[0]",
            ),
            (
                json!([{"type": "function", "function": {"name": "f"}},
                       {"type": "function", "function": {"name": "f"}}]),
                json!(null),
                "tools[1]",
            ),
            (weather(), json!("sometimes"), "tool_choice"),
            (
                weather(),
                json!({"type": "function", "function": {"name": "nope"}}),
                "tool_choice",
            ),
            (weather(), json!({"name": "now"}), "tool_choice"),
        ] {
            let e = ToolSpec::parse(Some(&tools), Some(&choice), None).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{tools} {choice}");
        }
        let e = ToolSpec::parse(None, Some(&json!("required")), None).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
    }

    #[test]
    fn detects_formats_from_templates() {
        assert_eq!(
            ToolFormat::detect("{% if tools %}<tool_call>{% endif %}"),
            Some(ToolFormat::Hermes)
        );
        assert_eq!(
            ToolFormat::detect("{% if tools %}[AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]"),
            Some(ToolFormat::Mistral)
        );
        assert_eq!(
            ToolFormat::detect("{% if tools %}\"parameters\": <|python_tag|>{% endif %}"),
            Some(ToolFormat::Llama3)
        );
        assert_eq!(ToolFormat::detect("<|im_start|>{{ m.content }}"), None);
    }

    #[test]
    fn required_and_named_grammars() {
        let t = ToolSpec::parse(Some(&weather()), Some(&json!("required")), None)
            .unwrap()
            .unwrap();
        let Some(ConstraintSpec::Lark(g)) = t.constraint(ToolFormat::Hermes, &|_| None).unwrap()
        else {
            panic!("no grammar");
        };
        assert!(g.starts_with("start: call (\"\\n\" call)*\n"), "{g}");
        assert!(g.contains("call: \"<tool_call>\" \"\\n\" body"), "{g}");
        let Some(ConstraintSpec::Lark(m)) = t
            .constraint(ToolFormat::Mistral, &|s| (s == "[TOOL_CALLS]").then_some(5))
            .unwrap()
        else {
            panic!("no grammar");
        };
        assert!(
            m.starts_with("start: <[5]> body\n") && !m.contains("maxItems"),
            "{m}"
        );
        assert!(g.contains("\"const\":\"get_weather\"") && g.contains("\"const\":\"now\""));
        let t = ToolSpec::parse(
            Some(&weather()),
            Some(&json!({"type": "function", "function": {"name": "get_weather"}})),
            None,
        )
        .unwrap()
        .unwrap();
        let Some(ConstraintSpec::Lark(g)) = t.constraint(ToolFormat::Llama3, &|_| None).unwrap()
        else {
            panic!("no grammar");
        };
        assert!(
            g.starts_with("start: body\n") && g.contains("\"parameters\""),
            "{g}"
        );
        assert!(!g.contains("\"now\""));
        let auto = ToolSpec::parse(Some(&weather()), None, None)
            .unwrap()
            .unwrap();
        assert!(auto
            .constraint(ToolFormat::Hermes, &|_| None)
            .unwrap()
            .is_none());
    }
}
