//! Responses input items as chat-template messages: messages, function calls (joined to the
//! assistant turn before them), their outputs (each naming an earlier call), reasoning.

use std::collections::HashMap;

use serde_json::{json, Value};
use tessera_tokenizer::ChatMessage;

use crate::api::ApiError;
use crate::text::quote;

fn bad(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::invalid(param, message)
}

/// Input items as template messages.
#[derive(Default)]
pub struct Conversation {
    pub messages: Vec<ChatMessage>,
    /// Calls made so far, by call id: their function's name.
    calls: HashMap<String, String>,
    /// The last message is an assistant turn that a function call joins.
    assistant_open: bool,
}

/// The text of a content (a string or text parts).
fn text_of(content: &Value, at: &str) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut s = String::new();
            for (j, p) in parts.iter().enumerate() {
                let ty = p.get("type").and_then(Value::as_str).unwrap_or("");
                match ty {
                    "input_text" | "output_text" | "text" | "reasoning_text" => {
                        s.push_str(p.get("text").and_then(Value::as_str).ok_or_else(|| {
                            bad(
                                &format!("{at}[{j}].text"),
                                format!("{at}[{j}] needs a text"),
                            )
                        })?)
                    }
                    "refusal" => s.push_str(p.get("refusal").and_then(Value::as_str).unwrap_or("")),
                    _ => {
                        return Err(bad(
                            &format!("{at}[{j}].type"),
                            format!(
                                "content part type {} is not supported (text only)",
                                quote(ty)
                            ),
                        ))
                    }
                }
            }
            Ok(s)
        }
        _ => Err(bad(at, format!("{at} must be a string or a list of parts"))),
    }
}

impl Conversation {
    pub fn push(&mut self, item: &Value, at: &str) -> Result<(), ApiError> {
        let o = item
            .as_object()
            .ok_or_else(|| bad(at, format!("{at} must be an object")))?;
        let field = |k: &str| -> Result<&str, ApiError> {
            o.get(k)
                .and_then(Value::as_str)
                .ok_or_else(|| bad(&format!("{at}.{k}"), format!("{at} needs a string {k}")))
        };
        let ty = match o.get("type") {
            None if o.contains_key("role") => "message",
            None => return Err(bad(&format!("{at}.type"), format!("{at} needs a type"))),
            Some(t) => t.as_str().unwrap_or(""),
        };
        match ty {
            "message" => {
                let role = field("role")?;
                let role = match role {
                    "user" | "assistant" | "system" => role,
                    "developer" => "system",
                    _ => {
                        return Err(bad(
                            &format!("{at}.role"),
                            format!("unknown role {}", quote(role)),
                        ))
                    }
                };
                let content = o.get("content").ok_or_else(|| {
                    bad(&format!("{at}.content"), format!("{at} needs a content"))
                })?;
                let text = text_of(content, &format!("{at}.content"))?;
                self.messages.push(ChatMessage::new(role, &text));
                self.assistant_open = role == "assistant";
            }
            "function_call" => {
                let call_id = field("call_id")?;
                let name = field("name")?;
                let args = field("arguments")?;
                self.calls.insert(call_id.into(), name.into());
                let arguments = serde_json::from_str::<Value>(args).unwrap_or_else(|_| json!(args));
                let call = json!({"id": call_id, "type": "function",
                    "function": {"name": name, "arguments": arguments}});
                if !self.assistant_open {
                    self.messages.push(ChatMessage::new("assistant", ""));
                    self.assistant_open = true;
                }
                let last = self.messages.last_mut().expect("an assistant message");
                match &mut last.tool_calls {
                    Some(Value::Array(calls)) => calls.push(call),
                    _ => last.tool_calls = Some(json!([call])),
                }
            }
            "function_call_output" => {
                let call_id = field("call_id")?;
                let Some(name) = self.calls.get(call_id) else {
                    return Err(bad(
                        &format!("{at}.call_id"),
                        format!(
                            "{at}: no function_call with call_id {} comes before this output",
                            quote(call_id)
                        ),
                    ));
                };
                let output = o
                    .get("output")
                    .ok_or_else(|| bad(&format!("{at}.output"), format!("{at} needs an output")))?;
                let mut m = ChatMessage::new("tool", &text_of(output, &format!("{at}.output"))?);
                m.tool_call_id = Some(call_id.into());
                m.name = Some(name.clone());
                self.messages.push(m);
                self.assistant_open = false;
            }
            // Earlier reasoning is not shown to the model again (chat templates drop it).
            "reasoning" => {}
            _ => {
                return Err(bad(
                    &format!("{at}.type"),
                    format!(
                        "input item type {} is not supported (message, function_call, \
                         function_call_output, reasoning)",
                        quote(ty)
                    ),
                ))
            }
        }
        Ok(())
    }
}
