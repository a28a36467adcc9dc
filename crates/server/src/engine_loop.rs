//! The engine step loop: one thread that owns the model, the KV storage and the scheduler,
//! and turns submitted requests into steps.
//!
//! Each step: take new submissions and aborts, ask the scheduler for a [`StepPlan`], run one
//! batched forward over its chunks (prefill chunks and decode tokens mixed), sample a token
//! for every sequence whose chunk reached its end, stream the text out, decide EOS and stop
//! strings, and report back to the scheduler. HTTP handlers talk to it only through
//! [`EngineHandle`] and per-request event channels; a dropped [`Submission`] aborts its
//! request, freeing its KV blocks in the next step.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use tessera_engine::sampling::{logprob, Sampler};
use tessera_engine::stop::StopMatcher;
use tessera_engine::Engine;
use tessera_model::{BatchMeta, KvStorage, LogitsFor, SeqChunk};
use tessera_scheduler::{
    FinishReason as SchedFinish, Request, Scheduler, SchedulerConfig, StepPlan,
};
use tessera_tokenizer::StreamDecoder;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::api::{ApiError, FinishReason, GenSpec, TokenLogprob};
use crate::metrics::Metrics;

/// What a request's handler hears from the engine.
#[derive(Debug)]
pub enum Event {
    /// Newly completed text and the log-probabilities of the tokens behind it (when asked).
    Text {
        text: String,
        logprobs: Vec<TokenLogprob>,
    },
    Finished {
        reason: FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
    },
    Error(String),
}

enum Command {
    Submit {
        id: u64,
        prompt: Vec<u32>,
        spec: GenSpec,
        seed_offset: u64,
        events: UnboundedSender<Event>,
    },
    Abort(u64),
}

/// A submitted request: its id and event stream. Dropping it before the request finished
/// aborts the request.
pub struct Submission {
    pub id: u64,
    pub events: UnboundedReceiver<Event>,
    done: bool,
    cmd: mpsc::Sender<Command>,
}

impl Submission {
    /// Marks the request as finished, so dropping the submission sends no abort.
    pub fn finished(&mut self) {
        self.done = true;
    }
}

impl Drop for Submission {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.cmd.send(Command::Abort(self.id));
        }
    }
}

#[derive(Clone)]
pub struct EngineHandle {
    cmd: mpsc::Sender<Command>,
    next_id: Arc<AtomicU64>,
    /// Requests submitted and not yet finished.
    in_flight: Arc<AtomicUsize>,
    max_in_flight: usize,
    pub metrics: Arc<Metrics>,
    alive: Arc<AtomicBool>,
}

impl EngineHandle {
    /// Queues a request (one choice); `seed_offset` keeps the `n` choices of one request
    /// from sampling identically under a seed.
    pub fn submit(
        &self,
        prompt: Vec<u32>,
        spec: &GenSpec,
        seed_offset: u64,
    ) -> Result<Submission, ApiError> {
        if !self.alive.load(Ordering::Acquire) {
            return Err(ApiError::new(503, "server_error", "the engine has stopped"));
        }
        if self.in_flight.fetch_add(1, Ordering::AcqRel) >= self.max_in_flight {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            self.metrics
                .requests_rejected
                .fetch_add(1, Ordering::Relaxed);
            return Err(ApiError::new(
                503,
                "server_overloaded",
                format!(
                    "the server is at capacity ({} requests queued or running); retry later",
                    self.max_in_flight
                ),
            ));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = unbounded_channel();
        let cmd = Command::Submit {
            id,
            prompt,
            spec: spec.clone(),
            seed_offset,
            events: tx,
        };
        if self.cmd.send(cmd).is_err() {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(ApiError::new(503, "server_error", "the engine has stopped"));
        }
        Ok(Submission {
            id,
            events: rx,
            done: false,
            cmd: self.cmd.clone(),
        })
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }
}

pub struct LoopConfig {
    pub scheduler: SchedulerConfig,
}

/// A request the loop is generating for.
struct Live {
    events: UnboundedSender<Event>,
    sampler: Sampler,
    stream: StreamDecoder,
    stops: StopMatcher,
    logprobs: Option<usize>,
    ignore_eos: bool,
    prompt_tokens: usize,
    generated: usize,
    submitted: Instant,
    first_token: Option<Instant>,
}

/// Starts the loop on its own thread.
pub fn start(engine: Engine, cfg: LoopConfig) -> anyhow::Result<EngineHandle> {
    let sched =
        Scheduler::new(cfg.scheduler.clone()).map_err(|e| anyhow::anyhow!("scheduler: {e}"))?;
    let kv = engine
        .model
        .new_kv_storage(cfg.scheduler.block_size, cfg.scheduler.num_blocks)
        .map_err(|e| anyhow::anyhow!("KV storage: {e}"))?;
    let (tx, rx) = mpsc::channel();
    let metrics = Arc::new(Metrics::default());
    *metrics.started.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    metrics
        .kv_blocks_total
        .store(cfg.scheduler.num_blocks as u64, Ordering::Relaxed);
    let handle = EngineHandle {
        cmd: tx,
        next_id: Arc::new(AtomicU64::new(1)),
        in_flight: Arc::new(AtomicUsize::new(0)),
        max_in_flight: cfg.scheduler.max_waiting + cfg.scheduler.max_num_seqs,
        metrics: metrics.clone(),
        alive: Arc::new(AtomicBool::new(true)),
    };
    let (in_flight, alive) = (handle.in_flight.clone(), handle.alive.clone());
    std::thread::Builder::new()
        .name("tessera-engine".into())
        .spawn(move || {
            let mut l = Loop {
                engine,
                kv,
                sched,
                live: HashMap::new(),
                metrics,
                in_flight,
            };
            l.run(rx);
            alive.store(false, Ordering::Release);
        })?;
    Ok(handle)
}

struct Loop {
    engine: Engine,
    kv: KvStorage,
    sched: Scheduler,
    live: HashMap<u64, Live>,
    metrics: Arc<Metrics>,
    in_flight: Arc<AtomicUsize>,
}

impl Loop {
    fn run(&mut self, rx: mpsc::Receiver<Command>) {
        loop {
            // Idle: block for the next command; busy: take what has arrived.
            if !self.sched.has_unfinished() {
                match rx.recv() {
                    Ok(c) => self.command(c),
                    Err(_) => return,
                }
            }
            while let Ok(c) = rx.try_recv() {
                self.command(c);
            }
            if self.sched.has_unfinished() {
                self.step();
            }
            self.publish_gauges();
        }
    }

    fn command(&mut self, c: Command) {
        match c {
            Command::Submit {
                id,
                prompt,
                spec,
                seed_offset,
                events,
            } => {
                let mut params = spec.params.clone();
                params.seed = params.seed.map(|s| s.wrapping_add(seed_offset));
                let req =
                    Request::new(id, prompt.clone(), spec.max_tokens).with_priority(spec.priority);
                if let Err(e) = self.sched.add_request(req) {
                    let _ = events.send(Event::Error(format!("request rejected: {e}")));
                    self.in_flight.fetch_sub(1, Ordering::AcqRel);
                    return;
                }
                self.metrics
                    .prompt_tokens
                    .fetch_add(prompt.len() as u64, Ordering::Relaxed);
                self.live.insert(
                    id,
                    Live {
                        events,
                        sampler: Sampler::new(params, &prompt),
                        stream: StreamDecoder::new(),
                        stops: StopMatcher::new(&spec.stop),
                        logprobs: spec.logprobs,
                        ignore_eos: spec.ignore_eos,
                        prompt_tokens: prompt.len(),
                        generated: 0,
                        submitted: Instant::now(),
                        first_token: None,
                    },
                );
            }
            Command::Abort(id) => {
                self.sched.abort(id);
                if self.live.remove(&id).is_some() {
                    self.in_flight.fetch_sub(1, Ordering::AcqRel);
                }
            }
        }
    }

    fn step(&mut self) {
        let plan = self.sched.schedule();
        self.metrics.steps.fetch_add(1, Ordering::Relaxed);
        self.metrics
            .preemptions
            .fetch_add(plan.preempted.len() as u64, Ordering::Relaxed);
        for &(id, reason) in &plan.finished {
            self.complete(id, reason, None);
        }
        if plan.is_empty() {
            return;
        }
        let batch = BatchMeta {
            seqs: plan
                .seqs
                .iter()
                .map(|s| SeqChunk {
                    tokens: s.tokens.clone(),
                    start_pos: s.start_pos,
                    block_table: s.block_table.clone(),
                    logits: if s.wants_logits {
                        LogitsFor::Last
                    } else {
                        LogitsFor::None
                    },
                })
                .collect(),
        };
        let logits = match self
            .engine
            .model
            .forward(&batch, &mut self.kv, &self.engine.ctx())
        {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("forward failed: {e}");
                for s in &plan.seqs {
                    self.fail(s.id, &format!("the forward step failed: {e}"));
                }
                return;
            }
        };
        let sampled = self.sample(&plan, &logits);
        match self.sched.update(&plan, &sampled) {
            Ok(done) => {
                for (id, reason) in done {
                    self.complete(id, reason, None);
                }
            }
            Err(e) => {
                tracing::error!("scheduler update failed: {e}");
                for s in &plan.seqs {
                    self.fail(s.id, &format!("scheduler error: {e}"));
                }
            }
        }
    }

    /// Samples a token for every chunk that reached its end, streams its text, and finishes
    /// requests on EOS or a stop string. Returns the samples for `Scheduler::update`.
    fn sample(&mut self, plan: &StepPlan, logits: &tessera_model::Logits) -> Vec<(u64, u32)> {
        let mut out = vec![];
        let tok = self.engine.tokenizer.clone();
        for (i, s) in plan.seqs.iter().enumerate() {
            if !s.wants_logits {
                continue;
            }
            let Some(row) = logits.last_of(i) else {
                continue;
            };
            let Some(live) = self.live.get_mut(&s.id) else {
                continue;
            };
            let token = live.sampler.sample(row);
            live.sampler.accept(token);
            out.push((s.id, token));
            let now = Instant::now();
            if live.first_token.is_none() {
                live.first_token = Some(now);
                self.metrics
                    .ttft
                    .observe((now - live.submitted).as_secs_f64());
            }
            if !live.ignore_eos && tok.is_eos(token) {
                self.sched.finish(s.id, SchedFinish::Stop);
                let rest = flush(live, &tok);
                self.complete(s.id, SchedFinish::Stop, rest);
                continue;
            }
            live.generated += 1;
            self.metrics
                .generation_tokens
                .fetch_add(1, Ordering::Relaxed);
            let lps = match live.logprobs {
                Some(top) => vec![token_logprob(&tok, row, token, top)],
                None => vec![],
            };
            let text = live
                .stream
                .push(&tok, token)
                .ok()
                .flatten()
                .unwrap_or_default();
            let (emit, hit) = live.stops.push(&text);
            if !emit.is_empty() || !lps.is_empty() {
                if live
                    .events
                    .send(Event::Text {
                        text: emit,
                        logprobs: lps,
                    })
                    .is_err()
                {
                    // The client is gone: free its blocks now.
                    self.sched.abort(s.id);
                    self.live.remove(&s.id);
                    self.in_flight.fetch_sub(1, Ordering::AcqRel);
                    continue;
                }
            }
            if hit {
                self.sched.finish(s.id, SchedFinish::Stop);
                self.complete(s.id, SchedFinish::Stop, None);
            }
        }
        out
    }

    /// Sends the final event and forgets the request.
    fn complete(&mut self, id: u64, reason: SchedFinish, rest: Option<String>) {
        let Some(mut live) = self.live.remove(&id) else {
            return;
        };
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        let reason = match reason {
            SchedFinish::Stop => FinishReason::Stop,
            SchedFinish::Length => FinishReason::Length,
            SchedFinish::Aborted => FinishReason::Abort,
        };
        let rest = match (reason, rest) {
            (_, Some(r)) => Some(r),
            (FinishReason::Length, None) => flush(&mut live, &self.engine.tokenizer.clone()),
            _ => None,
        };
        if let Some(text) = rest.filter(|t| !t.is_empty()) {
            let _ = live.events.send(Event::Text {
                text,
                logprobs: vec![],
            });
        }
        if let (Some(first), true) = (live.first_token, live.generated > 1) {
            let per = first.elapsed().as_secs_f64() / (live.generated - 1) as f64;
            self.metrics.tpot.observe(per);
        }
        self.metrics
            .requests_finished
            .fetch_add(1, Ordering::Relaxed);
        let _ = live.events.send(Event::Finished {
            reason,
            prompt_tokens: live.prompt_tokens,
            completion_tokens: live.generated,
        });
    }

    fn fail(&mut self, id: u64, msg: &str) {
        self.sched.abort(id);
        if let Some(live) = self.live.remove(&id) {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            let _ = live.events.send(Event::Error(msg.to_string()));
        }
    }

    fn publish_gauges(&self) {
        let m = &self.metrics;
        m.waiting
            .store(self.sched.num_waiting() as u64, Ordering::Relaxed);
        m.running
            .store(self.sched.num_running() as u64, Ordering::Relaxed);
        let kv = self.sched.kv_metrics();
        m.kv_blocks_used
            .store(kv.blocks_used as u64, Ordering::Relaxed);
        m.prefix_cache_queries
            .store(kv.prefix_query_tokens as u64, Ordering::Relaxed);
        m.prefix_cache_hits
            .store(kv.prefix_hit_tokens as u64, Ordering::Relaxed);
    }
}

/// Text held back by the stream decoder and the stop matcher, at the end of a request.
fn flush(live: &mut Live, tok: &tessera_tokenizer::Tokenizer) -> Option<String> {
    let mut s = String::new();
    if let Ok(Some(t)) = live.stream.finish(tok) {
        let (emit, hit) = live.stops.push(&t);
        s.push_str(&emit);
        if hit {
            return Some(s);
        }
    }
    s.push_str(&live.stops.flush());
    Some(s)
}

fn token_logprob(
    tok: &tessera_tokenizer::Tokenizer,
    row: &[f32],
    token: u32,
    top: usize,
) -> TokenLogprob {
    let text = |id: u32| tok.decode(&[id]).unwrap_or_default();
    let mut idx: Vec<usize> = (0..row.len()).collect();
    let top_n = top.min(row.len());
    if top_n > 0 {
        idx.select_nth_unstable_by(top_n - 1, |&a, &b| row[b].total_cmp(&row[a]));
        idx.truncate(top_n);
        idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    } else {
        idx.clear();
    }
    TokenLogprob {
        token: text(token),
        logprob: logprob(row, token as usize),
        top: idx
            .into_iter()
            .map(|i| (text(i as u32), logprob(row, i)))
            .collect(),
    }
}
