//! `POST /v1/chat/completions`, the OpenAI Chat Completions dialect: the request translated
//! into a [`ChatTurn`], the turn's events into `chat.completion` bodies and
//! `chat.completion.chunk` streams.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use serde_json::{json, Value};

use super::body::JsonBody;
use super::completions::{answer, sse};
use super::respond::{data_events, error_chunk, usage_chunk};
use super::{now, AppState};
use crate::api::{self, ApiError, ChatRequest};
use crate::chat_output::Part;
use crate::spec;
use crate::text::quote;
use crate::tools::ToolSpec;
use crate::turn::{self, ChatTurn, TurnEvent};

pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    JsonBody(req): JsonBody<ChatRequest>,
) -> Response {
    answer(chat_inner(state, req).await)
}

/// The request as a dialect-free turn.
fn to_turn(req: ChatRequest, default_max_tokens: usize) -> Result<ChatTurn, ApiError> {
    let spec = spec::validate(
        &req.common,
        spec::chat_logprobs_asked(&req)?,
        default_max_tokens,
    )?;
    api::check_extra(&req.extra, true)?;
    if req.messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    let tools = ToolSpec::parse(
        req.tools.as_ref(),
        req.tool_choice.as_ref(),
        req.parallel_tool_calls,
    )?;
    let mut messages = vec![];
    for m in &req.messages {
        if !matches!(
            m.role.as_str(),
            "system" | "user" | "assistant" | "tool" | "developer"
        ) {
            return Err(ApiError::invalid(
                "messages",
                format!("unknown role {}", quote(&m.role)),
            ));
        }
        messages.push(api::template_message(m)?);
    }
    Ok(ChatTurn {
        model: req.common.model.clone(),
        messages,
        messages_param: "messages",
        tools,
        tools_param: "tools",
        template_kwargs: req.chat_template_kwargs.clone().unwrap_or_default(),
        spec,
    })
}

async fn chat_inner(state: Arc<AppState>, req: ChatRequest) -> Result<Response, ApiError> {
    let turn = to_turn(req, state.default_max_tokens)?;
    let started = turn::start(&state, turn).await?;
    let id = format!("chatcmpl-{}", started.first_id);
    let model = started.model.clone();
    let spec = started.spec.clone();
    if spec.stream {
        let include_usage = spec.include_usage;
        // Logprobs not yet sent, per choice: a delta's ride on its first chunk.
        let mut pending: Vec<Vec<api::TokenLogprob>> = vec![Vec::new(); started.subs.len()];
        // Whether a choice has had its role-only first delta.
        let mut opened = vec![false; started.subs.len()];
        let stream = started.events(state.clone()).flat_map(move |ev| {
            let chunk = |index: usize, delta: Value, finish: Value| {
                json!({"id": id, "object": "chat.completion.chunk", "created": now(),
                    "model": model, "choices": [{"index": index, "delta": delta,
                    "logprobs": Value::Null, "finish_reason": finish}]})
            };
            let (index, parts, finish, logprobs) = match ev {
                TurnEvent::Parts {
                    choice,
                    parts,
                    logprobs,
                } => (choice, parts, None, logprobs),
                TurnEvent::Finish {
                    choice,
                    parts,
                    finish,
                } => (choice, parts, Some(finish.openai()), Vec::new()),
                TurnEvent::Failed { message, .. } => {
                    return data_events(vec![error_chunk(&message)]).boxed()
                }
                TurnEvent::Usage(u) => {
                    let mut out = vec![];
                    if include_usage {
                        out.push(usage_chunk(
                            &json!({"id": id, "object": "chat.completion.chunk", "model": model}),
                            api::usage(u.prompt_tokens, u.completion_tokens, u.cached_tokens),
                        ));
                    }
                    return data_events(out)
                        .chain(futures_util::stream::once(async {
                            Ok(axum::response::sse::Event::default().data("[DONE]"))
                        }))
                        .boxed();
                }
            };
            let mut out: Vec<Value> = parts
                .into_iter()
                .map(|part| chunk(index, delta_of(part), Value::Null))
                .collect();
            if let Some(f) = finish {
                out.push(chunk(index, json!({}), json!(f)));
            }
            pending[index].extend(logprobs);
            if !pending[index].is_empty() {
                if let Some(first) = out.first_mut() {
                    first["choices"][0]["logprobs"] =
                        api::chat_logprobs(&std::mem::take(&mut pending[index]));
                }
            }
            // As OpenAI streams it: first a delta with the role alone, once per choice.
            if !std::mem::replace(&mut opened[index], true) {
                out.insert(
                    0,
                    chunk(
                        index,
                        json!({"role": "assistant", "content": ""}),
                        Value::Null,
                    ),
                );
            }
            data_events(out).boxed()
        });
        return Ok(sse(stream));
    }
    let (choices, usage) = started.collect(&state).await?;
    let choices: Vec<Value> = choices
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let parsed = c.parsed;
            let mut message = json!({"role": "assistant", "content": parsed.content});
            if let Some(r) = parsed.reasoning {
                message["reasoning_content"] = json!(r);
            }
            if !parsed.calls.is_empty() {
                if parsed.content.trim().is_empty() {
                    message["content"] = Value::Null;
                }
                message["tool_calls"] = parsed
                    .calls
                    .iter()
                    .map(|call| {
                        json!({"id": call.id, "type": "function",
                            "function": {"name": call.name, "arguments": call.arguments}})
                    })
                    .collect();
            }
            json!({"index": i, "message": message,
                "logprobs": spec.logprobs().map(|_| api::chat_logprobs(&c.logprobs)),
                "finish_reason": c.finish.openai()})
        })
        .collect();
    Ok(Json(
        json!({"id": id, "object": "chat.completion", "created": now(), "model": model,
        "choices": choices,
        "usage": api::usage(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)}),
    )
    .into_response())
}

/// The `delta` of a streamed chat chunk carrying `part`, as OpenAI streams them (the role
/// only in each choice's first, role-only delta): a call's id, type and name first
/// (arguments empty), then its arguments in fragments.
fn delta_of(part: Part) -> Value {
    match part {
        Part::Content(t) => json!({"content": t}),
        Part::Reasoning(t) => json!({"reasoning_content": t}),
        Part::CallStart { index, id, name } => json!({"tool_calls": [
            {"index": index, "id": id, "type": "function",
             "function": {"name": name, "arguments": ""}}]}),
        Part::CallArgs { index, args } => {
            json!({"tool_calls": [{"index": index, "function": {"arguments": args}}]})
        }
    }
}
