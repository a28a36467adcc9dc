//! OpenAI conformance details over HTTP: `null` means the default for every optional field;
//! `top_logprobs` without `logprobs: true` is refused; the limits errors quote are the ones
//! enforced (the value at the limit passes, one past it fails); messages that quote client
//! input are short and carry no control characters.

use serde_json::{json, Value};

mod common;
use common::start;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn null_means_default() {
    let s = start(|_| {}, None).await;
    let nulls = json!({"model": null, "max_tokens": null, "max_completion_tokens": null,
        "temperature": null, "top_p": null, "top_k": null, "min_p": null,
        "presence_penalty": null, "frequency_penalty": null, "repetition_penalty": null,
        "stop": null, "seed": null, "n": null, "stream": null, "stream_options": null,
        "priority": null, "ignore_eos": null, "user": null, "logit_bias": null});
    let mut body = nulls.clone();
    body["prompt"] = json!("The capital of France is");
    body["echo"] = Value::Null;
    body["logprobs"] = Value::Null;
    body["suffix"] = Value::Null;
    let (status, v) = s.post("/v1/completions", body).await;
    assert_eq!(status, 200, "{v}");
    let n = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((1..=16).contains(&n), "the default max_tokens is 16: {v}");
    assert!(v["choices"][0]["logprobs"].is_null());

    let mut body = nulls;
    body["messages"] = json!([{"role": "user", "content": "Hi", "name": null}]);
    body["logprobs"] = Value::Null;
    body["top_logprobs"] = Value::Null;
    body["tools"] = Value::Null;
    let (status, v) = s.post("/v1/chat/completions", body.clone()).await;
    assert_eq!(status, 200, "{v}");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": null});
    let (_, finish, done) = s.stream("/v1/chat/completions", body).await;
    assert!(finish.is_some() && done);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_logprobs_requires_logprobs() {
    let s = start(|_| {}, None).await;
    let chat = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                           "temperature": 0});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    for extra in [
        json!({"top_logprobs": 2}),
        json!({"top_logprobs": 2, "logprobs": false}),
        json!({"top_logprobs": 0, "logprobs": null}),
    ] {
        let (status, v) = s.post("/v1/chat/completions", chat(extra.clone())).await;
        assert_eq!(
            (status, v["error"]["param"].as_str()),
            (400, Some("top_logprobs")),
            "{extra}"
        );
        assert!(
            v["error"]["message"].as_str().unwrap().contains("logprobs"),
            "{v}"
        );
    }
    let (status, v) = s
        .post(
            "/v1/chat/completions",
            chat(json!({"logprobs": true, "top_logprobs": 2})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let lp = &v["choices"][0]["logprobs"]["content"];
    assert_eq!(lp[0]["top_logprobs"].as_array().unwrap().len(), 2, "{v}");
    let (status, v) = s
        .post(
            "/v1/chat/completions",
            chat(json!({"logprobs": true, "top_logprobs": 21})),
        )
        .await;
    assert_eq!(
        (status, v["error"]["param"].as_str()),
        (400, Some("top_logprobs")),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("between 0 and 20"),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quoted_limits_are_the_enforced_ones() {
    // Context 512: a prompt of 511 tokens is the longest taken.
    let s = start(|_| {}, None).await;
    let (status, v) = s
        .post(
            "/v1/completions",
            json!({"prompt": vec![504u32; 511], "max_tokens": 1}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = s
        .post(
            "/v1/completions",
            json!({"prompt": vec![504u32; 512], "max_tokens": 1}),
        )
        .await;
    assert_eq!(status, 400);
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("has 512 tokens") && msg.contains("at most 511"),
        "{msg}"
    );

    for (body, param, quoted) in [
        (
            json!({"max_tokens": 1_048_577}),
            "max_tokens",
            "between 1 and 1048576",
        ),
        (
            json!({"max_tokens": -3}),
            "max_tokens",
            "between 1 and 1048576",
        ),
        (
            json!({"temperature": 2.5}),
            "temperature",
            "between 0 and 2",
        ),
        (
            json!({"top_p": 1.5}),
            "top_p",
            "greater than 0 and at most 1",
        ),
        (
            json!({"repetition_penalty": 11}),
            "repetition_penalty",
            "at most 10",
        ),
        (json!({"n": 17}), "n", "between 1 and 16"),
        (json!({"logprobs": 21}), "logprobs", "between 0 and 20"),
        (json!({"prompt": [999_999]}), "prompt", "0 to 49151"),
    ] {
        let mut b = json!({"prompt": "Hi"});
        for (k, v) in body.as_object().unwrap() {
            b[k] = v.clone();
        }
        let (status, v) = s.post("/v1/completions", b).await;
        assert_eq!(
            (status, v["error"]["param"].as_str()),
            (400, Some(param)),
            "{v}"
        );
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(quoted), "{param}: {msg}");
    }
}

fn assert_printable_and_short(v: &Value) {
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.chars().count() < 600, "{} chars", msg.chars().count());
    assert!(!msg.chars().any(|c| c.is_control()), "{msg:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_quoting_input_are_short_and_printable() {
    let s = start(|_| {}, None).await;
    let nasty = format!("\u{1b}[2J\r\n{}", "x".repeat(20_000));
    let (status, v) = s
        .post(
            "/v1/chat/completions",
            json!({"messages": [{"role": nasty, "content": "Hi"}]}),
        )
        .await;
    assert_eq!(status, 400);
    assert_printable_and_short(&v);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("\\u{001b}[2J\\r\\n"),
        "{v}"
    );

    let (status, v) = s
        .post("/v1/completions", json!({"model": nasty, "prompt": "Hi"}))
        .await;
    assert_eq!(status, 404);
    assert_printable_and_short(&v);

    let (status, v) = s
        .post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user",
            "content": [{"type": nasty, "text": "x"}]}]}),
        )
        .await;
    assert_eq!(status, 400);
    assert_printable_and_short(&v);

    // A body that does not parse, with the offending input quoted by the parser.
    let (status, v) = s
        .post("/v1/chat/completions", json!({"messages": nasty}))
        .await;
    assert_eq!(status, 400);
    assert_printable_and_short(&v);

    let (status, v) = s
        .post("/v1/unload_lora_adapter", json!({"lora_name": nasty}))
        .await;
    assert_eq!(status, 404);
    assert_printable_and_short(&v);
}
