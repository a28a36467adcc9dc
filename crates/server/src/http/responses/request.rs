//! A Responses request read field by field into a [`ChatTurn`]: every field is implemented,
//! taken as a hint, or refused with 400 naming it (docs/api-fields.md, "OpenAI Responses").
//! Input items become chat-template messages; tools, `tool_choice` and `text.format` become
//! their Chat Completions shapes and go through the same checks.

use serde_json::{json, Map, Value};
use tessera_tokenizer::ChatMessage;

use super::items::Conversation;
use super::store::ResponseStore;
use crate::api::{ApiError, CommonParams};
use crate::spec;
use crate::text::quote;
use crate::tools::ToolSpec;
use crate::turn::ChatTurn;

/// A request, read.
pub struct Request {
    pub turn: ChatTurn,
    /// The request's fields the response object echoes.
    pub echo: Map<String, Value>,
    /// The conversation so far as input items: the previous response's, then this input.
    pub items: Vec<Value>,
    pub store: bool,
    pub stream: bool,
}

/// Fields accepted as hints: they change nothing in the output.
const HINTS: &[&str] = &[
    "metadata",
    "user",
    "service_tier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "prompt_cache_options",
    "safety_identifier",
    "prediction",
    "stream_options",
];

/// Fields of OpenAI's API this server does not serve.
const REFUSED: &[(&str, &str)] = &[
    (
        "conversation",
        "the Conversations API is not served: use previous_response_id",
    ),
    (
        "prompt",
        "stored prompt templates are not served: send input",
    ),
    (
        "context_management",
        "context management (compaction) is not supported",
    ),
    (
        "background_options",
        "background responses are not supported",
    ),
    ("access_programs", "is not supported"),
    ("image", "image generation is not supported"),
    ("moderation", "moderation is not supported"),
];

fn bad(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::invalid(param, message)
}

fn string_of<'a>(v: &'a Value, param: &str) -> Result<&'a str, ApiError> {
    v.as_str()
        .ok_or_else(|| bad(param, format!("{param} must be a string")))
}

/// Reads `body` against the stored responses.
pub fn read(
    body: Value,
    store: &ResponseStore,
    default_max_tokens: usize,
) -> Result<Request, ApiError> {
    let Value::Object(mut body) = body else {
        return Err(bad("body", "the request body must be a JSON object"));
    };
    // `null` means the default everywhere.
    body.retain(|_, v| !v.is_null());
    for (name, why) in REFUSED {
        if body.contains_key(*name) {
            return Err(bad(name, format!("{name}: {why}")));
        }
    }
    const KNOWN: &[&str] = &[
        "model",
        "input",
        "instructions",
        "max_output_tokens",
        "temperature",
        "top_p",
        "text",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "stream",
        "store",
        "previous_response_id",
        "reasoning",
        "truncation",
        "include",
        "background",
        "max_tool_calls",
        "top_logprobs",
        "chat_template_kwargs",
        "ignore_eos",
    ];
    if let Some(k) = body
        .keys()
        .find(|k| !KNOWN.contains(&k.as_str()) && !HINTS.contains(&k.as_str()))
    {
        return Err(bad(k, format!("unknown field {}", quote(k))));
    }
    let flag = |name: &str, default: bool| match body.get(name) {
        None => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(bad(name, format!("{name} must be a boolean"))),
    };
    let stream = flag("stream", false)?;
    let store_it = flag("store", true)?;
    if flag("background", false)? {
        return Err(bad("background", "background responses are not supported"));
    }
    let parallel = flag("parallel_tool_calls", true)?;
    if let Some(v) = body.get("max_tool_calls") {
        return Err(bad(
            "max_tool_calls",
            format!(
                "max_tool_calls ({v}) is not supported: use parallel_tool_calls false for one call"
            ),
        ));
    }
    if let Some(v) = body.get("top_logprobs") {
        if v.as_i64() != Some(0) {
            return Err(bad(
                "top_logprobs",
                "top_logprobs is not supported (only 0)",
            ));
        }
    }
    match body.get("truncation").map(|v| string_of(v, "truncation")) {
        None => {}
        Some(Ok("disabled")) => {}
        Some(Ok(t)) => {
            return Err(bad(
                "truncation",
                format!(
                    "truncation {} is not supported: only \"disabled\" (an input over the \
                     context is refused)",
                    quote(t)
                ),
            ))
        }
        Some(Err(e)) => return Err(e),
    }
    if let Some(inc) = body.get("include") {
        let list = inc
            .as_array()
            .ok_or_else(|| bad("include", "include must be a list"))?;
        for v in list {
            let s = string_of(v, "include")?;
            // Reasoning is given in plain text: its encrypted form is not needed to send it back.
            if s != "reasoning.encrypted_content" {
                return Err(bad(
                    "include",
                    format!("include {} is not supported", quote(s)),
                ));
            }
        }
    }
    if let Some(m) = body.get("metadata") {
        if m.as_object().is_none_or(|m| m.len() > 16) {
            return Err(bad(
                "metadata",
                "metadata must be an object of at most 16 keys",
            ));
        }
    }
    let model = match body.get("model") {
        None => None,
        Some(v) => Some(string_of(v, "model")?.to_string()),
    };

    // The text format, as Chat's response_format.
    let mut text_echo = json!({"format": {"type": "text"}});
    let mut response_format = Value::Null;
    if let Some(text) = body.get("text") {
        let t = text
            .as_object()
            .ok_or_else(|| bad("text", "text must be an object"))?;
        for (k, v) in t {
            match k.as_str() {
                "format" => {
                    response_format = format_of(v)?;
                    text_echo["format"] = v.clone();
                }
                "verbosity" => text_echo["verbosity"] = v.clone(),
                _ => return Err(bad(&format!("text.{k}"), format!("unknown field text.{k}"))),
            }
        }
    }

    // Tools.
    let tools_echo = body.get("tools").cloned().unwrap_or(json!([]));
    let chat_tools = body.get("tools").map(tools_of).transpose()?;
    let tool_choice = body.get("tool_choice").map(tool_choice_of).transpose()?;
    let tools = ToolSpec::parse(chat_tools.as_ref(), tool_choice.as_ref(), Some(parallel))?;

    // Template kwargs: the extension's, and reasoning.effort as `reasoning_effort`.
    let mut kwargs = match body.get("chat_template_kwargs") {
        None => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => {
            return Err(bad(
                "chat_template_kwargs",
                "chat_template_kwargs must be an object",
            ))
        }
    };
    let mut reasoning_echo = json!({"effort": null, "summary": null});
    if let Some(r) = body.get("reasoning") {
        let r = r
            .as_object()
            .ok_or_else(|| bad("reasoning", "reasoning must be an object"))?;
        for (k, v) in r {
            match k.as_str() {
                "effort" => {
                    let e = string_of(v, "reasoning.effort")?;
                    if !["none", "minimal", "low", "medium", "high", "xhigh"].contains(&e) {
                        return Err(bad(
                            "reasoning.effort",
                            format!("unknown reasoning effort {}", quote(e)),
                        ));
                    }
                    kwargs.entry("reasoning_effort").or_insert_with(|| json!(e));
                    reasoning_echo["effort"] = v.clone();
                }
                "summary" | "generate_summary" => reasoning_echo["summary"] = v.clone(),
                _ => {
                    return Err(bad(
                        &format!("reasoning.{k}"),
                        format!("unknown field reasoning.{k}"),
                    ))
                }
            }
        }
    }

    // Sampling through the shared validation.
    if body.get("ignore_eos").is_some_and(|v| !v.is_boolean()) {
        return Err(bad("ignore_eos", "ignore_eos must be a boolean"));
    }
    for k in ["max_output_tokens", "temperature", "top_p"] {
        match body.get(k) {
            Some(v) if k == "max_output_tokens" && !(v.is_i64() || v.is_u64()) => {
                return Err(bad(k, format!("{k} must be an integer")))
            }
            Some(v) if !v.is_number() => return Err(bad(k, format!("{k} must be a number"))),
            _ => {}
        }
    }
    let common: CommonParams = serde_json::from_value(json!({
        "model": model,
        "max_tokens": body.get("max_output_tokens"),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "stream": stream,
        "response_format": response_format,
        "ignore_eos": body.get("ignore_eos"),
    }))
    .map_err(|e| {
        let field = ["max_output_tokens", "temperature", "top_p"]
            .into_iter()
            .find(|f| {
                e.to_string()
                    .contains(&f.replace("max_output_tokens", "max_tokens"))
            })
            .unwrap_or("body");
        bad(field, format!("{field}: {e}"))
    })?;
    let spec = spec::validate(&common, None, default_max_tokens).map_err(|mut e| {
        e.param = e.param.map(|p| match p.as_str() {
            "max_tokens" => "max_output_tokens".into(),
            "response_format" => "text.format".into(),
            _ => p,
        });
        e
    })?;

    // The conversation.
    let mut conv = Conversation::default();
    let mut items = vec![];
    if let Some(v) = body.get("previous_response_id") {
        let id = string_of(v, "previous_response_id")?;
        let prev = store.get(id).ok_or_else(|| ApiError {
            status: 404,
            message: format!("previous response {} not found", quote(id)),
            param: Some("previous_response_id".into()),
            kind: "invalid_request_error",
            code: None,
        })?;
        for (i, item) in prev.items.iter().enumerate() {
            conv.push(item, &format!("previous_response_id (item {i})"))?;
        }
        items.extend(prev.items.iter().cloned());
    }
    let input = match body.get("input") {
        None => vec![],
        Some(Value::String(s)) => vec![json!({"type": "message", "role": "user", "content": s})],
        Some(Value::Array(list)) => list.clone(),
        Some(_) => return Err(bad("input", "input must be a string or a list of items")),
    };
    for (i, item) in input.iter().enumerate() {
        conv.push(item, &format!("input[{i}]"))?;
    }
    items.extend(input);
    let mut messages = vec![];
    if let Some(v) = body.get("instructions") {
        messages.push(ChatMessage::new("system", string_of(v, "instructions")?));
    }
    messages.extend(conv.messages);
    if messages.is_empty() {
        return Err(bad("input", "input must not be empty"));
    }

    let mut echo = Map::new();
    for k in [
        "instructions",
        "max_output_tokens",
        "previous_response_id",
        "user",
        "service_tier",
        "prompt_cache_key",
        "safety_identifier",
    ] {
        echo.insert(k.into(), body.get(k).cloned().unwrap_or(Value::Null));
    }
    echo.insert(
        "metadata".into(),
        body.get("metadata").cloned().unwrap_or(json!({})),
    );
    for (k, v) in [
        ("temperature", spec.base.params.temperature),
        ("top_p", spec.base.params.top_p),
    ] {
        echo.insert(k.into(), body.get(k).cloned().unwrap_or(json!(v as f64)));
    }
    echo.insert("text".into(), text_echo);
    echo.insert("tools".into(), tools_echo);
    echo.insert(
        "tool_choice".into(),
        body.get("tool_choice").cloned().unwrap_or(json!("auto")),
    );
    echo.insert("parallel_tool_calls".into(), json!(parallel));
    echo.insert("reasoning".into(), reasoning_echo);
    echo.insert("store".into(), json!(store_it));
    echo.insert("truncation".into(), json!("disabled"));
    echo.insert("background".into(), json!(false));
    echo.insert("max_tool_calls".into(), Value::Null);
    echo.insert("top_logprobs".into(), json!(0));

    Ok(Request {
        turn: ChatTurn {
            model,
            messages,
            messages_param: "input",
            tools,
            tools_param: "tools",
            template_kwargs: kwargs,
            spec,
        },
        echo,
        items,
        store: store_it,
        stream,
    })
}

/// `text.format` as Chat's `response_format`.
fn format_of(f: &Value) -> Result<Value, ApiError> {
    let p = "text.format";
    let o = f
        .as_object()
        .ok_or_else(|| bad(p, "text.format must be an object"))?;
    let ty = o.get("type").and_then(Value::as_str).unwrap_or("");
    let allowed: &[&str] = match ty {
        "text" | "json_object" => &["type"],
        "json_schema" => &["type", "name", "schema", "strict", "description"],
        _ => {
            return Err(bad(
                "text.format.type",
                format!(
                    "text.format type {} is not supported (text, json_object, json_schema)",
                    quote(ty)
                ),
            ))
        }
    };
    if let Some(k) = o.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(bad(
            &format!("text.format.{k}"),
            format!("unknown field text.format.{k}"),
        ));
    }
    if ty != "json_schema" {
        return Ok(json!({"type": ty}));
    }
    if !o.get("schema").is_some_and(Value::is_object) {
        return Err(bad(
            "text.format.schema",
            "a json_schema format needs a schema object",
        ));
    }
    let mut js = o.clone();
    js.remove("type");
    Ok(json!({"type": "json_schema", "json_schema": js}))
}

/// Responses' flat function tools as Chat's `{"type": "function", "function": {...}}`.
fn tools_of(tools: &Value) -> Result<Value, ApiError> {
    let list = tools
        .as_array()
        .ok_or_else(|| bad("tools", "tools must be a list"))?;
    let mut out = vec![];
    for (i, t) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        let o = t
            .as_object()
            .ok_or_else(|| bad(&at, format!("{at} must be an object")))?;
        let ty = o.get("type").and_then(Value::as_str).unwrap_or("");
        if ty != "function" {
            return Err(bad(
                &format!("{at}.type"),
                format!(
                    "tool type {} is not supported: only function tools are",
                    quote(ty)
                ),
            ));
        }
        let mut f = Map::new();
        for (k, v) in o {
            match k.as_str() {
                "type" => {}
                "name" | "description" | "parameters" | "strict" => {
                    f.insert(k.clone(), v.clone());
                }
                _ => return Err(bad(&format!("{at}.{k}"), format!("unknown field {at}.{k}"))),
            }
        }
        if !f.contains_key("name") {
            return Err(bad(&format!("{at}.name"), format!("{at} needs a name")));
        }
        out.push(json!({"type": "function", "function": f}));
    }
    Ok(Value::Array(out))
}

/// Responses' `tool_choice` in Chat's shape.
fn tool_choice_of(c: &Value) -> Result<Value, ApiError> {
    match c {
        Value::String(_) => Ok(c.clone()),
        Value::Object(o) => match o.get("type").and_then(Value::as_str) {
            Some("function") => {
                let name = o.get("name").and_then(Value::as_str).ok_or_else(|| {
                    bad("tool_choice.name", "a function tool_choice needs a name")
                })?;
                Ok(json!({"type": "function", "function": {"name": name}}))
            }
            other => Err(bad(
                "tool_choice",
                format!(
                    "tool_choice type {} is not supported (auto, none, required, or a function)",
                    quote(other.unwrap_or(""))
                ),
            )),
        },
        _ => Err(bad(
            "tool_choice",
            "tool_choice must be a string or an object",
        )),
    }
}
