//! A request's answer from its submissions: collected into one JSON body, or streamed as
//! server-sent events ending with `data: [DONE]`. A choice that fails (its step failed, or the
//! engine stopped) fails the whole answer with 500, or, once streaming, adds an error event
//! before `[DONE]`. Dropping an answer (the client went away) drops its submissions, which
//! abort their requests at once.

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::Event as SseEvent;
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};
use tessera_engine::RequestEvent as Event;

use super::AppState;
use crate::api::{self, ApiError, TokenLogprob};
use crate::engine_loop::Submission;

/// What a finished choice accumulated.
#[derive(Default)]
pub struct Choice {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
    pub finish: Option<api::FinishReason>,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens the prefix cache served.
    pub cached_tokens: usize,
    /// The index of the stop string that ended it, if one did.
    pub stop_index: Option<usize>,
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

pub async fn collect(state: &AppState, mut sub: Submission) -> Result<Choice, ApiError> {
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
                cached_tokens,
                stop_index,
            } => {
                c.finish = Some(reason);
                c.stop_index = stop_index;
                c.prompt_tokens = prompt_tokens;
                c.completion_tokens = completion_tokens;
                c.cached_tokens = cached_tokens;
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

/// One choice's engine event, as the answers read them.
pub enum Item {
    Text {
        text: String,
        /// Empty unless logprobs were asked for.
        logprobs: Vec<TokenLogprob>,
    },
    Finished {
        reason: api::FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
        cached_tokens: usize,
        stop_index: Option<usize>,
    },
    /// The choice failed, or its channel closed before it finished (the engine stopped).
    Failed(String),
}

/// The choices' events merged as they come, `(choice, item)`, then one `None` once every
/// choice has ended. Dropping the stream (client gone) drops the submissions, which abort
/// their requests.
pub fn merged(
    state: Arc<AppState>,
    subs: Vec<Submission>,
    with_logprobs: bool,
) -> impl Stream<Item = Option<(usize, Item)>> + Send {
    let all = stream::select_all(subs.into_iter().enumerate().map(|(i, sub)| {
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
    all.map(move |(i, ev)| {
        let item = match ev {
            Some(Event::Text { text, logprobs, .. }) => Item::Text {
                text,
                logprobs: if with_logprobs { logprobs } else { Vec::new() },
            },
            Some(Event::Finished {
                reason,
                prompt_tokens,
                completion_tokens,
                cached_tokens,
                stop_index,
            }) => Item::Finished {
                reason,
                prompt_tokens,
                completion_tokens,
                cached_tokens,
                stop_index,
            },
            Some(Event::Failed { message }) => Item::Failed(message),
            None => Item::Failed(engine_gone(&state).message),
        };
        Some((i, item))
    })
    .chain(stream::once(async { None }))
}

pub enum StreamItem {
    Delta {
        text: String,
        logprobs: Option<Vec<TokenLogprob>>,
    },
    Finish(api::FinishReason),
}

/// Merges the choices' event streams into SSE events; `render` builds the chunks (none or
/// more) of each event, keeping what state it needs per choice.
/// Choice `i` belongs to prompt `i / n`. A choice whose channel closes before it finished
/// (the engine stopped) gets an error event; usage counts every prompt's tokens once.
/// The usage chunk is `head` (the chunks' `id`, `object` and `model`) with `created`, no
/// choices and the usage, shaped like every other chunk.
/// Dropping the stream (client gone) drops the submissions, which abort their requests.
pub fn sse_stream(
    state: Arc<AppState>,
    subs: Vec<Submission>,
    n: usize,
    include_usage: bool,
    head: Value,
    mut render: impl FnMut(usize, StreamItem) -> Vec<Value> + Send + 'static,
    with_logprobs: bool,
) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send {
    // (prompt tokens, completion tokens, cached prompt tokens) over all choices.
    let mut usage = (0usize, 0usize, 0usize);
    let n = n.max(1);
    merged(state, subs, with_logprobs).flat_map(move |ev| {
        let items = match ev {
            Some((i, Item::Text { text, logprobs })) => render(
                i,
                StreamItem::Delta {
                    text,
                    logprobs: with_logprobs.then_some(logprobs),
                },
            ),
            Some((
                i,
                Item::Finished {
                    reason,
                    prompt_tokens,
                    completion_tokens,
                    cached_tokens,
                    ..
                },
            )) => {
                if i % n == 0 {
                    usage.0 += prompt_tokens;
                    usage.2 += cached_tokens;
                }
                usage.1 += completion_tokens;
                render(i, StreamItem::Finish(reason))
            }
            Some((_, Item::Failed(message))) => vec![error_chunk(&message)],
            None => {
                let mut v = vec![];
                if include_usage {
                    v.push(usage_chunk(&head, api::usage(usage.0, usage.1, usage.2)));
                }
                let mut events: Vec<_> = v
                    .into_iter()
                    .map(|v| Ok(SseEvent::default().data(v.to_string())))
                    .collect();
                events.push(Ok(SseEvent::default().data("[DONE]")));
                return stream::iter(events);
            }
        };
        stream::iter(
            items
                .into_iter()
                .map(|v| Ok(SseEvent::default().data(v.to_string())))
                .collect::<Vec<_>>(),
        )
    })
}

/// The `data:` events of `values`.
pub fn data_events(values: Vec<Value>) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    stream::iter(
        values
            .into_iter()
            .map(|v| Ok(SseEvent::default().data(v.to_string())))
            .collect::<Vec<_>>(),
    )
}

/// A stream's usage chunk: `head` (`id`, `object`, `model`) with `created`, empty
/// `choices` and `usage`.
pub fn usage_chunk(head: &Value, usage: Value) -> Value {
    let mut v = head.clone();
    v["created"] = json!(super::now());
    v["choices"] = json!([]);
    v["usage"] = usage;
    v
}

/// An error event inside a stream.
pub fn error_chunk(message: &str) -> Value {
    json!({"error": {"message": crate::text::safe_message(message), "type": "server_error"}})
}
