//! LoRA adapters through the server: a request's `model` picks the adapter, /v1/models lists
//! them under the base, adapters load and unload at run time (vLLM's endpoints, behind the
//! API key), at most `--max-loras` stay resident (LRU, reloaded on demand), and none of it
//! changes any request's tokens: base and three adapters interleaved in one batch, through
//! loads, unloads and evictions, give every request what it gets alone, leaving no KV block
//! in use.

use std::collections::HashMap;
use std::path::PathBuf;

use serde_json::{json, Value};

mod common;
use common::{engine, start_opts, Server};

fn adapter_dir(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/golden/lora")
        .join(name)
        .display()
        .to_string()
}

async fn server(max_loras: usize, key: Option<&str>) -> Server {
    start_opts(engine(), |o| {
        o.loras = vec![
            ("pirate".into(), adapter_dir("pirate").into()),
            ("qv".into(), adapter_dir("rand-qv-rslora").into()),
        ];
        o.max_loras = max_loras;
        o.api_key = key.map(String::from);
    })
    .await
}

fn body(model: &str, prompt: &str) -> Value {
    json!({"model": model, "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": true})
}

async fn text(s: &Server, model: &str, prompt: &str) -> String {
    let (status, v) = s.post("/v1/completions", body(model, prompt)).await;
    assert_eq!(status, 200, "{model}: {v}");
    assert_eq!(v["model"], model);
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

async fn post_text(s: &Server, path: &str, body: Value, key: Option<&str>) -> (u16, String) {
    let mut r = s.client.post(format!("{}{path}", s.base)).json(&body);
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    let r = r.send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

const PROMPTS: [&str; 3] = [
    "The capital of France is",
    "Once upon a time, a small robot",
    "def fibonacci(n):",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapters_mixed_loaded_evicted_and_unloaded_never_change_outputs() {
    let s = server(2, None).await;
    // Listing.
    let models: Value = s
        .client
        .get(format!("{}/v1/models", s.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<(&str, Value)> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["id"].as_str().unwrap(), m["parent"].clone()))
        .collect();
    assert_eq!(
        ids,
        vec![
            ("smol", Value::Null),
            ("pirate", json!("smol")),
            ("qv", json!("smol"))
        ]
    );
    // Unknown names get 404 naming them.
    let (status, v) = s.post("/v1/completions", body("nope", "Hi")).await;
    assert_eq!(status, 404);
    assert!(
        v["error"]["message"].as_str().unwrap().contains("\"nope\""),
        "{v}"
    );

    // A third adapter at run time: more than --max-loras 2, so one is evicted.
    let (status, msg) = post_text(
        &s,
        "/v1/load_lora_adapter",
        json!({"lora_name": "all7", "lora_path": adapter_dir("rand-all7")}),
        None,
    )
    .await;
    assert_eq!(status, 200, "{msg}");
    let (status, _) = post_text(
        &s,
        "/v1/load_lora_adapter",
        json!({"lora_name": "all7", "lora_path": adapter_dir("rand-all7")}),
        None,
    )
    .await;
    assert_eq!(status, 400, "loading a name twice");
    let (status, msg) = post_text(
        &s,
        "/v1/load_lora_adapter",
        json!({"lora_name": "bad", "lora_path": "/nonexistent/adapter"}),
        None,
    )
    .await;
    assert_eq!(status, 400);
    assert!(msg.contains("/nonexistent/adapter"), "{msg}");
    assert!(s.metric("tessera_lora_adapters_resident").await <= 2.0);

    // Alone, one at a time (each adapter reloaded as needed).
    let models = ["smol", "pirate", "qv", "all7"];
    let mut alone = HashMap::new();
    for m in models {
        for p in PROMPTS {
            alone.insert((m.to_string(), p.to_string()), text(&s, m, p).await);
        }
    }
    let get = |m: &str, p: &str| alone[&(m.to_string(), p.to_string())].clone();
    assert_ne!(get("smol", PROMPTS[0]), get("pirate", PROMPTS[0]));
    assert_ne!(get("smol", PROMPTS[0]), get("all7", PROMPTS[0]));
    // Together: 24 concurrent requests, base and three adapters interleaved, with only two
    // adapters resident at a time (evictions and reloads under load).
    let mut handles = vec![];
    for _round in 0..2 {
        for m in models {
            for p in PROMPTS {
                let (base, client) = (s.base.clone(), s.client.clone());
                let (m, p) = (m.to_string(), p.to_string());
                handles.push(tokio::spawn(async move {
                    let r = client
                        .post(format!("{base}/v1/completions"))
                        .json(&body(&m, &p))
                        .send()
                        .await
                        .unwrap();
                    let v: Value = r.json().await.unwrap();
                    (
                        m,
                        p,
                        v["choices"][0]["text"].as_str().unwrap_or("").to_string(),
                    )
                }));
            }
        }
    }
    for h in handles {
        let (m, p, t) = h.await.unwrap();
        let want = get(&m, &p);
        assert_eq!(t, want, "{m} on {p:?} changed among other adapters");
    }
    assert!(s.metric("tessera_lora_adapters_resident").await <= 2.0);
    assert!(
        s.metric("tessera_lora_requests_total{adapter=\"pirate\"}")
            .await
            >= 9.0
    );

    // Unload while a request runs with it: that request finishes unchanged.
    let long = json!({"model": "pirate", "prompt": PROMPTS[1], "max_tokens": 48, "temperature": 0, "ignore_eos": true});
    let reference = s.post("/v1/completions", long.clone()).await.1["choices"][0]["text"].clone();
    let (base, client) = (s.base.clone(), s.client.clone());
    let running = tokio::spawn(async move {
        let v: Value = client
            .post(format!("{base}/v1/completions"))
            .json(&long)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["choices"][0]["text"].clone()
    });
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    let (status, msg) = post_text(
        &s,
        "/v1/unload_lora_adapter",
        json!({"lora_name": "pirate"}),
        None,
    )
    .await;
    assert_eq!(status, 200, "{msg}");
    assert_eq!(
        running.await.unwrap(),
        reference,
        "unloading changed a running request"
    );
    let (status, _) = s.post("/v1/completions", body("pirate", "Hi")).await;
    assert_eq!(status, 404, "an unloaded adapter is gone");
    let (status, _) = post_text(
        &s,
        "/v1/unload_lora_adapter",
        json!({"lora_name": "pirate"}),
        None,
    )
    .await;
    assert_eq!(status, 404);
    s.assert_drained().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapter_routes_need_the_api_key() {
    let s = server(4, Some("k3y")).await;
    let load = json!({"lora_name": "ko", "lora_path": adapter_dir("rand-ko")});
    let (status, _) = post_text(&s, "/v1/load_lora_adapter", load.clone(), None).await;
    assert_eq!(status, 401);
    let (status, _) = post_text(
        &s,
        "/v1/unload_lora_adapter",
        json!({"lora_name": "qv"}),
        Some("wrong"),
    )
    .await;
    assert_eq!(status, 401);
    let (status, msg) = post_text(&s, "/v1/load_lora_adapter", load, Some("k3y")).await;
    assert_eq!(status, 200, "{msg}");
    let (status, msg) = post_text(
        &s,
        "/v1/unload_lora_adapter",
        json!({"lora_name": "ko"}),
        Some("k3y"),
    )
    .await;
    assert_eq!(status, 200, "{msg}");
}
