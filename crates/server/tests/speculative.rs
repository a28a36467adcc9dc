//! Speculative decoding through the server: greedy chat answers, whole and streamed, are
//! those of a server without it (exact path, n-gram drafter); `/metrics` shows the drafter's
//! acceptance and tokens per step; a request's `spec_tokens` is checked and honoured; no KV
//! block is left in use.

mod common;

use common::{start_opts, Server};
use serde_json::{json, Value};
use tessera_engine::spec::{DrafterSpec, SpecConfig, SpecTokens};
use tessera_engine::{store, Engine};

async fn server(spec: bool) -> Server {
    let engine = Engine::load(&store::resolve_model(None).unwrap(), 2).unwrap();
    start_opts(engine, |o| {
        o.default_max_tokens = 48;
        if spec {
            o.speculation = Some(SpecConfig {
                drafter: DrafterSpec::parse("ngram").unwrap(),
                tokens: SpecTokens::Fixed(4),
            });
        }
    })
    .await
}

fn chat(prompt: &str, extra: Value) -> Value {
    let mut body = json!({
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": 48,
    });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_answers_match_a_server_without_speculation() {
    let (plain, spec) = (server(false).await, server(true).await);
    let prompts = [
        "Repeat exactly: one two three four five six seven eight nine ten. one two three",
        "List the days of the week, separated by commas.",
        "What is 2 + 2?",
    ];
    for p in prompts {
        let (s1, a) = plain.post("/v1/chat/completions", chat(p, json!({}))).await;
        let (s2, b) = spec.post("/v1/chat/completions", chat(p, json!({}))).await;
        assert_eq!((s1, s2), (200, 200), "{a} {b}");
        assert_eq!(
            a["choices"][0]["message"], b["choices"][0]["message"],
            "{p}"
        );
        assert_eq!(a["usage"], b["usage"]);
        let (text, finish, done) = spec
            .stream("/v1/chat/completions", chat(p, json!({"stream": true})))
            .await;
        assert!(done);
        assert_eq!(
            text,
            b["choices"][0]["message"]["content"].as_str().unwrap()
        );
        assert_eq!(finish.as_deref(), b["choices"][0]["finish_reason"].as_str());
    }
    let m = spec.metrics_text().await;
    let get = |name: &str| -> f64 {
        m.lines()
            .find(|l| l.starts_with(&format!("{name}{{drafter=\"ngram\"}} ")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing:\n{m}"))
    };
    assert!(get("tessera_spec_draft_tokens_total") > 0.0);
    assert!(get("tessera_spec_accepted_tokens_total") > 0.0);
    assert!(get("tessera_spec_tokens_per_step") > 1.0);
    let rate = get("tessera_spec_acceptance_rate");
    assert!(rate > 0.0 && rate <= 1.0);
    spec.assert_drained().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spec_tokens_is_checked_and_honoured() {
    let spec = server(true).await;
    let p = "Repeat exactly: red green blue red green blue red green blue";
    let (s, v) = spec
        .post("/v1/chat/completions", chat(p, json!({"spec_tokens": 65})))
        .await;
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("spec_tokens"),
        "{v}"
    );
    let before = spec.metrics_text().await;
    let (s, _) = spec
        .post("/v1/chat/completions", chat(p, json!({"spec_tokens": 0})))
        .await;
    assert_eq!(s, 200);
    // With speculation off for the only request, nothing was drafted.
    let after = spec.metrics_text().await;
    let drafted = |m: &str| {
        m.lines()
            .find(|l| l.starts_with("tessera_spec_draft_tokens_total{"))
            .map(str::to_string)
    };
    assert_eq!(drafted(&before), drafted(&after));
    let (s, v) = spec
        .post(
            "/v1/completions",
            json!({"prompt": p, "temperature": 0, "max_tokens": 16, "spec_tokens": 8}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    spec.assert_drained().await;
}

/// `logit_bias` applies in verification too: with tokens banned, the speculating server's
/// greedy answer is the plain server's, and has none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logit_bias_applies_in_verification() {
    let tok = common::engine().tokenizer.clone();
    let (plain, spec) = (server(false).await, server(true).await);
    let p = "Repeat exactly: one two three four five six seven eight nine ten. one two three";
    let (_, unbiased) = plain.post("/v1/chat/completions", chat(p, json!({}))).await;
    let mut bias = serde_json::Map::new();
    for w in [" four", " five", "four", "five"] {
        bias.insert(tok.encode(w).unwrap()[0].to_string(), json!(-100));
    }
    let body = chat(p, json!({"logit_bias": bias}));
    let (s1, a) = plain.post("/v1/chat/completions", body.clone()).await;
    let (s2, b) = spec.post("/v1/chat/completions", body).await;
    assert_eq!((s1, s2), (200, 200), "{a} {b}");
    assert_eq!(a["choices"][0]["message"], b["choices"][0]["message"]);
    let text = a["choices"][0]["message"]["content"].as_str().unwrap();
    assert_ne!(
        a["choices"][0]["message"],
        unbiased["choices"][0]["message"]
    );
    assert!(!text.contains("five"), "{text}");
}
