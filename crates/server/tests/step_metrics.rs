//! `/metrics` counts what the engine steps ran: their tokens (every prompt token once, then
//! one per decode) and the seconds they took.

use serde_json::json;

mod common;
use common::{engine, start_engine};

fn value(m: &str, name: &str) -> f64 {
    m.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {m}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_tokens_and_seconds_are_counted() {
    let s = start_engine(engine(), |_| {}, None).await;
    let (status, body) = s
        .post(
            "/v1/completions",
            json!({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let m = s.metrics_text().await;
    let prompt = value(&m, "tessera_prompt_tokens_total");
    let generated = value(&m, "tessera_generation_tokens_total");
    assert_eq!(generated, 4.0, "{m}");
    // The last generated token is never fed back.
    assert_eq!(
        value(&m, "tessera_engine_step_tokens_total"),
        prompt + generated - 1.0,
        "{m}"
    );
    let steps = value(&m, "tessera_engine_steps_total");
    assert!(steps >= 4.0, "{m}");
    assert!(value(&m, "tessera_engine_step_seconds_total") > 0.0, "{m}");
}
