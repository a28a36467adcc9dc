//! The admission gate: a full server answers 503 `server_overloaded` with a clear message on
//! every route and in every mode (streaming too), counts each refusal in
//! `tessera_requests_rejected_total`, and never answers 500 for capacity; a request counts as
//! the sequences it will run (`n` × prompts); one that could never fit, or whose prompt
//! exceeds the KV cache, gets 400 naming the limit.

use futures_util::StreamExt;
use serde_json::{json, Value};

mod common;
use common::{start, Server};

/// Two places in all: one sequence running, one waiting.
async fn tiny() -> Server {
    start(
        |c| {
            c.max_num_seqs = 1;
            c.max_num_batched_tokens = 16;
            c.max_waiting = 1;
        },
        None,
    )
    .await
}

/// A streaming request that holds its place for a long time; returned once admitted.
async fn hold(s: &Server) -> reqwest::Response {
    let r = s
        .client
        .post(format!("{}/v1/completions", s.base))
        .json(&json!({"prompt": "Count:", "max_tokens": 400, "ignore_eos": true, "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r
}

fn assert_overloaded(status: u16, body: &Value, what: &str) {
    assert_eq!(status, 503, "{what}: {body}");
    assert_eq!(body["error"]["type"], "server_overloaded", "{what}: {body}");
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("capacity") && msg.contains("retry"),
        "{what}: {msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_server_answers_503_counted_and_requests_count_as_their_sequences() {
    let s = tiny().await;
    let mut refused = 0.0;
    let a = hold(&s).await;
    let b = hold(&s).await;

    // Full: every route, streaming or not.
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1});
    for (path, body) in [
        ("/v1/completions", json!({"prompt": "Hi", "max_tokens": 1})),
        (
            "/v1/completions",
            json!({"prompt": "Hi", "max_tokens": 1, "stream": true}),
        ),
        ("/v1/chat/completions", chat.clone()),
        ("/v1/chat/completions", {
            let mut c = chat.clone();
            c["stream"] = json!(true);
            c
        }),
    ] {
        let (status, v) = s.post(path, body.clone()).await;
        assert_overloaded(status, &v, &body.to_string());
        refused += 1.0;
    }
    assert_eq!(s.metric("tessera_requests_rejected_total").await, refused);

    // One place free: a request of two sequences does not fit, whichever way it asks. (The
    // waiting stream streams once the other is gone, and by then its place is free.)
    drop(a);
    let mut b = b.bytes_stream();
    assert!(b.next().await.is_some());
    for body in [
        json!({"prompt": "Hi", "max_tokens": 1, "n": 2}),
        json!({"prompt": ["Hi", "Ho"], "max_tokens": 1}),
        json!({"prompt": [[1, 2], [3, 4]], "max_tokens": 1}),
    ] {
        let (status, v) = s.post("/v1/completions", body.clone()).await;
        assert_overloaded(status, &v, &body.to_string());
        assert!(
            v["error"]["message"].as_str().unwrap().contains("needs 2"),
            "{v}"
        );
        refused += 1.0;
    }
    let (status, v) = s
        .post("/v1/chat/completions", {
            let mut c = chat.clone();
            c["n"] = json!(2);
            c
        })
        .await;
    assert_overloaded(status, &v, "chat n=2");
    refused += 1.0;
    let (status, v) = s
        .post("/v1/completions", json!({"prompt": "Hi", "max_tokens": 1}))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(s.metric("tessera_requests_rejected_total").await, refused);

    // More sequences than the server ever holds: 400 naming n, not counted as overload.
    let (status, v) = s
        .post("/v1/completions", json!({"prompt": ["a", "b"], "n": 2}))
        .await;
    assert_eq!(
        (status, v["error"]["param"].as_str()),
        (400, Some("n")),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at most 2"),
        "{v}"
    );

    // Empty again: two sequences fit.
    drop(b);
    s.assert_drained().await;
    let (status, v) = s
        .post(
            "/v1/completions",
            json!({"prompt": "Hi", "max_tokens": 2, "n": 2}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"].as_array().unwrap().len(), 2);
    let (status, v) = s
        .post(
            "/v1/completions",
            json!({"prompt": ["Hi", "Ho"], "max_tokens": 2}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"].as_array().unwrap().len(), 2);

    // A burst: every answer is 200 or 503, and every 503 is counted.
    let before = s.metric("tessera_requests_rejected_total").await;
    let mut tasks = vec![];
    for i in 0..12 {
        let (c, url) = (s.client.clone(), format!("{}/v1/completions", s.base));
        tasks.push(tokio::spawn(async move {
            let body = json!({"prompt": format!("Say {i}"), "max_tokens": 6,
                              "n": 1 + i % 2, "stream": i % 3 == 0});
            let r = c.post(url).json(&body).send().await.unwrap();
            let status = r.status().as_u16();
            let _ = r.bytes().await;
            status
        }));
    }
    let mut codes = vec![];
    for t in tasks {
        codes.push(t.await.unwrap());
    }
    assert!(codes.iter().all(|&c| c == 200 || c == 503), "{codes:?}");
    assert!(codes.contains(&200), "{codes:?}");
    let n503 = codes.iter().filter(|&&c| c == 503).count() as f64;
    assert_eq!(
        s.metric("tessera_requests_rejected_total").await - before,
        n503
    );
    s.assert_drained().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_larger_than_the_kv_cache_is_refused_naming_it() {
    // 4 blocks of 16 positions; the context (512) is not what binds.
    let s = start(|c| c.num_blocks = 4, None).await;
    let (status, v) = s
        .post(
            "/v1/completions",
            json!({"prompt": vec![1u32; 65], "max_tokens": 1}),
        )
        .await;
    assert_eq!(
        (status, v["error"]["param"].as_str()),
        (400, Some("prompt")),
        "{v}"
    );
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("at most 64") && msg.contains("KV cache holds 64"),
        "{msg}"
    );
    let (status, v) = s
        .post(
            "/v1/completions",
            json!({"prompt": vec![1u32; 64], "max_tokens": 1}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    s.assert_drained().await;
}
