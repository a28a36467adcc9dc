//! From a parsed request to what the engine runs: [`validate`] checks the fields both
//! endpoints share and builds a [`GenSpec`] (one choice's engine request, `n`, streaming).
//! The ranges and their messages are the engine's ([`tessera_engine::params`], through
//! [`GenerateRequest::validate`]), the very check `tessera generate` runs, so the CLI and
//! the server accept and refuse the same values.

use serde_json::Value;
use tessera_engine::constrain::ConstraintSpec;
use tessera_engine::params::{self, IntRange};
use tessera_engine::{GenerateRequest, SamplingParams};

use crate::api::{ApiError, ChatRequest, CommonParams, StopField};

/// A validated generation request: the engine request of one choice (without its prompt)
/// and how many choices of each prompt to run and how to answer.
#[derive(Debug, Clone)]
pub struct GenSpec {
    pub base: GenerateRequest,
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
}

impl GenSpec {
    /// Top alternatives to report per token, if logprobs were asked for.
    pub fn logprobs(&self) -> Option<usize> {
        self.base.logprobs
    }

    /// The engine request for one choice over `prompt`; `seed_offset` keeps the `n` choices
    /// of one request from sampling identically under a seed.
    pub fn request(&self, prompt: Vec<u32>, seed_offset: u64) -> GenerateRequest {
        let mut req = self.base.clone();
        req.prompt_ids = prompt;
        req.params.seed = req.params.seed.map(|s| s.wrapping_add(seed_offset));
        req
    }
}

/// Choices per prompt (`n`).
pub const CHOICES: IntRange = IntRange {
    param: "n",
    min: 1,
    max: 16,
};

/// A number of top logprobs, in range, under the endpoint's name for it.
pub struct LogprobsAsked {
    pub count: i64,
    pub param: &'static str,
}

/// Validates the shared fields; `logprobs` is the endpoint's top-logprobs count. The
/// ranges and messages are [`GenerateRequest::validate`]'s, the CLI's too.
pub fn validate(
    c: &CommonParams,
    logprobs: Option<LogprobsAsked>,
    default_max_tokens: usize,
) -> Result<GenSpec, ApiError> {
    // Integers are checked at their wire width before they are narrowed.
    let max_tokens = match (c.max_completion_tokens, c.max_tokens) {
        (Some(v), _) => params::MAX_TOKENS.named("max_completion_tokens").check(v)? as usize,
        (None, Some(v)) => params::MAX_TOKENS.check(v)? as usize,
        (None, None) => default_max_tokens,
    };
    let logprobs = match logprobs {
        None => None,
        Some(l) => Some(params::LOGPROBS.named(l.param).check(l.count)? as usize),
    };
    let priority = params::PRIORITY.check(c.priority.unwrap_or(0))? as i32;
    let n = CHOICES.check(c.n.unwrap_or(1))? as usize;
    let top_k = match c.top_k.unwrap_or(0) {
        -1 | 0 => 0,
        k if k > 0 => usize::try_from(k).unwrap_or(usize::MAX),
        k => {
            return Err(ApiError::invalid(
                "top_k",
                format!("top_k must be -1 or 0 (no limit) or positive (got {k})"),
            ))
        }
    };
    let stop = match &c.stop {
        None => vec![],
        Some(StopField::One(s)) => vec![s.clone()],
        Some(StopField::Many(v)) => v.clone(),
    };
    if c.stream_options.is_some() && !c.stream {
        return Err(ApiError::invalid(
            "stream_options",
            "stream_options is only allowed when stream is true",
        ));
    }
    let base = GenerateRequest {
        prompt_ids: vec![],
        max_tokens,
        params: SamplingParams {
            temperature: c.temperature.unwrap_or(1.0) as f32,
            top_k,
            top_p: c.top_p.unwrap_or(1.0) as f32,
            min_p: c.min_p.unwrap_or(0.0) as f32,
            repetition_penalty: c.repetition_penalty.unwrap_or(1.0) as f32,
            presence_penalty: c.presence_penalty.unwrap_or(0.0) as f32,
            frequency_penalty: c.frequency_penalty.unwrap_or(0.0) as f32,
            seed: c.seed.map(|s| s as u64),
        },
        stop,
        ignore_eos: c.ignore_eos,
        logprobs,
        priority,
        adapter: None,
        constraint: constraint(c)?,
        spec_tokens: match c.spec_tokens {
            None => None,
            Some(k) => Some(params::SPEC_TOKENS.check(k)? as usize),
        },
        logit_bias: logit_bias(c)?,
    };
    base.validate()?;
    Ok(GenSpec {
        base,
        n,
        stream: c.stream,
        include_usage: c.stream_options.as_ref().is_some_and(|o| o.include_usage),
    })
}

/// `logit_bias` as the engine takes it: each key a token id (its range against the
/// vocabulary is checked with the prompt), each value a number; the count and the values'
/// range are the engine's checks.
fn logit_bias(c: &CommonParams) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(map) = &c.logit_bias else {
        return Ok(vec![]);
    };
    let mut out = Vec::with_capacity(map.len());
    for (k, v) in map {
        let id: u32 = k.trim().parse().map_err(|_| {
            ApiError::invalid(
                "logit_bias",
                format!(
                    "logit_bias keys must be token ids (got {})",
                    crate::text::quote(k)
                ),
            )
        })?;
        let b = v.as_f64().ok_or_else(|| {
            ApiError::invalid(
                "logit_bias",
                format!("logit_bias values must be numbers (token {id})"),
            )
        })?;
        out.push((id, b as f32));
    }
    Ok(out)
}

/// The request's output constraint: `response_format` (OpenAI) or one of vLLM's
/// `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`; at most one.
fn constraint(c: &CommonParams) -> Result<Option<ConstraintSpec>, ApiError> {
    let mut found: Vec<(&str, ConstraintSpec)> = Vec::new();
    if let Some(rf) = &c.response_format {
        let kind = rf.get("type").and_then(Value::as_str).unwrap_or("");
        match kind {
            "text" => {}
            "json_object" => found.push(("response_format", ConstraintSpec::JsonObject)),
            "json_schema" => {
                let schema = rf
                    .get("json_schema")
                    .and_then(|j| j.get("schema"))
                    .cloned()
                    .ok_or_else(|| {
                        ApiError::invalid(
                            "response_format",
                            "json_schema needs json_schema.schema (the JSON schema)",
                        )
                    })?;
                found.push(("response_format", ConstraintSpec::JsonSchema(schema)));
            }
            other => {
                return Err(ApiError::invalid(
                    "response_format",
                    format!(
                        "response_format type {} is not supported (text, json_object, json_schema)",
                        tessera_core::untrusted::quote(other)
                    ),
                ))
            }
        }
    }
    if let Some(s) = &c.guided_json {
        found.push(("guided_json", ConstraintSpec::JsonSchema(s.clone())));
    }
    if let Some(r) = &c.guided_regex {
        found.push(("guided_regex", ConstraintSpec::Regex(r.clone())));
    }
    if let Some(ch) = &c.guided_choice {
        found.push(("guided_choice", ConstraintSpec::Choice(ch.clone())));
    }
    if let Some(g) = &c.guided_grammar {
        found.push(("guided_grammar", ConstraintSpec::Lark(g.clone())));
    }
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.pop().map(|f| f.1)),
        _ => Err(ApiError::invalid(
            found[1].0,
            format!(
                "{} and {} both constrain the output: give one",
                found[0].0, found[1].0
            ),
        )),
    }
}

/// The top-logprobs count a chat request asks for: `top_logprobs` (default 0) when
/// `logprobs` is true; `top_logprobs` without `logprobs: true` is refused, as OpenAI does.
pub fn chat_logprobs_asked(req: &ChatRequest) -> Result<Option<LogprobsAsked>, ApiError> {
    match (req.logprobs, req.top_logprobs) {
        (true, top) => Ok(Some(LogprobsAsked {
            count: top.unwrap_or(0),
            param: "top_logprobs",
        })),
        (false, None) => Ok(None),
        (false, Some(_)) => Err(ApiError::invalid(
            "top_logprobs",
            "top_logprobs requires logprobs to be true",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::CompletionRequest;
    use serde_json::{json, Value};

    fn common(v: Value) -> CommonParams {
        serde_json::from_value(v).unwrap()
    }

    fn asked(count: i64) -> Option<LogprobsAsked> {
        Some(LogprobsAsked {
            count,
            param: "logprobs",
        })
    }

    #[test]
    fn defaults_and_ranges() {
        let g = validate(&common(json!({})), None, 16).unwrap();
        assert_eq!(
            (g.base.max_tokens, g.n, g.base.params.temperature),
            (16, 1, 1.0)
        );
        for (body, field) in [
            (json!({"temperature": 3.0}), "temperature"),
            (json!({"top_p": 0.0}), "top_p"),
            (json!({"max_tokens": 0}), "max_tokens"),
            (json!({"max_tokens": 2_000_000}), "max_tokens"),
            (
                json!({"max_completion_tokens": -1}),
                "max_completion_tokens",
            ),
            (json!({"n": 0}), "n"),
            (json!({"top_k": -5}), "top_k"),
            (json!({"min_p": 1.5}), "min_p"),
            (json!({"presence_penalty": 3}), "presence_penalty"),
            (json!({"repetition_penalty": 0}), "repetition_penalty"),
            (json!({"stop": ["", "x"]}), "stop"),
            (json!({"priority": 5000}), "priority"),
            (
                json!({"stream_options": {"include_usage": true}}),
                "stream_options",
            ),
        ] {
            let e = validate(&common(body.clone()), None, 16).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(field), "{body}");
            assert_eq!(e.status, 400);
        }
        assert_eq!(
            validate(&common(json!({})), asked(25), 16)
                .unwrap_err()
                .param
                .as_deref(),
            Some("logprobs")
        );
    }

    /// Every limit an error quotes is the one enforced: the value just inside passes, the
    /// value just outside fails with a message naming both bounds.
    #[test]
    fn messages_quote_the_enforced_limits() {
        for (field, inside, outside, range) in [
            (
                "max_tokens",
                json!(1 << 20),
                json!((1 << 20) + 1),
                "between 1 and 1048576",
            ),
            ("max_tokens", json!(1), json!(0), "between 1 and 1048576"),
            ("temperature", json!(2.0), json!(2.01), "between 0 and 2"),
            (
                "top_p",
                json!(1.0),
                json!(1.01),
                "greater than 0 and at most 1",
            ),
            ("min_p", json!(1.0), json!(1.01), "between 0 and 1"),
            (
                "presence_penalty",
                json!(-2.0),
                json!(-2.01),
                "between -2 and 2",
            ),
            (
                "frequency_penalty",
                json!(2.0),
                json!(2.01),
                "between -2 and 2",
            ),
            (
                "repetition_penalty",
                json!(10.0),
                json!(10.5),
                "greater than 0 and at most 10",
            ),
            ("n", json!(16), json!(17), "between 1 and 16"),
            (
                "priority",
                json!(1000),
                json!(1001),
                "between -1000 and 1000",
            ),
        ] {
            assert!(
                validate(&common(json!({field: inside})), None, 16).is_ok(),
                "{field}"
            );
            let e = validate(&common(json!({field: outside})), None, 16).unwrap_err();
            assert!(e.message.contains(range), "{field}: {}", e.message);
        }
        assert!(validate(&common(json!({})), asked(20), 16).is_ok());
        let e = validate(&common(json!({})), asked(21), 16).unwrap_err();
        assert!(e.message.contains("between 0 and 20"), "{}", e.message);
        let e = validate(&common(json!({"stop": vec!["x"; 17]})), None, 16).unwrap_err();
        assert!(e.message.contains("at most 16"), "{}", e.message);
        assert!(validate(&common(json!({"stop": vec!["x"; 16]})), None, 16).is_ok());
    }

    /// `tessera generate` builds a [`GenerateRequest`] from its flags and the engine checks it
    /// with [`GenerateRequest::validate`]; the server must accept and refuse the same values.
    #[test]
    fn server_and_cli_accept_the_same_values() {
        let cli = |field: &str, v: &Value| {
            let mut r = GenerateRequest {
                prompt_ids: vec![1],
                max_tokens: 16,
                ..Default::default()
            };
            let f = v.as_f64().unwrap_or(0.0) as f32;
            match field {
                "temperature" => r.params.temperature = f,
                "top_p" => r.params.top_p = f,
                "min_p" => r.params.min_p = f,
                "repetition_penalty" => r.params.repetition_penalty = f,
                "presence_penalty" => r.params.presence_penalty = f,
                "frequency_penalty" => r.params.frequency_penalty = f,
                "max_tokens" => r.max_tokens = v.as_u64().unwrap() as usize,
                "stop" => r.stop = serde_json::from_value(v.clone()).unwrap(),
                _ => unreachable!(),
            }
            r.validate().is_ok()
        };
        let grid: [(&str, Vec<Value>); 8] = [
            (
                "temperature",
                vec![
                    json!(0),
                    json!(0.7),
                    json!(2),
                    json!(2.01),
                    json!(5),
                    json!(100),
                ],
            ),
            ("top_p", vec![json!(0), json!(0.01), json!(1), json!(1.01)]),
            ("min_p", vec![json!(-0.1), json!(0), json!(1), json!(1.1)]),
            (
                "repetition_penalty",
                vec![json!(0), json!(0.5), json!(10), json!(10.5), json!(50)],
            ),
            (
                "presence_penalty",
                vec![json!(-2.1), json!(-2), json!(2), json!(2.1)],
            ),
            (
                "frequency_penalty",
                vec![json!(-2.1), json!(-2), json!(2), json!(2.1)],
            ),
            (
                "max_tokens",
                vec![json!(0), json!(1), json!(1 << 20), json!((1 << 20) + 1)],
            ),
            (
                "stop",
                vec![
                    json!([""]),
                    json!(["x"]),
                    json!(vec!["x"; 16]),
                    json!(vec!["x"; 17]),
                ],
            ),
        ];
        for (field, values) in grid {
            for v in values {
                let server = validate(&common(json!({field: v.clone()})), None, 16).is_ok();
                assert_eq!(server, cli(field, &v), "{field} = {v}");
            }
        }
    }

    #[test]
    fn null_means_default_everywhere() {
        let nulls = json!({"prompt": "hi", "model": null, "max_tokens": null,
            "max_completion_tokens": null, "temperature": null, "top_p": null, "top_k": null,
            "min_p": null, "presence_penalty": null, "frequency_penalty": null,
            "repetition_penalty": null, "stop": null, "seed": null, "n": null, "stream": null,
            "stream_options": null, "priority": null, "ignore_eos": null, "echo": null,
            "logprobs": null, "user": null, "suffix": null, "best_of": null, "logit_bias": null});
        let r: CompletionRequest = serde_json::from_value(nulls).unwrap();
        let g = validate(&r.common, None, 16).unwrap();
        let d = validate(&common(json!({})), None, 16).unwrap();
        assert_eq!(format!("{g:?}"), format!("{d:?}"));
        assert!(!r.echo && r.logprobs.is_none());

        let c: ChatRequest = serde_json::from_value(json!({
            "messages": [{"role": "user", "content": null, "name": null}],
            "logprobs": null, "top_logprobs": null, "stream": true,
            "stream_options": {"include_usage": null}, "tools": null, "response_format": null}))
        .unwrap();
        assert!(chat_logprobs_asked(&c).unwrap().is_none());
        let g = validate(&c.common, None, 16).unwrap();
        assert!(g.stream && !g.include_usage);
    }

    #[test]
    fn top_logprobs_needs_logprobs() {
        let chat = |v: Value| -> ChatRequest { serde_json::from_value(v).unwrap() };
        let m = json!([{"role": "user", "content": "x"}]);
        for body in [
            json!({"messages": m, "top_logprobs": 2}),
            json!({"messages": m, "top_logprobs": 2, "logprobs": false}),
            json!({"messages": m, "top_logprobs": 0, "logprobs": null}),
        ] {
            let e = chat_logprobs_asked(&chat(body)).err().unwrap();
            assert_eq!(e.param.as_deref(), Some("top_logprobs"));
        }
        let l = chat_logprobs_asked(&chat(json!({"messages": m, "logprobs": true})))
            .unwrap()
            .unwrap();
        assert_eq!(l.count, 0);
        let l = chat_logprobs_asked(&chat(
            json!({"messages": m, "logprobs": true, "top_logprobs": 30}),
        ))
        .unwrap();
        let e = validate(&common(json!({})), l, 16).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("top_logprobs"));
    }
}
