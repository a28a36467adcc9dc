//! The Anthropic Messages dialect over plain HTTP, on the default model: whole and streamed
//! answers (the events in Anthropic's order), count_tokens, the required `max_tokens`,
//! refused blocks and unknown tool_use ids, Anthropic's error shape, and `x-api-key`.

use serde_json::{json, Value};

mod common;
use common::{start, Server};

fn ask(max_tokens: usize) -> Value {
    json!({"model": "smol", "max_tokens": max_tokens, "temperature": 0,
        "system": "You are brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]}]})
}

/// Checks Anthropic's error shape and returns the message.
fn anthropic_error(status: u16, v: &Value, want_status: u16, want_type: &str) -> String {
    assert_eq!(status, want_status, "{v}");
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], want_type, "{v}");
    v["error"]["message"]
        .as_str()
        .expect("a message")
        .to_string()
}

/// A streamed request's events: (name, data).
async fn events(s: &Server, body: Value) -> Vec<(String, Value)> {
    let mut out = vec![];
    for (n, d) in s.sse("/v1/messages", body).await {
        let v: Value = serde_json::from_str(&d).unwrap();
        assert_eq!(v["type"], n, "the event is named after its type");
        out.push((n, v));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_streamed_and_counted() {
    let s = start(|_| {}, None).await;
    let (st, v) = s.post("/v1/messages", ask(8)).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert!(v["id"].as_str().unwrap().starts_with("msg_"), "{v}");
    assert_eq!(v["stop_reason"], "max_tokens");
    assert_eq!(v["stop_sequence"], Value::Null);
    assert_eq!(v["usage"]["output_tokens"], 8);
    let content = v["content"].as_array().unwrap();
    assert_eq!(content.len(), 1, "{v}");
    assert_eq!(content[0]["type"], "text");
    let text = content[0]["text"].as_str().unwrap().to_string();
    assert!(!text.is_empty());

    // count_tokens renders the same prompt.
    let mut count = ask(8);
    for k in ["max_tokens", "temperature"] {
        count.as_object_mut().unwrap().remove(k);
    }
    let (st, c) = s.post("/v1/messages/count_tokens", count).await;
    assert_eq!(st, 200, "{c}");
    assert_eq!(c, json!({"input_tokens": v["usage"]["input_tokens"]}));
    // A field count_tokens does not take is refused, naming it.
    let (st, e) = s.post("/v1/messages/count_tokens", ask(8)).await;
    assert!(anthropic_error(st, &e, 400, "invalid_request_error").contains("max_tokens"));

    // The same answer streamed, in Anthropic's event order.
    let mut body = ask(8);
    body["stream"] = json!(true);
    let evs = events(&s, body).await;
    let names: Vec<&str> = evs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[0], "message_start");
    assert_eq!(names[1], "content_block_start");
    assert_eq!(
        &names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    assert!(
        names[2..names.len() - 3]
            .iter()
            .all(|n| *n == "content_block_delta"),
        "{names:?}"
    );
    let start = &evs[0].1["message"];
    assert_eq!(start["content"], json!([]));
    assert_eq!(start["usage"]["input_tokens"], v["usage"]["input_tokens"]);
    assert_eq!(
        evs[1].1["content_block"],
        json!({"type": "text", "text": ""})
    );
    let streamed: String = evs
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .map(|(_, d)| {
            assert_eq!(d["index"], 0);
            assert_eq!(d["delta"]["type"], "text_delta");
            d["delta"]["text"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(streamed, text);
    let delta = &evs[evs.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "max_tokens");
    assert_eq!(delta["usage"]["output_tokens"], 8);

    // A stop sequence (a word of the answer) ends it there, and is named.
    let word = text
        .split_whitespace()
        .nth(1)
        .expect("two words")
        .to_string();
    let mut body = ask(8);
    body["stop_sequences"] = json!(["never in the answer", word]);
    let (st, v) = s.post("/v1/messages", body.clone()).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["stop_reason"], "stop_sequence", "{v}");
    assert_eq!(v["stop_sequence"], json!(word));
    body["stream"] = json!(true);
    let evs = events(&s, body).await;
    let delta = &evs[evs.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "stop_sequence", "{delta}");
    assert_eq!(delta["delta"]["stop_sequence"], json!(word));
    let cut = v["content"][0]["text"].as_str().unwrap_or("");
    assert!(
        !cut.contains(&word) && text.starts_with(cut),
        "{cut:?} vs {text:?}"
    );

    // The ignore_eos extension decodes to max_tokens past the end of turn.
    let one_word = |ignore: bool| {
        json!({"model": "smol", "max_tokens": 40, "temperature": 0, "ignore_eos": ignore,
            "system": "Answer with one word.",
            "messages": [{"role": "user", "content": "Say yes."}]})
    };
    let (_, v) = s.post("/v1/messages", one_word(false)).await;
    assert_eq!(v["stop_reason"], "end_turn", "{v}");
    let (st, v) = s.post("/v1/messages", one_word(true)).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (&v["stop_reason"], &v["usage"]["output_tokens"]),
        (&json!("max_tokens"), &json!(40)),
        "{v}"
    );
    s.assert_drained().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_anthropic_errors() {
    let s = start(|_| {}, None).await;
    let mut body = ask(8);
    body.as_object_mut().unwrap().remove("max_tokens");
    let (st, e) = s.post("/v1/messages", body).await;
    assert!(anthropic_error(st, &e, 400, "invalid_request_error").contains("max_tokens"));

    let mut body = ask(8);
    body["messages"][0]["content"] = json!([{"type": "image", "source": {"type": "base64",
        "media_type": "image/png", "data": "AAAA"}}]);
    let (st, e) = s.post("/v1/messages", body).await;
    assert!(anthropic_error(st, &e, 400, "invalid_request_error").contains("\"image\""));

    let mut body = ask(8);
    body["messages"] = json!([{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_nowhere", "content": "42"}]}]);
    let (st, e) = s.post("/v1/messages", body).await;
    assert!(anthropic_error(st, &e, 400, "invalid_request_error").contains("toolu_nowhere"));

    let mut body = ask(8);
    body["mcp_servers"] = json!([]);
    let (st, e) = s.post("/v1/messages", body).await;
    assert!(anthropic_error(st, &e, 400, "invalid_request_error").contains("mcp_servers"));

    let mut body = ask(8);
    body["model"] = json!("no-such-model");
    let (st, e) = s.post("/v1/messages", body).await;
    assert!(anthropic_error(st, &e, 404, "not_found_error").contains("no-such-model"));

    // The body reader's own refusal, in the same shape.
    let r = s
        .client
        .post(format!("{}/v1/messages", s.base))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    let st = r.status().as_u16();
    let e: Value = r.json().await.unwrap();
    anthropic_error(st, &e, 400, "invalid_request_error");
    s.assert_drained().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_api_key_and_anthropic_headers() {
    let s = start(|_| {}, Some("k3y")).await;
    let url = format!("{}/v1/messages?beta=true", s.base);
    let r = s.client.post(&url).json(&ask(2)).send().await.unwrap();
    let st = r.status().as_u16();
    let e: Value = r.json().await.unwrap();
    anthropic_error(st, &e, 401, "authentication_error");
    let r = s
        .client
        .post(&url)
        .header("x-api-key", "wrong")
        .json(&ask(2))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = s
        .client
        .post(&url)
        .header("x-api-key", "k3y")
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", "token-counting-2024-11-01")
        .json(&ask(2))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["usage"]["output_tokens"], 2, "{v}");
    // x-api-key opens every route, like Bearer; Bearer opens these.
    let r = s
        .client
        .get(format!("{}/v1/models", s.base))
        .header("x-api-key", "k3y")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = s
        .client
        .post(format!("{}/v1/messages/count_tokens", s.base))
        .bearer_auth("k3y")
        .json(&json!({"model": "smol", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_server_is_overloaded() {
    let s = start(
        |c| {
            c.max_num_seqs = 1;
            c.max_num_batched_tokens = 16;
            c.max_waiting = 1;
        },
        None,
    )
    .await;
    let mut tasks = vec![];
    for _ in 0..6 {
        let c = s.client.clone();
        let url = format!("{}/v1/messages", s.base);
        tasks.push(tokio::spawn(async move {
            let r = c.post(url).json(&ask(40)).send().await.unwrap();
            let st = r.status().as_u16();
            (st, r.json::<Value>().await.unwrap())
        }));
    }
    let mut codes = vec![];
    for t in tasks {
        let (st, v) = t.await.unwrap();
        if st == 503 {
            anthropic_error(st, &v, 503, "overloaded_error");
        } else {
            assert_eq!(st, 200, "{v}");
        }
        codes.push(st);
    }
    assert!(codes.contains(&503), "{codes:?}");
    s.assert_drained().await;
}
