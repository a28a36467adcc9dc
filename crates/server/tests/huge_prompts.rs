//! Huge prompts do not stall the server: several multi-megabyte prompts (completions and
//! chat) tokenized at once leave `/health` answering promptly, and each gets its answer (400:
//! longer than the context) in bounded time.

use std::time::{Duration, Instant};

use serde_json::json;

mod common;
use common::{engine, start_opts, Server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_stays_fast_while_megabyte_prompts_are_tokenized() {
    let s = start_opts(engine(), |o| {
        o.http.max_body_bytes = 64 << 20;
        o.http.tokenize_concurrency = 1;
    })
    .await;
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(4 << 20 >> 5);
    assert!(text.len() > 4 << 20);
    let mut tasks = vec![];
    for i in 0..4 {
        let s2 = Server {
            base: s.base.clone(),
            client: s.client.clone(),
        };
        let text = text.clone();
        tasks.push(tokio::spawn(async move {
            let t0 = Instant::now();
            let (status, v) = if i % 2 == 0 {
                s2.post("/v1/completions", json!({"prompt": text, "max_tokens": 1}))
                    .await
            } else {
                s2.post(
                    "/v1/chat/completions",
                    json!({"messages": [{"role": "user", "content": text}], "max_tokens": 1}),
                )
                .await
            };
            (status, v, t0.elapsed())
        }));
    }
    // Probe /health until every prompt has been answered.
    let (mut probes, mut slowest) = (0, Duration::ZERO);
    while tasks.iter().any(|t| !t.is_finished()) {
        let t0 = Instant::now();
        let r = s
            .client
            .get(format!("{}/health", s.base))
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        slowest = slowest.max(t0.elapsed());
        probes += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for t in tasks {
        let (status, v, took) = t.await.unwrap();
        assert_eq!(status, 400, "{v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains("at most 511"), "{msg}");
        assert!(took < Duration::from_secs(300), "{took:?}");
    }
    eprintln!("{probes} /health probes while the prompts were processed, slowest {slowest:?}");
    assert!(probes >= 2, "the prompts were answered too fast to tell");
    assert!(slowest < Duration::from_secs(1), "/health took {slowest:?}");
}
