//! `tessera bench model --speculative ...`: decoding speed with speculation against plain
//! decoding, on three workloads (code editing, where the answer repeats most of the prompt;
//! summarizing and quoting; open chat), single-stream and with 16 sequences batched, in one
//! run. Greedy, so both runs must give the same tokens: the bench checks that they do.
//!
//! Single stream: each prompt of the workload is generated plainly and with speculation
//! (alternating, `reps` times); the figure is generated tokens over decode seconds (from
//! the first token to the end), summed over the workload's prompts, median over the reps.
//! Batched: `clients` requests (the workload's prompts in turn) run together on one step
//! engine to the end; the figure is the tokens generated once every prompt is prefilled,
//! over the seconds from then to the end.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use tessera_engine::draft::DraftModel;
use tessera_engine::generate::{generate_with, single_request_config};
use tessera_engine::spec::{DrafterSpec, SpecConfig, SpecStats, SpecTokens};
use tessera_engine::{
    store, tuning, Engine, GenerateRequest, RequestEvent, SamplingParams, StepEngine,
};
use tessera_kernels::plan::Precision;
use tessera_tokenizer::ChatMessage;

use crate::stats::median;

/// The built-in workloads (docs/bench/spec/workloads.json).
const WORKLOADS: &str = include_str!("../../../docs/bench/spec/workloads.json");

#[derive(Debug, Clone)]
pub struct SpecBenchConfig {
    pub model: Option<PathBuf>,
    pub threads: usize,
    pub precision: Precision,
    pub drafter: DrafterSpec,
    pub tokens: SpecTokens,
    /// Most tokens generated per request.
    pub gen_tokens: usize,
    pub reps: usize,
    /// Sequences of the batched measurement (0: none).
    pub clients: usize,
    /// Workload names to run (empty: all), and a JSON file replacing the built-in ones.
    pub workloads: Vec<String>,
    pub workload_file: Option<PathBuf>,
    pub json: bool,
}

type Spec = Option<(SpecConfig, Option<DraftModel>)>;

/// One measurement: tokens per second plain and speculative, and the drafter's counters.
struct Measured {
    plain: f64,
    spec: f64,
    stats: SpecStats,
    identical: bool,
}

pub fn run_spec(cfg: &SpecBenchConfig) -> Result<()> {
    if cfg.reps == 0 || cfg.gen_tokens == 0 {
        bail!("--reps and --gen-tokens must be at least 1");
    }
    let path = store::resolve_model(cfg.model.as_deref())?;
    let engine = Engine::load_with(&path, cfg.threads, cfg.precision, tuning::load_planner())?;
    let loads: Value = match &cfg.workload_file {
        Some(f) => serde_json::from_str(
            &std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?,
        )
        .with_context(|| format!("{}: expected {{\"name\": [prompt, ...]}}", f.display()))?,
        None => serde_json::from_str(WORKLOADS)?,
    };
    let Some(loads) = loads.as_object() else {
        bail!("workloads: expected an object of prompt lists");
    };
    let positions = 16 * 4096;
    let mut spec: Spec = Some((
        SpecConfig {
            drafter: cfg.drafter.clone(),
            tokens: cfg.tokens,
        },
        match &cfg.drafter {
            DrafterSpec::Model(p) => Some(DraftModel::load(p, cfg.threads, &engine, positions)?),
            DrafterSpec::NGram { .. } => None,
        },
    ));
    let say = |s: String| {
        if cfg.json {
            eprintln!("{s}");
        } else {
            println!("{s}");
        }
    };
    say(format!(
        "model {} ({}), drafter {}, spec tokens {}, {} threads, isa {}, greedy, up to {} tokens",
        engine.name,
        path.display(),
        match &cfg.drafter {
            DrafterSpec::Model(p) => format!("draft model {}", p.display()),
            DrafterSpec::NGram { .. } => "ngram (prompt lookup)".into(),
        },
        match cfg.tokens {
            SpecTokens::Fixed(k) => k.to_string(),
            SpecTokens::Auto { max } => format!("auto (at most {max})"),
        },
        cfg.threads,
        tessera_engine::isa_name(),
        cfg.gen_tokens
    ));
    if let Some(w) = crate::stats::load_warning() {
        eprintln!("{w}");
    }
    let mut rows = Vec::new();
    for (name, prompts) in loads {
        if !cfg.workloads.is_empty() && !cfg.workloads.contains(name) {
            continue;
        }
        let prompts: Vec<Vec<u32>> = prompts
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .map(|p| {
                engine
                    .tokenizer
                    .encode_chat(&[ChatMessage::new("user", p)], true)
            })
            .collect::<tessera_core::Result<_>>()?;
        if prompts.is_empty() {
            bail!("workload {name:?} has no prompts");
        }
        let reqs: Vec<GenerateRequest> = prompts
            .iter()
            .map(|p| GenerateRequest {
                prompt_ids: p.clone(),
                max_tokens: cfg.gen_tokens,
                params: SamplingParams::greedy(),
                ..Default::default()
            })
            .collect();
        let single = single_stream(&engine, &reqs, cfg.reps, &mut spec)?;
        say(line(name, 1, &single));
        rows.push(row(name, 1, &single));
        if cfg.clients > 0 {
            let many: Vec<GenerateRequest> = (0..cfg.clients)
                .map(|i| reqs[i % reqs.len()].clone())
                .collect();
            let batched = batched(&engine, &many, cfg.reps, &mut spec)?;
            say(line(name, cfg.clients, &batched));
            rows.push(row(name, cfg.clients, &batched));
        }
    }
    if cfg.json {
        println!(
            "{}",
            json!({
                "model": engine.name,
                "drafter": cfg.drafter.name(),
                "spec_tokens": match cfg.tokens { SpecTokens::Fixed(k) => json!(k), SpecTokens::Auto { .. } => json!("auto") },
                "threads": cfg.threads,
                "gen_tokens": cfg.gen_tokens,
                "rows": rows,
            })
        );
    }
    Ok(())
}

fn line(name: &str, clients: usize, m: &Measured) -> String {
    format!(
        "{name:<8} {clients:>2} stream(s): plain {:>7.1} tok/s  speculative {:>7.1} tok/s  \
         {:>5.2}x  acceptance {:>5.1}%  {:.2} tokens/verification  outputs {}",
        m.plain,
        m.spec,
        m.spec / m.plain,
        100.0 * m.stats.acceptance(),
        m.stats.tokens_per_verification(),
        if m.identical { "identical" } else { "DIFFER" }
    )
}

fn row(name: &str, clients: usize, m: &Measured) -> Value {
    json!({
        "workload": name,
        "clients": clients,
        "plain_tok_s": m.plain,
        "spec_tok_s": m.spec,
        "speedup": m.spec / m.plain,
        "acceptance": m.stats.acceptance(),
        "tokens_per_verification": m.stats.tokens_per_verification(),
        "drafted": m.stats.drafted,
        "accepted": m.stats.accepted,
        "identical": m.identical,
    })
}

/// Each request alone, plain then speculative, `reps` times: tokens over decode seconds.
fn single_stream(
    engine: &Engine,
    reqs: &[GenerateRequest],
    reps: usize,
    spec: &mut Spec,
) -> Result<Measured> {
    let (mut plain, mut fast) = (Vec::new(), Vec::new());
    let mut stats = SpecStats::default();
    let mut identical = true;
    for _ in 0..reps {
        let (mut pt, mut ps, mut st, mut ss) = (0usize, 0f64, 0usize, 0f64);
        for r in reqs {
            let a = generate_with(engine, r, &mut None, &mut |_| {})?;
            let b = generate_with(engine, r, spec, &mut |_| {})?;
            identical &= a.tokens == b.tokens;
            pt += a.tokens.len().saturating_sub(1);
            ps += a.decode_secs;
            st += b.tokens.len().saturating_sub(1);
            ss += b.decode_secs;
            if let Some(s) = b.spec {
                stats.add(&s);
            }
        }
        plain.push(pt as f64 / ps.max(1e-9));
        fast.push(st as f64 / ss.max(1e-9));
    }
    Ok(Measured {
        plain: median(&plain),
        spec: median(&fast),
        stats,
        identical,
    })
}

/// All requests together on one step engine, plain then speculative, `reps` times:
/// decode tokens per second.
fn batched(
    engine: &Engine,
    reqs: &[GenerateRequest],
    reps: usize,
    spec: &mut Spec,
) -> Result<Measured> {
    let (mut plain, mut fast) = (Vec::new(), Vec::new());
    let mut stats = SpecStats::default();
    let mut identical = true;
    for _ in 0..reps {
        let (a, ta, _) = run_batch(engine, reqs, &mut None)?;
        let (b, tb, s) = run_batch(engine, reqs, spec)?;
        identical &= a == b;
        plain.push(ta);
        fast.push(tb);
        if let Some(s) = s {
            stats.add(&s);
        }
    }
    Ok(Measured {
        plain: median(&plain),
        spec: median(&fast),
        stats,
        identical,
    })
}

/// The tokens of every request, the decode window's tokens per second, and the counters.
type BatchRun = (HashMap<u64, Vec<u32>>, f64, Option<SpecStats>);

fn run_batch(engine: &Engine, reqs: &[GenerateRequest], spec: &mut Spec) -> Result<BatchRun> {
    let longest = reqs
        .iter()
        .map(|r| r.prompt_ids.len() + r.max_tokens)
        .max()
        .unwrap_or(1);
    let mut cfg = single_request_config(engine, longest * reqs.len());
    cfg.max_num_seqs = reqs.len();
    cfg.max_waiting = reqs.len();
    cfg.max_num_batched_tokens = 512;
    cfg.max_prefill_chunk = 256;
    let mut steps = StepEngine::new(engine, cfg)?;
    if let Some((c, m)) = spec.take() {
        steps.set_speculation(Some(c), m)?;
    }
    for (i, r) in reqs.iter().enumerate() {
        steps
            .submit(i as u64, r)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let mut out: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut failed = None;
    // The decode window: from the step after which every request has its first token (all
    // prompts prefilled) to the end; the tokens made in it over its seconds.
    let mut window: Option<(Instant, usize)> = None;
    while steps.has_work() {
        for (id, ev) in steps.step().events {
            match ev {
                RequestEvent::Text { tokens, .. } => out.entry(id).or_default().extend(tokens),
                RequestEvent::Failed { message } => failed = Some(message),
                RequestEvent::Finished { .. } => {
                    out.entry(id).or_default();
                }
            }
        }
        if window.is_none() && out.len() == reqs.len() {
            window = Some((Instant::now(), out.values().map(Vec::len).sum()));
        }
    }
    let (t1, before) = window.unwrap_or((Instant::now(), 0));
    let secs = t1.elapsed().as_secs_f64().max(1e-9);
    let stats = steps.spec_stats().map(|s| s.1);
    *spec = steps.take_speculation();
    if let Some(m) = failed {
        bail!("a request failed: {m}");
    }
    let made: usize = out.values().map(Vec::len).sum();
    Ok((out, (made - before) as f64 / secs, stats))
}
