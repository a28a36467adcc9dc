//! The engine thread: owns the model and a [`StepEngine`], takes submissions and aborts from
//! the HTTP handlers, runs steps, and routes each request's [`RequestEvent`]s to its channel.
//!
//! A request's sequences (its `n` choices of every prompt) arrive as one group, admitted whole
//! or refused whole; the handler hears which before it answers, so a refusal is an HTTP
//! status (503 for capacity, through the [`Admission`] gate; 400 for an invalid request), never
//! a failed response. Each sequence gives its admission place back when it ends.
//!
//! Everything about a step (scheduling, the forward, sampling, stop strings, fault isolation)
//! is the step engine's; this module only maps requests to channels, keeps the metrics, and
//! watches its own health: if the thread dies anyway, every channel closes, `/health` answers
//! 503 with the reason, and new submissions are refused with it. A dropped [`Submission`]
//! aborts its request, freeing its KV blocks in the next step.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

use tessera_engine::constrain::{Constraint, ConstraintSpec, Grammars};
use tessera_engine::draft::DraftModel;
use tessera_engine::spec::{DrafterSpec, SpecConfig};
use tessera_engine::step::panic_message;
use tessera_engine::{Engine, GenerateRequest, RequestEvent, StepEngine, StepOutcome, SubmitError};
use tessera_scheduler::SchedulerConfig;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::sync::oneshot;

use crate::admission::{Admission, Reservation};
use crate::api::ApiError;
use crate::metrics::Metrics;

/// One sequence of a submitted group.
struct Pending {
    id: u64,
    req: GenerateRequest,
    /// Its grammar, built off the engine thread.
    constraint: Option<Constraint>,
    events: UnboundedSender<RequestEvent>,
}

enum Command {
    /// A request's sequences, all admitted or none; `admitted` hears which.
    Submit {
        group: Vec<Pending>,
        admitted: oneshot::Sender<Result<(), ApiError>>,
    },
    Abort(u64),
}

/// A submitted request: its id and event stream. Dropping it before the request finished
/// aborts the request.
pub struct Submission {
    pub id: u64,
    pub events: UnboundedReceiver<RequestEvent>,
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

/// Whether the engine thread runs, and why not.
#[derive(Default)]
pub struct Health {
    stopped: AtomicBool,
    reason: Mutex<Option<String>>,
}

impl Health {
    /// `None` while the engine runs; the reason it stopped otherwise.
    pub fn stopped(&self) -> Option<String> {
        if !self.stopped.load(Ordering::Acquire) {
            return None;
        }
        let r = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        Some(r.clone().unwrap_or_else(|| "the engine has stopped".into()))
    }

    fn stop(&self, reason: String) {
        *self.reason.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason);
        self.stopped.store(true, Ordering::Release);
    }
}

#[derive(Clone)]
pub struct EngineHandle {
    cmd: mpsc::Sender<Command>,
    next_id: Arc<AtomicU64>,
    pub admission: Arc<Admission>,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    /// The grammar engine, so that constrained requests' grammars are built on the
    /// blocking pool rather than on the engine thread, where they would stall every step.
    grammars: Arc<Result<Grammars, String>>,
}

impl EngineHandle {
    /// The 503 for a stopped engine.
    fn stopped(&self) -> ApiError {
        let reason = self
            .health
            .stopped()
            .unwrap_or_else(|| "the engine has stopped".into());
        ApiError::new(503, "server_error", reason)
    }

    /// The grammars of `reqs`' constraints (none if they have none), built on the blocking
    /// pool. A constraint the grammar engine refuses gets 400 naming the problem.
    async fn build_grammars(
        &self,
        reqs: &[GenerateRequest],
    ) -> Result<Vec<Option<Constraint>>, ApiError> {
        if reqs.iter().all(|r| r.constraint.is_none()) {
            return Ok(Vec::new());
        }
        let specs: Vec<Option<ConstraintSpec>> =
            reqs.iter().map(|r| r.constraint.clone()).collect();
        let grammars = self.grammars.clone();
        let built = tokio::task::spawn_blocking(move || {
            let g = grammars.as_ref().as_ref().map_err(|e| e.clone())?;
            specs
                .iter()
                .map(|s| s.as_ref().map(|s| g.matcher(s)).transpose())
                .collect::<tessera_core::Result<Vec<_>>>()
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| {
            ApiError::new(
                500,
                "server_error",
                format!("building the grammar failed: {e}"),
            )
        })?;
        built.map_err(|m| {
            ApiError::new(
                400,
                "invalid_request_error",
                format!("request rejected: {m}"),
            )
        })
    }

    /// Submits one request's sequences under `reservation` (one place each) and waits until
    /// the engine thread has admitted them all or refused them all.
    pub async fn submit(
        &self,
        reqs: Vec<GenerateRequest>,
        reservation: Reservation,
    ) -> Result<Vec<Submission>, ApiError> {
        if reservation.places() != reqs.len() {
            // A handler reserved for another shape of request than it submits: refuse it
            // rather than let the gate's count drift.
            return Err(ApiError::new(
                500,
                "server_error",
                format!(
                    "internal error: {} sequences submitted under a reservation of {}",
                    reqs.len(),
                    reservation.places()
                ),
            ));
        }
        if self.health.stopped().is_some() {
            return Err(self.stopped());
        }
        let mut built = self.build_grammars(&reqs).await?;
        let mut group = Vec::with_capacity(reqs.len());
        let mut subs = Vec::with_capacity(reqs.len());
        for (i, req) in reqs.into_iter().enumerate() {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = unbounded_channel();
            group.push(Pending {
                id,
                req,
                constraint: built.get_mut(i).and_then(Option::take),
                events: tx,
            });
            subs.push(Submission {
                id,
                events: rx,
                done: false,
                cmd: self.cmd.clone(),
            });
        }
        let (admitted, answer) = oneshot::channel();
        // From here the engine thread gives the places back, one per sequence as it ends
        // (or all at once if it refuses the group).
        let places = reservation.hand_over();
        if self.cmd.send(Command::Submit { group, admitted }).is_err() {
            self.admission.release(places);
            subs.iter_mut().for_each(Submission::finished);
            return Err(self.stopped());
        }
        // Dropped while waiting (the client went away): the submissions' aborts follow the
        // group down the same channel.
        match answer.await {
            Ok(Ok(())) => Ok(subs),
            Ok(Err(e)) => {
                subs.iter_mut().for_each(Submission::finished);
                Err(e)
            }
            Err(_) => {
                subs.iter_mut().for_each(Submission::finished);
                Err(self.stopped())
            }
        }
    }
}

pub struct LoopConfig {
    pub scheduler: SchedulerConfig,
    /// Speculative decoding (a draft model is loaded on the engine thread at start).
    pub speculation: Option<SpecConfig>,
}

/// Where a live request's events go, and its timing for the metrics.
struct Route {
    events: UnboundedSender<RequestEvent>,
    submitted: Instant,
    first_token: Option<Instant>,
    generated: usize,
}

/// Starts the engine thread; returns once its step engine (KV storage included) exists.
pub fn start(engine: Engine, cfg: LoopConfig) -> anyhow::Result<EngineHandle> {
    let (tx, rx) = mpsc::channel();
    let metrics = Arc::new(Metrics::default());
    *metrics.started.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    metrics
        .kv_blocks_total
        .store(cfg.scheduler.num_blocks as u64, Ordering::Relaxed);
    *metrics.kv_dtype.lock().unwrap_or_else(|e| e.into_inner()) = Some(engine.kv_dtype.name());
    // The gate bounds sequences queued or running; the scheduler's own queue bound is raised
    // to the same capacity, so it never refuses what the gate admitted.
    let mut scheduler = cfg.scheduler;
    let speculation = cfg.speculation;
    let capacity = scheduler.max_waiting + scheduler.max_num_seqs;
    scheduler.max_waiting = capacity;
    let admission = Admission::new(capacity, metrics.clone());
    let grammars = Arc::new(engine.grammars().cloned().map_err(|e| e.to_string()));
    let handle = EngineHandle {
        grammars,
        cmd: tx,
        next_id: Arc::new(AtomicU64::new(1)),
        admission: admission.clone(),
        metrics: metrics.clone(),
        health: Arc::new(Health::default()),
    };
    let health = handle.health.clone();
    let (ready_tx, ready_rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("tessera-engine".into())
        .spawn(move || {
            let positions = scheduler.num_blocks * scheduler.block_size;
            let made = StepEngine::new(&engine, scheduler).and_then(|mut s| {
                if let Some(spec) = speculation {
                    let model = match &spec.drafter {
                        DrafterSpec::Model(p) => Some(DraftModel::load(
                            p,
                            engine.pool.units(),
                            &engine,
                            positions,
                        )?),
                        DrafterSpec::NGram { .. } => None,
                    };
                    s.set_speculation(Some(spec), model)?;
                }
                Ok(s)
            });
            let steps = match made {
                Ok(s) => {
                    let _ = ready_tx.send(Ok(()));
                    s
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let mut l = Loop {
                health: health.clone(),
                steps,
                routes: HashMap::new(),
                metrics,
                admission,
            };
            let reason = match catch_unwind(AssertUnwindSafe(|| l.run(rx))) {
                Ok(reason) => reason,
                Err(p) => {
                    let what = panic_message(&*p);
                    tracing::error!("the engine thread died: {what}");
                    format!("the engine thread died: {what}")
                }
            };
            health.stop(reason);
            // Dropping the loop closes every request's channel.
        })?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(handle),
        Ok(Err(e)) => Err(anyhow::anyhow!("starting the engine: {e}")),
        Err(_) => Err(anyhow::anyhow!("the engine thread died while starting")),
    }
}

struct Loop<'e> {
    health: Arc<Health>,
    steps: StepEngine<'e>,
    routes: HashMap<u64, Route>,
    metrics: Arc<Metrics>,
    admission: Arc<Admission>,
}

impl Loop<'_> {
    /// Runs until the server goes away or the engine cannot go on; returns why it stopped.
    fn run(&mut self, rx: mpsc::Receiver<Command>) -> String {
        loop {
            // Idle: block for the next command; busy: take what has arrived.
            if !self.steps.has_work() {
                match rx.recv() {
                    Ok(c) => self.command(c),
                    Err(_) => return "the engine has stopped".into(),
                }
            }
            while let Ok(c) = rx.try_recv() {
                self.command(c);
            }
            if self.steps.has_work() {
                let out = self.steps.step();
                // A tensor-parallel rank that died or stalled: no step can run any more. The
                // health says so before the failed requests hear of it.
                let failure = self.steps.engine().tp_failure();
                if let Some(why) = &failure {
                    tracing::error!("stopping the engine: {why}");
                    self.health
                        .stop(format!("tensor parallelism failed: {why}"));
                }
                // The step's figures are published before its tokens go out, so a client that
                // has its last token sees that step in `/metrics`.
                if self.steps.engine().tp_size() > 1 {
                    let stats = self.steps.engine().overlap_stats();
                    *self
                        .metrics
                        .overlap
                        .lock()
                        .unwrap_or_else(|e| e.into_inner()) = Some(stats);
                }
                self.deliver(out);
                if let Some(why) = failure {
                    return format!("tensor parallelism failed: {why}");
                }
            }
            self.publish_gauges();
        }
    }

    fn command(&mut self, c: Command) {
        match c {
            Command::Submit { group, admitted } => {
                let answer = self.admit(group);
                let _ = admitted.send(answer);
            }
            Command::Abort(id) => self.forget(id, true),
        }
    }

    /// Queues every sequence of `group`, or none of them (giving their places back).
    fn admit(&mut self, mut group: Vec<Pending>) -> Result<(), ApiError> {
        let max_waiting = self.steps.config().max_waiting;
        if self.steps.num_waiting() + group.len() > max_waiting {
            self.admission.release(group.len());
            return Err(self.admission.refuse(format!(
                "the waiting queue is full ({max_waiting} sequences); retry later"
            )));
        }
        for i in 0..group.len() {
            let p = &mut group[i];
            if let Err(e) = self.steps.submit_with(p.id, &p.req, p.constraint.take()) {
                for q in &group[..i] {
                    self.steps.abort(q.id);
                }
                self.admission.release(group.len());
                return Err(match e {
                    SubmitError::Invalid(m) => ApiError::new(
                        400,
                        "invalid_request_error",
                        format!("request rejected: {m}"),
                    ),
                    SubmitError::Overloaded(m) => self
                        .admission
                        .refuse(format!("server overloaded: {m}; retry later")),
                });
            }
        }
        for p in group {
            self.metrics
                .prompt_tokens
                .fetch_add(p.req.prompt_ids.len() as u64, Ordering::Relaxed);
            self.routes.insert(
                p.id,
                Route {
                    events: p.events,
                    submitted: Instant::now(),
                    first_token: None,
                    generated: 0,
                },
            );
        }
        Ok(())
    }

    /// Drops request `id`'s route (aborting it in the engine when it is still live).
    fn forget(&mut self, id: u64, abort: bool) {
        if abort {
            self.steps.abort(id);
        }
        if self.routes.remove(&id).is_some() {
            self.admission.release(1);
        }
    }

    fn deliver(&mut self, out: StepOutcome) {
        let m = self.metrics.clone();
        m.steps.fetch_add(1, Ordering::Relaxed);
        m.step_forward_us
            .fetch_add((out.forward_s * 1e6) as u64, Ordering::Relaxed);
        m.step_tokens
            .fetch_add(out.tokens as u64, Ordering::Relaxed);
        m.preemptions
            .fetch_add(out.preempted as u64, Ordering::Relaxed);
        m.requests_failed
            .fetch_add(out.failed as u64, Ordering::Relaxed);
        if out.spec.verifications > 0 {
            *m.spec.lock().unwrap_or_else(|e| e.into_inner()) = self.steps.spec_stats();
        }
        for (id, ev) in out.events {
            let Some(route) = self.routes.get_mut(&id) else {
                continue;
            };
            let last = !matches!(ev, RequestEvent::Text { .. });
            match &ev {
                RequestEvent::Text {
                    text,
                    tokens,
                    logprobs,
                } => {
                    if !tokens.is_empty() {
                        route.generated += tokens.len();
                        m.generation_tokens
                            .fetch_add(tokens.len() as u64, Ordering::Relaxed);
                    }
                    if route.first_token.is_none() {
                        let now = Instant::now();
                        route.first_token = Some(now);
                        m.ttft.observe((now - route.submitted).as_secs_f64());
                    }
                    if text.is_empty() && logprobs.is_empty() {
                        continue;
                    }
                }
                RequestEvent::Finished { .. } => {
                    if let (Some(first), true) = (route.first_token, route.generated > 1) {
                        let per = first.elapsed().as_secs_f64() / (route.generated - 1) as f64;
                        m.tpot.observe(per);
                    }
                    m.requests_finished.fetch_add(1, Ordering::Relaxed);
                }
                RequestEvent::Failed { .. } => {}
            }
            if last {
                // The place is given back before the client can see its end: it may send its
                // next request at once, and must find the place free.
                if let Some(route) = self.routes.remove(&id) {
                    self.admission.release(1);
                    let _ = route.events.send(ev);
                }
                continue;
            }
            if route.events.send(ev).is_err() {
                // A client gone mid-stream: free its blocks now.
                self.forget(id, true);
            }
        }
    }

    fn publish_gauges(&self) {
        let m = &self.metrics;
        m.waiting
            .store(self.steps.num_waiting() as u64, Ordering::Relaxed);
        m.running
            .store(self.steps.num_running() as u64, Ordering::Relaxed);
        let kv = self.steps.kv_metrics();
        m.kv_blocks_used
            .store(kv.blocks_used as u64, Ordering::Relaxed);
        m.prefix_cache_queries
            .store(kv.prefix_query_tokens, Ordering::Relaxed);
        m.prefix_cache_hits
            .store(kv.prefix_hit_tokens, Ordering::Relaxed);
    }
}
