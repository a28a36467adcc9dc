//! The adapter routes, with vLLM's bodies: `POST /v1/load_lora_adapter`
//! (`{"lora_name", "lora_path"}`) and `POST /v1/unload_lora_adapter` (`{"lora_name"}`), and
//! the resolution of a request's `model` field to the base model or an adapter.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use tessera_engine::request::LoraAdapter;

use super::body::JsonBody;
use super::AppState;
use crate::api::ApiError;
use crate::text::quote;

/// The adapter the request's `model` names (`None`: the base model) and the name to answer
/// with.
pub async fn resolve_model(
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
pub struct LoadLora {
    lora_name: String,
    lora_path: String,
}

#[derive(serde::Deserialize)]
pub struct UnloadLora {
    lora_name: String,
}

pub async fn load(
    State(state): State<Arc<AppState>>,
    JsonBody(req): JsonBody<LoadLora>,
) -> Response {
    let loaded = state
        .adapters
        .load(&req.lora_name, std::path::Path::new(&req.lora_path))
        .await;
    match loaded {
        Ok(()) => format!(
            "Success: LoRA adapter {} added successfully.",
            quote(&req.lora_name)
        )
        .into_response(),
        Err(e) => e.into_response(),
    }
}

/// Requests running with the adapter finish with it.
pub async fn unload(
    State(state): State<Arc<AppState>>,
    JsonBody(req): JsonBody<UnloadLora>,
) -> Response {
    match state.adapters.unload(&req.lora_name) {
        Ok(0) => format!(
            "Success: LoRA adapter {} removed successfully.",
            quote(&req.lora_name)
        )
        .into_response(),
        Ok(running) => format!(
            "Success: LoRA adapter {} removed successfully; {running} running request(s) \
             finish with it.",
            quote(&req.lora_name)
        )
        .into_response(),
        Err(e) => e.into_response(),
    }
}
