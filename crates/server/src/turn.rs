//! One chat turn in no dialect. Chat Completions, Responses and Messages each translate their
//! request into a [`ChatTurn`] (messages in the chat template's shape, tools, the generation
//! spec) and run it through the one pipeline here ([`start`]: the model or adapter, the tools'
//! constraint, the admission gate, the template and tokenization on the tokenizer pool, the
//! prompt's checks, submission); its output comes back as dialect-free [`TurnEvent`]s per
//! choice (reasoning, content, a call's start and argument fragments, the finish) or as whole
//! [`TurnChoice`]s. A dialect module only translates: no dialect has engine code of its own.

use std::sync::Arc;

use futures_util::stream::{Stream, StreamExt};
use serde_json::{Map, Value};
use tessera_tokenizer::{ChatExtras, ChatMessage};

use crate::api::{ApiError, FinishReason, TokenLogprob};
use crate::chat_output::{ChoiceParser, Parsed, Part};
use crate::engine_loop::Submission;
use crate::http::completions::{check_logit_bias, check_prompt, submit_all};
use crate::http::lora::resolve_model;
use crate::http::respond::{collect, merged, Item};
use crate::http::AppState;
use crate::spec::GenSpec;
use crate::tools::ToolSpec;

/// A chat request in no dialect.
pub struct ChatTurn {
    /// The model or adapter asked for (`None`: the base model).
    pub model: Option<String>,
    /// The conversation, as the chat template takes it.
    pub messages: Vec<ChatMessage>,
    /// The request's field that holds the conversation, named in errors.
    pub messages_param: &'static str,
    pub tools: Option<ToolSpec>,
    /// The request's field that holds the tools, named in errors.
    pub tools_param: &'static str,
    /// Extra variables for the chat template.
    pub template_kwargs: Map<String, Value>,
    pub spec: GenSpec,
}

/// A submitted turn: its choices' submissions and how their output is read.
pub struct StartedTurn {
    pub subs: Vec<Submission>,
    /// The model name the answer reports.
    pub model: String,
    /// The engine's id of the first choice (answers' ids are made from it).
    pub first_id: u64,
    /// The prompt's length in tokens.
    pub prompt_tokens: usize,
    pub spec: GenSpec,
    parser: Arc<dyn Fn() -> ChoiceParser + Send + Sync>,
}

/// Runs `turn` up to submission.
pub async fn start(state: &Arc<AppState>, turn: ChatTurn) -> Result<StartedTurn, ApiError> {
    let ChatTurn {
        model,
        messages,
        messages_param,
        tools,
        tools_param,
        template_kwargs,
        mut spec,
    } = turn;
    // The tool definitions the answer is read against, when it is read for calls.
    let mut call_tools: Option<Arc<Vec<Value>>> = None;
    if let Some(t) = tools.as_ref().filter(|t| t.parses_calls()) {
        let tok = state.tokenizers.tokenizer();
        let format = tool_format(state, tools_param)?;
        if let Some(c) = t.constraint(format, &|s| tok.added_token_id(s))? {
            if spec.base.constraint.is_some() {
                return Err(ApiError::invalid(
                    "tool_choice",
                    "a required or named tool_choice and a response format (or a guided_* \
                     field) both constrain the output: give one",
                ));
            }
            spec.base.constraint = Some(c);
        }
        call_tools = Some(Arc::new(t.tools.clone()));
    }
    check_logit_bias(state, &spec)?;
    let extras = ChatExtras {
        tools: tools.as_ref().and_then(ToolSpec::shown),
        kwargs: template_kwargs,
    };
    let (adapter, model) = resolve_model(state, &model).await?;
    let reservation = state.handle.admission.reserve(spec.n, 1)?;
    let ids = render(state, messages, messages_param, extras).await?;
    check_prompt(state, messages_param, &ids)?;
    let prompt_tokens = ids.len();
    let subs = submit_all(state, &[ids], &spec, &adapter, reservation).await?;
    let output = state.output.clone();
    Ok(StartedTurn {
        first_id: subs[0].id,
        prompt_tokens,
        subs,
        model,
        spec,
        parser: Arc::new(move || {
            ChoiceParser::new(&output, call_tools.as_deref().map(Vec::as_slice))
        }),
    })
}

/// The tool-call format the answer is read in; refused (naming `tools_param`) when the
/// model's chat template does not take tools.
fn tool_format(state: &AppState, tools_param: &str) -> Result<crate::tools::ToolFormat, ApiError> {
    let tok = state.tokenizers.tokenizer();
    state
        .output
        .tools
        .filter(|_| tok.chat_template_source().contains("tools"))
        .ok_or_else(|| {
            ApiError::invalid(
                tools_param,
                "this model's chat template does not take tools (serve a model whose \
                 template does, or send tool_choice \"none\")",
            )
        })
}

/// The conversation rendered by the chat template and tokenized, on the tokenizer pool.
async fn render(
    state: &AppState,
    messages: Vec<ChatMessage>,
    messages_param: &'static str,
    extras: ChatExtras,
) -> Result<Vec<u32>, ApiError> {
    state
        .tokenizers
        .run(move |tok| {
            // Message contents are text: special tokens in them are not parsed.
            tok.encode_chat_with(&messages, true, &extras)
                .map_err(|e| match &e {
                    tessera_core::Error::ChatTemplate(t) if !t.is_client_error() => {
                        ApiError::new(500, "server_error", e.to_string())
                    }
                    _ => ApiError::invalid(messages_param, e.to_string()),
                })
        })
        .await
}

/// The length in tokens of the prompt `turn` renders to, as [`start`] would render it
/// (model, tools and template checked the same way), with nothing submitted.
pub async fn count_prompt(state: &Arc<AppState>, turn: ChatTurn) -> Result<usize, ApiError> {
    if turn.tools.as_ref().is_some_and(ToolSpec::parses_calls) {
        tool_format(state, turn.tools_param)?;
    }
    resolve_model(state, &turn.model).await?;
    let extras = ChatExtras {
        tools: turn.tools.as_ref().and_then(ToolSpec::shown),
        kwargs: turn.template_kwargs,
    };
    Ok(render(state, turn.messages, turn.messages_param, extras)
        .await?
        .len())
}

/// Why a choice ended, as every dialect needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnFinish {
    pub reason: FinishReason,
    /// The choice called tools (and stopped after them rather than at the length limit).
    pub called: bool,
    /// The index in the request's stop strings of the one that ended the choice, if one did.
    pub stop_index: Option<usize>,
}

impl TurnFinish {
    /// OpenAI's `finish_reason`.
    pub fn openai(self) -> &'static str {
        if self.called {
            "tool_calls"
        } else {
            self.reason.as_str()
        }
    }
}

/// Tokens a turn used, over all its choices (each prompt counted once).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TurnUsage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens the prefix cache served.
    pub cached_tokens: usize,
}

/// A streamed turn's output, per choice, in order.
#[derive(Debug, Clone)]
pub enum TurnEvent {
    /// The parts of a piece of text (possibly none, while a parser holds text back) and the
    /// logprobs of its tokens (empty unless asked for).
    Parts {
        choice: usize,
        parts: Vec<Part>,
        logprobs: Vec<TokenLogprob>,
    },
    /// The choice ended; `parts` is what its parsers still held.
    Finish {
        choice: usize,
        parts: Vec<Part>,
        finish: TurnFinish,
    },
    /// The choice failed (its step failed, or the engine stopped).
    Failed { choice: usize, message: String },
    /// After every choice ended: the tokens used.
    Usage(TurnUsage),
}

/// A whole choice.
pub struct TurnChoice {
    pub parsed: Parsed,
    pub finish: TurnFinish,
    pub logprobs: Vec<TokenLogprob>,
}

impl StartedTurn {
    /// The output as events, the choices' interleaved; ends with [`TurnEvent::Usage`].
    /// Dropping the stream (the client went away) aborts the requests.
    pub fn events(self, state: Arc<AppState>) -> impl Stream<Item = TurnEvent> + Send {
        let with_logprobs = self.spec.logprobs().is_some();
        let parser = self.parser.clone();
        let mut parsers: Vec<Option<ChoiceParser>> = (0..self.subs.len()).map(|_| None).collect();
        let n = self.spec.n.max(1);
        let mut usage = TurnUsage::default();
        merged(state, self.subs, with_logprobs).flat_map(move |item| {
            let events = match item {
                Some((choice, item)) => {
                    let p = parsers[choice].get_or_insert_with(|| parser());
                    match item {
                        Item::Text { text, logprobs } => vec![TurnEvent::Parts {
                            choice,
                            parts: p.push(&text),
                            logprobs,
                        }],
                        Item::Finished {
                            reason,
                            prompt_tokens,
                            completion_tokens,
                            cached_tokens,
                            stop_index,
                        } => {
                            if choice % n == 0 {
                                usage.prompt_tokens += prompt_tokens;
                                usage.cached_tokens += cached_tokens;
                            }
                            usage.completion_tokens += completion_tokens;
                            let parts = p.finish();
                            let called = p.made_calls() && reason == FinishReason::Stop;
                            vec![TurnEvent::Finish {
                                choice,
                                parts,
                                finish: TurnFinish {
                                    reason,
                                    called,
                                    stop_index: stop_index.filter(|_| reason == FinishReason::Stop),
                                },
                            }]
                        }
                        Item::Failed(message) => vec![TurnEvent::Failed { choice, message }],
                    }
                }
                None => vec![TurnEvent::Usage(usage)],
            };
            futures_util::stream::iter(events)
        })
    }

    /// The whole choices and the tokens used; a failed choice fails the turn.
    pub async fn collect(self, state: &AppState) -> Result<(Vec<TurnChoice>, TurnUsage), ApiError> {
        let mut out = Vec::with_capacity(self.subs.len());
        let mut usage = TurnUsage::default();
        let n = self.spec.n.max(1);
        for (i, sub) in self.subs.into_iter().enumerate() {
            let c = collect(state, sub).await?;
            if i % n == 0 {
                usage.prompt_tokens += c.prompt_tokens;
                usage.cached_tokens += c.cached_tokens;
            }
            usage.completion_tokens += c.completion_tokens;
            let mut p = (self.parser)();
            let parsed = p.parse_whole(&c.text);
            let reason = c.finish.unwrap_or(FinishReason::Stop);
            out.push(TurnChoice {
                finish: TurnFinish {
                    reason,
                    called: !parsed.calls.is_empty() && reason == FinishReason::Stop,
                    stop_index: c.stop_index.filter(|_| reason == FinishReason::Stop),
                },
                parsed,
                logprobs: c.logprobs,
            });
        }
        Ok((out, usage))
    }
}
