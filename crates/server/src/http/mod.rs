//! The HTTP routes (axum) and what they share. `/v1/*` (completions, chat completions,
//! Anthropic messages ([`messages`]), models, adapter loading and unloading) sits behind the API key when one is set
//! ([`auth`]); `/health` is always open; `/metrics` is open unless the server is told to
//! protect it too. Request bodies are read under a size limit and a deadline ([`body`]);
//! the generation handlers are in [`completions`], their answers (whole or streamed) in
//! [`respond`], the adapter routes in [`lora`].

pub mod auth;
pub mod body;
pub mod chat;
pub mod completions;
pub mod cors;
pub mod lora;
pub mod messages;
pub mod respond;
pub mod responses;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::{Method, StatusCode, Uri};
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::adapters::AdapterRegistry;
use crate::api::ApiError;
use crate::engine_loop::EngineHandle;
use crate::text::quote;
use crate::tokenize::TokenizerPool;

pub struct AppState {
    pub handle: EngineHandle,
    pub model_name: String,
    pub adapters: Arc<AdapterRegistry>,
    pub api_key: Option<auth::ApiKey>,
    pub tokenizers: TokenizerPool,
    pub max_model_len: usize,
    /// KV cache positions in all (a prompt must fit in them).
    pub kv_positions: usize,
    pub default_max_tokens: usize,
    /// Largest request body accepted, bytes.
    pub max_body_bytes: usize,
    /// Time a request's body has to arrive, from when its handler starts reading it.
    pub body_timeout: Duration,
    /// Whether `/metrics` needs the API key too.
    pub metrics_require_key: bool,
    /// How chat answers are read for reasoning and tool calls.
    pub output: crate::chat_output::OutputParsers,
    /// Stored Responses API responses (`store`, `previous_response_id`).
    pub responses: responses::ResponseStore,
}

impl AppState {
    /// Longest prompt accepted, in tokens: one position of the context is left for the
    /// answer, and the prompt must fit in the KV cache.
    pub fn max_prompt_tokens(&self) -> usize {
        (self.max_model_len.saturating_sub(1)).min(self.kv_positions)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::BAD_REQUEST);
        (status, Json(self.body())).into_response()
    }
}

pub fn router(state: Arc<AppState>) -> Router {
    let key = || from_fn_with_state(state.clone(), auth::require_key);
    let v1 = Router::new()
        .route("/v1/completions", post(completions::completions))
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/responses", post(responses::create))
        .route(
            "/v1/responses/{id}",
            get(responses::get).delete(responses::delete),
        )
        .route(
            "/v1/responses/{id}/input_items",
            get(responses::input_items),
        )
        .route("/v1/models", get(models))
        .route("/v1/load_lora_adapter", post(lora::load))
        .route("/v1/unload_lora_adapter", post(lora::unload))
        .route_layer(key());
    // Anthropic Messages: its errors (the key's included) in Anthropic's shape.
    let anthropic = Router::new()
        .route("/v1/messages", post(messages::messages))
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .route_layer(key())
        .route_layer(axum::middleware::from_fn(messages::error_shape));
    let mut metrics_route = Router::new().route("/metrics", get(metrics));
    if state.metrics_require_key {
        metrics_route = metrics_route.route_layer(key());
    }
    Router::new()
        .merge(v1)
        .merge(anthropic)
        .merge(metrics_route)
        .route("/health", get(health))
        .fallback(not_found)
        .with_state(state)
}

pub(crate) fn now() -> u64 {
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

async fn models(State(state): State<Arc<AppState>>) -> Response {
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

async fn not_found(method: Method, uri: Uri) -> Response {
    ApiError::new(
        404,
        "invalid_request_error",
        format!("no route {method} {}", quote(uri.path())),
    )
    .into_response()
}
