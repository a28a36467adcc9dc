//! What a JSON-schema constraint costs per token, with its masks computed after the forward
//! (serial) or beside it (overlapped), on the default model through the step engine, for 1
//! and 16 sequences.
//!
//! ```sh
//! cargo run --release -p tessera-engine --example mask_overlap [-- --rounds 2 --tokens 64]
//! ```
//!
//! Sampling is greedy unless `--temperature T` (seeded): the temperature sampler's own cost
//! depends on how many tokens the mask leaves, which would blur the mask's.
//!
//! Each configuration decodes `--tokens` tokens per sequence on a step engine of its own;
//! the three engines (no constraint, serial masks, overlapped masks) take turns step by
//! step, so that a busy machine slows them alike. Figures are medians over the steps that
//! decoded every sequence (the prefill left out); `+ms/token` is the median of the
//! turn-by-turn differences from the unconstrained engine, per sequence.
//! The model is `$TESSERA_MODEL`, else the default model (pulled if missing).

use std::time::Instant;

use serde_json::json;
use tessera_engine::constrain::ConstraintSpec;
use tessera_engine::store::resolve_model;
use tessera_engine::{
    Engine, GenerateRequest, RequestEvent, SamplingParams, StepEngine, KV_BLOCK_SIZE,
};
use tessera_scheduler::SchedulerConfig;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Unconstrained,
    Serial,
    Overlapped,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Unconstrained => "none",
            Mode::Serial => "schema, serial",
            Mode::Overlapped => "schema, overlapped",
        }
    }
}

fn schema() -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "role": {"enum": ["admin", "editor", "viewer"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}},
            "address": {
                "type": "object",
                "properties": {
                    "street": {"type": "string"},
                    "city": {"type": "string"},
                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"}
                },
                "required": ["street", "city", "zip"],
                "additionalProperties": false
            },
            "notes": {"type": "string"}
        },
        "required": ["name", "age", "role", "tags", "address", "notes"],
        "additionalProperties": false
    })
}

/// A step engine for `seqs` sequences of `tokens` tokens each, submitted.
fn engine_for<'e>(e: &'e Engine, seqs: usize, mode: Mode, opts: &Opts) -> StepEngine<'e> {
    let tokens = opts.tokens;
    let blocks = (seqs * (tokens + 64)).div_ceil(KV_BLOCK_SIZE) + 16;
    let mut cfg = SchedulerConfig::new(blocks, KV_BLOCK_SIZE);
    cfg.max_num_seqs = seqs;
    cfg.max_model_len = 512;
    let mut steps = StepEngine::new(e, cfg).expect("step engine");
    steps.overlap_masks(mode == Mode::Overlapped);
    for i in 0..seqs {
        let prompt = format!("Describe user number {i} of the system as a JSON record:\n");
        let mut params = SamplingParams::greedy();
        if opts.temperature > 0.0 {
            params.temperature = opts.temperature;
            params.seed = Some(1 + i as u64);
        }
        let req = GenerateRequest {
            prompt_ids: e.tokenizer.encode(&prompt).expect("prompt"),
            max_tokens: tokens,
            params,
            ignore_eos: true,
            constraint: (mode != Mode::Unconstrained).then(|| ConstraintSpec::JsonSchema(schema())),
            ..Default::default()
        };
        steps.submit(i as u64, &req).expect("submit");
    }
    steps
}

/// Runs every mode's engine for `seqs` sequences in lockstep, one step each in turn, and
/// returns per mode the times (ms) of its steps that decoded all `seqs` sequences (entry
/// `k` of each list from the same turn), and the tokens the last mode's sequences drew.
fn run(e: &Engine, seqs: usize, modes: &[Mode], opts: &Opts) -> (Vec<Vec<f64>>, Vec<Vec<u32>>) {
    let mut engines: Vec<StepEngine> = modes
        .iter()
        .map(|&m| engine_for(e, seqs, m, opts))
        .collect();
    let mut times = vec![Vec::new(); modes.len()];
    let mut drawn = vec![Vec::new(); seqs];
    while engines.iter().any(StepEngine::has_work) {
        let mut turn = Vec::new();
        for (k, steps) in engines.iter_mut().enumerate() {
            let t0 = Instant::now();
            let out = steps.step();
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            for (id, ev) in &out.events {
                match ev {
                    RequestEvent::Failed { message } => panic!("request {id}: {message}"),
                    RequestEvent::Text { tokens, .. } if k + 1 == modes.len() => {
                        drawn[*id as usize].extend(tokens)
                    }
                    _ => {}
                }
            }
            turn.push((out.seqs == seqs && out.tokens == seqs).then_some(ms));
        }
        if turn.iter().all(Option::is_some) {
            for (t, ms) in times.iter_mut().zip(turn) {
                t.extend(ms);
            }
        }
    }
    (times, drawn)
}

/// Microseconds of each mask (computed and applied to a logits row) along the token
/// sequences `drawn`, one grammar per sequence, on this thread alone.
fn mask_times(e: &Engine, drawn: &[Vec<u32>]) -> Vec<f64> {
    let grammars = e.grammars().expect("grammars");
    let row = vec![0f32; e.model.config.vocab_size];
    let mut out = Vec::new();
    let mut us = Vec::new();
    for tokens in drawn {
        let mut c = grammars
            .matcher(&ConstraintSpec::JsonSchema(schema()))
            .expect("matcher");
        for &t in tokens {
            let t0 = Instant::now();
            c.masked(&row, &mut out).expect("mask");
            us.push(t0.elapsed().as_secs_f64() * 1e6);
            c.accept(t).expect("accept");
        }
    }
    us
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn number<T: std::str::FromStr>(option: &str, v: &str) -> T {
    v.parse()
        .unwrap_or_else(|_| panic!("{option} needs a number, not {v:?}"))
}

struct Opts {
    rounds: usize,
    tokens: usize,
    temperature: f32,
}

fn main() {
    let mut opts = Opts {
        rounds: 2,
        tokens: 64,
        temperature: 0.0,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let v = pair.get(1).map_or("", String::as_str);
        match pair[0].as_str() {
            "--rounds" => opts.rounds = number(&pair[0], v),
            "--tokens" => opts.tokens = number(&pair[0], v),
            "--temperature" => opts.temperature = number(&pair[0], v),
            other => {
                panic!("unknown option {other} (--rounds N, --tokens N, --temperature T)")
            }
        }
    }
    let path = resolve_model(None).expect("model");
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let e = Engine::load(&path, threads).expect("load");
    eprintln!("{} on {threads} threads", path.display());
    // Warm-up: kernel plans, the grammar engine's token trie.
    let modes = [Mode::Unconstrained, Mode::Serial, Mode::Overlapped];
    let warm = Opts { tokens: 8, ..opts };
    run(&e, 16, &modes, &warm);
    for round in 1..=opts.rounds {
        println!("round {round}: medians over the steps that decoded every sequence");
        println!(
            "{:>4}  {:<20} {:>9} {:>9} {:>8} {:>10}",
            "seqs", "constraint", "ms/step", "ms/token", "vs none", "+ms/token"
        );
        for seqs in [1, 16] {
            let (times, drawn) = run(&e, seqs, &modes, &opts);
            let none = median(times[0].clone());
            for (k, mode) in modes.iter().enumerate() {
                let ms = median(times[k].clone());
                // The median of the turn-by-turn differences: robust to a busy machine.
                let extra = median(times[k].iter().zip(&times[0]).map(|(a, b)| a - b).collect());
                println!(
                    "{seqs:>4}  {:<20} {ms:>9.2} {:>9.3} {:>7.3}x {:>+10.3}   ({} steps)",
                    mode.name(),
                    ms / seqs as f64,
                    ms / none,
                    extra / seqs as f64,
                    times[k].len(),
                );
            }
            let us = mask_times(&e, &drawn);
            let mean = us.iter().sum::<f64>() / us.len().max(1) as f64;
            println!(
                "{seqs:>4}  one mask alone: median {:.0} us, mean {mean:.0} us ({} masks)",
                median(us.clone()),
                us.len()
            );
        }
    }
}
