//! `POST /v1/messages` and `POST /v1/messages/count_tokens`, the Anthropic Messages dialect:
//! the request read into a [`ChatTurn`] ([`request`]), the turn's answer written as a
//! `message` or as Anthropic's stream of named SSE events, and every error on these routes
//! (the body reader's, the API key's, the handler's) in Anthropic's shape ([`error_shape`]).

mod request;

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, StreamExt};
use serde_json::{json, Value};

use super::body::read_body;
use super::completions::{answer, sse};
use super::AppState;
use crate::api::{ApiError, FinishReason};
use crate::chat_output::{call_id, Part};
use crate::turn::{self, TurnEvent, TurnFinish};

/// Anthropic's name of an error of HTTP status `status`.
fn error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        s if (400..500).contains(&s) => "invalid_request_error",
        _ => "api_error",
    }
}

/// Anthropic's error body.
fn error_body(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": crate::text::safe_message(message)}})
}

/// Rewrites an error answer of these routes (OpenAI's `{"error": {"message", "param", ...}}`,
/// whoever made it: the API key's layer, the body reader, the handler) into Anthropic's
/// shape, with the same status; the field, if one is named, leads the message.
pub async fn error_shape(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 16)
        .await
        .unwrap_or_default();
    let old: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let mut message = old["error"]["message"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| {
            let text = String::from_utf8_lossy(&bytes).trim().to_string();
            if text.is_empty() {
                status.canonical_reason().unwrap_or("error").to_string()
            } else {
                text
            }
        });
    if let Some(p) = old["error"]["param"].as_str() {
        if !message.contains(p) {
            message = format!("{p}: {message}");
        }
    }
    let body = error_body(error_type(status.as_u16()), &message).to_string();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, Body::from(body))
}

/// The request body as JSON, under the server's limits.
async fn json_body(state: &AppState, req: Request) -> Result<Value, Response> {
    let bytes = read_body(req, state.max_body_bytes, state.body_timeout).await?;
    super::body::parse(&bytes).map_err(IntoResponse::into_response)
}

pub async fn messages(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let body = match json_body(&state, req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    answer(messages_inner(state, body).await)
}

pub async fn count_tokens(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let body = match json_body(&state, req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    answer(
        async {
            let asked = request::read(body, true, state.default_max_tokens)?;
            let n = turn::count_prompt(&state, asked.turn).await?;
            Ok(Json(json!({"input_tokens": n})).into_response())
        }
        .await,
    )
}

/// Anthropic's `stop_reason`.
fn stop_reason(f: TurnFinish) -> &'static str {
    if f.called {
        "tool_use"
    } else if f.reason == FinishReason::Length {
        "max_tokens"
    } else if f.stop_index.is_some() {
        "stop_sequence"
    } else {
        "end_turn"
    }
}

/// `stop_sequence`: the one of `stops` that ended the message, else null.
fn stop_sequence(f: TurnFinish, stops: &[String]) -> Value {
    match f.stop_index.and_then(|i| stops.get(i)) {
        Some(s) if !f.called => json!(s),
        _ => Value::Null,
    }
}

/// An id with Anthropic's prefix and a fresh unpredictable suffix.
fn fresh_id(prefix: &str) -> String {
    let id = call_id();
    format!("{prefix}{}", id.trim_start_matches("call_"))
}

/// A tool call id of ours (`call_...`) in Anthropic's form (`toolu_...`).
fn tool_id(id: &str) -> String {
    format!("toolu_{}", id.trim_start_matches("call_"))
}

async fn messages_inner(state: Arc<AppState>, body: Value) -> Result<Response, ApiError> {
    let asked = request::read(body, false, state.default_max_tokens)?;
    let stops = asked.turn.spec.base.stop.clone();
    let started = turn::start(&state, asked.turn).await?;
    let id = fresh_id("msg_");
    let model = started.model.clone();
    let input_tokens = started.prompt_tokens;
    if asked.stream {
        let start = json!({"type": "message_start", "message": {"id": id, "type": "message",
            "role": "assistant", "model": model, "content": [], "stop_reason": Value::Null,
            "stop_sequence": Value::Null,
            "usage": {"input_tokens": input_tokens, "output_tokens": 0}}});
        let mut blocks = Blocks {
            stops,
            ..Blocks::default()
        };
        let events = started.events(state.clone()).flat_map(move |ev| {
            let out = blocks.event(ev);
            stream::iter(out.into_iter().map(named).collect::<Vec<_>>())
        });
        let all = stream::iter([named(start)]).chain(events);
        return Ok(sse(all));
    }
    let (choices, usage) = started.collect(&state).await?;
    let c = choices
        .into_iter()
        .next()
        .ok_or_else(|| ApiError::new(500, "server_error", "the turn ended with no answer"))?;
    let mut content = vec![];
    if let Some(r) = c.parsed.reasoning.filter(|r| !r.is_empty()) {
        content.push(json!({"type": "thinking", "thinking": r, "signature": ""}));
    }
    if !c.parsed.content.trim().is_empty() {
        content.push(json!({"type": "text", "text": c.parsed.content}));
    }
    for call in &c.parsed.calls {
        content.push(
            json!({"type": "tool_use", "id": tool_id(&call.id), "name": call.name,
            "input": tool_input(&call.arguments)}),
        );
    }
    Ok(Json(
        json!({"id": id, "type": "message", "role": "assistant", "model": model,
        "content": content, "stop_reason": stop_reason(c.finish),
        "stop_sequence": stop_sequence(c.finish, &stops),
        "usage": {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens}}),
    )
    .into_response())
}

/// A call's arguments as the `input` object (text that is not a JSON object is wrapped, so
/// `input` is always an object as clients expect).
fn tool_input(args: &str) -> Value {
    match serde_json::from_str::<Value>(args) {
        Ok(v @ Value::Object(_)) => v,
        Ok(Value::Null) | Err(_) if args.trim().is_empty() => json!({}),
        _ => json!({"arguments": args}),
    }
}

/// An SSE event named after its JSON's `type`.
fn named(v: Value) -> Result<Event, Infallible> {
    let name = v["type"].as_str().unwrap_or("message").to_string();
    Ok(Event::default().event(name).data(v.to_string()))
}

/// The kind of the open content block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Thinking,
    Text,
    Tool,
}

/// The streaming state: which block is open, how many were opened, how the message ended.
#[derive(Default)]
struct Blocks {
    open: Option<Kind>,
    /// Blocks opened so far (the next one's index).
    count: usize,
    /// Whitespace content not yet sent: it opens no text block by itself.
    pending_space: String,
    stop: Option<&'static str>,
    /// The request's stop sequences, and the one that ended the message (or null).
    stops: Vec<String>,
    stop_sequence: Value,
    failed: bool,
}

impl Blocks {
    fn close(&mut self, out: &mut Vec<Value>) {
        if self.open.take().is_some() {
            out.push(json!({"type": "content_block_stop", "index": self.count - 1}));
        }
    }

    fn open(&mut self, kind: Kind, block: Value, out: &mut Vec<Value>) {
        self.close(out);
        out.push(
            json!({"type": "content_block_start", "index": self.count, "content_block": block}),
        );
        self.open = Some(kind);
        self.count += 1;
    }

    fn delta(&self, delta: Value) -> Value {
        json!({"type": "content_block_delta", "index": self.count - 1, "delta": delta})
    }

    fn part(&mut self, part: Part, out: &mut Vec<Value>) {
        match part {
            Part::Reasoning(t) => {
                if t.is_empty() {
                    return;
                }
                if self.open != Some(Kind::Thinking) {
                    self.open(
                        Kind::Thinking,
                        json!({"type": "thinking", "thinking": "", "signature": ""}),
                        out,
                    );
                }
                out.push(self.delta(json!({"type": "thinking_delta", "thinking": t})));
            }
            Part::Content(t) => {
                if self.open != Some(Kind::Text) {
                    if t.trim().is_empty() {
                        self.pending_space.push_str(&t);
                        return;
                    }
                    self.open(Kind::Text, json!({"type": "text", "text": ""}), out);
                }
                let text = std::mem::take(&mut self.pending_space) + &t;
                out.push(self.delta(json!({"type": "text_delta", "text": text})));
            }
            Part::CallStart { id, name, .. } => {
                self.pending_space.clear();
                self.open(
                    Kind::Tool,
                    json!({"type": "tool_use", "id": tool_id(&id), "name": name, "input": {}}),
                    out,
                );
            }
            Part::CallArgs { args, .. } => {
                if self.open == Some(Kind::Tool) && !args.is_empty() {
                    out.push(self.delta(json!({"type": "input_json_delta", "partial_json": args})));
                }
            }
        }
    }

    /// The stream events of one turn event.
    fn event(&mut self, ev: TurnEvent) -> Vec<Value> {
        let mut out = vec![];
        if self.failed {
            return out;
        }
        match ev {
            TurnEvent::Parts { parts, .. } => {
                for p in parts {
                    self.part(p, &mut out);
                }
            }
            TurnEvent::Finish { parts, finish, .. } => {
                for p in parts {
                    self.part(p, &mut out);
                }
                self.close(&mut out);
                self.stop = Some(stop_reason(finish));
                self.stop_sequence = stop_sequence(finish, &self.stops);
            }
            TurnEvent::Failed { message, .. } => {
                self.failed = true;
                out.push(error_body("api_error", &message));
            }
            TurnEvent::Usage(u) => {
                self.close(&mut out);
                out.push(json!({"type": "message_delta",
                    "delta": {"stop_reason": self.stop.unwrap_or("end_turn"), "stop_sequence": self.stop_sequence.clone()},
                    "usage": {"output_tokens": u.completion_tokens}}));
                out.push(json!({"type": "message_stop"}));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::turn::TurnUsage;

    #[test]
    fn blocks_open_and_close_as_the_kind_changes() {
        let mut b = Blocks::default();
        let mut out = vec![];
        for ev in [
            TurnEvent::Parts {
                choice: 0,
                parts: vec![
                    Part::Reasoning("hm".into()),
                    Part::Content("\n".into()),
                    Part::Content("Hi".into()),
                    Part::CallStart {
                        index: 0,
                        id: "call_ab".into(),
                        name: "w".into(),
                    },
                    Part::CallArgs {
                        index: 0,
                        args: "{\"c\":".into(),
                    },
                ],
                logprobs: vec![],
            },
            TurnEvent::Finish {
                choice: 0,
                parts: vec![Part::CallArgs {
                    index: 0,
                    args: "1}".into(),
                }],
                finish: TurnFinish {
                    reason: FinishReason::Stop,
                    called: true,
                    stop_index: None,
                },
            },
            TurnEvent::Usage(TurnUsage {
                prompt_tokens: 3,
                completion_tokens: 5,
                cached_tokens: 0,
            }),
        ] {
            out.extend(b.event(ev));
        }
        let kinds: Vec<String> = out
            .iter()
            .map(|v| {
                let d = v["delta"]["type"]
                    .as_str()
                    .or(v["content_block"]["type"].as_str());
                format!(
                    "{}{}",
                    v["type"].as_str().unwrap(),
                    d.map(|d| format!(":{d}")).unwrap_or_default()
                )
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "content_block_start:thinking",
                "content_block_delta:thinking_delta",
                "content_block_stop",
                "content_block_start:text",
                "content_block_delta:text_delta",
                "content_block_stop",
                "content_block_start:tool_use",
                "content_block_delta:input_json_delta",
                "content_block_delta:input_json_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(out[4]["delta"]["text"], "\nHi");
        assert_eq!(out[6]["content_block"]["id"], "toolu_ab");
        assert_eq!(out[10]["delta"]["stop_reason"], "tool_use");
        assert_eq!(out[10]["usage"]["output_tokens"], 5);
    }

    #[test]
    fn statuses_map_to_anthropic_types() {
        assert_eq!(error_type(400), "invalid_request_error");
        assert_eq!(error_type(401), "authentication_error");
        assert_eq!(error_type(404), "not_found_error");
        assert_eq!(error_type(503), "overloaded_error");
        assert_eq!(error_type(500), "api_error");
    }
}
