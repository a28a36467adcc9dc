//! Fault isolation through the engine's test-only fault hook: a step that panics or fails
//! fails the requests in it (HTTP 500 with a JSON error; an error event before `[DONE]` when
//! streaming), frees their KV blocks, and the server goes on serving; an engine thread that
//! dies anyway makes `/health` and new requests answer 503 with the reason.

use std::sync::Arc;

use serde_json::{json, Value};
use tessera_engine::step::Fault;

mod common;
use common::{engine, start_engine, tp_engine, Server};

/// Prompt tokens that make the hook fire for the step computing them.
const PANIC: u32 = 4242;
const ERROR: u32 = 4243;
const CRASH: u32 = 4244;

async fn faulty_server() -> Server {
    let mut e = engine();
    e.fault_hook = Some(Arc::new(|plan| {
        let has = |t: u32| plan.seqs.iter().any(|s| s.tokens.contains(&t));
        if has(CRASH) {
            Some(Fault::Crash)
        } else if has(PANIC) {
            Some(Fault::Panic)
        } else if has(ERROR) {
            Some(Fault::Error)
        } else {
            None
        }
    }));
    start_engine(e, |_| {}, None).await
}

fn tokens(bad: u32, stream: bool) -> Value {
    json!({"prompt": [1, 504, 3458, bad, 314], "max_tokens": 4, "temperature": 0, "stream": stream})
}

/// The raw SSE data lines of a streaming request.
async fn stream_lines(s: &Server, body: Value) -> Vec<String> {
    let events = s.sse("/v1/completions", body).await;
    events.into_iter().map(|(_, data)| data).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_step_fails_its_requests_and_the_server_goes_on() {
    let s = faulty_server().await;
    for (bad, what) in [(PANIC, "panicked"), (ERROR, "injected fault")] {
        let (status, body) = s.post("/v1/completions", tokens(bad, false)).await;
        assert_eq!(status, 500, "{body}");
        let msg = body["error"]["message"].as_str().unwrap();
        assert!(msg.contains(what), "{msg}");
        assert_eq!(body["error"]["type"], "server_error");

        let lines = stream_lines(&s, tokens(bad, true)).await;
        assert_eq!(
            lines.last().map(String::as_str),
            Some("[DONE]"),
            "{lines:?}"
        );
        let before: Value = serde_json::from_str(&lines[lines.len() - 2]).unwrap();
        assert!(
            before["error"]["message"].as_str().unwrap().contains(what),
            "{lines:?}"
        );
        assert!(
            !lines.iter().any(|l| l.contains("\"finish_reason\":\"")),
            "a failed stream must not finish normally: {lines:?}"
        );
        s.assert_drained().await;
    }
    // A request alongside a failing one in the same step fails too; one sent afterwards
    // succeeds.
    let (status, body) = s
        .post(
            "/v1/completions",
            json!({"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert!(!body["choices"][0]["text"].as_str().unwrap().is_empty());
    assert!(s.metric("tessera_requests_failed_total").await >= 4.0);
    s.assert_drained().await;
    let h = s
        .client
        .get(format!("{}/health", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(h.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_engine_thread_answers_503_with_the_reason() {
    let s = faulty_server().await;
    let (status, body) = s.post("/v1/completions", tokens(CRASH, false)).await;
    assert_eq!(status, 500, "{body}");
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(msg.contains("engine thread died"), "{msg}");
    let h = s
        .client
        .get(format!("{}/health", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(h.status(), 503);
    let hb: Value = h.json().await.unwrap();
    assert!(
        hb["error"]["message"]
            .as_str()
            .unwrap()
            .contains("injected crash"),
        "{hb}"
    );
    let (status, body) = s
        .post(
            "/v1/completions",
            json!({"prompt": "Hello", "max_tokens": 2}),
        )
        .await;
    assert_eq!(status, 503, "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("engine thread died"));
    let (status, _) = s.post("/v1/completions", tokens(1, true)).await;
    assert_eq!(status, 503, "streaming requests are refused too");
}

const KILL_RANK: u32 = 4245;
const STALL_RANK: u32 = 4246;
const KILL_MID_PIPELINE: u32 = 4247;

/// A server over the default model split over 2 in-process ranks, collectives timing out
/// after `timeout`, whose rank 1 dies or stalls for 4 s in a step computing the tokens above.
async fn tp_server(timeout: std::time::Duration) -> Server {
    let mut e = tp_engine(timeout);
    e.fault_hook = Some(Arc::new(|plan| {
        let has = |t: u32| plan.seqs.iter().any(|s| s.tokens.contains(&t));
        if has(KILL_RANK) {
            Some(Fault::KillRank(1))
        } else if has(STALL_RANK) {
            Some(Fault::StallRank(1, std::time::Duration::from_secs(4)))
        } else if has(KILL_MID_PIPELINE) {
            // Past the embedding's all-reduce and a few layers' stages of 4 sub-batches.
            Some(Fault::KillRankMidStep(1, 1 + 4 * 2 * 3 + 2))
        } else {
            None
        }
    }));
    start_engine(e, |_| {}, None).await
}

async fn health(s: &Server) -> (u16, String) {
    let r = s
        .client
        .get(format!("{}/health", s.base))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_rank_fails_requests_naming_it_and_health_says_why() {
    let s = tp_server(std::time::Duration::from_secs(10)).await;
    let (status, body) = s
        .post(
            "/v1/completions",
            json!({"prompt": "Hello", "max_tokens": 3, "temperature": 0}),
        )
        .await;
    assert_eq!(status, 200, "tensor-parallel serving works: {body}");
    let (status, body) = s
        .post(
            "/v1/load_lora_adapter",
            json!({"lora_name": "x", "lora_path": "/nonexistent"}),
        )
        .await;
    assert_eq!(status, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/nonexistent"),
        "a bad adapter path under tensor parallelism is refused naming it: {body}"
    );
    let t0 = std::time::Instant::now();
    let (status, body) = s.post("/v1/completions", tokens(KILL_RANK, false)).await;
    assert_eq!(status, 500, "{body}");
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(msg.contains("rank 1"), "{msg}");
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(10),
        "not bounded"
    );
    let (status, text) = health(&s).await;
    assert_eq!(status, 503);
    assert!(text.contains("rank 1"), "{text}");
    let (status, _) = s
        .post(
            "/v1/completions",
            json!({"prompt": "Hello", "max_tokens": 3}),
        )
        .await;
    assert_eq!(status, 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_rank_fails_within_the_timeout() {
    let s = tp_server(std::time::Duration::from_millis(800)).await;
    let t0 = std::time::Instant::now();
    let (status, body) = s.post("/v1/completions", tokens(STALL_RANK, false)).await;
    let took = t0.elapsed();
    assert_eq!(status, 500, "{body}");
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(msg.contains("rank") && msg.contains('1'), "{msg}");
    assert!(
        took < std::time::Duration::from_millis(3900),
        "took {took:?}: not bounded by the timeout"
    );
    let (status, text) = health(&s).await;
    assert_eq!(status, 503, "{text}");
}

/// A rank dying in the middle of a step pipelined over four sub-batches (some of its
/// reductions landed, others in flight) ends the step with the bounded-time error naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_dying_mid_pipeline_fails_within_the_timeout() {
    let mut e = tp_engine(std::time::Duration::from_millis(800));
    e.sub_batching = tessera_engine::SubBatching {
        count: 4,
        split: tessera_engine::SplitBy::Tokens,
    }
    .into();
    e.fault_hook = Some(Arc::new(|plan| {
        plan.seqs
            .iter()
            .any(|s| s.tokens.contains(&KILL_MID_PIPELINE))
            .then_some(Fault::KillRankMidStep(1, 1 + 4 * 2 * 3 + 2))
    }));
    let s = start_engine(e, |_| {}, None).await;
    let (status, body) = s
        .post(
            "/v1/completions",
            json!({"prompt": "Hello there", "max_tokens": 2, "temperature": 0}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let prompt: Vec<u32> = (0..40)
        .map(|i| 500 + i)
        .chain([KILL_MID_PIPELINE])
        .collect();
    let t0 = std::time::Instant::now();
    let (status, body) = s
        .post(
            "/v1/completions",
            json!({"prompt": prompt, "max_tokens": 2}),
        )
        .await;
    assert_eq!(status, 500, "{body}");
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(msg.contains("rank") && msg.contains('1'), "{msg}");
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(5),
        "took {:?}: not bounded",
        t0.elapsed()
    );
    let (status, text) = health(&s).await;
    assert_eq!(status, 503, "{text}");
}
