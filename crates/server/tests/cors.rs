//! CORS (`--cors-origins`): off by default; with origins listed, a preflight from an allowed
//! origin is answered without the API key and lists the headers clients send, a disallowed
//! origin gets no CORS headers, answers carry `Access-Control-Allow-Origin`, and the chat
//! page at `/` keeps working.

use reqwest::Method;
use serde_json::json;

mod common;
use common::{engine, start_opts, Server};

async fn preflight(s: &Server, origin: &str) -> reqwest::Response {
    s.client
        .request(Method::OPTIONS, format!("{}/v1/chat/completions", s.base))
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization,content-type,x-api-key,anthropic-version,anthropic-beta",
        )
        .send()
        .await
        .unwrap()
}

fn allow_origin(r: &reqwest::Response) -> Option<String> {
    r.headers()
        .get("access-control-allow-origin")
        .map(|v| v.to_str().unwrap().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflights_are_answered_without_the_key_for_allowed_origins_only() {
    let s = start_opts(engine(), |o| {
        o.api_key = Some("sekret".into());
        o.http.cors_origins = vec!["http://app.example:3000".into()];
    })
    .await;
    let r = preflight(&s, "http://app.example:3000").await;
    assert!(r.status().is_success(), "{}", r.status());
    assert_eq!(allow_origin(&r).as_deref(), Some("http://app.example:3000"));
    let allowed = r.headers()["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .to_ascii_lowercase();
    for h in [
        "authorization",
        "content-type",
        "x-api-key",
        "anthropic-version",
        "anthropic-beta",
    ] {
        assert!(allowed.contains(h), "{h} not in {allowed}");
    }
    let methods = r.headers()["access-control-allow-methods"]
        .to_str()
        .unwrap();
    assert!(methods.contains("POST"), "{methods}");
    // Another origin: no CORS headers (the browser then refuses the call).
    let r = preflight(&s, "http://evil.example").await;
    assert_eq!(allow_origin(&r), None);
    // The call itself still needs the key, and carries the header for the allowed origin.
    let call = |key: Option<&str>| {
        let mut b = s
            .client
            .post(format!("{}/v1/chat/completions", s.base))
            .header("origin", "http://app.example:3000")
            .json(&json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}));
        if let Some(k) = key {
            b = b.bearer_auth(k);
        }
        b.send()
    };
    let r = call(None).await.unwrap();
    assert_eq!(r.status(), 401);
    let r = call(Some("sekret")).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(allow_origin(&r).as_deref(), Some("http://app.example:3000"));
    // The chat page keeps working.
    let r = s.client.get(format!("{}/", s.base)).send().await.unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_by_default_and_star_allows_any_origin() {
    let s = start_opts(engine(), |o| o.api_key = Some("sekret".into())).await;
    let r = preflight(&s, "http://app.example").await;
    assert_eq!(allow_origin(&r), None);
    assert!(!r.status().is_success());
    let r = s.client.get(format!("{}/", s.base)).send().await.unwrap();
    assert_eq!(r.status(), 200);

    let s = start_opts(engine(), |o| o.http.cors_origins = vec!["*".into()]).await;
    let r = preflight(&s, "http://anything.example").await;
    assert!(r.status().is_success());
    assert_eq!(allow_origin(&r).as_deref(), Some("*"));
}

#[test]
fn bad_origins_are_refused_by_name() {
    let opts = |o: &[&str]| tessera_server::HttpOptions {
        cors_origins: o.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    assert!(opts(&["https://a.example", "http://localhost:5173"])
        .validate()
        .is_ok());
    for bad in [
        &["*", "https://a.example"][..],
        &["a.example"],
        &["https://a.example/path"],
    ] {
        let e = opts(bad).validate().unwrap_err();
        assert!(e.contains("--cors-origins"), "{e}");
    }
}
