//! Reading a response stream: server-sent event lines, the chunk shapes of Completions and
//! Chat Completions and the typed events of Responses and Messages, OpenAI- and
//! Anthropic-style error bodies, and [`StreamAcc`], which turns the bytes of one stream into
//! token timings and counts, the output text and its finish reason.

use serde_json::Value;

/// One line of a server-sent event stream.
#[derive(Debug, Clone, PartialEq)]
pub enum SseLine {
    /// `data: [DONE]`.
    Done,
    /// `data: <json>`.
    Data(Value),
    /// `data:` with text that is not JSON.
    BadData(String),
    /// An `error:` line (some servers send errors this way).
    Error(String),
    /// Blank lines, comments (`: keep-alive`), `event:`/`id:`/`retry:` fields.
    Other,
}

/// Parses one line (without its line ending) of an event stream.
pub fn parse_sse_line(line: &str) -> SseLine {
    let line = line.trim_end_matches('\r');
    if let Some(rest) = line.strip_prefix("data:") {
        let rest = rest.trim();
        if rest == "[DONE]" {
            return SseLine::Done;
        }
        if rest.is_empty() {
            return SseLine::Other;
        }
        return match serde_json::from_str(rest) {
            Ok(v) => SseLine::Data(v),
            Err(_) => SseLine::BadData(rest.to_string()),
        };
    }
    if let Some(rest) = line.strip_prefix("error:") {
        return SseLine::Error(error_message(rest.trim()));
    }
    SseLine::Other
}

/// What one stream chunk says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChunkInfo {
    /// The first choice's content (`text` or `delta.content`).
    pub content: String,
    /// The first choice's `finish_reason`, when not null.
    pub finish_reason: Option<String>,
    pub completion_tokens: Option<usize>,
    pub prompt_tokens: Option<usize>,
    /// Tokens of the prompt the server's prefix cache served, when it says.
    pub cached_tokens: Option<usize>,
    pub error: Option<String>,
    /// The dialect's last event (Responses' `response.completed`, Messages'
    /// `message_stop`); Completions and Chat end with `data: [DONE]` instead.
    pub done: bool,
    /// The response's id, where the event carries it (Responses' `response.created`).
    pub response_id: Option<String>,
}

/// Reads a stream chunk of any of the four dialects: Responses and Messages events carry
/// a `type`, Completions and Chat chunks do not. Finish reasons are given in Chat's words
/// (`stop`, `length`, `tool_calls`).
pub fn chunk_info(v: &Value) -> ChunkInfo {
    if let Some(ty) = v.get("type").and_then(Value::as_str) {
        return event_info(ty, v);
    }
    let mut info = ChunkInfo::default();
    if let Some(e) = v.get("error") {
        info.error = Some(
            e.get("message")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| e.to_string()),
        );
        return info;
    }
    if let Some(c) = v
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
    {
        let text = c
            .get("text")
            .and_then(Value::as_str)
            .or_else(|| c.pointer("/delta/content").and_then(Value::as_str));
        info.content = text.unwrap_or_default().to_string();
        info.finish_reason = c
            .get("finish_reason")
            .and_then(Value::as_str)
            .map(str::to_string);
    }
    if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
        let n = |k: &str| u.get(k).and_then(Value::as_u64).map(|x| x as usize);
        info.completion_tokens = n("completion_tokens");
        info.prompt_tokens = n("prompt_tokens");
        info.cached_tokens = u
            .pointer("/prompt_tokens_details/cached_tokens")
            .and_then(Value::as_u64)
            .map(|x| x as usize);
    }
    info
}

/// Reads a typed event of the Responses or Messages stream.
fn event_info(ty: &str, v: &Value) -> ChunkInfo {
    let mut info = ChunkInfo::default();
    let text = |p: &str| v.pointer(p).and_then(Value::as_str).map(str::to_string);
    let count = |u: &Value, k: &str| u.get(k).and_then(Value::as_u64).map(|x| x as usize);
    match ty {
        // Responses.
        "response.created" => info.response_id = text("/response/id"),
        "response.output_text.delta" => info.content = text("/delta").unwrap_or_default(),
        "response.completed" | "response.incomplete" => {
            info.done = true;
            info.response_id = text("/response/id");
            info.finish_reason = Some(
                if ty == "response.completed" {
                    "stop"
                } else {
                    "length"
                }
                .into(),
            );
            if let Some(u) = v.pointer("/response/usage").filter(|u| u.is_object()) {
                info.prompt_tokens = count(u, "input_tokens");
                info.completion_tokens = count(u, "output_tokens");
                info.cached_tokens = u
                    .pointer("/input_tokens_details/cached_tokens")
                    .and_then(Value::as_u64)
                    .map(|x| x as usize);
            }
        }
        "response.failed" => {
            info.error =
                Some(text("/response/error/message").unwrap_or_else(|| "response.failed".into()))
        }
        // Messages.
        "message_start" => {
            if let Some(u) = v.pointer("/message/usage") {
                info.prompt_tokens = count(u, "input_tokens");
                info.cached_tokens = count(u, "cache_read_input_tokens");
            }
        }
        "content_block_delta" if v.pointer("/delta/type") == Some(&Value::from("text_delta")) => {
            info.content = text("/delta/text").unwrap_or_default()
        }
        "message_delta" => {
            info.finish_reason = text("/delta/stop_reason").map(|r| {
                match r.as_str() {
                    "max_tokens" => "length",
                    "tool_use" => "tool_calls",
                    _ => "stop",
                }
                .to_string()
            });
            if let Some(u) = v.get("usage") {
                info.completion_tokens = count(u, "output_tokens");
            }
        }
        "message_stop" => info.done = true,
        // Both: Responses' `{"type": "error", "message"}`, Anthropic's
        // `{"type": "error", "error": {"type", "message"}}`.
        "error" => {
            info.error = Some(
                text("/error/message")
                    .or_else(|| text("/message"))
                    .unwrap_or_else(|| v.to_string()),
            )
        }
        _ => {}
    }
    info
}

/// The message of an OpenAI-style error body (or the text itself, shortened).
pub fn error_message(text: &str) -> String {
    if let Ok(v) = serde_json::from_str::<Value>(text) {
        if let Some(m) = v.pointer("/error/message").and_then(Value::as_str) {
            return m.to_string();
        }
        if let Some(m) = v.get("error").and_then(Value::as_str) {
            return m.to_string();
        }
        if let Some(m) = v.get("message").and_then(Value::as_str) {
            return m.to_string();
        }
    }
    let t = text.trim();
    if t.chars().count() > 300 {
        format!("{}…", t.chars().take(300).collect::<String>())
    } else {
        t.to_string()
    }
}

/// Accumulates a response stream: bytes in, token timings out. Times are seconds since
/// the request was sent.
#[derive(Debug, Default)]
pub struct StreamAcc {
    buf: Vec<u8>,
    pub first_token: Option<f64>,
    pub last_token: Option<f64>,
    pub content_chunks: usize,
    pub usage_completion: Option<usize>,
    pub usage_prompt: Option<usize>,
    pub usage_cached: Option<usize>,
    /// The response's id (Responses).
    pub response_id: Option<String>,
    /// The content chunks concatenated.
    pub text: String,
    /// The last `finish_reason` the stream gave.
    pub finish_reason: Option<String>,
    pub done: bool,
    pub error: Option<String>,
}

impl StreamAcc {
    /// Feeds bytes received at time `t`; complete lines are parsed, a partial last line
    /// is kept for the next call.
    pub fn feed(&mut self, bytes: &[u8], t: f64) {
        self.buf.extend_from_slice(bytes);
        while let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=pos).collect();
            let line = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
            self.line(&line, t);
            if self.done || self.error.is_some() {
                return;
            }
        }
    }

    /// Parses what is left once the stream has ended (a last line without a newline).
    pub fn finish(&mut self, t: f64) {
        if !self.buf.is_empty() && !self.done && self.error.is_none() {
            let line = String::from_utf8_lossy(&std::mem::take(&mut self.buf)).into_owned();
            self.line(&line, t);
        }
    }

    fn line(&mut self, line: &str, t: f64) {
        match parse_sse_line(line) {
            SseLine::Done => self.done = true,
            SseLine::Error(e) => self.error = Some(e),
            SseLine::BadData(s) => self.error = Some(format!("unparsable stream data: {s}")),
            SseLine::Other => {}
            SseLine::Data(v) => {
                let info = chunk_info(&v);
                if let Some(e) = info.error {
                    self.error = Some(e);
                    return;
                }
                if !info.content.is_empty() {
                    self.content_chunks += 1;
                    self.first_token.get_or_insert(t);
                    self.last_token = Some(t);
                    self.text.push_str(&info.content);
                }
                if info.finish_reason.is_some() {
                    self.finish_reason = info.finish_reason;
                }
                if info.completion_tokens.is_some() {
                    self.usage_completion = info.completion_tokens;
                }
                if info.prompt_tokens.is_some() {
                    self.usage_prompt = info.prompt_tokens;
                }
                if info.cached_tokens.is_some() {
                    self.usage_cached = info.cached_tokens;
                }
                if info.response_id.is_some() {
                    self.response_id = info.response_id;
                }
                if info.done {
                    self.done = true;
                }
            }
        }
    }

    /// Output tokens: the usage count when the server sent one, else the content chunks.
    pub fn output_tokens(&self) -> usize {
        self.usage_completion.unwrap_or(self.content_chunks)
    }

    /// Seconds per output token after the first; `None` with fewer than two tokens.
    pub fn tpot(&self) -> Option<f64> {
        let n = self.output_tokens();
        match (self.first_token, self.last_token) {
            (Some(a), Some(b)) if n > 1 => Some((b - a) / (n - 1) as f64),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sse_lines() {
        assert_eq!(parse_sse_line("data: [DONE]"), SseLine::Done);
        assert_eq!(parse_sse_line("data:[DONE]\r"), SseLine::Done);
        assert_eq!(
            parse_sse_line(r#"data: {"a":1}"#),
            SseLine::Data(json!({"a": 1}))
        );
        assert_eq!(parse_sse_line(""), SseLine::Other);
        assert_eq!(parse_sse_line(": keep-alive"), SseLine::Other);
        assert_eq!(parse_sse_line("event: message"), SseLine::Other);
        assert_eq!(
            parse_sse_line("data: {oops"),
            SseLine::BadData("{oops".into())
        );
        assert_eq!(
            parse_sse_line(r#"error: {"error":{"message":"boom"}}"#),
            SseLine::Error("boom".into())
        );
    }

    #[test]
    fn chunk_contents() {
        let c =
            chunk_info(&json!({"choices": [{"index": 0, "text": "Hi", "finish_reason": null}]}));
        assert_eq!((c.content.as_str(), c.finish_reason), ("Hi", None));
        let c = chunk_info(
            &json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "abc"}}]}),
        );
        assert_eq!(c.content, "abc");
        // Role-only and finish chunks carry no content.
        let c = chunk_info(&json!({"choices": [{"delta": {"role": "assistant"}}]}));
        assert_eq!(c.content, "");
        let c = chunk_info(
            &json!({"choices": [{"delta": {"content": null}, "finish_reason": "length"}]}),
        );
        assert_eq!(
            (c.content.as_str(), c.finish_reason.as_deref()),
            ("", Some("length"))
        );
        let c = chunk_info(
            &json!({"object": "usage", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}}),
        );
        assert_eq!((c.prompt_tokens, c.completion_tokens), (Some(7), Some(5)));
        let c = chunk_info(&json!({"choices": [{"text": "x"}], "usage": null}));
        assert_eq!((c.content.as_str(), c.completion_tokens), ("x", None));
        let c = chunk_info(&json!({"error": {"message": "bad", "type": "server_error"}}));
        assert_eq!(c.error.as_deref(), Some("bad"));
    }

    #[test]
    fn responses_and_messages_events() {
        // Responses: deltas, then the usage and id of response.completed; no [DONE].
        let mut a = StreamAcc::default();
        a.feed(b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\"}}\n\n", 0.1);
        a.feed(b"data: {\"type\":\"response.output_item.added\"}\n\n", 0.15);
        a.feed(
            b"data: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n",
            0.2,
        );
        a.feed(
            b"data: {\"type\":\"response.output_text.delta\",\"delta\":\" there\"}\n\n",
            0.4,
        );
        assert!(!a.done);
        a.feed(b"data: {\"type\":\"response.incomplete\",\"response\":{\"id\":\"resp_1\",\"usage\":{\"input_tokens\":30,\"output_tokens\":3,\"input_tokens_details\":{\"cached_tokens\":16}}}}\n\n", 0.5);
        assert!(a.done);
        assert_eq!(a.text, "Hi there");
        assert_eq!((a.first_token, a.last_token), (Some(0.2), Some(0.4)));
        assert_eq!(
            (a.usage_prompt, a.output_tokens(), a.usage_cached),
            (Some(30), 3, Some(16))
        );
        assert_eq!(a.response_id.as_deref(), Some("resp_1"));
        assert_eq!(a.finish_reason.as_deref(), Some("length"));
        let e = chunk_info(&json!({"type": "error", "code": "x", "message": "boom"}));
        assert_eq!(e.error.as_deref(), Some("boom"));
        let e = chunk_info(
            &json!({"type": "response.failed", "response": {"error": {"message": "died"}}}),
        );
        assert_eq!(e.error.as_deref(), Some("died"));

        // Messages: text deltas only (not tool input), the stop reason in Chat's words.
        let mut m = StreamAcc::default();
        let ev = |v: serde_json::Value| format!("event: x\ndata: {v}\n\n").into_bytes();
        m.feed(&ev(json!({"type": "message_start", "message": {"usage": {"input_tokens": 12, "output_tokens": 1}}})), 0.1);
        m.feed(&ev(json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})), 0.1);
        m.feed(&ev(json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "A"}})), 0.2);
        m.feed(&ev(json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{"}})), 0.25);
        m.feed(&ev(json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "B"}})), 0.3);
        m.feed(&ev(json!({"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": 2}})), 0.35);
        assert!(!m.done);
        m.feed(&ev(json!({"type": "message_stop"})), 0.4);
        assert!(m.done);
        assert_eq!(
            (m.text.as_str(), m.content_chunks, m.output_tokens()),
            ("AB", 2, 2)
        );
        assert_eq!(
            (m.usage_prompt, m.finish_reason.as_deref()),
            (Some(12), Some("length"))
        );
        let e = chunk_info(
            &json!({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}),
        );
        assert_eq!(e.error.as_deref(), Some("busy"));
    }

    #[test]
    fn stream_accumulates_across_split_chunks() {
        let mut a = StreamAcc::default();
        // A line split across two reads, CRLF endings, a keep-alive comment.
        a.feed(b"data: {\"choices\":[{\"te", 0.10);
        a.feed(b"xt\":\"A\"}]}\r\n\r\n: ping\n", 0.20);
        a.feed(b"data: {\"choices\":[{\"text\":\"\"}]}\n\n", 0.25);
        a.feed(b"data: {\"choices\":[{\"text\":\"B\"}]}\n\n", 0.30);
        a.feed(b"data: {\"choices\":[{\"text\":\"C\"}]}\n\n", 0.50);
        assert_eq!(a.content_chunks, 3);
        assert_eq!(a.text, "ABC");
        assert_eq!((a.first_token, a.last_token), (Some(0.20), Some(0.50)));
        assert_eq!(a.output_tokens(), 3);
        assert!((a.tpot().unwrap() - 0.15).abs() < 1e-12);
        // The usage chunk overrides the chunk count.
        assert_eq!(a.finish_reason, None);
        a.feed(
            b"data: {\"choices\":[{\"text\":\"\",\"finish_reason\":\"stop\"}]}\n\n",
            0.55,
        );
        a.feed(
            b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":4}}\n\ndata: [DONE]\n\n",
            0.6,
        );
        assert!(a.done);
        assert_eq!(a.finish_reason.as_deref(), Some("stop"));
        assert_eq!(a.text, "ABC");
        assert_eq!(a.output_tokens(), 4);
        assert_eq!(a.usage_prompt, Some(9));
        assert!((a.tpot().unwrap() - 0.1).abs() < 1e-12);

        // A last line without its newline is parsed at the end; errors stop the stream.
        let mut b = StreamAcc::default();
        b.feed(b"data: [DONE]", 1.0);
        assert!(!b.done);
        b.finish(1.0);
        assert!(b.done);
        let mut c = StreamAcc::default();
        c.feed(b"data: {\"error\":{\"message\":\"engine died\"}}\n", 1.0);
        assert_eq!(c.error.as_deref(), Some("engine died"));
        let mut d = StreamAcc::default();
        d.feed(b"data: {\"choices\":[{\"text\":\"x\"}]}\n", 1.0);
        assert_eq!(d.tpot(), None);
    }
}
