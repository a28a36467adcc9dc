//! Tessera's OpenAI-compatible server as a library: the wire format ([`api`]) and its
//! validation ([`spec`]), the HTTP routes ([`http`]), the connections under them with their
//! timeouts ([`conn`]), the one admission gate ([`admission`]), the tokenizer pool
//! ([`tokenize`]), the engine thread behind them ([`engine_loop`]), the LoRA adapter registry
//! ([`adapters`]), the metrics ([`metrics`]) and error text made safe to print ([`text`]).
//! The `tessera serve` command is a thin wrapper around [`serve`].

pub mod adapters;
pub mod admission;
pub mod api;
pub mod chat_output;
pub mod chat_page;
pub mod conn;
pub mod engine_loop;
pub mod http;
pub mod metrics;
pub mod spec;
pub mod text;
pub mod tokenize;
pub mod tools;
pub mod turn;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tessera_engine::Engine;
use tessera_scheduler::SchedulerConfig;

pub struct ServeOptions {
    pub addr: SocketAddr,
    pub model_name: String,
    /// The key every `/v1` route (and `/metrics`, if [`HttpOptions::metrics_require_key`])
    /// requires as `Authorization: Bearer KEY` or `x-api-key: KEY`.
    pub api_key: Option<String>,
    pub scheduler: SchedulerConfig,
    pub default_max_tokens: usize,
    /// Adapters loaded at start, by name.
    pub loras: Vec<(String, std::path::PathBuf)>,
    /// Most adapters resident at once (least recently used evicted beyond).
    pub max_loras: usize,
    pub http: HttpOptions,
    /// `--tool-call-parser` and `--reasoning-parser`: `None` reads them off the chat
    /// template, `"none"` turns one off.
    pub tool_parser: Option<String>,
    pub reasoning_parser: Option<String>,
    /// Speculative decoding (`--speculative`, `--spec-tokens`).
    pub speculation: Option<tessera_engine::spec::SpecConfig>,
}

/// Limits on what clients may send and how slowly.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpOptions {
    /// A new connection's first request head, or a kept-alive connection's next one from its
    /// first byte, must arrive within this.
    pub header_timeout: Duration,
    /// A request's body must arrive within this (else 408).
    pub body_timeout: Duration,
    /// An idle kept-alive connection is closed after this.
    pub keep_alive_timeout: Duration,
    /// Largest request body (else 413; a declared length over it is refused unread).
    pub max_body_bytes: usize,
    /// Tokenization and chat-template jobs running at once on the blocking pool.
    pub tokenize_concurrency: usize,
    /// Whether `/metrics` requires the API key too.
    pub metrics_require_key: bool,
    /// Bytes the Responses API's store keeps at most (least recently used evicted past it).
    pub responses_store_bytes: usize,
    /// Origins browsers may call the API from (`--cors-origins`; `*`: any); empty: no
    /// CORS headers at all (the default).
    pub cors_origins: Vec<String>,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            keep_alive_timeout: Duration::from_secs(30),
            max_body_bytes: 8 << 20,
            tokenize_concurrency: 2,
            metrics_require_key: false,
            responses_store_bytes: 64 << 20,
            cors_origins: Vec::new(),
        }
    }
}

impl HttpOptions {
    pub fn validate(&self) -> Result<(), String> {
        for (name, t) in [
            ("header timeout", self.header_timeout),
            ("body timeout", self.body_timeout),
            ("keep-alive timeout", self.keep_alive_timeout),
        ] {
            if t.is_zero() {
                return Err(format!("the {name} must be positive"));
            }
        }
        if self.max_body_bytes == 0 {
            return Err("the body limit (--max-body-bytes) must be positive".into());
        }
        if self.tokenize_concurrency == 0 {
            return Err("--tokenize-concurrency must be at least 1".into());
        }
        http::cors::layer(&self.cors_origins)?;
        Ok(())
    }

    pub fn conn_timeouts(&self) -> conn::ConnTimeouts {
        conn::ConnTimeouts {
            header: self.header_timeout,
            keep_alive: self.keep_alive_timeout,
        }
    }
}

/// Builds the router over a started engine loop (tests use this with their own listener).
pub fn app(engine: Engine, opts: &ServeOptions) -> anyhow::Result<axum::Router> {
    opts.http
        .validate()
        .map_err(|e| anyhow::anyhow!("invalid server settings: {e}"))?;
    let tokenizer = engine.tokenizer.clone();
    let output = chat_output::OutputParsers::resolve(
        opts.tool_parser.as_deref(),
        opts.reasoning_parser.as_deref(),
        &tokenizer,
    )
    .map_err(anyhow::Error::msg)?;
    let adapters = Arc::new(adapters::AdapterRegistry::new(
        engine.config.clone(),
        &opts.model_name,
        opts.max_loras,
        engine.adapter_preparer(),
    ));
    for (name, path) in &opts.loras {
        adapters.preload(name, path).map_err(anyhow::Error::msg)?;
        eprintln!("LoRA adapter {name} loaded from {}", path.display());
    }
    let handle = engine_loop::start(
        engine,
        engine_loop::LoopConfig {
            scheduler: opts.scheduler.clone(),
            speculation: opts.speculation.clone(),
        },
    )?;
    let state = Arc::new(http::AppState {
        handle,
        model_name: opts.model_name.clone(),
        adapters,
        api_key: opts.api_key.as_deref().map(http::auth::ApiKey::new),
        tokenizers: tokenize::TokenizerPool::new(tokenizer, opts.http.tokenize_concurrency),
        max_model_len: opts.scheduler.max_model_len,
        kv_positions: opts.scheduler.num_blocks * opts.scheduler.block_size,
        default_max_tokens: opts.default_max_tokens,
        max_body_bytes: opts.http.max_body_bytes,
        body_timeout: opts.http.body_timeout,
        metrics_require_key: opts.http.metrics_require_key,
        output,
        responses: http::responses::ResponseStore::new(opts.http.responses_store_bytes),
    });
    // The chat page at `/` sits outside the API routes (and their key check).
    let router = http::router(state).merge(chat_page::router());
    // Outermost: a preflight is answered before any key check.
    Ok(
        match http::cors::layer(&opts.http.cors_origins).map_err(anyhow::Error::msg)? {
            Some(cors) => router.layer(cors),
            None => router,
        },
    )
}

/// Serves `router` on `listener` with `http`'s connection timeouts until `shutdown`.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    http: &HttpOptions,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    conn::serve(listener, router, http.conn_timeouts(), shutdown).await
}

/// Serves until Ctrl-C.
pub async fn serve(engine: Engine, opts: ServeOptions) -> anyhow::Result<()> {
    let router = app(engine, &opts)?;
    let listener = tokio::net::TcpListener::bind(opts.addr).await?;
    tracing::info!("listening on http://{}", listener.local_addr()?);
    eprintln!(
        "serving {} on http://{}",
        opts.model_name,
        listener.local_addr()?
    );
    serve_on(listener, router, &opts.http, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}
