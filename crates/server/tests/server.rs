//! End-to-end tests of `tessera serve` over plain HTTP, on the default model (fetched with
//! pip if missing): the OpenAI endpoints, streaming, stop strings, n > 1, chat templates,
//! errors, batch invariance under concurrency, cancellation, the bounded queue, and a load
//! of 1,000 requests with random cancellations that must leave no KV block in use.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};

mod common;
use common::{start, Server};

fn greedy(prompt: &str, max_tokens: usize) -> Value {
    json!({"model": "smol", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_endpoints_end_to_end() {
    let s = start(|_| {}, None).await;

    // Completions, and the same text streamed.
    let (st, v) = s
        .post("/v1/completions", greedy("The capital of France is", 12))
        .await;
    assert_eq!(st, 200, "{v}");
    let text = v["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(text.starts_with(" Paris"), "{text:?}");
    assert_eq!(v["usage"]["prompt_tokens"], 5);
    assert_eq!(v["usage"]["completion_tokens"], 12);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let mut body = greedy("The capital of France is", 12);
    body["stream"] = json!(true);
    let (streamed, finish, done) = s.stream("/v1/completions", body).await;
    assert_eq!(streamed, text);
    assert_eq!(finish.as_deref(), Some("length"));
    assert!(done, "stream must end with [DONE]");

    // Stop strings end the text before the stop string.
    let mut body = greedy("The capital of France is", 32);
    body["stop"] = json!(["\n"]);
    let (_, v) = s.post("/v1/completions", body).await;
    let t = v["choices"][0]["text"].as_str().unwrap();
    assert!(!t.contains('\n') && text.starts_with(t), "{t:?}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    // n > 1 with a seed: reproducible, one choice per index.
    let body = json!({"prompt": "Once upon a time", "max_tokens": 8, "temperature": 1.0, "n": 3, "seed": 7});
    let (_, a) = s.post("/v1/completions", body.clone()).await;
    let (_, b) = s.post("/v1/completions", body).await;
    assert_eq!(a["choices"].as_array().unwrap().len(), 3);
    assert_eq!(a["choices"], b["choices"]);
    assert_eq!(a["usage"]["completion_tokens"], 24);

    // Chat template, streaming and not.
    let chat = json!({"messages": [{"role": "user", "content": "What is 2+2?"}], "max_tokens": 10, "temperature": 0});
    let (st, v) = s.post("/v1/chat/completions", chat.clone()).await;
    assert_eq!(st, 200, "{v}");
    let content = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!content.is_empty());
    assert_eq!(v["object"], "chat.completion");
    let mut body = chat;
    body["stream"] = json!(true);
    assert_eq!(s.stream("/v1/chat/completions", body).await.0, content);

    // Logprobs.
    let mut body = greedy("Hello", 3);
    body["logprobs"] = json!(2);
    let (_, v) = s.post("/v1/completions", body).await;
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 3);
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 2);

    // Errors name the field.
    let (st, v) = s
        .post("/v1/completions", json!({"prompt": "x", "top_p": 2}))
        .await;
    assert_eq!((st, v["error"]["param"].as_str()), (400, Some("top_p")));
    let long = "word ".repeat(600);
    let (st, v) = s.post("/v1/completions", json!({"prompt": long})).await;
    assert_eq!(
        (st, v["error"]["param"].as_str()),
        (400, Some("prompt")),
        "{v}"
    );
    let (st, _) = s
        .post("/v1/completions", json!({"model": "other", "prompt": "x"}))
        .await;
    assert_eq!(st, 404);
    let (st, _) = s
        .post("/v1/chat/completions", json!({"messages": []}))
        .await;
    assert_eq!(st, 400);
    let r = s
        .client
        .post(format!("{}/v1/completions", s.base))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);

    // Models, health.
    let m: Value = s
        .client
        .get(format!("{}/v1/models", s.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(m["data"][0]["id"], "smol");
    assert_eq!(
        s.client
            .get(format!("{}/health", s.base))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    s.assert_drained().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_output_is_the_same_alone_and_among_16_others() {
    let s = start(|_| {}, None).await;
    let probe = greedy("Write a short poem about the sea.", 24);
    let (_, alone) = s.post("/v1/completions", probe.clone()).await;
    let alone = alone["choices"][0]["text"].as_str().unwrap().to_string();
    let mut tasks = vec![];
    for i in 0..16 {
        let s2 = Server {
            base: s.base.clone(),
            client: s.client.clone(),
        };
        let prompt = format!(
            "{} {}",
            "Tell me about the history of computing.".repeat(1 + i % 5),
            i
        );
        tasks.push(tokio::spawn(async move {
            s2.post(
                "/v1/completions",
                json!({"prompt": prompt, "max_tokens": 8 + i * 3, "temperature": 0.8, "seed": i}),
            )
            .await
        }));
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    let (_, together) = s.post("/v1/completions", probe).await;
    for t in tasks {
        assert_eq!(t.await.unwrap().0, 200);
    }
    assert_eq!(together["choices"][0]["text"].as_str().unwrap(), alone);
    s.assert_drained().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_and_full_queue() {
    let s = start(
        |c| {
            c.max_num_seqs = 1;
            c.max_num_batched_tokens = 16;
            c.max_waiting = 1;
        },
        Some("sekret"),
    )
    .await;
    let (st, _) = s.post("/v1/completions", json!({"prompt": "x"})).await;
    assert_eq!(st, 401);
    let mut tasks = vec![];
    for _ in 0..6 {
        let c = s.client.clone();
        let url = format!("{}/v1/completions", s.base);
        tasks.push(tokio::spawn(async move {
            c.post(url)
                .bearer_auth("sekret")
                .json(&json!({"prompt": "Count to ten:", "max_tokens": 40}))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }));
    }
    let mut codes = vec![];
    for t in tasks {
        codes.push(t.await.unwrap());
    }
    assert!(codes.contains(&503), "{codes:?}");
    assert!(codes.contains(&200), "{codes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellations_free_every_block() {
    let s = start(|_| {}, None).await;
    // A stream dropped after its first chunks frees its blocks at once.
    let r = s
        .client
        .post(format!("{}/v1/completions", s.base))
        .json(&json!({"prompt": "Tell me a long story.", "max_tokens": 400, "stream": true}))
        .send()
        .await
        .unwrap();
    let mut bytes = r.bytes_stream();
    let _ = bytes.next().await;
    let _ = bytes.next().await;
    drop(bytes);
    s.assert_drained().await;

    // 1,000 requests, a third of them abandoned after a random short wait.
    let mut tasks = vec![];
    for i in 0..1000u64 {
        let c = s.client.clone();
        let url = format!("{}/v1/completions", s.base);
        let stream = i % 2 == 0;
        tasks.push(tokio::spawn(async move {
            let body = json!({"prompt": format!("Request {i}: say something"), "max_tokens": 1 + i % 6,
                              "temperature": 0.7, "seed": i, "stream": stream});
            let fut = async move {
                let r = c.post(url).json(&body).send().await?;
                r.bytes().await.map(|_| ())
            };
            if i % 3 == 0 {
                let _ = tokio::time::timeout(Duration::from_millis(1 + (i * 7919) % 40), fut).await;
            } else {
                fut.await.unwrap();
            }
        }));
        if tasks.len() >= 64 {
            for t in tasks.drain(..) {
                t.await.unwrap();
            }
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    s.assert_drained().await;
    assert_eq!(s.metric("tessera_requests_waiting").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preemption_then_recompute_gives_the_same_greedy_tokens() {
    // 14 blocks of 16 positions cannot hold four ~70-token prompts plus their outputs at
    // once: the scheduler must preempt and later recompute some of them.
    let s = start(
        |c| {
            c.num_blocks = 14;
            c.max_num_seqs = 4;
            c.max_num_batched_tokens = 128;
        },
        None,
    )
    .await;
    // Distinct prompts (no shared prefix blocks) of roughly 70 tokens.
    let prompts: Vec<String> = (0..4)
        .map(|i| {
            let words: Vec<String> = (0..30)
                .map(|j| format!("item{}", (i * 31 + j * 7) % 97))
                .collect();
            format!("List {i}: {}. Next:", words.join(" "))
        })
        .collect();
    let mut alone = vec![];
    for p in &prompts {
        let (st, v) = s.post("/v1/completions", greedy(p, 24)).await;
        assert_eq!(st, 200, "{v}");
        alone.push(v["choices"][0]["text"].as_str().unwrap().to_string());
    }
    let mut tasks = vec![];
    for p in prompts.clone() {
        let s2 = Server {
            base: s.base.clone(),
            client: s.client.clone(),
        };
        tasks.push(tokio::spawn(async move {
            s2.post("/v1/completions", greedy(&p, 24)).await
        }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        let (st, v) = t.await.unwrap();
        assert_eq!(st, 200, "{v}");
        assert_eq!(
            v["choices"][0]["text"].as_str().unwrap(),
            alone[i],
            "request {i} changed under preemption"
        );
    }
    assert!(
        s.metric("tessera_preemptions_total").await > 0.0,
        "the test did not force a preemption"
    );
    s.assert_drained().await;
}
