//! HTTP routes (axum): `/v1/completions`, `/v1/chat/completions`, `/v1/models`, `/health`,
//! `/metrics`, with optional Bearer-key authentication. Handlers validate, tokenize and
//! submit to the engine loop, then either collect the events into one response or stream
//! them as server-sent events ending with `data: [DONE]`. A client that goes away drops its
//! stream or handler future, whose submissions' guards abort the requests at once.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};
use tessera_tokenizer::{ChatMessage, Tokenizer};

use crate::adapters::AdapterRegistry;
use crate::api::{
    self, ApiError, ChatRequest, CompletionRequest, GenSpec, PromptField, TokenLogprob,
};
use crate::engine_loop::{EngineHandle, Submission};
use tessera_engine::request::LoraAdapter;
use tessera_engine::RequestEvent as Event;

pub struct AppState {
    pub handle: EngineHandle,
    pub model_name: String,
    pub adapters: Arc<AdapterRegistry>,
    pub api_key: Option<String>,
    pub tokenizer: Arc<Tokenizer>,
    pub max_model_len: usize,
    pub default_max_tokens: usize,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::BAD_REQUEST);
        (status, Json(self.body())).into_response()
    }
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/v1/load_lora_adapter", post(load_lora))
        .route("/v1/unload_lora_adapter", post(unload_lora))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .with_state(state)
}

fn check_key(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &state.api_key else {
        return Ok(());
    };
    let given = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if given == Some(key.as_str()) {
        Ok(())
    } else {
        Err(ApiError::new(
            401,
            "authentication_error",
            "missing or invalid API key",
        ))
    }
}

/// The adapter the request's `model` names (`None`: the base model) and the name to answer
/// with.
async fn resolve_model(
    state: &AppState,
    model: &Option<String>,
) -> Result<(Option<Arc<LoraAdapter>>, String), ApiError> {
    let adapter = state.adapters.resolve(model.as_deref()).await?;
    let name = match (&adapter, model) {
        (Some(_), Some(m)) => m.clone(),
        _ => state.model_name.clone(),
    };
    Ok((adapter, name))
}

#[derive(serde::Deserialize)]
struct LoadLora {
    lora_name: String,
    lora_path: String,
}

#[derive(serde::Deserialize)]
struct UnloadLora {
    lora_name: String,
}

/// `POST /v1/load_lora_adapter` with vLLM's body: `{"lora_name", "lora_path"}`.
async fn load_lora(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let run = async {
        check_key(&state, &headers)?;
        let req: LoadLora = parse(&body)?;
        state
            .adapters
            .load(&req.lora_name, std::path::Path::new(&req.lora_path))
            .await?;
        Ok::<_, ApiError>(format!(
            "Success: LoRA adapter '{}' added successfully.",
            req.lora_name
        ))
    };
    match run.await {
        Ok(msg) => msg.into_response(),
        Err(e) => e.into_response(),
    }
}

/// `POST /v1/unload_lora_adapter` with vLLM's body: `{"lora_name"}`. Requests running with
/// the adapter finish with it.
async fn unload_lora(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let run = || {
        check_key(&state, &headers)?;
        let req: UnloadLora = parse(&body)?;
        let running = state.adapters.unload(&req.lora_name)?;
        Ok::<_, ApiError>(if running == 0 {
            format!(
                "Success: LoRA adapter '{}' removed successfully.",
                req.lora_name
            )
        } else {
            format!(
                "Success: LoRA adapter '{}' removed successfully; {running} running request(s) \
                 finish with it.",
                req.lora_name
            )
        })
    };
    match run() {
        Ok(msg) => msg.into_response(),
        Err(e) => e.into_response(),
    }
}

fn parse<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid("body", format!("invalid request body: {e}")))
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `ok` while the engine runs; 503 with the reason once it has stopped.
async fn health(State(state): State<Arc<AppState>>) -> Response {
    match state.handle.health.stopped() {
        None => "ok".into_response(),
        Some(reason) => ApiError::new(503, "server_error", reason).into_response(),
    }
}

async fn models(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = check_key(&state, &headers) {
        return e.into_response();
    }
    let mut data = vec![
        json!({"id": state.model_name, "object": "model", "created": now(),
        "owned_by": "tessera", "root": state.model_name, "parent": Value::Null,
        "max_model_len": state.max_model_len}),
    ];
    for a in state.adapters.list() {
        data.push(
            json!({"id": a.name, "object": "model", "created": now(), "owned_by": "tessera",
            "root": a.path.display().to_string(), "parent": state.model_name,
            "max_model_len": state.max_model_len}),
        );
    }
    Json(json!({"object": "list", "data": data})).into_response()
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let mut text = state.handle.metrics.render();
    text.push_str(&state.adapters.render_metrics());
    ([("content-type", "text/plain; version=0.0.4")], text).into_response()
}

fn check_prompt_len(state: &AppState, ids: &[u32]) -> Result<(), ApiError> {
    if ids.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt is empty"));
    }
    if ids.len() >= state.max_model_len {
        return Err(ApiError::invalid(
            "prompt",
            format!("the prompt has {} tokens; this model's context holds {} (including at least one generated token)", ids.len(), state.max_model_len),
        ));
    }
    let vocab = state.tokenizer.vocab_size();
    if let Some(&t) = ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid(
            "prompt",
            format!("token id {t} is outside the vocabulary"),
        ));
    }
    Ok(())
}

/// Submits `n` choices for every prompt; choice index = prompt index · n + j.
fn submit_all(
    state: &AppState,
    prompts: &[Vec<u32>],
    spec: &GenSpec,
    adapter: &Option<Arc<LoraAdapter>>,
) -> Result<Vec<Submission>, ApiError> {
    let mut subs = vec![];
    for ids in prompts {
        for j in 0..spec.n {
            let mut req = spec.request(ids.clone(), j as u64);
            req.adapter = adapter.clone();
            subs.push(state.handle.submit(req)?);
        }
    }
    Ok(subs)
}

/// What a finished choice accumulated.
#[derive(Default)]
struct Choice {
    text: String,
    logprobs: Vec<TokenLogprob>,
    finish: Option<api::FinishReason>,
    prompt_tokens: usize,
    completion_tokens: usize,
}

/// The error for a request whose channel closed before it finished: the engine stopped.
fn engine_gone(state: &AppState) -> ApiError {
    let reason = state
        .handle
        .health
        .stopped()
        .unwrap_or_else(|| "the engine has stopped".into());
    ApiError::new(
        500,
        "server_error",
        format!("the request did not finish: {reason}"),
    )
}

async fn collect(state: &AppState, mut sub: Submission) -> Result<Choice, ApiError> {
    let mut c = Choice::default();
    while let Some(ev) = sub.events.recv().await {
        match ev {
            Event::Text { text, logprobs, .. } => {
                c.text.push_str(&text);
                c.logprobs.extend(logprobs);
            }
            Event::Finished {
                reason,
                prompt_tokens,
                completion_tokens,
            } => {
                c.finish = Some(reason);
                c.prompt_tokens = prompt_tokens;
                c.completion_tokens = completion_tokens;
                sub.finished();
                return Ok(c);
            }
            Event::Failed { message } => {
                sub.finished();
                return Err(ApiError::new(500, "server_error", message));
            }
        }
    }
    Err(engine_gone(state))
}

async fn completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match completions_inner(state, headers, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn completions_inner(
    state: Arc<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    check_key(&state, &headers)?;
    let req: CompletionRequest = parse(&body)?;
    let (adapter, model) = resolve_model(&state, &req.common.model).await?;
    if req.echo {
        return Err(ApiError::invalid("echo", "echo is not supported"));
    }
    let spec = api::validate(&req.common, req.logprobs, state.default_max_tokens)?;
    let texts_to_ids = |t: &str| {
        state
            .tokenizer
            .encode(t)
            .map_err(|e| ApiError::invalid("prompt", e.to_string()))
    };
    let prompts: Vec<Vec<u32>> = match &req.prompt {
        PromptField::Text(t) => vec![texts_to_ids(t)?],
        PromptField::Texts(ts) if ts.is_empty() => {
            return Err(ApiError::invalid("prompt", "the prompt list is empty"))
        }
        PromptField::Texts(ts) => ts
            .iter()
            .map(|t| texts_to_ids(t))
            .collect::<Result<_, _>>()?,
        PromptField::Tokens(ids) => vec![ids.clone()],
    };
    for p in &prompts {
        check_prompt_len(&state, p)?;
    }
    let subs = submit_all(&state, &prompts, &spec, &adapter)?;
    let id = format!("cmpl-{}", subs[0].id);
    let answer_model = model.clone();
    if spec.stream {
        let include_usage = spec.include_usage;
        let stream = sse_stream(
            state.clone(),
            subs,
            spec.n,
            include_usage,
            move |index, ev| match ev {
                StreamItem::Delta { text, logprobs } => Some(
                    json!({"id": id, "object": "text_completion", "created": now(), "model": model,
                "choices": [{"index": index, "text": text, "logprobs": logprobs.map(|l| api::completion_logprobs(&l, 0)), "finish_reason": Value::Null}]}),
                ),
                StreamItem::Finish(reason) => Some(
                    json!({"id": id, "object": "text_completion", "created": now(), "model": model,
                "choices": [{"index": index, "text": "", "logprobs": Value::Null, "finish_reason": reason.as_str()}]}),
                ),
            },
            spec.logprobs.is_some(),
        );
        return Ok(Sse::new(stream)
            .keep_alive(KeepAlive::default())
            .into_response());
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
            "logprobs": spec.logprobs.map(|_| api::completion_logprobs(&c.logprobs, 0)),
            "finish_reason": c.finish.map(|r| r.as_str())}));
    }
    Ok(Json(
        json!({"id": id, "object": "text_completion", "created": now(), "model": answer_model,
        "choices": choices, "usage": api::usage(prompt_tokens, completion_tokens)}),
    )
    .into_response())
}

async fn chat_completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match chat_inner(state, headers, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn chat_inner(
    state: Arc<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    check_key(&state, &headers)?;
    let req: ChatRequest = parse(&body)?;
    let (adapter, model) = resolve_model(&state, &req.common.model).await?;
    if req.messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    let top = if req.logprobs {
        Some(req.top_logprobs.unwrap_or(0))
    } else {
        None
    };
    let spec = api::validate(&req.common, top, state.default_max_tokens)?;
    let mut msgs = vec![];
    for m in &req.messages {
        if !matches!(
            m.role.as_str(),
            "system" | "user" | "assistant" | "tool" | "developer"
        ) {
            return Err(ApiError::invalid(
                "messages",
                format!("unknown role {:?}", m.role),
            ));
        }
        msgs.push(ChatMessage::new(&m.role, &api::message_text(m)?));
    }
    // Message contents are text: special tokens in them are not parsed.
    let ids = state
        .tokenizer
        .encode_chat(&msgs, true)
        .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    check_prompt_len(&state, &ids)?;
    let subs = submit_all(&state, &[ids], &spec, &adapter)?;
    let id = format!("chatcmpl-{}", subs[0].id);
    let answer_model = model.clone();
    if spec.stream {
        let stream = sse_stream(
            state.clone(),
            subs,
            spec.n,
            spec.include_usage,
            move |index, ev| match ev {
                StreamItem::Delta { text, logprobs } => Some(
                    json!({"id": id, "object": "chat.completion.chunk", "created": now(), "model": model,
                "choices": [{"index": index, "delta": {"role": "assistant", "content": text}, "logprobs": logprobs.map(|l| api::chat_logprobs(&l)), "finish_reason": Value::Null}]}),
                ),
                StreamItem::Finish(reason) => Some(
                    json!({"id": id, "object": "chat.completion.chunk", "created": now(), "model": model,
                "choices": [{"index": index, "delta": {}, "logprobs": Value::Null, "finish_reason": reason.as_str()}]}),
                ),
            },
            spec.logprobs.is_some(),
        );
        return Ok(Sse::new(stream)
            .keep_alive(KeepAlive::default())
            .into_response());
    }
    let mut choices = vec![];
    let (mut prompt_tokens, mut completion_tokens) = (0, 0);
    for (i, sub) in subs.into_iter().enumerate() {
        let c = collect(&state, sub).await?;
        if i == 0 {
            prompt_tokens = c.prompt_tokens;
        }
        completion_tokens += c.completion_tokens;
        choices.push(json!({"index": i, "message": {"role": "assistant", "content": c.text},
            "logprobs": spec.logprobs.map(|_| api::chat_logprobs(&c.logprobs)), "finish_reason": c.finish.map(|r| r.as_str())}));
    }
    Ok(Json(
        json!({"id": id, "object": "chat.completion", "created": now(), "model": answer_model,
        "choices": choices, "usage": api::usage(prompt_tokens, completion_tokens)}),
    )
    .into_response())
}

enum StreamItem {
    Delta {
        text: String,
        logprobs: Option<Vec<TokenLogprob>>,
    },
    Finish(api::FinishReason),
}

/// Merges the choices' event streams into SSE events; `render` builds each chunk's JSON.
/// Choice `i` belongs to prompt `i / n`. A choice whose channel closes before it finished
/// (the engine stopped) gets an error event; usage counts every prompt's tokens once.
/// Dropping the stream (client gone) drops the submissions, which abort their requests.
fn sse_stream(
    state: Arc<AppState>,
    subs: Vec<Submission>,
    n: usize,
    include_usage: bool,
    render: impl Fn(usize, StreamItem) -> Option<Value> + Send + 'static,
    with_logprobs: bool,
) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send {
    let merged = stream::select_all(subs.into_iter().enumerate().map(|(i, sub)| {
        stream::unfold(Some(sub), move |sub| async move {
            let mut sub = sub?;
            match sub.events.recv().await {
                // Closed without a last event: the engine is gone.
                None => Some(((i, None), None)),
                Some(ev @ (Event::Finished { .. } | Event::Failed { .. })) => {
                    sub.finished();
                    Some(((i, Some(ev)), None))
                }
                Some(ev) => Some(((i, Some(ev)), Some(sub))),
            }
        })
        .boxed()
    }));
    // (prompt tokens, completion tokens) over all choices.
    let usage = Arc::new(std::sync::Mutex::new((0usize, 0usize)));
    let tail_usage = usage.clone();
    let n = n.max(1);
    let body = merged.filter_map(move |(i, ev)| {
        let item = match ev {
            Some(Event::Text { text, logprobs, .. }) => render(
                i,
                StreamItem::Delta {
                    text,
                    logprobs: with_logprobs.then_some(logprobs),
                },
            ),
            Some(Event::Finished {
                reason,
                prompt_tokens,
                completion_tokens,
            }) => {
                let mut u = usage.lock().unwrap_or_else(|e| e.into_inner());
                if i % n == 0 {
                    u.0 += prompt_tokens;
                }
                u.1 += completion_tokens;
                render(i, StreamItem::Finish(reason))
            }
            Some(Event::Failed { message }) => Some(error_chunk(&message)),
            None => Some(error_chunk(&engine_gone(&state).message)),
        };
        std::future::ready(item.map(|v| Ok(SseEvent::default().data(v.to_string()))))
    });
    let tail = stream::once(async move { *tail_usage.lock().unwrap_or_else(|e| e.into_inner()) })
        .flat_map(move |(p, c)| {
            let mut v = vec![];
            if include_usage {
                v.push(Ok(SseEvent::default().data(
                    json!({"object": "usage", "choices": [], "usage": api::usage(p, c)})
                        .to_string(),
                )));
            }
            v.push(Ok(SseEvent::default().data("[DONE]")));
            stream::iter(v)
        });
    body.chain(tail)
}

/// An error event inside a stream.
fn error_chunk(message: &str) -> Value {
    json!({"error": {"message": message, "type": "server_error"}})
}
