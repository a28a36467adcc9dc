//! The network side of `tessera bench serve`: the HTTP client that sends one streaming
//! request and times it, the clients or Poisson arrivals of a measurement, and
//! [`run_serve`], which checks the configuration, warms up, runs every measurement and
//! prints its report.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use futures_util::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;

use super::adapters::{self, adapter_for};
use super::requests::{prompt_lines, request_body, Arrivals, ReqSpec, RequestGen};
use super::response_format::{was_cut, ResponseFormat};
use super::sse::{error_message, StreamAcc};
use super::stats::{summarize, sweep_table, Outcome, Timing};
use super::{Endpoint, Load, OutputLen, ServeConfig};

/// The base URL without a trailing `/` or `/v1`.
pub fn base_url(url: &str) -> String {
    let u = url.trim().trim_end_matches('/');
    u.strip_suffix("/v1").unwrap_or(u).to_string()
}

// ---------------------------------------------------------------------------------------
// Network
// ---------------------------------------------------------------------------------------

/// An error and its causes, `: `-separated (reqwest's own message omits the cause).
fn err_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        src = c.source();
    }
    s
}

pub(super) struct Client {
    http: reqwest::Client,
    url: String,
    api_key: Option<String>,
    model: Option<String>,
    /// `--adapters`: request `i` asks for `adapters[i % len]` instead of `model`.
    adapters: Option<Arc<Vec<String>>>,
    endpoint: Endpoint,
    temperature: f64,
    timeout: Duration,
    /// `--response-format`: sent with every request, each output checked against it.
    response_format: Option<Arc<ResponseFormat>>,
}

impl Client {
    /// Sends `rf` with every request and checks each output against it.
    pub(super) fn with_response_format(mut self, rf: Option<Arc<ResponseFormat>>) -> Self {
        self.response_format = rf;
        self
    }

    /// Sends one request and reads its stream to the end; never panics.
    pub(super) async fn send(&self, spec: &ReqSpec, t0: Instant) -> Outcome {
        let start = t0.elapsed().as_secs_f64();
        let sent = Instant::now();
        let result = match tokio::time::timeout(self.timeout, self.stream(spec, sent)).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "timed out after {:.0} s",
                self.timeout.as_secs_f64()
            )),
        };
        Outcome {
            index: spec.index,
            start,
            result,
        }
    }

    async fn stream(&self, spec: &ReqSpec, sent: Instant) -> std::result::Result<Timing, String> {
        let model = match &self.adapters {
            Some(names) => Some(adapter_for(names, spec.index)),
            None => self.model.as_deref(),
        };
        let mut body = request_body(
            self.endpoint,
            model,
            &spec.prompt,
            spec.max_tokens,
            self.temperature,
        );
        if let Some(rf) = &self.response_format {
            rf.apply(&mut body, self.endpoint);
        }
        let (acc, end) = self.stream_body(&body, sent).await?;
        let Some(ttft) = acc.first_token else {
            return Err("no content in the response stream".into());
        };
        let output_tokens = acc.output_tokens();
        let verdict = self.response_format.as_ref().map(|rf| {
            let cut = was_cut(acc.finish_reason.as_deref(), output_tokens, spec.max_tokens);
            rf.check(&acc.text, cut)
        });
        Ok(Timing {
            ttft,
            tpot: acc.tpot(),
            e2e: end,
            output_tokens,
            prompt_tokens: acc.usage_prompt.unwrap_or(spec.prompt_tokens_est),
            prompt_tokens_exact: acc.usage_prompt.is_some(),
            verdict,
        })
    }

    /// Posts `body` to the endpoint and reads its stream to the dialect's last event:
    /// the accumulated stream and the seconds from `sent` to its end.
    pub(super) async fn stream_body(
        &self,
        body: &Value,
        sent: Instant,
    ) -> std::result::Result<(StreamAcc, f64), String> {
        let mut rb = self.http.post(&self.url).json(body);
        if let Some(k) = &self.api_key {
            rb = rb.bearer_auth(k);
            if self.endpoint == Endpoint::Messages {
                rb = rb.header("x-api-key", k);
            }
        }
        let resp = rb
            .send()
            .await
            .map_err(|e| format!("request failed: {}", err_chain(&e)))?;
        let status = resp.status();
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            return Err(format!("HTTP {status}: {}", error_message(&text)));
        }
        let mut acc = StreamAcc::default();
        let mut body = resp.bytes_stream();
        while let Some(item) = body.next().await {
            let bytes = item.map_err(|e| format!("stream failed: {}", err_chain(&e)))?;
            acc.feed(&bytes, sent.elapsed().as_secs_f64());
            if acc.done || acc.error.is_some() {
                break;
            }
        }
        let end = sent.elapsed().as_secs_f64();
        acc.finish(end);
        if let Some(e) = acc.error {
            return Err(format!("stream error: {e}"));
        }
        if !acc.done {
            return Err("the stream ended before its last event".into());
        }
        Ok((acc, end))
    }
}

/// The first model id of `GET /v1/models`.
async fn first_model(
    http: &reqwest::Client,
    base: &str,
    api_key: Option<&str>,
) -> std::result::Result<String, String> {
    let mut rb = http.get(format!("{base}/v1/models"));
    if let Some(k) = api_key {
        rb = rb.bearer_auth(k);
    }
    let resp = rb.send().await.map_err(|e| err_chain(&e))?;
    let status = resp.status();
    let text = resp.text().await.map_err(|e| err_chain(&e))?;
    if !status.is_success() {
        return Err(format!("HTTP {status}: {}", error_message(&text)));
    }
    let v: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    v.pointer("/data/0/id")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| "no model listed".to_string())
}

struct Shared {
    client: Client,
    gen: Mutex<RequestGen>,
    deadline: Option<Instant>,
    outcomes: Mutex<Vec<Outcome>>,
    pb: ProgressBar,
}

impl Shared {
    /// The next request, unless the count or the time is used up.
    fn next_spec(&self) -> Option<ReqSpec> {
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return None;
        }
        self.gen.lock().unwrap_or_else(|e| e.into_inner()).next()
    }

    fn record(&self, o: Outcome) {
        let mut v = self.outcomes.lock().unwrap_or_else(|e| e.into_inner());
        v.push(o);
        let failed = v.iter().filter(|o| o.result.is_err()).count();
        self.pb
            .set_message(format!("ok {} failed {failed}", v.len() - failed));
        self.pb.inc(1);
    }
}

fn progress_bar(total: Option<usize>, label: &str) -> ProgressBar {
    let pb = match total {
        Some(n) => {
            let pb = ProgressBar::new(n as u64);
            pb.set_style(
                ProgressStyle::with_template(
                    "{prefix} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            pb
        }
        None => {
            let pb = ProgressBar::new_spinner();
            pb.set_style(
                ProgressStyle::with_template("{prefix} {spinner} [{elapsed_precise}] {pos} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            pb.enable_steady_tick(Duration::from_millis(200));
            pb
        }
    };
    pb.set_prefix(label.to_string());
    pb
}

/// One measurement under `load`; returns the outcomes and the wall time in seconds.
async fn measure(shared: Arc<Shared>, load: Load, seed: u64) -> (Vec<Outcome>, f64) {
    let t0 = Instant::now();
    match load {
        Load::Concurrency(c) => {
            let mut set = tokio::task::JoinSet::new();
            for _ in 0..c.max(1) {
                let sh = shared.clone();
                set.spawn(async move {
                    while let Some(spec) = sh.next_spec() {
                        let o = sh.client.send(&spec, t0).await;
                        sh.record(o);
                    }
                });
            }
            while set.join_next().await.is_some() {}
        }
        Load::Rate {
            rate,
            max_concurrency,
        } => {
            let sem = max_concurrency.map(|c| Arc::new(tokio::sync::Semaphore::new(c.max(1))));
            let mut arrivals = Arrivals::new(rate, seed);
            let mut at = 0.0f64;
            let mut set = tokio::task::JoinSet::new();
            loop {
                let when = t0 + Duration::from_secs_f64(at.min(1e9));
                if shared.deadline.is_some_and(|d| when >= d) {
                    break;
                }
                tokio::time::sleep_until(when.into()).await;
                let Some(spec) = shared.next_spec() else {
                    break;
                };
                let sh = shared.clone();
                let sem = sem.clone();
                set.spawn(async move {
                    let _permit = match &sem {
                        Some(s) => s.clone().acquire_owned().await.ok(),
                        None => None,
                    };
                    let o = sh.client.send(&spec, t0).await;
                    sh.record(o);
                });
                at += arrivals.next_gap();
                // Reap finished tasks so the set does not grow without bound.
                while set.try_join_next().is_some() {}
            }
            while set.join_next().await.is_some() {}
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    shared.pb.finish_and_clear();
    let mut v = std::mem::take(&mut *shared.outcomes.lock().unwrap_or_else(|e| e.into_inner()));
    v.sort_by_key(|o| o.index);
    (v, secs)
}

/// Runs the benchmark as configured.
pub fn run_serve(cfg: &ServeConfig) -> Result<()> {
    let (file, response_format) = prepare(cfg)?;
    runtime()?.block_on(run_async(cfg, file, response_format))
}

/// A measurement's prompts from `--prompt-file` (none: random words).
pub(super) type PromptLines = Option<Arc<Vec<String>>>;

/// Checks `cfg` and reads its prompt file and response format.
pub(super) fn prepare(cfg: &ServeConfig) -> Result<(PromptLines, Option<ResponseFormat>)> {
    if cfg.loads.is_empty() {
        bail!("nothing to run");
    }
    if cfg.requests == Some(0) {
        bail!("--requests must be positive");
    }
    if cfg.adapters.as_ref().is_some_and(|a| a.is_empty()) {
        bail!("--adapters needs at least one model name");
    }
    if cfg.output == OutputLen::Fixed(0) {
        bail!("--output-tokens must be positive");
    }
    if cfg.response_format.is_some() && cfg.endpoint == Endpoint::Messages {
        bail!("--response-format is not available with --api messages (Anthropic's Messages API has no response format)");
    }
    let file = match &cfg.prompt_file {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("reading --prompt-file {}", p.display()))?;
            let lines = prompt_lines(&text);
            if lines.is_empty() {
                bail!("--prompt-file {} holds no prompts", p.display());
            }
            Some(Arc::new(lines))
        }
        None => {
            if cfg.prompt_tokens == 0 {
                bail!("--prompt-tokens must be positive");
            }
            None
        }
    };
    let response_format = cfg
        .response_format
        .as_deref()
        .map(ResponseFormat::load)
        .transpose()?;
    Ok((file, response_format))
}

/// The client's runtime: up to 4 worker threads.
pub(super) fn runtime() -> Result<tokio::runtime::Runtime> {
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 4);
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()?)
}

/// The HTTP client for `url` and the model name its requests send (`model`, else the first
/// of `GET /v1/models`, else none), checking the URL.
pub(super) async fn connect(
    url: &str,
    api_key: Option<String>,
    model: Option<String>,
    adapters: Option<Vec<String>>,
    endpoint: Endpoint,
    temperature: f64,
    timeout: Duration,
) -> Result<(Client, Option<String>)> {
    let base = base_url(url);
    if !base.starts_with("http://") && !base.starts_with("https://") {
        bail!("--url must start with http:// (got {url:?})");
    }
    let http = reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(Duration::from_secs(10))
        // A new connection per request, as other serving benchmarks do: llama-server closes
        // the connection after a streamed response while announcing keep-alive, and a pooled
        // connection reused at that moment fails the request ("connection closed before
        // message completed"). A local connection costs well under a millisecond.
        .pool_max_idle_per_host(0)
        .build()
        .context("building the HTTP client")?;
    let model = match (&adapters, model) {
        // The names requests take in turn; the report's model is the list.
        (Some(names), _) => Some(names.join(",")),
        (None, Some(m)) => Some(m),
        (None, None) => match first_model(&http, &base, api_key.as_deref()).await {
            Ok(m) => Some(m),
            Err(e) => {
                eprintln!("note: GET {base}/v1/models failed ({e}); sending no model name");
                None
            }
        },
    };
    let client = Client {
        http,
        url: format!("{base}{}", endpoint.path()),
        api_key,
        model: model.clone(),
        adapters: adapters.map(Arc::new),
        endpoint,
        temperature,
        timeout,
        response_format: None,
    };
    Ok((client, model))
}

/// One measurement: `load` offered with `cfg`'s requests, drawn from `seed`; gives the
/// client back with the outcomes and the measurement's length in seconds.
pub(super) async fn measure_once(
    client: Client,
    cfg: &ServeConfig,
    load: Load,
    seed: u64,
    file: Option<Arc<Vec<String>>>,
    label: &str,
) -> Result<(Client, Vec<Outcome>, f64)> {
    let shared = Arc::new(Shared {
        client,
        gen: Mutex::new(RequestGen::new(
            seed,
            cfg.prompt_tokens,
            file,
            cfg.output,
            cfg.requests,
        )),
        deadline: cfg.duration.map(|d| Instant::now() + d),
        outcomes: Mutex::new(vec![]),
        pb: progress_bar(cfg.requests, label),
    });
    let (outcomes, secs) = measure(shared.clone(), load, seed).await;
    let client = Arc::try_unwrap(shared)
        .ok()
        .map(|s| s.client)
        .ok_or_else(|| anyhow!("internal: the client is still shared after a measurement"))?;
    Ok((client, outcomes, secs))
}

/// Untimed sequential requests (seeded apart from the measured ones).
pub(super) async fn warm_up(
    c: &Client,
    cfg: &ServeConfig,
    seed: u64,
    file: Option<Arc<Vec<String>>>,
) {
    let gen = RequestGen::new(seed, cfg.prompt_tokens, file, cfg.output, Some(cfg.warmup));
    let t0 = Instant::now();
    for spec in gen {
        if let Err(e) = c.send(&spec, t0).await.result {
            eprintln!("warning: warm-up request failed: {e}");
        }
    }
}

async fn run_async(
    cfg: &ServeConfig,
    file: Option<Arc<Vec<String>>>,
    response_format: Option<ResponseFormat>,
) -> Result<()> {
    let (client, model) = connect(
        &cfg.url,
        cfg.api_key.clone(),
        cfg.model.clone(),
        cfg.adapters.clone(),
        cfg.endpoint,
        cfg.temperature,
        cfg.timeout,
    )
    .await?;
    let mut client = Some(client.with_response_format(response_format.map(Arc::new)));

    if cfg.warmup > 0 {
        let c = client.as_ref().ok_or_else(|| anyhow!("no client"))?;
        warm_up(c, cfg, cfg.seed ^ 0x5eed, file.clone()).await;
    }

    let mut runs = vec![];
    for (i, &load) in cfg.loads.iter().enumerate() {
        let label = if cfg.loads.len() > 1 {
            format!("[{}/{}] {}", i + 1, cfg.loads.len(), load.label())
        } else {
            load.label()
        };
        let c = client.take().ok_or_else(|| anyhow!("no client"))?;
        let (c, outcomes, secs) =
            measure_once(c, cfg, load, cfg.seed, file.clone(), &label).await?;
        client = Some(c);
        let stats = summarize(load, &outcomes, secs, cfg.slo_ttft_ms, cfg.slo_tpot_ms);
        let per_adapter = cfg.adapters.as_ref().map(|names| {
            let per = adapters::per_adapter(
                names,
                load,
                &outcomes,
                secs,
                cfg.slo_ttft_ms,
                cfg.slo_tpot_ms,
            );
            (names, per)
        });
        if cfg.json {
            let mut row = stats.to_json(cfg.endpoint, model.as_deref());
            if let Some((names, per)) = &per_adapter {
                adapters::add_to_json(&mut row, names, per);
            }
            println!("{row}");
        } else {
            if i > 0 {
                println!();
            }
            print!("{}", stats.table(cfg.endpoint, model.as_deref()));
            if let Some((names, per)) = &per_adapter {
                print!("{}", adapters::table(names, per));
            }
        }
        if stats.failed > 0 {
            eprintln!(
                "{} of {} requests failed; first error: {}",
                stats.failed,
                outcomes.len(),
                stats.first_error.as_deref().unwrap_or("?")
            );
        }
        if cfg.plot.is_some() && cfg.loads.len() == 1 {
            if let Some(path) = &cfg.plot {
                match crate::serve_plot::plot_requests(path, &outcomes, &load.label()) {
                    Ok(()) => eprintln!("wrote {}", path.display()),
                    Err(e) => eprintln!("warning: plot failed: {e:#}"),
                }
            }
        }
        runs.push(stats);
    }
    if runs.len() > 1 {
        if !cfg.json {
            println!();
            print!("{}", sweep_table(&runs));
        }
        if let Some(path) = &cfg.plot {
            match crate::serve_plot::plot_sweep(path, &runs) {
                Ok(()) => eprintln!("wrote {}", path.display()),
                Err(e) => eprintln!("warning: plot failed: {e:#}"),
            }
        }
    }
    if runs.iter().all(|r| r.completed == 0) {
        bail!("no request completed");
    }
    Ok(())
}
