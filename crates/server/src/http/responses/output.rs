//! A turn's output as Responses output items: whole (from [`TurnChoice`]) or streamed as
//! OpenAI's typed events, each with its `sequence_number` (from [`TurnEvent`] parts).

use serde_json::{json, Map, Value};

use crate::chat_output::{call_id, Parsed, Part};
use crate::turn::{TurnFinish, TurnUsage};

/// A fresh id with OpenAI's `prefix` (`resp`, `msg`, `rs`, `fc`).
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", &call_id()["call_".len()..])
}

/// What a response object is made of besides its output.
pub struct Meta {
    pub id: String,
    pub created_at: u64,
    pub model: String,
    pub echo: Map<String, Value>,
}

impl Meta {
    /// The response object; `finish` and `usage` once it ended.
    pub fn response(
        &self,
        status: &str,
        output: &[Value],
        usage: Option<TurnUsage>,
        error: Option<&str>,
    ) -> Value {
        let mut r = json!({"id": self.id, "object": "response", "created_at": self.created_at,
            "status": status, "model": self.model, "output": output, "error": null,
            "incomplete_details": null, "usage": null});
        if status == "incomplete" {
            r["incomplete_details"] = json!({"reason": "max_output_tokens"});
        }
        if let Some(m) = error {
            r["error"] = json!({"code": "server_error", "message": crate::text::safe_message(m)});
        }
        if let Some(u) = usage {
            r["usage"] = json!({"input_tokens": u.prompt_tokens,
                "input_tokens_details": {"cached_tokens": u.cached_tokens},
                "output_tokens": u.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": u.prompt_tokens + u.completion_tokens});
        }
        for (k, v) in &self.echo {
            r[k] = v.clone();
        }
        r
    }
}

/// The status a finished turn gives its response.
pub fn status_of(finish: TurnFinish) -> &'static str {
    if finish.reason == crate::api::FinishReason::Length && !finish.called {
        "incomplete"
    } else {
        "completed"
    }
}

fn reasoning_item(id: &str, text: &str) -> Value {
    json!({"type": "reasoning", "id": id, "summary": [], "status": "completed",
        "content": [{"type": "reasoning_text", "text": text}]})
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn message_item(id: &str, status: &str, text: Option<&str>) -> Value {
    json!({"type": "message", "id": id, "role": "assistant", "status": status,
        "content": text.map(|t| vec![text_part(t)]).unwrap_or_default()})
}

fn call_item(id: &str, call_id: &str, name: &str, args: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": id, "call_id": call_id, "name": name,
        "arguments": args, "status": status})
}

/// The output items of a whole answer: its reasoning, its text (left out when the answer is
/// only calls and whitespace), its calls.
pub fn items_of(p: &Parsed) -> Vec<Value> {
    let mut out = vec![];
    if let Some(r) = p.reasoning.as_deref().filter(|r| !r.is_empty()) {
        out.push(reasoning_item(&new_id("rs"), r));
    }
    if !p.content.trim().is_empty() || p.calls.is_empty() {
        out.push(message_item(&new_id("msg"), "completed", Some(&p.content)));
    }
    for c in &p.calls {
        out.push(call_item(
            &new_id("fc"),
            &c.id,
            &c.name,
            &c.arguments,
            "completed",
        ));
    }
    out
}

/// The item being streamed.
enum Open {
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        args: String,
    },
}

/// The streaming state of one response: the events so far and the items.
pub struct Streamer {
    seq: u64,
    /// The finished items.
    pub output: Vec<Value>,
    open: Option<Open>,
    /// Whitespace-only text not yet sent: it opens a message only if text follows it.
    pending: String,
}

/// One typed event: its `type` and its data (with `type` and `sequence_number`).
pub type Ev = (&'static str, Value);

impl Default for Streamer {
    fn default() -> Self {
        Self::new()
    }
}

impl Streamer {
    pub fn new() -> Self {
        Streamer {
            seq: 0,
            output: vec![],
            open: None,
            pending: String::new(),
        }
    }

    pub fn event(&mut self, ty: &'static str, mut data: Value) -> Ev {
        data["type"] = json!(ty);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        (ty, data)
    }

    fn index(&self) -> usize {
        self.output.len()
    }

    fn open(&mut self, open: Open, out: &mut Vec<Ev>) {
        let i = self.index();
        let (item, part) = match &open {
            Open::Reasoning { id, .. } => (
                json!({"type": "reasoning", "id": id, "summary": [], "content": [],
                    "status": "in_progress"}),
                Some((id.clone(), json!({"type": "reasoning_text", "text": ""}))),
            ),
            Open::Message { id, .. } => (
                message_item(id, "in_progress", None),
                Some((id.clone(), text_part(""))),
            ),
            Open::Call {
                id, call_id, name, ..
            } => (call_item(id, call_id, name, "", "in_progress"), None),
        };
        let ev = self.event(
            "response.output_item.added",
            json!({"output_index": i, "item": item}),
        );
        out.push(ev);
        if let Some((id, part)) = part {
            let ev = self.event(
                "response.content_part.added",
                json!({"item_id": id, "output_index": i, "content_index": 0, "part": part}),
            );
            out.push(ev);
        }
        self.open = Some(open);
    }

    /// Ends the open item, if any.
    fn close(&mut self, out: &mut Vec<Ev>) {
        let Some(open) = self.open.take() else {
            return;
        };
        let i = self.index();
        let item = match open {
            Open::Reasoning { id, text } => {
                let e = self.event(
                    "response.reasoning_text.done",
                    json!({"item_id": id,
                    "output_index": i, "content_index": 0, "text": text}),
                );
                out.push(e);
                let e = self.event(
                    "response.content_part.done",
                    json!({"item_id": id,
                    "output_index": i, "content_index": 0,
                    "part": {"type": "reasoning_text", "text": text}}),
                );
                out.push(e);
                reasoning_item(&id, &text)
            }
            Open::Message { id, text } => {
                let e = self.event(
                    "response.output_text.done",
                    json!({"item_id": id,
                    "output_index": i, "content_index": 0, "text": text, "logprobs": []}),
                );
                out.push(e);
                let e = self.event(
                    "response.content_part.done",
                    json!({"item_id": id,
                    "output_index": i, "content_index": 0, "part": text_part(&text)}),
                );
                out.push(e);
                message_item(&id, "completed", Some(&text))
            }
            Open::Call {
                id,
                call_id,
                name,
                args,
            } => {
                let e = self.event(
                    "response.function_call_arguments.done",
                    json!({
                    "item_id": id, "output_index": i, "name": name, "arguments": args}),
                );
                out.push(e);
                call_item(&id, &call_id, &name, &args, "completed")
            }
        };
        let e = self.event(
            "response.output_item.done",
            json!({"output_index": i, "item": item}),
        );
        out.push(e);
        self.output.push(item);
    }

    /// The events of `part`.
    pub fn part(&mut self, part: Part) -> Vec<Ev> {
        let mut out = vec![];
        let i = self.index();
        match part {
            Part::Reasoning(t) => {
                if !matches!(self.open, Some(Open::Reasoning { .. })) {
                    self.close(&mut out);
                    self.open(
                        Open::Reasoning {
                            id: new_id("rs"),
                            text: String::new(),
                        },
                        &mut out,
                    );
                }
                if let Some(Open::Reasoning { id, text }) = &mut self.open {
                    text.push_str(&t);
                    let data = json!({"item_id": id, "output_index": i, "content_index": 0,
                        "delta": t});
                    out.push(self.event("response.reasoning_text.delta", data));
                }
            }
            Part::Content(t) => {
                if !matches!(self.open, Some(Open::Message { .. })) {
                    self.pending.push_str(&t);
                    if self.pending.trim().is_empty() {
                        return out;
                    }
                    self.close(&mut out);
                    self.open(
                        Open::Message {
                            id: new_id("msg"),
                            text: String::new(),
                        },
                        &mut out,
                    );
                    let pending = std::mem::take(&mut self.pending);
                    return self.text(pending, out);
                }
                return self.text(t, out);
            }
            Part::CallStart { id, name, .. } => {
                self.close(&mut out);
                self.pending.clear();
                self.open(
                    Open::Call {
                        id: new_id("fc"),
                        call_id: id,
                        name,
                        args: String::new(),
                    },
                    &mut out,
                );
            }
            Part::CallArgs { args: a, .. } => {
                if let Some(Open::Call { id, args, .. }) = &mut self.open {
                    args.push_str(&a);
                    let data = json!({"item_id": id, "output_index": i, "delta": a});
                    out.push(self.event("response.function_call_arguments.delta", data));
                }
            }
        }
        out
    }

    fn text(&mut self, t: String, mut out: Vec<Ev>) -> Vec<Ev> {
        let i = self.index();
        if let Some(Open::Message { id, text }) = &mut self.open {
            text.push_str(&t);
            let data = json!({"item_id": id, "output_index": i, "content_index": 0,
                "delta": t, "logprobs": []});
            out.push(self.event("response.output_text.delta", data));
        }
        out
    }

    /// The answer ended: the open item ends; an answer with no item gets an empty message.
    pub fn finish(&mut self) -> Vec<Ev> {
        let mut out = vec![];
        self.close(&mut out);
        if self.output.is_empty() {
            self.open(
                Open::Message {
                    id: new_id("msg"),
                    text: String::new(),
                },
                &mut out,
            );
            let pending = std::mem::take(&mut self.pending);
            if !pending.is_empty() {
                out = self.text(pending, out);
            }
            self.close(&mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(evs: &[Ev]) -> Vec<&'static str> {
        evs.iter().map(|(n, _)| *n).collect()
    }

    #[test]
    fn reasoning_then_a_call_streams_two_items_and_no_blank_message() {
        let mut s = Streamer::new();
        let mut evs = vec![];
        evs.extend(s.part(Part::Reasoning("let me ".into())));
        evs.extend(s.part(Part::Reasoning("think".into())));
        evs.extend(s.part(Part::Content("\n\n".into())));
        evs.extend(s.part(Part::CallStart {
            index: 0,
            id: "call_1".into(),
            name: "f".into(),
        }));
        evs.extend(s.part(Part::CallArgs {
            index: 0,
            args: "{\"a\":".into(),
        }));
        evs.extend(s.part(Part::CallArgs {
            index: 0,
            args: "1}".into(),
        }));
        evs.extend(s.finish());
        assert_eq!(
            names(&evs),
            [
                "response.output_item.added",
                "response.content_part.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
            ]
        );
        for (i, (_, d)) in evs.iter().enumerate() {
            assert_eq!(d["sequence_number"], i);
        }
        assert_eq!(s.output.len(), 2);
        assert_eq!(s.output[0]["content"][0]["text"], "let me think");
        assert_eq!(s.output[1]["arguments"], "{\"a\":1}");
        assert_eq!(s.output[1]["call_id"], "call_1");
        assert_eq!(evs[7].1["output_index"], 1);
        // The same answer whole gives the same items.
        let whole = items_of(&Parsed {
            reasoning: Some("let me think".into()),
            content: "\n\n".into(),
            calls: vec![crate::chat_output::Call {
                id: "call_1".into(),
                name: "f".into(),
                arguments: "{\"a\":1}".into(),
            }],
        });
        let types = |v: &[Value]| v.iter().map(|i| i["type"].clone()).collect::<Vec<_>>();
        assert_eq!(types(&whole), types(&s.output));
    }

    #[test]
    fn leading_whitespace_is_kept_once_text_follows_and_empty_answers_get_a_message() {
        let mut s = Streamer::new();
        let mut evs = s.part(Part::Content(" ".into()));
        assert!(evs.is_empty());
        evs.extend(s.part(Part::Content("Hi".into())));
        evs.extend(s.finish());
        assert_eq!(s.output[0]["content"][0]["text"], " Hi");
        let mut s = Streamer::new();
        let evs = s.finish();
        assert_eq!(names(&evs).len(), 5, "no delta: {:?}", names(&evs));
        assert_eq!(s.output[0]["type"], "message");
    }
}
