//! Tessera's OpenAI-compatible server as a library: the wire format ([`api`]), the HTTP
//! routes ([`http`]), the engine step loop behind them ([`engine_loop`]) and the metrics
//! ([`metrics`]). The `tessera serve` command is a thin wrapper around [`serve`].

pub mod api;
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
}

/// Builds the router over a started engine loop (tests use this with their own listener).
pub fn app(engine: Engine, opts: &ServeOptions) -> anyhow::Result<axum::Router> {
    let tokenizer = engine.tokenizer.clone();
    let handle = engine_loop::start(
        engine,
        engine_loop::LoopConfig {
            scheduler: opts.scheduler.clone(),
        },
    )?;
    let state = Arc::new(http::AppState {
        handle,
        model_name: opts.model_name.clone(),
        api_key: opts.api_key.clone(),
        tokenizer,
        max_model_len: opts.scheduler.max_model_len,
        default_max_tokens: opts.default_max_tokens,
    });
    Ok(http::router(state))
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
