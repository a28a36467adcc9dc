//! Tessera's OpenAI-compatible server as a library: the wire format ([`api`]), the HTTP
//! routes ([`http`]), the engine thread behind them ([`engine_loop`]), the LoRA adapter
//! registry ([`adapters`]) and the metrics ([`metrics`]). The `tessera serve` command is a thin wrapper around [`serve`].

pub mod adapters;
pub mod api;
pub mod chat_page;
pub mod engine_loop;
pub mod http;
pub mod metrics;

use std::net::SocketAddr;
use std::sync::Arc;

use tessera_engine::Engine;
use tessera_scheduler::SchedulerConfig;

pub struct ServeOptions {
    pub addr: SocketAddr,
    pub model_name: String,
    pub api_key: Option<String>,
    pub scheduler: SchedulerConfig,
    pub default_max_tokens: usize,
    /// Adapters loaded at start, by name.
    pub loras: Vec<(String, std::path::PathBuf)>,
    /// Most adapters resident at once (least recently used evicted beyond).
    pub max_loras: usize,
}

/// Builds the router over a started engine loop (tests use this with their own listener).
pub fn app(engine: Engine, opts: &ServeOptions) -> anyhow::Result<axum::Router> {
    let tokenizer = engine.tokenizer.clone();
    let adapters = Arc::new(adapters::AdapterRegistry::new(
        engine.config.clone(),
        &opts.model_name,
        opts.max_loras,
        (engine.tp_size() > 1)
            .then(|| "LoRA adapters are not supported under tensor parallelism (--tp) yet".into()),
    ));
    for (name, path) in &opts.loras {
        adapters.preload(name, path).map_err(anyhow::Error::msg)?;
        eprintln!("LoRA adapter {name} loaded from {}", path.display());
    }
    let handle = engine_loop::start(
        engine,
        engine_loop::LoopConfig {
            scheduler: opts.scheduler.clone(),
        },
    )?;
    let state = Arc::new(http::AppState {
        handle,
        model_name: opts.model_name.clone(),
        adapters,
        api_key: opts.api_key.clone(),
        tokenizer,
        max_model_len: opts.scheduler.max_model_len,
        default_max_tokens: opts.default_max_tokens,
    });
    // The chat page at `/` sits outside the API routes (and their key check).
    Ok(http::router(state).merge(chat_page::router()))
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
    axum::serve(listener, router)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
