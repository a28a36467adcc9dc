//! Reading the golden JSON files transformers' references write.

use serde_json::Value;
use tessera_tokenizer::ChatMessage;

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

pub fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

pub fn chat_messages(v: &Value) -> Option<Vec<ChatMessage>> {
    v.as_array().map(|msgs| {
        msgs.iter()
            .map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect()
    })
}
