//! Reasoning split from content over HTTP: with a reasoning parser on, `<think>...</think>`
//! goes to `reasoning_content`, whole and streamed, and the rest to `content`. The model's
//! output is held to a thinking shape by a regex, so any model shows it.

use serde_json::{json, Value};

mod common;
use common::{engine, start_opts};

/// The SSE data lines of a streamed request, parsed.
async fn chunks(s: &common::Server, body: Value) -> Vec<Value> {
    let (chunks, _) = s.chunks("/v1/chat/completions", body).await;
    chunks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn think_blocks_become_reasoning_content() {
    let s = start_opts(engine(), |o| o.reasoning_parser = Some("qwen3".into())).await;
    let body = json!({"messages": [{"role": "user", "content": "Think, then answer."}],
        "guided_regex": "<think>[a-z ]{3,12}</think>[A-Z][a-z]{2,8}\\.", "max_tokens": 48,
        "temperature": 0, "logprobs": true});
    let (status, v) = s.post("/v1/chat/completions", body.clone()).await;
    assert_eq!(status, 200, "{v}");
    let m = &v["choices"][0]["message"];
    let reasoning = m["reasoning_content"].as_str().unwrap();
    let content = m["content"].as_str().unwrap();
    assert!((3..=12).contains(&reasoning.len()), "{m}");
    assert!(!content.contains("think>") && content.ends_with('.'), "{m}");
    // Every token keeps its logprob, whichever part its text went to.
    assert_eq!(
        v["choices"][0]["logprobs"]["content"]
            .as_array()
            .unwrap()
            .len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap()
    );

    let mut stream_body = body;
    stream_body["stream"] = json!(true);
    let (mut r, mut c, mut lps) = (String::new(), String::new(), 0);
    for ch in chunks(&s, stream_body).await {
        let choice = &ch["choices"][0];
        r.push_str(choice["delta"]["reasoning_content"].as_str().unwrap_or(""));
        c.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
        lps += choice["logprobs"]["content"].as_array().map_or(0, Vec::len);
    }
    assert_eq!((r.as_str(), c.as_str()), (reasoning, content));
    assert_eq!(
        lps as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap()
    );
    s.assert_drained().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_parser_think_stays_in_content() {
    let s = start_opts(engine(), |_| {}).await;
    let (status, v) = s
        .post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}],
                "guided_regex": "<think>ab</think>Cd\\.", "max_tokens": 24}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let m = &v["choices"][0]["message"];
    assert_eq!(m["content"], "<think>ab</think>Cd.");
    assert!(m.get("reasoning_content").is_none());
}
