//! Slow and oversized clients: a half-sent head, a stalled body and an idle kept-alive
//! connection are cut at their timeouts; a request in progress is not; a declared body over
//! the limit is refused unread; the API key is checked before any body is read, with the
//! Bearer scheme in any case; /health is open, /metrics open unless told otherwise.

use std::time::Duration;

use serde_json::json;
use tokio::io::AsyncWriteExt;

mod common;
use common::{engine, read_head, start_opts, wait_closed, Server};

/// A server with short timeouts: heads 1 s, bodies 2 s, idle connections 1 s.
async fn strict(key: Option<&str>, metrics_require_key: bool) -> Server {
    let key = key.map(String::from);
    start_opts(engine(), move |o| {
        o.api_key = key;
        o.http.header_timeout = Duration::from_secs(1);
        o.http.body_timeout = Duration::from_secs(2);
        o.http.keep_alive_timeout = Duration::from_secs(1);
        o.http.metrics_require_key = metrics_require_key;
    })
    .await
}

const GENEROUS: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_heads_and_idle_connections_are_closed() {
    let s = strict(None, false).await;

    // Slow loris: half a head, then nothing.
    let mut c = s
        .raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: appl")
        .await;
    let t = wait_closed(&mut c, GENEROUS).await;
    assert!(t >= Duration::from_millis(800), "closed too soon: {t:?}");

    // A connection that never sends a byte.
    let mut c = s.raw(b"").await;
    wait_closed(&mut c, GENEROUS).await;

    // Kept alive: two requests on one connection, then idle until closed.
    let get = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut c = s.raw(get).await;
    assert_eq!(read_head(&mut c, GENEROUS).await.0, Some(200));
    c.write_all(get).await.unwrap();
    assert_eq!(read_head(&mut c, GENEROUS).await.0, Some(200));
    let t = wait_closed(&mut c, GENEROUS).await;
    assert!(t >= Duration::from_millis(500), "closed too soon: {t:?}");

    // Idle for a while, then a head trickled in: 1.2 s since the last response (past the
    // keep-alive timeout) but within the header timeout of its first byte, so it is served.
    let mut c = s.raw(get).await;
    assert_eq!(read_head(&mut c, GENEROUS).await.0, Some(200));
    tokio::time::sleep(Duration::from_millis(600)).await;
    c.write_all(b"GET /hea").await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    c.write_all(b"lth HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_head(&mut c, GENEROUS).await.0, Some(200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_that_stall_or_are_too_large() {
    let s = strict(None, false).await;

    // A body that stops halfway: 408 (or a closed connection), within the body timeout.
    let mut c = s
        .raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\": ")
        .await;
    let (status, t) = read_head(&mut c, GENEROUS).await;
    assert!(matches!(status, Some(408) | None), "{status:?}");
    assert!(t >= Duration::from_millis(1500), "answered too soon: {t:?}");

    // A body arriving slower than the header timeout but within the body timeout is served:
    // the connection timers leave a request in progress alone.
    let body = json!({"prompt": "Hi", "max_tokens": 1}).to_string();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut c = s.raw(head.as_bytes()).await;
    c.write_all(&body.as_bytes()[..5]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1300)).await;
    c.write_all(&body.as_bytes()[5..]).await.unwrap();
    assert_eq!(read_head(&mut c, GENEROUS).await.0, Some(200));

    // A declared length of 10^12 bytes: 413 at once, nothing of the body sent.
    let mut c = s
        .raw(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n\r\n")
        .await;
    let (status, t) = read_head(&mut c, GENEROUS).await;
    assert_eq!(status, Some(413));
    assert!(t < Duration::from_secs(5), "{t:?}");

    // A chunked body that grows past the limit: 413 too.
    let s = start_opts(engine(), |o| o.http.max_body_bytes = 1000).await;
    let r = s
        .client
        .post(format!("{}/v1/completions", s.base))
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            (0..10).map(|_| Ok::<_, std::io::Error>(vec![b' '; 500])),
        )))
        .send()
        .await;
    // The server may close before the client has sent everything; a 413 if it got it.
    if let Ok(r) = r {
        assert_eq!(r.status(), 413);
    }
    let (st, _) = s
        .post("/v1/completions", json!({"prompt": "x".repeat(2000)}))
        .await;
    assert_eq!(st, 413);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_is_checked_before_the_body_and_names_its_routes() {
    let s = strict(Some("k3y"), false).await;

    // Wrong key, a large declared body of which nothing is sent: 401 at once (a server that
    // read the body first would wait for it and answer 408 at the body timeout).
    for auth in [
        "",
        "Authorization: Bearer wrong\r\n",
        "Authorization: Basic k3y\r\n",
    ] {
        let mut c = s
            .raw(format!("POST /v1/completions HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 1000000\r\n\r\n").as_bytes())
            .await;
        let (status, t) = read_head(&mut c, GENEROUS).await;
        assert_eq!(status, Some(401), "{auth:?}");
        assert!(t < Duration::from_secs(5), "{auth:?}: {t:?}");
    }

    // The scheme in any case, the header name in any case.
    for auth in ["bearer k3y", "BEARER k3y", "Bearer  k3y"] {
        let r = s
            .client
            .get(format!("{}/v1/models", s.base))
            .header("authorization", auth)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{auth:?}");
    }
    let r = s
        .client
        .post(format!("{}/v1/completions", s.base))
        .header("authorization", "bearer k3y")
        .json(&json!({"prompt": "Hi", "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // Every /v1 route needs the key; /health and (by default) /metrics do not.
    let get = |path: &str| s.client.get(format!("{}{path}", s.base)).send();
    assert_eq!(get("/v1/models").await.unwrap().status(), 401);
    for path in [
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/load_lora_adapter",
        "/v1/unload_lora_adapter",
    ] {
        let (status, _) = s.post(path, json!({})).await;
        assert_eq!(status, 401, "{path}");
    }
    assert_eq!(get("/health").await.unwrap().status(), 200);
    assert_eq!(get("/metrics").await.unwrap().status(), 200);

    let s = strict(Some("k3y"), true).await;
    let metrics = |key: Option<&str>| {
        let mut r = s.client.get(format!("{}/metrics", s.base));
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        r.send()
    };
    assert_eq!(metrics(None).await.unwrap().status(), 401);
    assert_eq!(metrics(Some("nope")).await.unwrap().status(), 401);
    assert_eq!(metrics(Some("k3y")).await.unwrap().status(), 200);
}
