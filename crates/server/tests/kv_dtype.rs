//! A server on an f16 KV cache answers as usual and says its KV dtype on `/metrics`; the
//! default says f32.

use serde_json::json;
use tessera_engine::KvDtype;

mod common;
use common::{engine, start_engine};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_name_the_kv_dtype() {
    for (dtype, line) in [
        (KvDtype::F16, "tessera_kv_cache_info{dtype=\"f16\"} 1"),
        (KvDtype::F32, "tessera_kv_cache_info{dtype=\"f32\"} 1"),
    ] {
        let mut e = engine();
        e.kv_dtype = dtype;
        let s = start_engine(e, |_| {}, None).await;
        let (status, body) = s
            .post(
                "/v1/completions",
                json!({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        let text = body["choices"][0]["text"].as_str().unwrap();
        assert!(text.starts_with(" Paris"), "{dtype}: {text:?}");
        let m = s.metrics_text().await;
        assert!(m.lines().any(|l| l == line), "{dtype}: {m}");
    }
}
