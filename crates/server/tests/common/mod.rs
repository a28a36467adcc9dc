//! A test server on the default model and the requests the server tests make.

#![allow(dead_code)]

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::Value;
use tessera_engine::{store, Engine};
use tessera_kernels::plan::Precision;
use tessera_scheduler::SchedulerConfig;
use tessera_server::ServeOptions;

pub struct Server {
    pub base: String,
    pub client: reqwest::Client,
}

/// The default model, fast path, 2 threads, untuned planner.
pub fn engine() -> Engine {
    let path = store::resolve_model(None).expect("default model");
    Engine::load_with(
        &path,
        2,
        Precision::Fast,
        tessera_kernels::planner::Planner::untuned(),
    )
    .unwrap()
}

pub async fn start(cfg: impl FnOnce(&mut SchedulerConfig), api_key: Option<&str>) -> Server {
    start_engine(engine(), cfg, api_key).await
}

/// A server over `engine` on a free local port, with the test scheduler settings.
pub async fn start_engine(
    engine: Engine,
    cfg: impl FnOnce(&mut SchedulerConfig),
    api_key: Option<&str>,
) -> Server {
    start_opts(engine, |o| {
        cfg(&mut o.scheduler);
        o.api_key = api_key.map(String::from);
    })
    .await
}

/// A server over `engine` with the test settings, then `edit` applied to them.
pub async fn start_opts(engine: Engine, edit: impl FnOnce(&mut ServeOptions)) -> Server {
    let mut sched = SchedulerConfig::new(512, 16);
    sched.max_num_seqs = 16;
    sched.max_num_batched_tokens = 256;
    sched.max_prefill_chunk = 128;
    sched.max_model_len = 512;
    sched.max_waiting = 1024;
    let mut opts = ServeOptions {
        addr: "127.0.0.1:0".parse().unwrap(),
        model_name: "smol".into(),
        api_key: None,
        scheduler: sched,
        default_max_tokens: 16,
        loras: vec![],
        max_loras: 4,
        http: Default::default(),
        tool_parser: None,
        reasoning_parser: None,
        speculation: None,
    };
    edit(&mut opts);
    let router = tessera_server::app(engine, &opts).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let http = opts.http.clone();
    tokio::spawn(async move {
        tessera_server::serve_on(listener, router, &http, std::future::pending())
            .await
            .unwrap()
    });
    Server {
        base: format!("http://{addr}"),
        client: reqwest::Client::new(),
    }
}

impl Server {
    /// The server's `host:port`.
    pub fn addr(&self) -> String {
        self.base.trim_start_matches("http://").to_string()
    }

    /// A raw TCP connection to the server that has sent `bytes`.
    pub async fn raw(&self, bytes: &[u8]) -> tokio::net::TcpStream {
        use tokio::io::AsyncWriteExt;
        let mut c = tokio::net::TcpStream::connect(self.addr()).await.unwrap();
        c.write_all(bytes).await.unwrap();
        c
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let r = self
            .client
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap())
    }

    /// The `/metrics` page.
    pub async fn metrics_text(&self) -> String {
        self.client
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    pub async fn metric(&self, name: &str) -> f64 {
        let text = self.metrics_text().await;
        text.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("metric {name} missing"))
    }

    /// Waits until no request runs and no KV block is in use (blocks free asynchronously).
    pub async fn assert_drained(&self) {
        for _ in 0..200 {
            if self.metric("tessera_kv_blocks_used").await == 0.0
                && self.metric("tessera_requests_running").await == 0.0
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "KV blocks still in use: {} (running {})",
            self.metric("tessera_kv_blocks_used").await,
            self.metric("tessera_requests_running").await
        );
    }

    /// Posts a streaming request (asserting 200) and reads its whole event stream: each
    /// event's name (`event:`, empty without one) and data (`data:`), in order.
    pub async fn sse(&self, path: &str, body: Value) -> Vec<(String, String)> {
        let r = self
            .client
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let mut bytes = r.bytes_stream();
        let mut buf = String::new();
        while let Some(chunk) = bytes.next().await {
            buf.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        }
        let mut out = vec![];
        for ev in buf.split("\n\n") {
            let name = ev.lines().find_map(|l| l.strip_prefix("event: "));
            if let Some(data) = ev.lines().find_map(|l| l.strip_prefix("data: ")) {
                out.push((name.unwrap_or("").to_string(), data.to_string()));
            }
        }
        out
    }

    /// A Completions or Chat stream's JSON chunks, and whether it ended with `[DONE]`.
    pub async fn chunks(&self, path: &str, body: Value) -> (Vec<Value>, bool) {
        let mut done = false;
        let mut out = vec![];
        for (_, data) in self.sse(path, body).await {
            if data == "[DONE]" {
                done = true;
            } else {
                out.push(serde_json::from_str(&data).unwrap());
            }
        }
        (out, done)
    }

    /// Streams a request; returns the concatenated text, the finish reason and whether
    /// the stream ended with [DONE].
    pub async fn stream(&self, path: &str, body: Value) -> (String, Option<String>, bool) {
        let (chunks, done) = self.chunks(path, body).await;
        let (mut text, mut finish) = (String::new(), None);
        for v in chunks {
            for c in v["choices"].as_array().unwrap() {
                text.push_str(
                    c["text"]
                        .as_str()
                        .or(c["delta"]["content"].as_str())
                        .unwrap_or(""),
                );
                if let Some(f) = c["finish_reason"].as_str() {
                    finish = Some(f.to_string());
                }
            }
        }
        (text, finish, done)
    }
}

/// Reads from `c` until a response head has arrived, the server closed the connection, or
/// `limit` passed. Returns the status (`None`: closed or reset before a head) and the time
/// it took.
pub async fn read_head(c: &mut tokio::net::TcpStream, limit: Duration) -> (Option<u16>, Duration) {
    use tokio::io::AsyncReadExt;
    let t0 = std::time::Instant::now();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let left = limit.saturating_sub(t0.elapsed());
        match tokio::time::timeout(left, c.read(&mut chunk)).await {
            Err(_) => panic!("no response and no close within {limit:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => return (None, t0.elapsed()),
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]);
            let status = head.split(' ').nth(1).and_then(|s| s.parse().ok());
            return (status, t0.elapsed());
        }
    }
}

/// Reads from `c` until the server closes the connection (or `limit` passes: a panic).
/// Returns the time it took.
pub async fn wait_closed(c: &mut tokio::net::TcpStream, limit: Duration) -> Duration {
    use tokio::io::AsyncReadExt;
    let t0 = std::time::Instant::now();
    let mut chunk = [0u8; 4096];
    loop {
        let left = limit.saturating_sub(t0.elapsed());
        match tokio::time::timeout(left, c.read(&mut chunk)).await {
            Err(_) => panic!("the server kept the connection open past {limit:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => return t0.elapsed(),
            Ok(Ok(_)) => {}
        }
    }
}

/// The default model split over 2 in-process ranks (fast precision, untuned planner), its
/// collectives timing out after `timeout`.
#[allow(dead_code)]
pub fn tp_engine(timeout: std::time::Duration) -> Engine {
    let path = tessera_engine::store::resolve_model(None).unwrap();
    Engine::load_tp(
        &path,
        2,
        tessera_kernels::plan::Precision::Fast,
        tessera_kernels::planner::Planner::untuned(),
        2,
        timeout,
    )
    .unwrap()
}
