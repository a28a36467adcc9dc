//! The OpenAI wire format: request bodies for `/v1/completions` and `/v1/chat/completions`,
//! their validation into a [`GenSpec`] (each invalid field is named), and the response and
//! stream-chunk bodies. Extensions beyond OpenAI's schema: `top_k`, `min_p`,
//! `repetition_penalty`, `ignore_eos` and `priority` (lower runs first; default 0).

use serde::Deserialize;
use serde_json::{json, Value};
pub use tessera_engine::{FinishReason, TokenLogprob};
use tessera_engine::{GenerateRequest, SamplingParams};

/// A request's problem, reported as HTTP 400 naming the field.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub param: Option<String>,
    pub kind: &'static str,
}

impl ApiError {
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            status: 400,
            message: message.into(),
            param: Some(param.to_string()),
            kind: "invalid_request_error",
        }
    }
    pub fn new(status: u16, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            param: None,
            kind,
        }
    }
    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": Value::Null}})
    }
}

/// `stop`: a string or a list of strings.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

/// `prompt`: a string, or a list holding one string, or token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
}

#[derive(Debug, Clone, Deserialize, Default)]
pub struct StreamOptions {
    #[serde(default)]
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
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub priority: Option<i64>,
    #[serde(default)]
    pub ignore_eos: bool,
}

#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub prompt: PromptField,
    /// Number of top alternatives per token (0..=20), as in OpenAI's legacy API.
    pub logprobs: Option<i64>,
    #[serde(default)]
    pub echo: bool,
    #[serde(flatten)]
    pub common: CommonParams,
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
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    #[serde(default)]
    pub logprobs: bool,
    pub top_logprobs: Option<i64>,
    #[serde(flatten)]
    pub common: CommonParams,
}

/// A validated generation request (one choice; `n` copies are made by the caller).
#[derive(Debug, Clone, PartialEq)]
pub struct GenSpec {
    pub max_tokens: usize,
    pub params: SamplingParams,
    pub stop: Vec<String>,
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    pub priority: i32,
    /// Top alternatives to report per token, if logprobs were asked for.
    pub logprobs: Option<usize>,
    pub ignore_eos: bool,
}

impl GenSpec {
    /// The engine request for one choice over `prompt`; `seed_offset` keeps the `n` choices
    /// of one request from sampling identically under a seed.
    pub fn request(&self, prompt: Vec<u32>, seed_offset: u64) -> GenerateRequest {
        let mut params = self.params.clone();
        params.seed = params.seed.map(|s| s.wrapping_add(seed_offset));
        GenerateRequest {
            prompt_ids: prompt,
            max_tokens: self.max_tokens,
            params,
            stop: self.stop.clone(),
            ignore_eos: self.ignore_eos,
            logprobs: self.logprobs,
            priority: self.priority,
            adapter: None,
        }
    }
}

fn finite(name: &str, v: f64) -> Result<f64, ApiError> {
    if v.is_finite() {
        Ok(v)
    } else {
        Err(ApiError::invalid(
            name,
            format!("{name} must be a finite number"),
        ))
    }
}

/// Validates the shared fields; `logprobs` is the endpoint's top-logprobs count.
pub fn validate(
    c: &CommonParams,
    logprobs: Option<i64>,
    default_max_tokens: usize,
) -> Result<GenSpec, ApiError> {
    let max_tokens = match c.max_completion_tokens.or(c.max_tokens) {
        None => default_max_tokens,
        Some(v) if v >= 1 && v <= 1 << 20 => v as usize,
        Some(v) => {
            return Err(ApiError::invalid(
                "max_tokens",
                format!("max_tokens must be at least 1 (got {v})"),
            ))
        }
    };
    let temperature = finite("temperature", c.temperature.unwrap_or(1.0))?;
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::invalid(
            "temperature",
            format!("temperature must be between 0 and 2 (got {temperature})"),
        ));
    }
    let top_p = finite("top_p", c.top_p.unwrap_or(1.0))?;
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid(
            "top_p",
            format!("top_p must be in (0, 1] (got {top_p})"),
        ));
    }
    let top_k = match c.top_k.unwrap_or(0) {
        -1 | 0 => 0,
        k if k > 0 => k as usize,
        k => {
            return Err(ApiError::invalid(
                "top_k",
                format!("top_k must be -1, 0 or positive (got {k})"),
            ))
        }
    };
    let min_p = finite("min_p", c.min_p.unwrap_or(0.0))?;
    if !(0.0..=1.0).contains(&min_p) {
        return Err(ApiError::invalid(
            "min_p",
            format!("min_p must be between 0 and 1 (got {min_p})"),
        ));
    }
    let pp = finite("presence_penalty", c.presence_penalty.unwrap_or(0.0))?;
    if !(-2.0..=2.0).contains(&pp) {
        return Err(ApiError::invalid(
            "presence_penalty",
            format!("presence_penalty must be between -2 and 2 (got {pp})"),
        ));
    }
    let fp = finite("frequency_penalty", c.frequency_penalty.unwrap_or(0.0))?;
    if !(-2.0..=2.0).contains(&fp) {
        return Err(ApiError::invalid(
            "frequency_penalty",
            format!("frequency_penalty must be between -2 and 2 (got {fp})"),
        ));
    }
    let rp = finite("repetition_penalty", c.repetition_penalty.unwrap_or(1.0))?;
    if !(rp > 0.0 && rp <= 10.0) {
        return Err(ApiError::invalid(
            "repetition_penalty",
            format!("repetition_penalty must be in (0, 10] (got {rp})"),
        ));
    }
    let stop = match &c.stop {
        None => vec![],
        Some(StopField::One(s)) => vec![s.clone()],
        Some(StopField::Many(v)) => v.clone(),
    };
    if stop.len() > 16 {
        return Err(ApiError::invalid("stop", "at most 16 stop strings"));
    }
    if stop.iter().any(|s| s.is_empty()) {
        return Err(ApiError::invalid("stop", "stop strings must not be empty"));
    }
    let n = match c.n.unwrap_or(1) {
        v if (1..=16).contains(&v) => v as usize,
        v => {
            return Err(ApiError::invalid(
                "n",
                format!("n must be between 1 and 16 (got {v})"),
            ))
        }
    };
    let logprobs = match logprobs {
        None => None,
        Some(v) if (0..=20).contains(&v) => Some(v as usize),
        Some(v) => {
            return Err(ApiError::invalid(
                "logprobs",
                format!("logprobs must be between 0 and 20 (got {v})"),
            ))
        }
    };
    let priority = match c.priority.unwrap_or(0) {
        p if (-1000..=1000).contains(&p) => p as i32,
        p => {
            return Err(ApiError::invalid(
                "priority",
                format!("priority must be between -1000 and 1000 (got {p})"),
            ))
        }
    };
    let seed = match c.seed {
        None => None,
        Some(s) => Some(s as u64),
    };
    Ok(GenSpec {
        max_tokens,
        params: SamplingParams {
            temperature: temperature as f32,
            top_k,
            top_p: top_p as f32,
            min_p: min_p as f32,
            repetition_penalty: rp as f32,
            presence_penalty: pp as f32,
            frequency_penalty: fp as f32,
            seed,
        },
        stop,
        n,
        stream: c.stream,
        include_usage: c.stream_options.as_ref().is_some_and(|o| o.include_usage),
        priority,
        logprobs,
        ignore_eos: c.ignore_eos,
    })
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
                        format!("content part type {:?} is not supported", p.kind),
                    ));
                }
                s.push_str(p.text.as_deref().unwrap_or(""));
            }
            Ok(s)
        }
    }
}

pub fn usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
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

    fn common(v: Value) -> CommonParams {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn defaults_and_ranges() {
        let g = validate(&common(json!({})), None, 16).unwrap();
        assert_eq!((g.max_tokens, g.n, g.params.temperature), (16, 1, 1.0));
        for (body, field) in [
            (json!({"temperature": 3.0}), "temperature"),
            (json!({"top_p": 0.0}), "top_p"),
            (json!({"max_tokens": 0}), "max_tokens"),
            (json!({"n": 0}), "n"),
            (json!({"top_k": -5}), "top_k"),
            (json!({"min_p": 1.5}), "min_p"),
            (json!({"presence_penalty": 3}), "presence_penalty"),
            (json!({"stop": ["", "x"]}), "stop"),
            (json!({"priority": 5000}), "priority"),
        ] {
            let e = validate(&common(body.clone()), None, 16).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(field), "{body}");
            assert_eq!(e.status, 400);
        }
        assert_eq!(
            validate(&common(json!({})), Some(25), 16)
                .unwrap_err()
                .param
                .as_deref(),
            Some("logprobs")
        );
    }

    #[test]
    fn parses_prompt_and_stop_shapes() {
        let r: CompletionRequest =
            serde_json::from_value(json!({"prompt": "hi", "stop": "\n", "max_tokens": 3})).unwrap();
        assert!(matches!(r.prompt, PromptField::Text(_)));
        assert_eq!(
            validate(&r.common, r.logprobs, 16).unwrap().stop,
            vec!["\n"]
        );
        let r: CompletionRequest = serde_json::from_value(json!({"prompt": [1, 2, 3]})).unwrap();
        assert!(matches!(r.prompt, PromptField::Tokens(_)));
        let c: ChatRequest = serde_json::from_value(json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]})).unwrap();
        assert_eq!(message_text(&c.messages[0]).unwrap(), "ab");
    }
}
