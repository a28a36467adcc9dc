//! An Anthropic Messages request read into a [`ChatTurn`]. The body is taken field by field
//! (each field's type error names it), and a field this module does not know is refused
//! naming it, so nothing a client sends is silently ignored. docs/api-fields.md has the
//! table of what each field does here.

use std::collections::HashMap;

use serde::de::DeserializeOwned;
use serde_json::{json, Map, Value};
use tessera_tokenizer::ChatMessage;

use crate::api::{ApiError, CommonParams};
use crate::spec::{self, GenSpec};
use crate::text::quote;
use crate::tools::ToolSpec;
use crate::turn::ChatTurn;

/// The fields `POST /v1/messages` takes.
const MESSAGE_FIELDS: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "system",
    "tools",
    "tool_choice",
    "thinking",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "stream",
    "metadata",
    "service_tier",
    "cache_control",
    "ignore_eos",
];

/// The fields `POST /v1/messages/count_tokens` takes.
const COUNT_FIELDS: &[&str] = &[
    "model",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "thinking",
];

/// What a request asks for, beyond the turn itself.
pub struct Asked {
    pub turn: ChatTurn,
    pub stream: bool,
}

/// The body of `POST /v1/messages` (`count` false) or of `count_tokens` (`count` true).
pub fn read(body: Value, count: bool, default_max_tokens: usize) -> Result<Asked, ApiError> {
    let Value::Object(mut body) = body else {
        return Err(ApiError::invalid(
            "body",
            "the request body must be a JSON object",
        ));
    };
    let known = if count { COUNT_FIELDS } else { MESSAGE_FIELDS };
    if let Some(k) = body.keys().find(|k| !known.contains(&k.as_str())) {
        let what = if MESSAGE_FIELDS.contains(&k.as_str()) {
            "is not a field of count_tokens"
        } else {
            "is not supported by this server"
        };
        return Err(ApiError::invalid(k, format!("{}: {what}", quote(k))));
    }
    let model: String = field(&mut body, "model")?
        .ok_or_else(|| ApiError::invalid("model", "model: Field required"))?;
    let max_tokens: Option<i64> = field(&mut body, "max_tokens")?;
    if !count && max_tokens.is_none() {
        return Err(ApiError::invalid(
            "max_tokens",
            "max_tokens: Field required",
        ));
    }
    let stream = field::<bool>(&mut body, "stream")?.unwrap_or(false);
    // Pure hints: checked for shape, not acted on.
    if let Some(m) = field::<Value>(&mut body, "metadata")? {
        if !m.is_object() {
            return Err(ApiError::invalid("metadata", "metadata must be an object"));
        }
    }
    if let Some(c) = field::<Value>(&mut body, "cache_control")? {
        if !c.is_object() {
            return Err(ApiError::invalid(
                "cache_control",
                "cache_control must be an object",
            ));
        }
    }
    if let Some(t) = field::<String>(&mut body, "service_tier")? {
        if !matches!(t.as_str(), "auto" | "standard_only") {
            return Err(ApiError::invalid(
                "service_tier",
                format!(
                    "service_tier {} is not one of \"auto\", \"standard_only\"",
                    quote(&t)
                ),
            ));
        }
    }
    let thinking = thinking(field(&mut body, "thinking")?, max_tokens)?;
    let mut template_kwargs = Map::new();
    template_kwargs.insert("enable_thinking".into(), json!(thinking));
    let stop: Option<Vec<String>> = field(&mut body, "stop_sequences")?;
    let common: CommonParams = serde_json::from_value(json!({
        "model": model,
        "max_tokens": if count { None } else { max_tokens },
        "temperature": field::<f64>(&mut body, "temperature")?,
        "top_p": field::<f64>(&mut body, "top_p")?,
        "top_k": field::<i64>(&mut body, "top_k")?,
        "stop": stop,
        "stream": stream,
        "ignore_eos": field::<bool>(&mut body, "ignore_eos")?,
    }))
    .map_err(|e| ApiError::invalid("body", e.to_string()))?;
    let spec: GenSpec = spec::validate(&common, None, default_max_tokens).map_err(|mut e| {
        if e.param.as_deref() == Some("stop") {
            e.param = Some("stop_sequences".into());
        }
        e
    })?;
    let tools = tools(field(&mut body, "tools")?, field(&mut body, "tool_choice")?)?;
    let mut messages = vec![];
    if let Some(system) = field::<Value>(&mut body, "system")? {
        messages.push(ChatMessage::new("system", &text_of(&system, "system")?));
    }
    let list: Vec<Value> = field(&mut body, "messages")?
        .ok_or_else(|| ApiError::invalid("messages", "messages: Field required"))?;
    if list.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    conversation(&list, &mut messages)?;
    Ok(Asked {
        turn: ChatTurn {
            model: Some(model),
            messages,
            messages_param: "messages",
            tools,
            tools_param: "tools",
            template_kwargs,
            spec,
        },
        stream,
    })
}

/// Field `key` taken out of `body`, `null` being absent; a type error names it.
fn field<T: DeserializeOwned>(
    body: &mut Map<String, Value>,
    key: &str,
) -> Result<Option<T>, ApiError> {
    match body.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v)
            .map(Some)
            .map_err(|e| ApiError::invalid(key, format!("{key}: {e}"))),
    }
}

/// `thinking`: whether the model is asked to think (the template's `enable_thinking`).
/// Absent means disabled, as in Anthropic's API. `budget_tokens` is checked as Anthropic
/// checks it (at least 1024, under `max_tokens`) and is a hint: the thinking is not cut at it.
fn thinking(v: Option<Value>, max_tokens: Option<i64>) -> Result<bool, ApiError> {
    let Some(v) = v else { return Ok(false) };
    let bad = |m: &str| ApiError::invalid("thinking", m.to_string());
    let kind = v.get("type").and_then(Value::as_str).unwrap_or("");
    if let Some(k) = v.as_object().and_then(|o| {
        o.keys()
            .find(|k| !matches!(k.as_str(), "type" | "budget_tokens" | "display"))
    }) {
        return Err(ApiError::invalid(
            "thinking",
            format!("thinking.{k} is not supported"),
        ));
    }
    match v.get("display") {
        None | Some(Value::Null) => {}
        Some(d) if d == "summarized" => {}
        Some(d) => {
            return Err(bad(&format!(
                "thinking.display {d} is not supported (the thinking is returned whole; \
                 \"summarized\" is accepted)"
            )))
        }
    }
    match kind {
        "disabled" => Ok(false),
        "adaptive" => Ok(true),
        "enabled" => {
            let budget = v
                .get("budget_tokens")
                .and_then(Value::as_i64)
                .ok_or_else(|| bad("thinking.budget_tokens: Field required (an integer)"))?;
            if budget < 1024 {
                return Err(bad("thinking.budget_tokens must be at least 1024"));
            }
            if max_tokens.is_some_and(|m| budget >= m) {
                return Err(bad("thinking.budget_tokens must be less than max_tokens"));
            }
            Ok(true)
        }
        other => Err(ApiError::invalid(
            "thinking",
            format!(
                "thinking.type {} is not one of \"enabled\", \"adaptive\", \"disabled\"",
                quote(other)
            ),
        )),
    }
}

/// `tools` and `tool_choice` in OpenAI's shape, checked by [`ToolSpec::parse`].
fn tools(tools: Option<Value>, choice: Option<Value>) -> Result<Option<ToolSpec>, ApiError> {
    let tools = match tools {
        None => None,
        Some(Value::Array(list)) => {
            let mut out = vec![];
            for (i, t) in list.iter().enumerate() {
                let param = format!("tools[{i}]");
                let Some(o) = t.as_object() else {
                    return Err(ApiError::invalid(&param, "a tool must be an object"));
                };
                if let Some(kind) = o.get("type").and_then(Value::as_str) {
                    if kind != "custom" {
                        return Err(ApiError::invalid(
                            &param,
                            format!(
                                "tool type {} is not supported (only client tools: \
                                 name, description, input_schema)",
                                quote(kind)
                            ),
                        ));
                    }
                }
                if let Some(k) = o.keys().find(|k| {
                    !matches!(
                        k.as_str(),
                        "type" | "name" | "description" | "input_schema" | "cache_control"
                    )
                }) {
                    return Err(ApiError::invalid(
                        &param,
                        format!("{param}.{k} is not supported"),
                    ));
                }
                let mut f = Map::new();
                f.insert("name".into(), o.get("name").cloned().unwrap_or(Value::Null));
                if let Some(d) = o.get("description") {
                    f.insert("description".into(), d.clone());
                }
                let schema = o.get("input_schema").ok_or_else(|| {
                    ApiError::invalid(&param, format!("{param}.input_schema: Field required"))
                })?;
                f.insert("parameters".into(), schema.clone());
                out.push(json!({"type": "function", "function": f}));
            }
            Some(Value::Array(out))
        }
        Some(_) => return Err(ApiError::invalid("tools", "tools must be a list")),
    };
    let mut parallel = None;
    let choice = match choice {
        None => None,
        Some(c) => {
            let kind = c.get("type").and_then(Value::as_str).unwrap_or("");
            if let Some(k) = c.as_object().and_then(|o| {
                o.keys()
                    .find(|k| !matches!(k.as_str(), "type" | "name" | "disable_parallel_tool_use"))
            }) {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("tool_choice.{k} is not supported"),
                ));
            }
            match c.get("disable_parallel_tool_use") {
                None | Some(Value::Null) => {}
                Some(Value::Bool(b)) => parallel = Some(!b),
                Some(_) => {
                    return Err(ApiError::invalid(
                        "tool_choice",
                        "tool_choice.disable_parallel_tool_use must be a boolean",
                    ))
                }
            }
            Some(match kind {
                "auto" => json!("auto"),
                "any" => json!("required"),
                "none" => json!("none"),
                "tool" => {
                    let name = c.get("name").and_then(Value::as_str).ok_or_else(|| {
                        ApiError::invalid("tool_choice", "tool_choice.name: Field required")
                    })?;
                    json!({"type": "function", "function": {"name": name}})
                }
                other => {
                    return Err(ApiError::invalid(
                        "tool_choice",
                        format!(
                            "tool_choice.type {} is not one of \"auto\", \"any\", \"tool\", \
                             \"none\"",
                            quote(other)
                        ),
                    ))
                }
            })
        }
    };
    ToolSpec::parse(tools.as_ref(), choice.as_ref(), parallel)
}

/// The keys a block of type `kind` may have.
fn block_keys(kind: &str) -> &'static [&'static str] {
    match kind {
        "text" => &["type", "text", "cache_control", "citations"],
        "tool_use" => &["type", "id", "name", "input", "cache_control"],
        "tool_result" => &[
            "type",
            "tool_use_id",
            "content",
            "is_error",
            "cache_control",
        ],
        "thinking" => &["type", "thinking", "signature"],
        "redacted_thinking" => &["type", "data"],
        _ => &[],
    }
}

/// The blocks of a content (a string is one text block), each checked for its type and
/// keys; `param` names the content in errors.
fn blocks(content: &Value, param: &str) -> Result<Vec<Map<String, Value>>, ApiError> {
    let list = match content {
        Value::String(s) => {
            return Ok(vec![json!({"type": "text", "text": s})
                .as_object()
                .cloned()
                .unwrap_or_default()])
        }
        Value::Array(a) => a,
        _ => {
            return Err(ApiError::invalid(
                param,
                format!("{param} must be a string or a list of content blocks"),
            ))
        }
    };
    let mut out = vec![];
    for (j, b) in list.iter().enumerate() {
        let here = format!("{param}[{j}]");
        let o = b.as_object().ok_or_else(|| {
            ApiError::invalid(&here, format!("{here} must be a content block object"))
        })?;
        let kind = o.get("type").and_then(Value::as_str).unwrap_or("");
        let keys = block_keys(kind);
        if keys.is_empty() {
            return Err(ApiError::invalid(
                &here,
                format!(
                    "content block type {} is not supported (text, tool_use, tool_result, \
                     thinking and redacted_thinking are)",
                    quote(kind)
                ),
            ));
        }
        // A key that is null is absent (clients' models dump their unset fields as null).
        if let Some((k, _)) = o
            .iter()
            .find(|(k, v)| !v.is_null() && !keys.contains(&k.as_str()))
        {
            return Err(ApiError::invalid(
                &here,
                format!("{here}.{k} is not supported in a {kind} block"),
            ));
        }
        if kind == "text" {
            if !o.get("text").is_some_and(Value::is_string) {
                return Err(ApiError::invalid(
                    &here,
                    format!("{here}.text must be a string"),
                ));
            }
            if o.get("citations")
                .is_some_and(|c| !c.is_null() && c != &json!([]))
            {
                return Err(ApiError::invalid(
                    &here,
                    format!("{here}.citations is not supported"),
                ));
            }
        }
        out.push(o.clone());
    }
    Ok(out)
}

/// The text of a content made only of text blocks (`system`, a tool result).
fn text_of(content: &Value, param: &str) -> Result<String, ApiError> {
    let mut s = String::new();
    for (j, b) in blocks(content, param)?.iter().enumerate() {
        let kind = b.get("type").and_then(Value::as_str).unwrap_or("");
        if kind != "text" {
            return Err(ApiError::invalid(
                param,
                format!("{param}[{j}]: a {kind} block is not allowed here (only text)"),
            ));
        }
        s.push_str(b.get("text").and_then(Value::as_str).unwrap_or(""));
    }
    Ok(s)
}

/// `messages` as template messages, appended to `out`: a user turn's tool results become
/// `tool` messages (before its text, as Anthropic orders them), an assistant turn's
/// tool_use blocks its `tool_calls`; thinking blocks are dropped from the prompt.
fn conversation(list: &[Value], out: &mut Vec<ChatMessage>) -> Result<(), ApiError> {
    // The tool_use ids seen so far, with their tools' names.
    let mut calls: HashMap<String, String> = HashMap::new();
    for (i, m) in list.iter().enumerate() {
        let param = format!("messages[{i}]");
        let o = m
            .as_object()
            .ok_or_else(|| ApiError::invalid(&param, format!("{param} must be an object")))?;
        if let Some(k) = o.keys().find(|k| !matches!(k.as_str(), "role" | "content")) {
            return Err(ApiError::invalid(
                &param,
                format!("{param}.{k} is not supported"),
            ));
        }
        let role = o.get("role").and_then(Value::as_str).unwrap_or("");
        if !matches!(role, "user" | "assistant") {
            return Err(ApiError::invalid(
                &param,
                format!(
                    "{param}.role {} is not one of \"user\", \"assistant\"",
                    quote(role)
                ),
            ));
        }
        let content = o
            .get("content")
            .ok_or_else(|| ApiError::invalid(&param, format!("{param}.content: Field required")))?;
        let cparam = format!("{param}.content");
        let mut text = String::new();
        let mut tool_calls = vec![];
        for (j, b) in blocks(content, &cparam)?.into_iter().enumerate() {
            let here = format!("{cparam}[{j}]");
            let kind = b.get("type").and_then(Value::as_str).unwrap_or("");
            let misplaced = || {
                ApiError::invalid(
                    &here,
                    format!("{here}: a {kind} block is not allowed in a {role} turn"),
                )
            };
            let string = |key: &str| {
                b.get(key)
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .ok_or_else(|| {
                        ApiError::invalid(&here, format!("{here}.{key}: Field required (a string)"))
                    })
            };
            match kind {
                "text" => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
                "thinking" | "redacted_thinking" if role == "assistant" => {}
                "tool_use" if role == "assistant" => {
                    let id = string("id")?;
                    let name = string("name")?;
                    let input = b.get("input").cloned().unwrap_or(json!({}));
                    if !input.is_object() {
                        return Err(ApiError::invalid(
                            &here,
                            format!("{here}.input must be an object"),
                        ));
                    }
                    calls.insert(id.clone(), name.clone());
                    tool_calls.push(json!({"id": id, "type": "function",
                        "function": {"name": name, "arguments": input}}));
                }
                "tool_result" if role == "user" => {
                    let id = string("tool_use_id")?;
                    let Some(name) = calls.get(&id) else {
                        return Err(ApiError::invalid(
                            &here,
                            format!(
                                "{here}.tool_use_id {} matches no tool_use block of an earlier \
                                 assistant turn",
                                quote(&id)
                            ),
                        ));
                    };
                    let mut result = match b.get("content") {
                        None | Some(Value::Null) => String::new(),
                        Some(c) => text_of(c, &format!("{here}.content"))?,
                    };
                    match b.get("is_error") {
                        None | Some(Value::Null) | Some(Value::Bool(false)) => {}
                        Some(Value::Bool(true)) => result = format!("Error: {result}"),
                        Some(_) => {
                            return Err(ApiError::invalid(
                                &here,
                                format!("{here}.is_error must be a boolean"),
                            ))
                        }
                    }
                    let mut t = ChatMessage::new("tool", &result);
                    t.tool_call_id = Some(id);
                    t.name = Some(name.clone());
                    out.push(t);
                }
                _ => return Err(misplaced()),
            }
        }
        if role == "assistant" {
            if i + 1 == list.len() {
                return Err(ApiError::invalid(
                    &param,
                    format!(
                        "{param}: a final assistant turn (a prefill to continue) is not \
                         supported; end the conversation with a user turn"
                    ),
                ));
            }
            let mut a = ChatMessage::new("assistant", &text);
            if !tool_calls.is_empty() {
                a.tool_calls = Some(Value::Array(tool_calls));
            }
            out.push(a);
        } else if !text.is_empty() || !content.is_array() {
            out.push(ChatMessage::new("user", &text));
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
