//! Server metrics, exported at `/metrics` in Prometheus' text format: queue depths, KV block
//! use, prefix-cache hits, TTFT and time-per-output-token histograms, token counters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Histogram bucket bounds, seconds.
const BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0,
];

#[derive(Default)]
pub struct Histogram {
    inner: Mutex<(Vec<u64>, u64, f64)>,
}

impl Histogram {
    pub fn observe(&self, secs: f64) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if g.0.is_empty() {
            g.0 = vec![0; BUCKETS.len()];
        }
        for (i, &b) in BUCKETS.iter().enumerate() {
            if secs <= b {
                g.0[i] += 1;
            }
        }
        g.1 += 1;
        g.2 += secs;
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} histogram\n"));
        for (i, &b) in BUCKETS.iter().enumerate() {
            out.push_str(&format!(
                "{name}_bucket{{le=\"{b}\"}} {}\n",
                g.0.get(i).copied().unwrap_or(0)
            ));
        }
        out.push_str(&format!(
            "{name}_bucket{{le=\"+Inf\"}} {}\n{name}_sum {}\n{name}_count {}\n",
            g.1, g.2, g.1
        ));
    }
}

#[derive(Default)]
pub struct Metrics {
    pub waiting: AtomicU64,
    pub running: AtomicU64,
    pub kv_blocks_used: AtomicU64,
    pub kv_blocks_total: AtomicU64,
    pub prefix_cache_queries: AtomicU64,
    pub prefix_cache_hits: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub generation_tokens: AtomicU64,
    pub requests_finished: AtomicU64,
    pub requests_rejected: AtomicU64,
    pub requests_failed: AtomicU64,
    pub steps: AtomicU64,
    /// Microseconds engine steps spent in the forward (plus sampling), summed.
    pub step_forward_us: AtomicU64,
    /// Tokens of every step (decodes and prefill chunks), summed.
    pub step_tokens: AtomicU64,
    pub preemptions: AtomicU64,
    pub ttft: Histogram,
    pub tpot: Histogram,
    pub started: Mutex<Option<std::time::Instant>>,
    /// Element type of the KV cache (`f32`, `f16`), set at start.
    pub kv_dtype: Mutex<Option<&'static str>>,
    /// Under tensor parallelism: the measured link and the sub-batchings chosen.
    pub overlap: Mutex<Option<tessera_engine::OverlapStats>>,
    /// With speculative decoding: the drafter's name and its counters.
    pub spec: Mutex<Option<(&'static str, tessera_engine::spec::SpecStats)>>,
}

impl Metrics {
    pub fn render(&self) -> String {
        let mut s = String::new();
        let gauge = |s: &mut String, name: &str, help: &str, v: u64| {
            s.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}\n"
            ));
        };
        let counter = |s: &mut String, name: &str, help: &str, v: u64| {
            s.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}\n"
            ));
        };
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        gauge(
            &mut s,
            "tessera_requests_waiting",
            "Requests waiting to be scheduled.",
            l(&self.waiting),
        );
        gauge(
            &mut s,
            "tessera_requests_running",
            "Requests being generated.",
            l(&self.running),
        );
        gauge(
            &mut s,
            "tessera_kv_blocks_used",
            "KV cache blocks in use.",
            l(&self.kv_blocks_used),
        );
        gauge(
            &mut s,
            "tessera_kv_blocks_total",
            "KV cache blocks in all.",
            l(&self.kv_blocks_total),
        );
        if let Some(d) = *self.kv_dtype.lock().unwrap_or_else(|e| e.into_inner()) {
            s.push_str(&format!(
                "# HELP tessera_kv_cache_info The KV cache's element type.\n# TYPE tessera_kv_cache_info gauge\ntessera_kv_cache_info{{dtype=\"{d}\"}} 1\n"
            ));
        }
        counter(
            &mut s,
            "tessera_prefix_cache_queries_total",
            "Prompt tokens looked up in the prefix cache.",
            l(&self.prefix_cache_queries),
        );
        counter(
            &mut s,
            "tessera_prefix_cache_hits_total",
            "Prompt tokens found in the prefix cache.",
            l(&self.prefix_cache_hits),
        );
        counter(
            &mut s,
            "tessera_prompt_tokens_total",
            "Prompt tokens processed.",
            l(&self.prompt_tokens),
        );
        counter(
            &mut s,
            "tessera_generation_tokens_total",
            "Tokens generated.",
            l(&self.generation_tokens),
        );
        counter(
            &mut s,
            "tessera_requests_finished_total",
            "Requests finished.",
            l(&self.requests_finished),
        );
        counter(
            &mut s,
            "tessera_requests_rejected_total",
            "Requests refused for capacity (HTTP 503: the server was full).",
            l(&self.requests_rejected),
        );
        counter(
            &mut s,
            "tessera_requests_failed_total",
            "Requests ended by an error in their engine step.",
            l(&self.requests_failed),
        );
        counter(
            &mut s,
            "tessera_engine_steps_total",
            "Engine steps run.",
            l(&self.steps),
        );
        s.push_str(&format!(
            "# HELP tessera_engine_step_seconds_total Seconds engine steps spent running their \
             batch (forward and sampling).\n# TYPE tessera_engine_step_seconds_total counter\n\
             tessera_engine_step_seconds_total {}\n",
            l(&self.step_forward_us) as f64 / 1e6
        ));
        counter(
            &mut s,
            "tessera_engine_step_tokens_total",
            "Tokens engine steps ran (decodes and prefill chunks).",
            l(&self.step_tokens),
        );
        counter(
            &mut s,
            "tessera_preemptions_total",
            "Sequences preempted (KV freed, recomputed later).",
            l(&self.preemptions),
        );
        let up = self
            .started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map(|t| t.elapsed().as_secs_f64())
            .unwrap_or(0.0);
        let tps = if up > 0.0 {
            l(&self.generation_tokens) as f64 / up
        } else {
            0.0
        };
        s.push_str(&format!("# HELP tessera_generation_tokens_per_second Generated tokens per second since start.\n# TYPE tessera_generation_tokens_per_second gauge\ntessera_generation_tokens_per_second {tps}\n"));
        if let Some(o) = &*self.overlap.lock().unwrap_or_else(|e| e.into_inner()) {
            render_overlap(o, &mut s);
        }
        if let Some((name, st)) = &*self.spec.lock().unwrap_or_else(|e| e.into_inner()) {
            render_spec(name, st, &mut s);
        }
        self.ttft.render(
            "tessera_time_to_first_token_seconds",
            "Time to first token.",
            &mut s,
        );
        self.tpot.render(
            "tessera_time_per_output_token_seconds",
            "Time per output token after the first.",
            &mut s,
        );
        s
    }
}

/// The tensor-parallel overlap planner's figures: the link it measured at start-up, how many
/// steps ran with each sub-batching, and its prediction for the last step.
/// Speculative decoding's counters and rates, labelled with the drafter.
fn render_spec(name: &str, st: &tessera_engine::spec::SpecStats, s: &mut String) {
    let rows: [(&str, &str, &str, f64); 6] = [
        (
            "tessera_spec_verifications_total",
            "counter",
            "Verification chunks run (a decode token and its drafts).",
            st.verifications as f64,
        ),
        (
            "tessera_spec_draft_tokens_total",
            "counter",
            "Drafted tokens verified.",
            st.drafted as f64,
        ),
        (
            "tessera_spec_accepted_tokens_total",
            "counter",
            "Drafted tokens accepted.",
            st.accepted as f64,
        ),
        (
            "tessera_spec_emitted_tokens_total",
            "counter",
            "Tokens verification chunks made (accepted drafts and the token after them).",
            st.emitted as f64,
        ),
        (
            "tessera_spec_acceptance_rate",
            "gauge",
            "Accepted share of the drafted tokens since start.",
            st.acceptance(),
        ),
        (
            "tessera_spec_tokens_per_step",
            "gauge",
            "Tokens per verification chunk since start (1 is plain decoding).",
            st.tokens_per_verification(),
        ),
    ];
    for (metric, kind, help, v) in rows {
        s.push_str(&format!(
            "# HELP {metric} {help}\n# TYPE {metric} {kind}\n{metric}{{drafter=\"{name}\"}} {v}\n"
        ));
    }
}

fn render_overlap(o: &tessera_engine::OverlapStats, s: &mut String) {
    if let Some(link) = &o.link {
        s.push_str(&format!(
            "# HELP tessera_tp_link_latency_seconds All-reduce latency measured at start-up.\n# TYPE tessera_tp_link_latency_seconds gauge\ntessera_tp_link_latency_seconds {}\n",
            link.latency_s
        ));
        let bw = if link.secs_per_byte > 0.0 {
            1.0 / link.secs_per_byte
        } else {
            0.0
        };
        s.push_str(&format!(
            "# HELP tessera_tp_link_bytes_per_second All-reduce bandwidth measured at start-up.\n# TYPE tessera_tp_link_bytes_per_second gauge\ntessera_tp_link_bytes_per_second {bw}\n"
        ));
    }
    s.push_str("# HELP tessera_tp_sub_batches_total Engine steps by the sub-batching they ran with (chosen per step by the step-time model, or forced).\n# TYPE tessera_tp_sub_batches_total counter\n");
    for (spec, n) in &o.choices {
        s.push_str(&format!(
            "tessera_tp_sub_batches_total{{s=\"{}\",split=\"{}\"}} {n}\n",
            spec.count, spec.split
        ));
    }
    if let Some((spec, est)) = o.last {
        s.push_str(&format!(
            "# HELP tessera_tp_last_step_sub_batches Sub-batches of the last step.\n# TYPE tessera_tp_last_step_sub_batches gauge\ntessera_tp_last_step_sub_batches{{split=\"{}\"}} {}\n",
            spec.split, spec.count
        ));
        s.push_str(&format!(
            "# HELP tessera_tp_last_step_predicted_seconds The step-time model's prediction for the last step.\n# TYPE tessera_tp_last_step_predicted_seconds gauge\ntessera_tp_last_step_predicted_seconds {}\n",
            est.step
        ));
        s.push_str(&format!(
            "# HELP tessera_tp_last_step_predicted_hidden_ratio Share of the last step's communication predicted hidden behind compute.\n# TYPE tessera_tp_last_step_predicted_hidden_ratio gauge\ntessera_tp_last_step_predicted_hidden_ratio {}\n",
            est.hidden()
        ));
    }
}
