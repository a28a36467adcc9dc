//! The grammar bounds (`tessera serve --grammar-*`): a schema whose grammar is past them gets
//! 400 naming the limit, and the server goes on serving.

use serde_json::json;
use tessera_engine::constrain::GrammarLimits;

mod common;
use common::{engine, start_opts};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grammar_past_the_bounds_gets_400() {
    let mut e = engine();
    e.set_grammar_limits(GrammarLimits {
        max_grammar_size: 200,
        ..GrammarLimits::default()
    });
    let s = start_opts(e, |_| {}).await;
    let props: serde_json::Map<String, serde_json::Value> = (0..40)
        .map(|i| {
            (
                format!("field{i}"),
                json!({"type": "string", "maxLength": 8}),
            )
        })
        .collect();
    let schema = json!({"type": "object", "properties": props});
    let (status, v) = s
        .post(
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": 4, "guided_json": schema}),
        )
        .await;
    assert_eq!(status, 400, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("grammar") || msg.contains("size"), "{msg}");
    // A small one still passes.
    let (status, v) = s
        .post(
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": 4, "guided_choice": ["a", "b"]}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    s.assert_drained().await;
}
