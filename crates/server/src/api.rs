//! The OpenAI wire format: request bodies for `/v1/completions` and `/v1/chat/completions`
//! (validated into a generation spec by [`crate::spec`]), errors, and the response and
//! stream-chunk bodies. Extensions beyond OpenAI's schema: `top_k`, `min_p`,
//! `repetition_penalty`, `ignore_eos` and `priority` (lower runs first; default 0).
//!
//! As in OpenAI's API, `null` is accepted for every optional field and means its default.

use serde::{Deserialize, Deserializer};
use serde_json::{json, Value};
use tessera_engine::ParamError;
pub use tessera_engine::{FinishReason, TokenLogprob};

use crate::text::quote;

/// A request's problem, reported as HTTP 400 naming the field.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub param: Option<String>,
    pub kind: &'static str,
    /// OpenAI's machine-readable `code` (e.g. `context_length_exceeded`); `null` if none.
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            status: 400,
            message: message.into(),
            param: Some(param.to_string()),
            kind: "invalid_request_error",
            code: None,
        }
    }
    pub fn new(status: u16, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            param: None,
            kind,
            code: None,
        }
    }
    /// The same error with OpenAI's `code`.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }
    /// The JSON error body; the message made safe to print.
    pub fn body(&self) -> Value {
        json!({"error": {"message": crate::text::safe_message(&self.message), "type": self.kind,
            "param": self.param, "code": self.code}})
    }
}

impl From<ParamError> for ApiError {
    fn from(e: ParamError) -> Self {
        ApiError::invalid(e.param, e.message)
    }
}

/// A field where `null` means the same as leaving it out: the type's default.
fn null_is_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// `stop`: a string or a list of strings.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

/// `prompt`: a string, a list of strings, token ids, or a list of token-id lists.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

impl PromptField {
    /// How many prompts (each runs `n` sequences).
    pub fn count(&self) -> usize {
        match self {
            PromptField::Text(_) | PromptField::Tokens(_) => 1,
            PromptField::Texts(v) => v.len(),
            PromptField::TokenLists(v) => v.len(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Default)]
pub struct StreamOptions {
    #[serde(default, deserialize_with = "null_is_default")]
    pub include_usage: bool,
}

/// Fields shared by both endpoints.
#[derive(Debug, Clone, Deserialize)]
pub struct CommonParams {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub stop: Option<StopField>,
    pub seed: Option<i64>,
    pub n: Option<i64>,
    #[serde(default, deserialize_with = "null_is_default")]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub priority: Option<i64>,
    #[serde(default, deserialize_with = "null_is_default")]
    pub ignore_eos: bool,
    /// OpenAI's `{"type": "text" | "json_object" | "json_schema", "json_schema": {...}}`.
    pub response_format: Option<serde_json::Value>,
    /// vLLM's names for the other constraints: a JSON schema, a regex, a choice of strings,
    /// a grammar (Lark, llguidance's dialect).
    pub guided_json: Option<serde_json::Value>,
    pub guided_regex: Option<String>,
    pub guided_choice: Option<Vec<String>>,
    pub guided_grammar: Option<String>,
    /// Most drafted tokens verified per step for this request when the server speculates
    /// (0: none; absent: the server's `--spec-tokens`).
    pub spec_tokens: Option<i64>,
    /// OpenAI's `logit_bias`: token id (a string) -> bias in [-100, 100], at most 300.
    pub logit_bias: Option<serde_json::Map<String, Value>>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub prompt: PromptField,
    /// Number of top alternatives per token (0..=20), as in OpenAI's legacy API.
    pub logprobs: Option<i64>,
    #[serde(default, deserialize_with = "null_is_default")]
    pub echo: bool,
    #[serde(flatten)]
    pub common: CommonParams,
    /// Every other field, refused unless it is a pure hint ([`check_extra`]).
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: Option<MessageContent>,
    /// An assistant turn's calls: `[{"id", "type": "function", "function": {"name",
    /// "arguments": "<JSON text>"}}]`.
    pub tool_calls: Option<Value>,
    /// A `tool` turn's answer to this call.
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    #[serde(default, deserialize_with = "null_is_default")]
    pub logprobs: bool,
    pub top_logprobs: Option<i64>,
    /// Functions the model may call, `tool_choice` and `parallel_tool_calls` as OpenAI has
    /// them ([`crate::tools`]).
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    /// Extra variables for the chat template (vLLM's name), e.g. `{"enable_thinking": false}`.
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    #[serde(flatten)]
    pub common: CommonParams,
    /// Every other field, refused unless it is a pure hint ([`check_extra`]).
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

/// Fields OpenAI's endpoints take that change nothing in the output here: accepted and
/// not acted on (bookkeeping, caching and routing hints).
pub const HINTS: &[&str] = &[
    "user",
    "metadata",
    "service_tier",
    "store",
    "prompt_cache_key",
    "prompt_cache_retention",
    "prediction",
    "safety_identifier",
];

/// Refuses the fields no handler took, naming them, except the pure hints, fields sent as
/// `null` (which means the default, as everywhere), for chat `modalities: ["text"]` (text
/// is the only output), and for completions `best_of: 1`.
pub fn check_extra(extra: &serde_json::Map<String, Value>, chat: bool) -> Result<(), ApiError> {
    let mut unknown = vec![];
    for (k, v) in extra {
        if HINTS.contains(&k.as_str()) || v.is_null() {
            continue;
        }
        match k.as_str() {
            "modalities" if chat => {
                let text_only = v
                    .as_array()
                    .is_some_and(|a| a.iter().all(|m| m.as_str() == Some("text")));
                if !text_only {
                    return Err(ApiError::invalid(
                        "modalities",
                        "only text output is supported (modalities must be [\"text\"])",
                    ));
                }
            }
            "audio" if chat => {
                return Err(ApiError::invalid("audio", "audio output is not supported"));
            }
            "best_of" if !chat && v.as_i64() == Some(1) => {}
            _ => unknown.push(k.as_str()),
        }
    }
    if let Some(first) = unknown.first() {
        return Err(ApiError::invalid(
            first,
            format!(
                "unsupported field{} {}",
                if unknown.len() > 1 { "s" } else { "" },
                unknown
                    .iter()
                    .map(|k| quote(k))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    Ok(())
}
/// The text of a chat message's content.
pub fn message_text(m: &Message) -> Result<String, ApiError> {
    match &m.content {
        None => Ok(String::new()),
        Some(MessageContent::Text(s)) => Ok(s.clone()),
        Some(MessageContent::Parts(parts)) => {
            let mut s = String::new();
            for p in parts {
                if p.kind != "text" {
                    return Err(ApiError::invalid(
                        "messages",
                        format!("content part type {} is not supported", quote(&p.kind)),
                    ));
                }
                s.push_str(p.text.as_deref().unwrap_or(""));
            }
            Ok(s)
        }
    }
}

/// A message as the chat template gets it: an assistant turn's call arguments parsed from
/// their JSON text into objects, as Hugging Face templates expect them (a text that is not
/// JSON is passed as it is).
pub fn template_message(m: &Message) -> Result<tessera_tokenizer::ChatMessage, ApiError> {
    let mut out = tessera_tokenizer::ChatMessage::new(&m.role, &message_text(m)?);
    if let Some(calls) = &m.tool_calls {
        let Value::Array(list) = calls else {
            return Err(ApiError::invalid("messages", "tool_calls must be a list"));
        };
        let mut calls = list.clone();
        for c in &mut calls {
            let f = c
                .get_mut("function")
                .filter(|f| f.is_object())
                .ok_or_else(|| {
                    ApiError::invalid(
                        "messages",
                        "each of tool_calls needs a \"function\" object with a name and arguments",
                    )
                })?;
            if let Some(Value::String(text)) = f.get("arguments") {
                if let Ok(v) = serde_json::from_str::<Value>(text) {
                    f["arguments"] = v;
                }
            }
        }
        out.tool_calls = Some(Value::Array(calls));
    }
    out.tool_call_id = m.tool_call_id.clone();
    out.name = m.name.clone();
    Ok(out)
}

/// The `usage` object; `cached` prompt tokens were served by the prefix cache.
pub fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached}})
}

/// Legacy completions logprobs object for a run of tokens.
pub fn completion_logprobs(lps: &[TokenLogprob], text_offset0: usize) -> Value {
    let mut offset = text_offset0;
    let mut offsets = vec![];
    for l in lps {
        offsets.push(offset);
        offset += l.token.len();
    }
    json!({
        "tokens": lps.iter().map(|l| l.token.clone()).collect::<Vec<_>>(),
        "token_logprobs": lps.iter().map(|l| l.logprob).collect::<Vec<_>>(),
        "top_logprobs": lps.iter().map(|l| l.top.iter().map(|(t, p)| (t.clone(), json!(p))).collect::<serde_json::Map<_, _>>()).collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}

/// Chat logprobs object for a run of tokens.
pub fn chat_logprobs(lps: &[TokenLogprob]) -> Value {
    json!({"content": lps.iter().map(|l| json!({
        "token": l.token, "logprob": l.logprob, "bytes": l.token.as_bytes(),
        "top_logprobs": l.top.iter().map(|(t, p)| json!({"token": t, "logprob": p, "bytes": t.as_bytes()})).collect::<Vec<_>>(),
    })).collect::<Vec<_>>()})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::validate;

    #[test]
    fn parses_prompt_and_stop_shapes() {
        let r: CompletionRequest =
            serde_json::from_value(json!({"prompt": "hi", "stop": "\n", "max_tokens": 3})).unwrap();
        assert!(matches!(r.prompt, PromptField::Text(_)));
        assert_eq!(validate(&r.common, None, 16).unwrap().base.stop, vec!["\n"]);
        let r: CompletionRequest = serde_json::from_value(json!({"prompt": [1, 2, 3]})).unwrap();
        assert!(matches!(r.prompt, PromptField::Tokens(_)));
        let r: CompletionRequest =
            serde_json::from_value(json!({"prompt": [[1, 2], [3]]})).unwrap();
        assert_eq!(r.prompt.count(), 2);
        let c: ChatRequest = serde_json::from_value(json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]})).unwrap();
        assert_eq!(message_text(&c.messages[0]).unwrap(), "ab");
    }

    #[test]
    fn unknown_fields_are_refused_by_name_and_hints_pass() {
        let c: ChatRequest = serde_json::from_value(json!({"messages": [], "max_tokens": 3,
            "user": "u", "metadata": {"a": "b"}, "modalities": ["text"], "frobnicate": 1}))
        .unwrap();
        assert_eq!(c.common.max_tokens, Some(3));
        let e = check_extra(&c.extra, true).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("frobnicate"));
        let c: ChatRequest =
            serde_json::from_value(json!({"messages": [], "modalities": ["text", "audio"]}))
                .unwrap();
        assert_eq!(
            check_extra(&c.extra, true).unwrap_err().param.as_deref(),
            Some("modalities")
        );
        let r: CompletionRequest =
            serde_json::from_value(json!({"prompt": "x", "user": "u", "suffix": "y"})).unwrap();
        assert_eq!(
            check_extra(&r.extra, false).unwrap_err().param.as_deref(),
            Some("suffix")
        );
    }
}
