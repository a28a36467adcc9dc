//! `tessera serve`: the server's flags, and the step from them to a running server (model,
//! KV cache size, scheduler limits, adapters).

use anyhow::{bail, Context, Result};
use tessera_engine::constrain::GrammarLimits;

use tessera_kernels::plan::Precision;

use crate::{default_model_name, ModelArgs};

#[derive(clap::Args)]
pub struct ServeArgs {
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` (scheme in any case) or `x-api-key: KEY` on every
    /// /v1 route: completions, chat completions, messages, models, and loading and unloading
    /// LoRA adapters.
    /// /health is always open; /metrics is open unless --metrics-require-key.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Make /metrics require the --api-key too.
    #[arg(long, requires = "api_key")]
    pub metrics_require_key: bool,
    /// Origins browsers may call the API from, comma-separated (`*`: any), e.g.
    /// `https://app.example.com,http://localhost:5173`. Off by default (no CORS headers);
    /// preflights are answered without the API key.
    #[arg(long, value_delimiter = ',')]
    pub cors_origins: Vec<String>,
    /// Seconds a client has to send a complete request head: from connecting, or from the
    /// first byte of its next request on a kept-alive connection. Slower ones are
    /// disconnected.
    #[arg(long, default_value_t = 10.0)]
    pub header_timeout: f64,
    /// Seconds a request's body has to arrive in full; slower ones get HTTP 408.
    #[arg(long, default_value_t = 30.0)]
    pub body_timeout: f64,
    /// Seconds an idle kept-alive connection stays open between requests.
    #[arg(long, default_value_t = 30.0)]
    pub keep_alive_timeout: f64,
    /// Largest request body in bytes; larger ones get HTTP 413 (a declared Content-Length
    /// over it is refused before the body is read).
    #[arg(long, default_value_t = 8 << 20)]
    pub max_body_bytes: usize,
    /// Bytes of stored responses (`/v1/responses` with `store`) kept at most; the least
    /// recently used are evicted past it, and one response bigger than it is not kept.
    #[arg(long, default_value_t = 64 << 20)]
    pub responses_store_bytes: usize,
    /// Prompts tokenized (and chat templates rendered) at once, off the request threads;
    /// more wait for a turn.
    #[arg(long, default_value_t = 2)]
    pub tokenize_concurrency: usize,
    /// Model name clients use (default: the model's name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Most sequences decoding at once.
    #[arg(long, default_value_t = 32)]
    pub max_num_seqs: usize,
    /// Token budget of one engine step (decodes plus prefill chunks). Small steps keep
    /// time-to-first-token low while long prompts prefill; on a CPU the matrix products
    /// are already efficient at this size.
    #[arg(long, default_value_t = 128)]
    pub max_batched_tokens: usize,
    /// Longest prefill chunk of one sequence in one step.
    #[arg(long, default_value_t = 64)]
    pub max_prefill_chunk: usize,
    /// Fill each engine step until its predicted time reaches this many milliseconds
    /// (--max-batched-tokens stays an upper limit). The prediction is a cost model fitted at
    /// start-up to the model's measured stage times, attention over the context included, so
    /// chunks deep in long prompts get fewer tokens and a short request arriving meanwhile
    /// starts within about one budget. `auto`: 1.25 times the predicted step of a 32-token
    /// prompt. 0: steps by tokens alone.
    #[arg(long, default_value = "auto")]
    pub step_time_budget_ms: String,
    /// Under the step-time budget, only prompts longer than this many tokens are chunked by
    /// predicted time; shorter ones are chunked by --max-batched-tokens and
    /// --max-prefill-chunk alone, as with a budget of 0 (finer chunks would cost them
    /// throughput and buy little latency). Default: 4% of the context, as vLLM's
    /// long_prefill_token_threshold. 0: every prompt is chunked by time.
    #[arg(long)]
    pub long_prefill_tokens: Option<usize>,
    /// Context length (default: the model's, at most 8192). Also what RoPE choices that
    /// depend on the context follow (Phi-3's LongRoPE takes its short factors when the
    /// context fits the original one).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// KV cache size in blocks of 16 positions (default: from --kv-memory-mb).
    #[arg(long)]
    pub kv_blocks: Option<usize>,
    /// KV cache memory budget when --kv-blocks is not given.
    #[arg(long, default_value_t = 1024)]
    pub kv_memory_mb: usize,
    /// Most LoRA adapters resident at once; the least recently used is evicted beyond
    /// (and reloaded from its file when asked for again).
    #[arg(long, default_value_t = 8)]
    pub max_loras: usize,
    /// `mixed`: requests of different adapters share every step; `serial`: a step runs
    /// one adapter's requests only, taking turns (llama.cpp's server; for comparison).
    #[arg(long, default_value = "mixed")]
    pub lora_batching: String,
    /// Sequences allowed to wait beyond --max-num-seqs running ones; a request that would go
    /// past (it counts as n choices × its prompts) gets HTTP 503.
    #[arg(long, default_value_t = 256)]
    pub max_waiting: usize,
    /// max_tokens when a request does not say.
    #[arg(long, default_value_t = 256)]
    pub default_max_tokens: usize,
    /// How the model writes tool calls: hermes (Qwen2.5, Qwen3, Hermes), llama3_json,
    /// mistral, or none. Default: read off the chat template.
    #[arg(long, value_name = "NAME")]
    pub tool_call_parser: Option<String>,
    /// How the model marks its reasoning, split into `reasoning_content`: qwen3,
    /// deepseek_r1 (and the other names of the reasoning-parser crate), or none. Default:
    /// qwen3 when the chat template thinks in <think>, deepseek_r1 when its generation
    /// prompt opens <think>.
    #[arg(long, value_name = "NAME")]
    pub reasoning_parser: Option<String>,
    /// Largest grammar a constrained request may build (llguidance's size after expansion);
    /// a schema past it gets 400.
    #[arg(long, default_value_t = GrammarLimits::default().max_grammar_size)]
    pub grammar_max_size: usize,
    /// Most lexer states one grammar may build.
    #[arg(long, default_value_t = GrammarLimits::default().max_lexer_states)]
    pub grammar_max_lexer_states: usize,
    /// Lexer work allowed to build a grammar's first mask (llguidance's fuel).
    #[arg(long, default_value_t = GrammarLimits::default().initial_lexer_fuel)]
    pub grammar_initial_fuel: u64,
    /// Lexer work allowed per token of a constrained request; past it the request fails.
    #[arg(long, default_value_t = GrammarLimits::default().step_lexer_fuel)]
    pub grammar_step_fuel: u64,
    #[command(flatten)]
    pub spec: crate::SpecArgs,
    /// Parse special tokens (`<|im_end|>`...) written inside chat messages as control
    /// tokens. Off by default: message contents are text, so a user cannot close their
    /// turn or open a system one. Raw completions always parse them.
    #[arg(long)]
    pub allow_special_tokens_in_chat: bool,
    #[command(flatten)]
    pub model: ModelArgs,
}

/// The scheduler's time budget for `--step-time-budget-ms` (`None` for 0): the step-cost
/// model calibrated on `engine` for steps up to the token budget, said on stderr.
fn step_time_budget(
    engine: &tessera_engine::Engine,
    sched: &tessera_scheduler::SchedulerConfig,
    arg: &str,
) -> Result<Option<tessera_scheduler::TimeBudget>> {
    use tessera_engine::step_cost;
    let ms = match arg.trim() {
        "auto" => None,
        s => match s.parse::<f64>() {
            Ok(0.0) => return Ok(None),
            Ok(v) if v > 0.0 && v.is_finite() => Some(v),
            _ => bail!(
                "--step-time-budget-ms {arg:?}: expected auto, a positive number of \
                 milliseconds, or 0"
            ),
        },
    };
    let cost = step_cost::calibrate(engine, sched.max_num_batched_tokens)
        .context("calibrating the step-cost model")?;
    let budget = match ms {
        None => step_cost::auto_budget(cost),
        Some(v) => tessera_scheduler::TimeBudget::secs(cost, v * 1e-3),
    };
    let (asked, effective) = (budget.budget_s() * 1e3, budget.effective_s() * 1e3);
    let how = match ms {
        None => "auto: 1.25x a 32-token prompt's step, refitted with the cost".to_string(),
        Some(_) if effective > asked => {
            format!("raised from {asked:.0} ms: the fixed parts take at most a quarter")
        }
        Some(_) => "--step-time-budget-ms".to_string(),
    };
    eprintln!(
        "step cost model: {}, refitted to every step; steps filled to {effective:.0} ms \
         predicted ({how}); prompts of up to {} tokens chunked by tokens alone",
        step_cost::describe(&cost),
        sched.long_prefill_tokens
    );
    Ok(Some(budget))
}

pub fn run(args: ServeArgs) -> Result<()> {
    let ServeArgs {
        host,
        port,
        api_key,
        metrics_require_key,
        cors_origins,
        header_timeout,
        body_timeout,
        keep_alive_timeout,
        max_body_bytes,
        responses_store_bytes,
        tokenize_concurrency,
        served_model_name,
        max_num_seqs,
        max_batched_tokens,
        max_prefill_chunk,
        step_time_budget_ms,
        long_prefill_tokens,
        max_model_len,
        kv_blocks,
        kv_memory_mb,
        max_waiting,
        default_max_tokens,
        tool_call_parser,
        reasoning_parser,
        grammar_max_size,
        grammar_max_lexer_states,
        grammar_initial_fuel,
        grammar_step_fuel,
        max_loras,
        lora_batching,
        allow_special_tokens_in_chat,
        spec,
        model,
    } = args;
    crate::device::check(model.device, model.tp, 0, spec.speculative.is_some())?;
    let speculation = spec.config(model.tp)?;

    let seconds = |flag: &str, v: f64| {
        if v > 0.0 && v.is_finite() && v < 1e9 {
            Ok(std::time::Duration::from_secs_f64(v))
        } else {
            Err(anyhow::anyhow!(
                "{flag} must be a positive number of seconds"
            ))
        }
    };
    let http = tessera_server::HttpOptions {
        header_timeout: seconds("--header-timeout", header_timeout)?,
        body_timeout: seconds("--body-timeout", body_timeout)?,
        keep_alive_timeout: seconds("--keep-alive-timeout", keep_alive_timeout)?,
        max_body_bytes,
        tokenize_concurrency,
        metrics_require_key,
        responses_store_bytes,
        cors_origins,
    };
    http.validate()
        .map_err(|e| anyhow::anyhow!("invalid server settings: {e}"))?;
    let loras =
        tessera_server::adapters::parse_lora_flags(&model.lora).map_err(anyhow::Error::msg)?;
    let serial = match lora_batching.as_str() {
        "mixed" => false,
        "serial" => true,
        o => bail!("--lora-batching {o:?}: expected mixed or serial"),
    };
    let mut engine = crate::load_with_context(&model, Precision::Exact, max_model_len)?;
    engine.set_grammar_limits(GrammarLimits {
        max_grammar_size: grammar_max_size,
        max_lexer_states: grammar_max_lexer_states,
        initial_lexer_fuel: grammar_initial_fuel,
        step_lexer_fuel: grammar_step_fuel,
        ..GrammarLimits::default()
    });
    engine
        .tokenizer
        .set_allow_special_in_content(allow_special_tokens_in_chat);
    if let Some(e) = engine.tokenizer.chat_template_error() {
        eprintln!("note: {e}; /v1/chat/completions will fail, /v1/completions works");
    }
    let block = tessera_engine::KV_BLOCK_SIZE;
    // Sliding-window layers keep only the running sequences' windows (a window group of
    // fixed size); the rest of the memory budget goes to the full cache's blocks.
    let max_batched = max_batched_tokens.max(max_num_seqs);
    let window = tessera_engine::step::window_group_for(
        &engine,
        block,
        max_num_seqs,
        max_prefill_chunk.min(max_batched),
    );
    let (full_per_block, window_per_block) = engine.kv_bytes_per_block_groups(block);
    let (per_block, window_mb) = match window {
        Some(w) => (
            full_per_block,
            (w.num_blocks * window_per_block).div_ceil(1 << 20),
        ),
        None => (engine.kv_bytes_per_block(block), 0),
    };
    if kv_blocks.is_none() && window_mb >= kv_memory_mb {
        bail!(
            "--kv-memory-mb {kv_memory_mb}: the sliding-window layers of {max_num_seqs} \
             sequences alone take {window_mb} MB"
        );
    }
    // The cache must fit the memory, the context the cache.
    let kv = tessera_engine::resources::size_kv(
        &tessera_engine::resources::KvRequest {
            blocks: kv_blocks,
            memory_mb: kv_memory_mb.saturating_sub(window_mb),
            max_model_len,
            default_context: 8192,
        },
        per_block,
        block,
        engine.config.max_position,
    )?;
    if let Some(note) = &kv.note {
        eprintln!("{note}");
    }
    let (num_blocks, max_model_len) = (kv.num_blocks, kv.max_model_len);
    let mut sched = tessera_scheduler::SchedulerConfig::new(num_blocks, block);
    sched.max_num_seqs = max_num_seqs;
    sched.max_num_batched_tokens = max_batched_tokens.max(max_num_seqs);
    sched.max_prefill_chunk = max_prefill_chunk;
    sched.max_model_len = max_model_len;
    sched.max_waiting = max_waiting;
    sched.adapter_serial = serial;
    sched.long_prefill_tokens = long_prefill_tokens.unwrap_or(max_model_len / 25);
    sched.window = window;
    sched.time_budget = if model.device == tessera_engine::DeviceKind::Cpu {
        step_time_budget(&engine, &sched, &step_time_budget_ms)?
    } else {
        // The step-cost model is fitted to the CPU forward's stage times.
        eprintln!(
            "--device {}: steps are filled by tokens alone (the step-time budget's cost model \
             is the CPU's)",
            model.device
        );
        None
    };
    sched
        .validate()
        .map_err(|e| anyhow::anyhow!("invalid server settings: {e}"))?;
    eprintln!(
        "KV cache: {num_blocks} blocks of {block} positions ({:.0} MB, {}), context {max_model_len}",
        kv.bytes as f64 / 1e6,
        engine.kv_dtype
    );
    if let Some(w) = window {
        eprintln!(
            "KV window group: the {}-position sliding-window layers in {} blocks ({:.0} MB): \
             each sequence holds only its window there",
            w.window,
            w.num_blocks,
            (w.num_blocks * window_per_block) as f64 / 1e6
        );
    }
    let name = served_model_name.unwrap_or_else(|| default_model_name(&model, &engine));
    let addr: std::net::SocketAddr = format!("{host}:{port}")
        .parse()
        .with_context(|| format!("--host {host:?} --port {port}"))?;
    let opts = tessera_server::ServeOptions {
        addr,
        model_name: name,
        api_key,
        scheduler: sched,
        default_max_tokens,
        loras,
        max_loras,
        http,
        tool_parser: tool_call_parser,
        reasoning_parser,
        speculation,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(tessera_server::serve(engine, opts))?;

    Ok(())
}
