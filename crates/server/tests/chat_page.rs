//! The chat page at `/`: served as HTML with its script and stylesheet, without the API key
//! the API routes require, and referencing nothing outside the server. (The page's
//! behaviour in a browser is tested by tools/browser.)

mod common;
use common::start;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_page_is_served_self_contained() {
    let s = start(|_| {}, Some("secret")).await;
    let get = |path: &str| {
        let url = format!("{}{path}", s.base);
        let client = s.client.clone();
        async move { client.get(url).send().await.unwrap() }
    };
    let mut bodies = vec![];
    for (path, kind) in [
        ("/", "text/html"),
        ("/chat.js", "text/javascript"),
        ("/chat.css", "text/css"),
    ] {
        // No key needed for the page itself.
        let r = get(path).await;
        assert_eq!(r.status(), 200, "{path}");
        let ct = r.headers()["content-type"].to_str().unwrap().to_string();
        assert!(ct.starts_with(kind), "{path}: content-type {ct}");
        let csp = r.headers()["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("connect-src 'self'"), "{csp}");
        let body = r.text().await.unwrap();
        for external in ["http://", "https://"] {
            assert!(!body.contains(external), "{path} references {external}");
        }
        bodies.push(body);
    }
    let html = &bodies[0];
    assert!(html.starts_with("<!doctype html>"));
    assert!(html.contains("src=\"/chat.js\"") && html.contains("href=\"/chat.css\""));
    let js = &bodies[1];
    assert!(js.contains("/v1/chat/completions") && js.contains("/v1/models"));
    assert!(!js.contains("innerHTML"), "model output must go in as text");
    // The API itself still wants the key.
    assert_eq!(get("/v1/models").await.status(), 401);
}
