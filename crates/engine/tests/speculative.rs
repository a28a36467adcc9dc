//! Speculative decoding changes no output: on the default model (SmolLM2-135M-Instruct
//! Q4_1, exact path), greedy requests give bitwise the tokens, text, log-probabilities and
//! finish reasons of plain decoding, with the n-gram drafter and with a draft model (the
//! model drafting for itself), for k = 1..8, batched and alone, under a small KV cache that
//! preempts, with stop strings, max_tokens and a JSON schema; every KV block comes back.

use std::collections::HashMap;

use tessera_engine::constrain::ConstraintSpec;
use tessera_engine::draft::DraftModel;
use tessera_engine::spec::{DrafterSpec, SpecConfig, SpecTokens};
use tessera_engine::{store, Engine, GenerateRequest, RequestEvent, SamplingParams, StepEngine};
use tessera_scheduler::{FinishReason, SchedulerConfig};

fn engine() -> Engine {
    let path = store::resolve_model(None).expect("default model (run `tessera pull`)");
    Engine::load(&path, 2).unwrap()
}

/// What a request produced: token ids, text, log-probabilities (as bits) and how it ended.
#[derive(Debug, Clone, PartialEq)]
struct Output {
    tokens: Vec<u32>,
    text: String,
    logprobs: Vec<(String, u64)>,
    finish: Option<FinishReason>,
}

fn prompts(e: &Engine) -> Vec<GenerateRequest> {
    let texts = [
        // Code editing: the answer repeats most of the prompt (n-gram drafts pay).
        "Rename the variable x to count in this code and print the whole code again:\n\
         def f(x):\n    x = x + 1\n    return x * 2\n",
        "List the numbers from 1 to 20, separated by commas.",
        "What is the capital of France? Answer in one sentence.",
        "Repeat exactly: the quick brown fox jumps over the lazy dog. the quick brown fox",
        "Write a haiku about the sea.",
    ];
    texts
        .iter()
        .enumerate()
        .map(|(i, t)| GenerateRequest {
            prompt_ids: e
                .tokenizer
                .apply_chat_template(&[tessera_tokenizer::ChatMessage::new("user", t)], true)
                .and_then(|s| e.tokenizer.encode(&s))
                .unwrap(),
            max_tokens: [64, 48, 24, 40, 7][i],
            params: SamplingParams::greedy(),
            stop: if i == 2 { vec![".".into()] } else { vec![] },
            logprobs: (i % 2 == 0).then_some(2),
            ..Default::default()
        })
        .collect()
}

fn sched(blocks: usize) -> SchedulerConfig {
    let mut c = SchedulerConfig::new(blocks, tessera_engine::KV_BLOCK_SIZE);
    c.max_num_batched_tokens = 256;
    c.max_prefill_chunk = 64;
    c.max_model_len = 1024;
    c
}

/// Runs `reqs` together to the end; the outputs in order.
fn run(
    e: &Engine,
    cfg: SchedulerConfig,
    spec: Option<(SpecConfig, Option<DraftModel>)>,
    reqs: &[GenerateRequest],
) -> (Vec<Output>, Option<tessera_engine::spec::SpecStats>) {
    let mut s = StepEngine::new(e, cfg).unwrap();
    if let Some((c, m)) = spec {
        s.set_speculation(Some(c), m).unwrap();
    }
    for (i, r) in reqs.iter().enumerate() {
        s.submit(i as u64, r).unwrap();
    }
    let mut out: HashMap<u64, Output> = HashMap::new();
    let mut steps = 0;
    while s.has_work() {
        steps += 1;
        assert!(steps < 5000, "no progress");
        let o = s.step();
        assert_eq!(o.failed, 0, "{:?}", o.events);
        for (id, ev) in o.events {
            let r = out.entry(id).or_insert(Output {
                tokens: vec![],
                text: String::new(),
                logprobs: vec![],
                finish: None,
            });
            match ev {
                RequestEvent::Text {
                    text,
                    tokens,
                    logprobs,
                } => {
                    r.text.push_str(&text);
                    r.tokens.extend(tokens);
                    r.logprobs
                        .extend(logprobs.into_iter().map(|l| (l.token, l.logprob.to_bits())));
                }
                RequestEvent::Finished { reason, .. } => r.finish = Some(reason),
                RequestEvent::Failed { message } => panic!("request {id} failed: {message}"),
            }
        }
    }
    s.check().unwrap();
    assert_eq!(s.kv_metrics().blocks_used, 0, "KV blocks leaked");
    let stats = s.spec_stats().map(|x| x.1);
    let mut v: Vec<(u64, Output)> = out.into_iter().collect();
    v.sort_by_key(|x| x.0);
    assert_eq!(v.len(), reqs.len());
    (v.into_iter().map(|x| x.1).collect(), stats)
}

fn ngram(k: SpecTokens) -> (SpecConfig, Option<DraftModel>) {
    (
        SpecConfig {
            drafter: DrafterSpec::parse("ngram").unwrap(),
            tokens: k,
        },
        None,
    )
}

fn self_draft(e: &Engine, k: SpecTokens) -> (SpecConfig, Option<DraftModel>) {
    let path = store::resolve_model(None).unwrap();
    let m = DraftModel::load(&path, 2, e, 4096).unwrap();
    (
        SpecConfig {
            drafter: DrafterSpec::Model(path),
            tokens: k,
        },
        Some(m),
    )
}

#[test]
fn greedy_speculation_gives_bitwise_the_tokens_of_plain_decoding() {
    let e = engine();
    let reqs = prompts(&e);
    let (plain, _) = run(&e, sched(256), None, &reqs);
    assert!(plain.iter().all(|o| !o.tokens.is_empty()));
    for k in 1..=8 {
        let (got, stats) = run(&e, sched(256), Some(ngram(SpecTokens::Fixed(k))), &reqs);
        assert_eq!(got, plain, "n-gram drafter, k = {k}");
        let st = stats.unwrap();
        assert!(st.drafted > 0, "the n-gram drafter never drafted (k = {k})");
        let (got, stats) = run(
            &e,
            sched(256),
            Some(self_draft(&e, SpecTokens::Fixed(k))),
            &reqs,
        );
        assert_eq!(got, plain, "draft model, k = {k}");
        let st = stats.unwrap();
        // Drafting for itself greedily (on the fast path, whose argmax is the exact path's
        // at almost every position), the model's drafts are nearly its own choices.
        assert!(
            st.acceptance() > 0.8,
            "self-drafting accepted {:.3} (k = {k})",
            st.acceptance()
        );
        eprintln!(
            "k = {k}: self-draft {:.2} tokens per verification",
            st.tokens_per_verification()
        );
    }
    for (cfg, name) in [
        (ngram(SpecTokens::Auto { max: 8 }), "n-gram auto"),
        (self_draft(&e, SpecTokens::Auto { max: 8 }), "draft auto"),
    ] {
        let (got, _) = run(&e, sched(256), Some(cfg), &reqs);
        assert_eq!(got, plain, "{name}");
    }
    // Each alone: the same again.
    for (i, r) in reqs.iter().enumerate() {
        let (got, _) = run(
            &e,
            sched(256),
            Some(ngram(SpecTokens::Fixed(4))),
            std::slice::from_ref(r),
        );
        assert_eq!(got[0], plain[i], "request {i} alone");
    }
}

#[test]
fn speculation_under_preemption_and_a_schema_changes_nothing() {
    let e = engine();
    let mut reqs = prompts(&e);
    // Eight requests in a cache too small for all of them: preemption and recompute.
    reqs.extend(prompts(&e).into_iter().take(3));
    let mut json = reqs[1].clone();
    json.constraint = Some(ConstraintSpec::JsonSchema(serde_json::json!({
        "type": "object",
        "properties": {"numbers": {"type": "array", "items": {"type": "integer"}, "maxItems": 12}},
        "required": ["numbers"]
    })));
    json.max_tokens = 80;
    reqs.push(json);
    let (plain, _) = run(&e, sched(24), None, &reqs);
    for spec in [
        ngram(SpecTokens::Fixed(5)),
        self_draft(&e, SpecTokens::Fixed(3)),
    ] {
        let (got, _) = run(&e, sched(24), Some(spec), &reqs);
        assert_eq!(got, plain);
    }
    let obj: serde_json::Value = serde_json::from_str(&plain.last().unwrap().text).unwrap();
    assert!(obj["numbers"].is_array());
}

#[test]
fn a_request_can_turn_speculation_off_or_choose_its_k() {
    let e = engine();
    let mut reqs = prompts(&e);
    reqs[0].spec_tokens = Some(0);
    reqs[1].spec_tokens = Some(6);
    let (plain, _) = run(&e, sched(256), None, &reqs[..2]);
    let (got, stats) = run(
        &e,
        sched(256),
        Some(ngram(SpecTokens::Fixed(2))),
        &reqs[..2],
    );
    assert_eq!(got, plain);
    assert!(stats.unwrap().drafted > 0);
    // Only request 0, which turned it off: no drafts at all.
    let (_, stats) = run(
        &e,
        sched(256),
        Some(ngram(SpecTokens::Fixed(2))),
        &reqs[..1],
    );
    assert_eq!(stats.unwrap().drafted, 0);
}

#[test]
fn adapters_verify_what_the_base_model_drafts() {
    let e = engine();
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/lora");
    let pirate = e.load_adapter(&root.join("pirate")).unwrap();
    let all7 = e.load_adapter(&root.join("rand-all7")).unwrap();
    let mut reqs = prompts(&e);
    reqs[0].adapter = Some(pirate.clone());
    reqs[1].adapter = Some(all7);
    reqs[3].adapter = Some(pirate);
    let (plain, _) = run(&e, sched(256), None, &reqs);
    // The draft model runs without adapters; the verification with each request's own.
    for spec in [
        ngram(SpecTokens::Fixed(4)),
        self_draft(&e, SpecTokens::Fixed(4)),
    ] {
        let (got, stats) = run(&e, sched(256), Some(spec), &reqs);
        assert_eq!(got, plain);
        assert!(stats.unwrap().accepted > 0);
    }
}

/// The fast path (8-bit activations against block-quantized weights: integer dot products,
/// combined per row in a fixed order) also computes each row the same whatever else the
/// step holds, so speculation keeps its greedy tokens too.
#[test]
fn the_fast_path_keeps_its_tokens_under_speculation() {
    let path = store::resolve_model(None).unwrap();
    let e = Engine::load_with(
        &path,
        2,
        tessera_kernels::plan::Precision::Fast,
        tessera_engine::tuning::load_planner(),
    )
    .unwrap();
    let reqs = prompts(&e);
    let (plain, _) = run(&e, sched(256), None, &reqs);
    for k in [1, 4, 8] {
        let (got, stats) = run(&e, sched(256), Some(ngram(SpecTokens::Fixed(k))), &reqs);
        assert_eq!(got, plain, "n-gram drafter, k = {k}");
        assert!(stats.unwrap().drafted > 0);
    }
    let (got, _) = run(
        &e,
        sched(256),
        Some(self_draft(&e, SpecTokens::Fixed(3))),
        &reqs,
    );
    assert_eq!(got, plain, "draft model");
}
