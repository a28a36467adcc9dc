//! `POST /v1/completions` and `POST /v1/chat/completions`. Each handler, in order: validates
//! the parameters (cheap, on the async worker); resolves the model or adapter; reserves the
//! request's sequences (`n` × prompts) at the admission gate (503 when full); tokenizes, and
//! for chat renders the template, on the tokenizer pool; checks the prompts against the
//! context and the KV cache; submits the sequences as one group (admitted whole or refused
//! whole); then answers, whole or streamed ([`super::respond`]).

use std::sync::Arc;

use axum::extract::State;
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tessera_engine::request::LoraAdapter;
use tessera_tokenizer::{ChatExtras, Tokenizer};

use super::body::JsonBody;
use super::lora::resolve_model;
use super::respond::{collect, sse_stream, StreamItem};
use super::{now, AppState};
use crate::admission::Reservation;
use crate::api::{self, ApiError, ChatRequest, CompletionRequest, FinishReason, PromptField};
use crate::chat_output::{ChoiceParser, Part};
use crate::engine_loop::Submission;
use crate::spec::{self, GenSpec, LogprobsAsked};
use crate::text::quote;
use crate::tools::ToolSpec;

fn answer(r: Result<Response, ApiError>) -> Response {
    r.unwrap_or_else(IntoResponse::into_response)
}

pub async fn completions(
    State(state): State<Arc<AppState>>,
    JsonBody(req): JsonBody<CompletionRequest>,
) -> Response {
    answer(completions_inner(state, req).await)
}

pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    JsonBody(req): JsonBody<ChatRequest>,
) -> Response {
    answer(chat_inner(state, req).await)
}

fn encode(tok: &Tokenizer, text: &str, param: &str) -> Result<Vec<u32>, ApiError> {
    tok.encode(text)
        .map_err(|e| ApiError::invalid(param, format!("cannot tokenize the prompt: {e}")))
}

/// The prompts' token ids; text is tokenized on the pool.
async fn prompt_ids(state: &AppState, prompt: PromptField) -> Result<Vec<Vec<u32>>, ApiError> {
    match prompt {
        PromptField::Tokens(ids) => Ok(vec![ids]),
        PromptField::TokenLists(lists) => Ok(lists),
        PromptField::Text(t) => {
            state
                .tokenizers
                .run(move |tok| Ok(vec![encode(tok, &t, "prompt")?]))
                .await
        }
        PromptField::Texts(ts) => {
            state
                .tokenizers
                .run(move |tok| ts.iter().map(|t| encode(tok, t, "prompt")).collect())
                .await
        }
    }
}

/// Refuses an empty prompt, one longer than the context or the KV cache takes, and token
/// ids outside the vocabulary; each message quotes the limit enforced.
fn check_prompt(state: &AppState, param: &str, ids: &[u32]) -> Result<(), ApiError> {
    if ids.is_empty() {
        return Err(ApiError::invalid(param, "the prompt is empty"));
    }
    let max = state.max_prompt_tokens();
    if ids.len() > max {
        let why = if max + 1 == state.max_model_len {
            format!(
                "this model's context holds {} tokens, at least one of them generated",
                state.max_model_len
            )
        } else {
            format!(
                "this server's KV cache holds {} positions",
                state.kv_positions
            )
        };
        return Err(ApiError::invalid(
            param,
            format!(
                "the prompt has {} tokens; at most {max} are accepted ({why})",
                ids.len()
            ),
        ));
    }
    let vocab = state.tokenizers.tokenizer().vocab_size();
    if let Some(&t) = ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid(
            param,
            format!(
                "token id {t} is outside the vocabulary (0 to {})",
                vocab - 1
            ),
        ));
    }
    Ok(())
}

/// Submits `n` choices for every prompt under `reservation`; choice index = prompt index · n + j.
async fn submit_all(
    state: &AppState,
    prompts: &[Vec<u32>],
    spec: &GenSpec,
    adapter: &Option<Arc<LoraAdapter>>,
    reservation: Reservation,
) -> Result<Vec<Submission>, ApiError> {
    let mut reqs = Vec::with_capacity(prompts.len() * spec.n);
    for ids in prompts {
        for j in 0..spec.n {
            let mut req = spec.request(ids.clone(), j as u64);
            req.adapter = adapter.clone();
            reqs.push(req);
        }
    }
    state.handle.submit(reqs, reservation).await
}

fn sse(
    stream: impl futures_util::Stream<Item = Result<axum::response::sse::Event, std::convert::Infallible>>
        + Send
        + 'static,
) -> Response {
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

async fn completions_inner(
    state: Arc<AppState>,
    req: CompletionRequest,
) -> Result<Response, ApiError> {
    if req.echo {
        return Err(ApiError::invalid("echo", "echo is not supported"));
    }
    let asked = req.logprobs.map(|count| LogprobsAsked {
        count,
        param: "logprobs",
    });
    let spec = spec::validate(&req.common, asked, state.default_max_tokens)?;
    if req.prompt.count() == 0 {
        return Err(ApiError::invalid("prompt", "the prompt list is empty"));
    }
    let (adapter, model) = resolve_model(&state, &req.common.model).await?;
    let reservation = state.handle.admission.reserve(spec.n, req.prompt.count())?;
    let prompts = prompt_ids(&state, req.prompt).await?;
    for p in &prompts {
        check_prompt(&state, "prompt", p)?;
    }
    let subs = submit_all(&state, &prompts, &spec, &adapter, reservation).await?;
    let id = format!("cmpl-{}", subs[0].id);
    let answer_model = model.clone();
    if spec.stream {
        let stream = sse_stream(
            state.clone(),
            subs,
            spec.n,
            spec.include_usage,
            move |index, ev| match ev {
                StreamItem::Delta { text, logprobs } => vec![
                    json!({"id": id, "object": "text_completion", "created": now(), "model": model,
                "choices": [{"index": index, "text": text, "logprobs": logprobs.map(|l| api::completion_logprobs(&l, 0)), "finish_reason": Value::Null}]}),
                ],
                StreamItem::Finish(reason) => vec![
                    json!({"id": id, "object": "text_completion", "created": now(), "model": model,
                "choices": [{"index": index, "text": "", "logprobs": Value::Null, "finish_reason": reason.as_str()}]}),
                ],
            },
            spec.logprobs().is_some(),
        );
        return Ok(sse(stream));
    }
    let mut choices = vec![];
    let (mut prompt_tokens, mut completion_tokens) = (0, 0);
    for (i, sub) in subs.into_iter().enumerate() {
        let c = collect(&state, sub).await?;
        if i % spec.n == 0 {
            prompt_tokens += c.prompt_tokens;
        }
        completion_tokens += c.completion_tokens;
        choices.push(json!({"index": i, "text": c.text,
            "logprobs": spec.logprobs().map(|_| api::completion_logprobs(&c.logprobs, 0)),
            "finish_reason": c.finish.map(|r| r.as_str())}));
    }
    Ok(Json(
        json!({"id": id, "object": "text_completion", "created": now(), "model": answer_model,
        "choices": choices, "usage": api::usage(prompt_tokens, completion_tokens)}),
    )
    .into_response())
}

async fn chat_inner(state: Arc<AppState>, req: ChatRequest) -> Result<Response, ApiError> {
    let mut spec = spec::validate(
        &req.common,
        spec::chat_logprobs_asked(&req)?,
        state.default_max_tokens,
    )?;
    if req.messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    let tools = ToolSpec::parse(
        req.tools.as_ref(),
        req.tool_choice.as_ref(),
        req.parallel_tool_calls,
    )?;
    // The tool definitions the answer is read against, when it is read for calls.
    let mut call_tools: Option<Arc<Vec<Value>>> = None;
    if let Some(t) = tools.as_ref().filter(|t| t.parses_calls()) {
        let tok = state.tokenizers.tokenizer();
        let format = state
            .output
            .tools
            .filter(|_| tok.chat_template_source().contains("tools"))
            .ok_or_else(|| {
                ApiError::invalid(
                    "tools",
                    "this model's chat template does not take tools (serve a model whose \
                     template does, or send tool_choice \"none\")",
                )
            })?;
        if let Some(c) = t.constraint(format, &|s| tok.added_token_id(s))? {
            if spec.base.constraint.is_some() {
                return Err(ApiError::invalid(
                    "tool_choice",
                    "a required or named tool_choice and response_format (or a guided_* \
                     field) both constrain the output: give one",
                ));
            }
            spec.base.constraint = Some(c);
        }
        call_tools = Some(Arc::new(t.tools.clone()));
    }
    let mut msgs = vec![];
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
        msgs.push(api::template_message(m)?);
    }
    let extras = ChatExtras {
        tools: tools.as_ref().and_then(ToolSpec::shown),
        kwargs: req.chat_template_kwargs.clone().unwrap_or_default(),
    };
    let (adapter, model) = resolve_model(&state, &req.common.model).await?;
    let reservation = state.handle.admission.reserve(spec.n, 1)?;
    let ids = state
        .tokenizers
        .run(move |tok| {
            // Message contents are text: special tokens in them are not parsed.
            tok.encode_chat_with(&msgs, true, &extras)
                .map_err(|e| match &e {
                    tessera_core::Error::ChatTemplate(t) if !t.is_client_error() => {
                        ApiError::new(500, "server_error", e.to_string())
                    }
                    _ => ApiError::invalid("messages", e.to_string()),
                })
        })
        .await?;
    check_prompt(&state, "messages", &ids)?;
    let subs = submit_all(&state, &[ids], &spec, &adapter, reservation).await?;
    let id = format!("chatcmpl-{}", subs[0].id);
    let answer_model = model.clone();
    let output = state.output.clone();
    let parser = move || ChoiceParser::new(&output, call_tools.as_deref().map(Vec::as_slice));
    if spec.stream {
        let mut choices: Vec<StreamedChoice> =
            (0..subs.len()).map(|_| Default::default()).collect();
        let with_logprobs = spec.logprobs().is_some();
        let stream = sse_stream(
            state.clone(),
            subs,
            spec.n,
            spec.include_usage,
            move |index, ev| {
                let chunk = |delta: Value, logprobs: Option<Value>, finish: Value| {
                    json!({"id": id, "object": "chat.completion.chunk", "created": now(),
                        "model": model, "choices": [{"index": index, "delta": delta,
                        "logprobs": logprobs, "finish_reason": finish}]})
                };
                let c = &mut choices[index];
                let p = c.parser.get_or_insert_with(&parser);
                let (parts, finish) = match ev {
                    StreamItem::Delta { text, logprobs } => {
                        c.logprobs.extend(logprobs.unwrap_or_default());
                        (p.push(&text), None)
                    }
                    StreamItem::Finish(reason) => {
                        let parts = p.finish();
                        let called = p.made_calls() && reason == FinishReason::Stop;
                        (
                            parts,
                            Some(if called {
                                "tool_calls"
                            } else {
                                reason.as_str()
                            }),
                        )
                    }
                };
                let mut out: Vec<Value> = parts
                    .into_iter()
                    .map(|part| chunk(delta_of(part), None, Value::Null))
                    .collect();
                if let Some(f) = finish {
                    out.push(chunk(json!({}), None, json!(f)));
                }
                // A delta's logprobs ride on its first chunk (or wait for the next one).
                if with_logprobs && !c.logprobs.is_empty() {
                    if let Some(first) = out.first_mut() {
                        first["choices"][0]["logprobs"] =
                            api::chat_logprobs(&std::mem::take(&mut c.logprobs));
                    }
                }
                out
            },
            with_logprobs,
        );
        return Ok(sse(stream));
    }
    let mut choices = vec![];
    let (mut prompt_tokens, mut completion_tokens) = (0, 0);
    for (i, sub) in subs.into_iter().enumerate() {
        let c = collect(&state, sub).await?;
        if i == 0 {
            prompt_tokens = c.prompt_tokens;
        }
        completion_tokens += c.completion_tokens;
        let parsed = parser().parse_whole(&c.text);
        let mut finish = c.finish.map(|r| r.as_str());
        let mut message = json!({"role": "assistant", "content": parsed.content});
        if let Some(r) = parsed.reasoning {
            message["reasoning_content"] = json!(r);
        }
        if !parsed.calls.is_empty() {
            if c.finish == Some(FinishReason::Stop) {
                finish = Some("tool_calls");
            }
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
        choices.push(json!({"index": i, "message": message,
            "logprobs": spec.logprobs().map(|_| api::chat_logprobs(&c.logprobs)), "finish_reason": finish}));
    }
    Ok(Json(
        json!({"id": id, "object": "chat.completion", "created": now(), "model": answer_model,
        "choices": choices, "usage": api::usage(prompt_tokens, completion_tokens)}),
    )
    .into_response())
}

/// A streamed choice's parser (made on its first event) and the logprobs not yet sent.
#[derive(Default)]
struct StreamedChoice {
    parser: Option<ChoiceParser>,
    logprobs: Vec<api::TokenLogprob>,
}

/// The `delta` of a streamed chat chunk carrying `part`, as OpenAI streams them: a call's
/// id, type and name first (arguments empty), then its arguments in fragments.
fn delta_of(part: Part) -> Value {
    match part {
        Part::Content(t) => json!({"role": "assistant", "content": t}),
        Part::Reasoning(t) => json!({"role": "assistant", "reasoning_content": t}),
        Part::CallStart { index, id, name } => json!({"role": "assistant", "tool_calls": [
            {"index": index, "id": id, "type": "function",
             "function": {"name": name, "arguments": ""}}]}),
        Part::CallArgs { index, args } => {
            json!({"role": "assistant", "tool_calls": [{"index": index, "function": {"arguments": args}}]})
        }
    }
}
