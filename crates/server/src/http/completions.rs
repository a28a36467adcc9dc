//! `POST /v1/completions`, and the steps every generation handler shares. In order: validates
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
use tessera_tokenizer::Tokenizer;

use super::body::JsonBody;
use super::lora::resolve_model;
use super::respond::{collect, sse_stream, StreamItem};
use super::{now, AppState};
use crate::admission::Reservation;
use crate::api::{self, ApiError, CompletionRequest, PromptField};
use crate::engine_loop::Submission;
use crate::spec::{self, GenSpec, LogprobsAsked};

pub(crate) fn answer(r: Result<Response, ApiError>) -> Response {
    r.unwrap_or_else(IntoResponse::into_response)
}

pub async fn completions(
    State(state): State<Arc<AppState>>,
    JsonBody(req): JsonBody<CompletionRequest>,
) -> Response {
    answer(completions_inner(state, req).await)
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
pub(crate) fn check_prompt(state: &AppState, param: &str, ids: &[u32]) -> Result<(), ApiError> {
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
        )
        .with_code("context_length_exceeded"));
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

/// Refuses `logit_bias` entries for token ids outside the vocabulary.
pub(crate) fn check_logit_bias(state: &AppState, spec: &GenSpec) -> Result<(), ApiError> {
    let vocab = state.tokenizers.tokenizer().vocab_size();
    if let Some(&(t, _)) = spec
        .base
        .logit_bias
        .iter()
        .find(|(t, _)| *t as usize >= vocab)
    {
        return Err(ApiError::invalid(
            "logit_bias",
            format!(
                "logit_bias: token id {t} is outside the vocabulary (0 to {})",
                vocab - 1
            ),
        ));
    }
    Ok(())
}

/// Submits `n` choices for every prompt under `reservation`; choice index = prompt index · n + j.
pub(crate) async fn submit_all(
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

pub(crate) fn sse(
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
    api::check_extra(&req.extra, false)?;
    let asked = req.logprobs.map(|count| LogprobsAsked {
        count,
        param: "logprobs",
    });
    let spec = spec::validate(&req.common, asked, state.default_max_tokens)?;
    check_logit_bias(&state, &spec)?;
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
        let head = json!({"id": id, "object": "text_completion", "model": model});
        let stream = sse_stream(
            state.clone(),
            subs,
            spec.n,
            spec.include_usage,
            head,
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
    let (mut prompt_tokens, mut completion_tokens, mut cached_tokens) = (0, 0, 0);
    for (i, sub) in subs.into_iter().enumerate() {
        let c = collect(&state, sub).await?;
        if i % spec.n == 0 {
            prompt_tokens += c.prompt_tokens;
            cached_tokens += c.cached_tokens;
        }
        completion_tokens += c.completion_tokens;
        choices.push(json!({"index": i, "text": c.text,
            "logprobs": spec.logprobs().map(|_| api::completion_logprobs(&c.logprobs, 0)),
            "finish_reason": c.finish.map(|r| r.as_str())}));
    }
    Ok(Json(
        json!({"id": id, "object": "text_completion", "created": now(), "model": answer_model,
        "choices": choices, "usage": api::usage(prompt_tokens, completion_tokens, cached_tokens)}),
    )
    .into_response())
}
