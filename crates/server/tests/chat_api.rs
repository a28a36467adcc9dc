//! Chat Completions and Completions as OpenAI's clients expect them: a role-only first delta
//! per choice and no role after it; the usage chunk shaped like every other chunk;
//! `context_length_exceeded`; `logit_bias` (greedy output moved by it, OpenAI's limits);
//! `usage.prompt_tokens_details.cached_tokens` from prefix-cache hits; unknown fields
//! refused by name, pure hints accepted.

use serde_json::{json, Value};

mod common;
use common::start;

fn chat(content: &str, extra: Value) -> Value {
    let mut b = json!({"messages": [{"role": "user", "content": content}], "max_tokens": 8,
        "temperature": 0});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_chat_has_one_role_delta_per_choice_and_a_usage_chunk_like_the_others() {
    let s = start(|_| {}, None).await;
    let body = chat(
        "Name three colors.",
        json!({"n": 2, "temperature": 1.0, "seed": 5, "stream": true,
            "stream_options": {"include_usage": true}}),
    );
    let (cs, done) = s.chunks("/v1/chat/completions", body).await;
    assert!(done);
    let id = cs[0]["id"].as_str().unwrap().to_string();
    for c in &cs {
        assert_eq!(c["id"], id.as_str(), "{c}");
        assert_eq!(c["object"], "chat.completion.chunk", "{c}");
        assert!(c["created"].is_u64() && c["model"] == "smol", "{c}");
    }
    let (usage, rest) = cs.split_last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert!(usage["usage"]["completion_tokens"].as_u64().unwrap() >= 2);
    assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    for index in 0..2 {
        let deltas: Vec<&Value> = rest
            .iter()
            .map(|c| &c["choices"][0])
            .filter(|c| c["index"] == index)
            .collect();
        assert_eq!(
            deltas[0]["delta"],
            json!({"role": "assistant", "content": ""}),
            "choice {index}: {:?}",
            deltas[0]
        );
        assert!(deltas[0]["finish_reason"].is_null());
        for d in &deltas[1..] {
            assert!(d["delta"].get("role").is_none(), "{d}");
        }
        assert!(deltas.last().unwrap()["finish_reason"].is_string());
        assert!(deltas.len() >= 3, "{deltas:?}");
    }
    // Without include_usage: no usage chunk, every chunk has a choice.
    let (cs, _) = s
        .chunks("/v1/chat/completions", chat("Hi", json!({"stream": true})))
        .await;
    assert!(cs
        .iter()
        .all(|c| c["choices"].as_array().unwrap().len() == 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_completion_usage_chunk_is_shaped_like_the_others() {
    let s = start(|_| {}, None).await;
    let body = json!({"prompt": "The capital of France is", "max_tokens": 4, "stream": true,
        "stream_options": {"include_usage": true}});
    let (cs, done) = s.chunks("/v1/completions", body).await;
    assert!(done);
    let usage = cs.last().unwrap();
    assert_eq!(usage["object"], "text_completion");
    assert_eq!(usage["id"], cs[0]["id"]);
    assert_eq!(usage["model"], "smol");
    assert!(usage["created"].is_u64());
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 4);
    assert!(usage["usage"]["prompt_tokens_details"]["cached_tokens"].is_u64());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_over_the_context_is_context_length_exceeded() {
    let s = start(|_| {}, None).await;
    let long = "hello ".repeat(700);
    let (status, v) = s.post("/v1/chat/completions", chat(&long, json!({}))).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    assert_eq!(v["error"]["param"], "messages");
    let (status, v) = s
        .post("/v1/completions", json!({"prompt": long, "max_tokens": 2}))
        .await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    assert_eq!(v["error"]["param"], "prompt");
    // Other errors keep code null.
    let (status, v) = s
        .post("/v1/completions", json!({"prompt": "x", "max_tokens": 0}))
        .await;
    assert_eq!(status, 400);
    assert!(v["error"]["code"].is_null(), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logit_bias_moves_greedy_output_within_openais_limits() {
    let engine = common::engine();
    let tok = engine.tokenizer.clone();
    let s = common::start_engine(engine, |_| {}, None).await;
    let prompt = tok.encode("The capital of France is").unwrap();
    let body = |max: usize, bias: Value| {
        json!({"prompt": prompt, "max_tokens": max, "temperature": 0, "logit_bias": bias,
            "ignore_eos": true})
    };
    let text = |v: &Value| v["choices"][0]["text"].as_str().unwrap().to_string();
    let (_, plain) = s.post("/v1/completions", body(4, json!({}))).await;
    let plain = text(&plain);
    // +100 on a token: greedy output is that token, every time.
    let x = tok.encode(" banana").unwrap()[0];
    let xs = tok.decode(&[x]).unwrap();
    let (status, v) = s
        .post("/v1/completions", body(3, json!({x.to_string(): 100})))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(text(&v), xs.repeat(3), "{v}");
    // -100 on the greedy first token: the output changes.
    let first = tok.encode(&plain).unwrap()[0];
    let (_, v) = s
        .post("/v1/completions", body(4, json!({first.to_string(): -100})))
        .await;
    assert_ne!(text(&v), plain);
    assert!(!text(&v).starts_with(&tok.decode(&[first]).unwrap()), "{v}");
    // Chat too, whole and streamed.
    let (status, v) = s
        .post(
            "/v1/chat/completions",
            chat(
                "Hi",
                json!({"logit_bias": {x.to_string(): 100}, "max_tokens": 3}),
            ),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], xs.repeat(3), "{v}");
    let (streamed, _, _) = s
        .stream(
            "/v1/chat/completions",
            chat(
                "Hi",
                json!({"logit_bias": {x.to_string(): 100}, "max_tokens": 3, "stream": true}),
            ),
        )
        .await;
    assert_eq!(streamed, xs.repeat(3));
    // With a grammar: the bias cannot take the output outside it.
    let (status, v) = s
        .post(
            "/v1/chat/completions",
            chat(
                "Pick one",
                json!({"logit_bias": {x.to_string(): 100}, "max_tokens": 8,
                    "guided_choice": ["yes", "no"]}),
            ),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let c = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(c == "yes" || c == "no", "{v}");
    // Limits: 300 entries pass, 301 do not; values in [-100, 100]; keys token ids in the
    // vocabulary.
    let many = |n: u32| Value::Object((100..100 + n).map(|t| (t.to_string(), json!(1))).collect());
    let (status, v) = s
        .post(
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": 1, "logit_bias": many(300)}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    for bad in [
        many(301),
        json!({"33": 100.5}),
        json!({"33": -101}),
        json!({"abc": 1}),
        json!({"33": "1"}),
        json!({"99999999": 1}),
        json!({"-1": 1}),
    ] {
        for (path, body) in [
            (
                "/v1/completions",
                json!({"prompt": "x", "max_tokens": 1, "logit_bias": bad}),
            ),
            (
                "/v1/chat/completions",
                chat("x", json!({"logit_bias": bad})),
            ),
        ] {
            let (status, v) = s.post(path, body).await;
            assert_eq!(status, 400, "{path} {bad}: {v}");
            assert_eq!(v["error"]["param"], "logit_bias", "{v}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_tokens_count_the_prefix_cache_hits() {
    let s = start(|_| {}, None).await;
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(20);
    for stream in [false, true] {
        let prompt = format!("{stream} {long}");
        let mut cached = vec![];
        for _ in 0..2 {
            for (path, body) in [(
                "/v1/completions",
                json!({"prompt": prompt, "max_tokens": 2, "stream": stream}),
            )] {
                let mut body = body;
                if stream {
                    body["stream_options"] = json!({"include_usage": true});
                    let (cs, _) = s.chunks(path, body).await;
                    cached.push(cs.last().unwrap()["usage"].clone());
                } else {
                    let (status, v) = s.post(path, body).await;
                    assert_eq!(status, 200, "{v}");
                    cached.push(v["usage"].clone());
                }
            }
        }
        assert_eq!(
            cached[0]["prompt_tokens_details"]["cached_tokens"], 0,
            "{cached:?}"
        );
        let hit = cached[1]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        let prompt_tokens = cached[1]["prompt_tokens"].as_u64().unwrap();
        assert!(hit > 0 && hit < prompt_tokens, "{cached:?}");
    }
    // Chat, whole and streamed.
    let content = format!("chat {long}");
    let first = s
        .post(
            "/v1/chat/completions",
            chat(&content, json!({"max_tokens": 2})),
        )
        .await
        .1;
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let second = s
        .post(
            "/v1/chat/completions",
            chat(&content, json!({"max_tokens": 2})),
        )
        .await
        .1;
    assert!(
        second["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0,
        "{second}"
    );
    let (cs, _) = s
        .chunks(
            "/v1/chat/completions",
            chat(
                &content,
                json!({"max_tokens": 2, "stream": true, "stream_options": {"include_usage": true}}),
            ),
        )
        .await;
    let u = &cs.last().unwrap()["usage"];
    assert!(
        u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0,
        "{u}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_are_refused_by_name_and_hints_accepted() {
    let s = start(|_| {}, None).await;
    let hints = json!({"user": "u1", "metadata": {"k": "v"}, "service_tier": "auto",
        "store": false, "prompt_cache_key": "k", "safety_identifier": "s",
        "prediction": {"type": "content", "content": "x"}});
    let (status, v) = s
        .post("/v1/chat/completions", chat("Hi", hints.clone()))
        .await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = s
        .post(
            "/v1/chat/completions",
            chat("Hi", json!({"modalities": ["text"]})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let mut body = hints;
    body["prompt"] = json!("Hi");
    body["max_tokens"] = json!(2);
    body["best_of"] = json!(1);
    let (status, v) = s.post("/v1/completions", body).await;
    assert_eq!(status, 200, "{v}");
    for (path, body, param) in [
        (
            "/v1/chat/completions",
            chat("Hi", json!({"frobnicate": 1})),
            "frobnicate",
        ),
        (
            "/v1/chat/completions",
            chat("Hi", json!({"modalities": ["text", "audio"]})),
            "modalities",
        ),
        (
            "/v1/chat/completions",
            chat("Hi", json!({"audio": {"voice": "alloy", "format": "wav"}})),
            "audio",
        ),
        (
            "/v1/chat/completions",
            chat("Hi", json!({"reasoning_effort": "low"})),
            "reasoning_effort",
        ),
        (
            "/v1/completions",
            json!({"prompt": "Hi", "suffix": "end"}),
            "suffix",
        ),
        (
            "/v1/completions",
            json!({"prompt": "Hi", "best_of": 3}),
            "best_of",
        ),
    ] {
        let (status, v) = s.post(path, body).await;
        assert_eq!(status, 400, "{path} {param}: {v}");
        assert_eq!(v["error"]["param"], param, "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(param),
            "{v}"
        );
    }
}
