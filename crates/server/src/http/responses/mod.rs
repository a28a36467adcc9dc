//! `POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`,
//! `GET /v1/responses/{id}/input_items`: the OpenAI Responses
//! dialect. The request is read into a [`ChatTurn`](crate::turn::ChatTurn) ([`request`]);
//! the turn's events become output items and OpenAI's typed stream events ([`output`]);
//! with `store` the response and its conversation are kept in a byte-bounded LRU
//! ([`store`]) for `previous_response_id`, which re-renders the whole conversation so that
//! the prompt shares its prefix (and the prefix cache its KV blocks) with the earlier one.

pub mod items;
pub mod output;
pub mod request;
pub mod store;

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::response::sse::Event as SseEvent;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use serde_json::{json, Value};

use super::body::JsonBody;
use super::completions::{answer, sse};
use super::{now, AppState};
use crate::api::ApiError;
use crate::text::quote;
use crate::turn::{self, TurnEvent, TurnFinish};
use output::{items_of, new_id, status_of, Meta, Streamer};
pub use store::ResponseStore;

pub async fn create(
    State(state): State<Arc<AppState>>,
    JsonBody(body): JsonBody<Value>,
) -> Response {
    answer(create_inner(state, body).await)
}

/// The conversation to keep: the input items, then the output items as input items.
fn conversation(mut items: Vec<Value>, output: &[Value]) -> Vec<Value> {
    for item in output {
        let mut it = item.clone();
        if let Some(o) = it.as_object_mut() {
            o.remove("id");
            o.remove("status");
        }
        items.push(it);
    }
    items
}

async fn create_inner(state: Arc<AppState>, body: Value) -> Result<Response, ApiError> {
    let req = request::read(body, &state.responses, state.default_max_tokens)?;
    let started = turn::start(&state, req.turn).await?;
    let meta = Meta {
        id: new_id("resp"),
        created_at: now(),
        model: started.model.clone(),
        echo: req.echo,
    };
    let (items, keep) = (req.items, req.store);
    if !req.stream {
        let (mut choices, usage) = started.collect(&state).await?;
        let choice = choices.remove(0);
        let output = items_of(&choice.parsed);
        let r = meta.response(status_of(choice.finish), &output, Some(usage), None);
        if keep {
            state
                .responses
                .put(&meta.id, r.clone(), conversation(items, &output));
        }
        return Ok(Json(r).into_response());
    }
    let mut st = Streamer::new();
    let mut first = vec![];
    let r = meta.response("in_progress", &[], None, None);
    first.push(st.event("response.created", json!({"response": r})));
    first.push(st.event("response.in_progress", json!({"response": r})));
    let mut finish: Option<TurnFinish> = None;
    let mut failed = false;
    let mut items = Some(items);
    let events = started.events(state.clone()).flat_map(move |ev| {
        let evs = match ev {
            TurnEvent::Parts { parts, .. } => parts.into_iter().flat_map(|p| st.part(p)).collect(),
            TurnEvent::Finish {
                parts, finish: f, ..
            } => {
                let mut v: Vec<_> = parts.into_iter().flat_map(|p| st.part(p)).collect();
                v.extend(st.finish());
                finish = Some(f);
                v
            }
            TurnEvent::Failed { message, .. } => {
                failed = true;
                let r = meta.response("failed", &st.output, None, Some(&message));
                vec![st.event("response.failed", json!({"response": r}))]
            }
            TurnEvent::Usage(u) if !failed => {
                let status = finish.map(status_of).unwrap_or("completed");
                let r = meta.response(status, &st.output, Some(u), None);
                if keep {
                    let items = conversation(items.take().unwrap_or_default(), &st.output);
                    state.responses.put(&meta.id, r.clone(), items);
                }
                let ty = if status == "incomplete" {
                    "response.incomplete"
                } else {
                    "response.completed"
                };
                vec![st.event(ty, json!({"response": r}))]
            }
            TurnEvent::Usage(_) => vec![],
        };
        futures_util::stream::iter(
            evs.into_iter()
                .map(|(ty, data)| Ok(SseEvent::default().event(ty).data(data.to_string())))
                .collect::<Vec<_>>(),
        )
    });
    let head = futures_util::stream::iter(
        first
            .into_iter()
            .map(|(ty, data)| Ok(SseEvent::default().event(ty).data(data.to_string())))
            .collect::<Vec<_>>(),
    );
    Ok(sse(head.chain(events)))
}

fn unknown(id: &str) -> ApiError {
    ApiError {
        status: 404,
        message: format!(
            "no response with id {} (never stored, evicted, or deleted)",
            quote(id)
        ),
        param: Some("response_id".into()),
        kind: "invalid_request_error",
        code: None,
    }
}

pub async fn get(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match state.responses.get(&id) {
        Some(s) => Json((*s.response).clone()).into_response(),
        None => unknown(&id).into_response(),
    }
}

/// `GET /v1/responses/{id}/input_items`: the conversation the response answered (its
/// earlier turns included), as a list page. Items get ids made from the response's id and
/// their position, the same on every call; `limit` (1 to 100, default 20), `order` (`desc`,
/// the default, or `asc`) and `after` (an item id) page through them; `include` is accepted.
pub async fn input_items(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(query): Query<Vec<(String, String)>>,
) -> Response {
    match input_items_page(&state, &id, &query) {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

fn input_items_page(
    state: &AppState,
    id: &str,
    query: &[(String, String)],
) -> Result<Value, ApiError> {
    let (mut limit, mut desc, mut after) = (20usize, true, None);
    for (k, v) in query {
        match k.as_str() {
            "limit" => {
                limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=100).contains(n))
                    .ok_or_else(|| {
                        ApiError::invalid("limit", "limit must be an integer from 1 to 100")
                    })?
            }
            "order" => {
                desc = match v.as_str() {
                    "desc" => true,
                    "asc" => false,
                    _ => return Err(ApiError::invalid("order", "order must be asc or desc")),
                }
            }
            "after" => after = Some(v.clone()),
            "include" | "include[]" => {}
            _ => {
                return Err(ApiError::invalid(
                    k,
                    format!("unknown query parameter {}", quote(k)),
                ))
            }
        }
    }
    let stored = state.responses.get(id).ok_or_else(|| unknown(id))?;
    let outputs = stored.response["output"].as_array().map_or(0, Vec::len);
    let inputs = &stored.items[..stored.items.len().saturating_sub(outputs)];
    let suffix = id.trim_start_matches("resp_");
    let mut all: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let mut it = item.clone();
            if let Some(o) = it.as_object_mut() {
                o.entry("type").or_insert_with(|| json!("message"));
                o.entry("id")
                    .or_insert_with(|| json!(format!("item_{suffix}_{i}")));
            }
            it
        })
        .collect();
    if desc {
        all.reverse();
    }
    let start = match &after {
        None => 0,
        Some(a) => {
            all.iter()
                .position(|it| it["id"] == a.as_str())
                .ok_or_else(|| {
                    ApiError::invalid("after", format!("no input item {} in {id}", quote(a)))
                })?
                + 1
        }
    };
    let page: Vec<Value> = all.iter().skip(start).take(limit).cloned().collect();
    Ok(json!({
        "object": "list",
        "data": page,
        "first_id": page.first().map(|v| v["id"].clone()),
        "last_id": page.last().map(|v| v["id"].clone()),
        "has_more": start + page.len() < all.len(),
    }))
}

pub async fn delete(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    if state.responses.delete(&id) {
        Json(json!({"id": id, "object": "response", "deleted": true})).into_response()
    } else {
        unknown(&id).into_response()
    }
}
