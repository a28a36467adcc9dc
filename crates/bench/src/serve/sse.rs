//! Reading a response stream: server-sent event lines, the completions and chat chunk
//! shapes, OpenAI-style error bodies, and [`StreamAcc`], which turns the bytes of one
//! stream into token timings and counts, the output text and its finish reason.

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
    pub error: Option<String>,
}

/// Reads a completions or chat stream chunk.
pub fn chunk_info(v: &Value) -> ChunkInfo {
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
