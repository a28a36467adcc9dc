//! `/metrics` under tensor parallelism shows the overlap planner: the link measured at
//! start-up and the sub-batching each step ran with.

use serde_json::json;

mod common;
use common::{start_engine, tp_engine};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_the_measured_link_and_the_chosen_sub_batching() {
    let s = start_engine(tp_engine(std::time::Duration::from_secs(10)), |_| {}, None).await;
    let (status, body) = s
        .post(
            "/v1/completions",
            json!({"prompt": "The capital of France is a city where", "max_tokens": 3, "temperature": 0}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let text = s.metrics_text().await;
    assert!(text.contains("tessera_tp_link_bytes_per_second "), "{text}");
    let steps: u64 = text
        .lines()
        .filter(|l| l.starts_with("tessera_tp_sub_batches_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    // One prefill step and two decode steps at least (the last token needs no step).
    assert!(steps >= 3, "{text}");
    assert!(
        text.contains("tessera_tp_last_step_predicted_seconds "),
        "{text}"
    );
}
