//! Constrained decoding (llguidance): outputs held to a JSON schema, any JSON object, a
//! regex or a choice parse as asked, on a random tiny model that left alone writes
//! gibberish; a constrained request's tokens are the same alone or beside others; a bad
//! schema is refused at submission, naming the problem.

use std::path::PathBuf;

use serde_json::{json, Value};
use tessera_engine::constrain::ConstraintSpec;
use tessera_engine::generate::generate;
use tessera_engine::{Engine, GenerateRequest, RequestEvent, SamplingParams, StepEngine};
use tessera_scheduler::SchedulerConfig;

fn model(family: &str) -> Engine {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/models")
        .join(format!("tiny-{family}.gguf"));
    Engine::load(&p, 2).unwrap()
}

fn request(e: &Engine, spec: ConstraintSpec, seed: u64) -> GenerateRequest {
    let mut params = SamplingParams::greedy();
    if seed > 0 {
        params.temperature = 1.0;
        params.seed = Some(seed);
    }
    GenerateRequest {
        prompt_ids: e.tokenizer.encode("Answer in JSON:").unwrap(),
        max_tokens: 200,
        params,
        constraint: Some(spec),
        ..Default::default()
    }
}

/// The output, and whether the grammar ended it (rather than the token limit).
fn run(e: &Engine, req: &GenerateRequest) -> (String, bool) {
    let mut text = String::new();
    let stats = generate(e, req, &mut |t| text.push_str(t)).unwrap();
    (text, stats.tokens.len() < req.max_tokens)
}

/// The output of a grammar that must end (every string and number in it bounded).
fn output(e: &Engine, req: &GenerateRequest) -> String {
    let (text, ended) = run(e, req);
    assert!(
        ended,
        "the grammar did not end within {} tokens: {text:?}",
        req.max_tokens
    );
    text
}

#[test]
fn outputs_follow_their_constraint() {
    let schema = json!({
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "color": {"enum": ["red", "green", "blue"]},
            "n": {"type": "integer", "minimum": 0, "maximum": 99}
        },
        "required": ["ok", "color", "n"],
        "additionalProperties": false
    });
    for family in ["llama3", "gemma3", "phi3"] {
        let e = model(family);
        for seed in [0, 1, 2, 3] {
            let text = output(
                &e,
                &request(&e, ConstraintSpec::JsonSchema(schema.clone()), seed),
            );
            let v: Value = serde_json::from_str(&text)
                .unwrap_or_else(|err| panic!("{family} seed {seed}: {text:?} is not JSON: {err}"));
            assert!(v["ok"].is_boolean(), "{family}: {v}");
            assert!(
                ["red", "green", "blue"].contains(&v["color"].as_str().unwrap()),
                "{v}"
            );
            assert!(v["n"].as_u64().is_some_and(|n| n <= 99), "{v}");
            assert_eq!(v.as_object().unwrap().len(), 3, "{v}");
            // Any object: a random model may write one key forever; where it ends, it parses.
            let (obj, ended) = run(&e, &request(&e, ConstraintSpec::JsonObject, seed));
            assert!(obj.trim_start().starts_with('{'), "{obj:?}");
            if ended {
                let o: Value =
                    serde_json::from_str(&obj).unwrap_or_else(|err| panic!("{obj:?}: {err}"));
                assert!(o.is_object(), "{o}");
            }
            let code = output(
                &e,
                &request(
                    &e,
                    ConstraintSpec::Regex(r"[A-Z]{3}-[0-9]{2,4}".into()),
                    seed,
                ),
            );
            assert!(
                code.len() >= 6
                    && code[..3].chars().all(|c| c.is_ascii_uppercase())
                    && &code[3..4] == "-",
                "{code:?}"
            );
            let pick = output(
                &e,
                &request(
                    &e,
                    ConstraintSpec::Choice(vec!["yes".into(), "no".into(), "maybe so".into()]),
                    seed,
                ),
            );
            assert!(
                ["yes", "no", "maybe so"].contains(&pick.as_str()),
                "{pick:?}"
            );
        }
        eprintln!("{family}: schema, object, regex and choice outputs all parse");
    }
}

#[test]
fn a_constrained_request_is_the_same_alone_or_batched() {
    let e = model("llama3");
    let schema = json!({"type": "object", "properties": {"a": {"type": "string", "maxLength": 12}},
        "required": ["a"], "additionalProperties": false});
    let req = request(&e, ConstraintSpec::JsonSchema(schema), 0);
    let alone = output(&e, &req);
    let mut cfg = SchedulerConfig::new(64, tessera_engine::KV_BLOCK_SIZE);
    cfg.max_model_len = 512;
    let mut steps = StepEngine::new(&e, cfg).unwrap();
    steps.submit(0, &req).unwrap();
    let mut other = req.clone();
    other.constraint = None;
    other.max_tokens = 40;
    other.prompt_ids = e
        .tokenizer
        .encode("Something else entirely, longer")
        .unwrap();
    steps.submit(1, &other).unwrap();
    let mut texts = [String::new(), String::new()];
    let mut done = 0;
    while done < 2 {
        for (id, ev) in steps.step().events {
            match ev {
                RequestEvent::Text { text, .. } => texts[id as usize].push_str(&text),
                RequestEvent::Finished { .. } => done += 1,
                RequestEvent::Failed { message } => panic!("{id}: {message}"),
            }
        }
    }
    assert_eq!(texts[0], alone);
}

#[test]
fn bad_constraints_are_refused_naming_the_problem() {
    let e = model("llama3");
    let mut cfg = SchedulerConfig::new(64, tessera_engine::KV_BLOCK_SIZE);
    cfg.max_model_len = 512;
    let mut steps = StepEngine::new(&e, cfg).unwrap();
    let cases = [
        (
            ConstraintSpec::JsonSchema(json!({"type": "no-such-type"})),
            "no-such-type",
        ),
        (ConstraintSpec::JsonSchema(json!([1, 2])), "schema"),
        (ConstraintSpec::Regex("(unclosed".into()), "constraint"),
        (
            ConstraintSpec::Lark("start: undefined_rule".into()),
            "undefined_rule",
        ),
        (ConstraintSpec::Choice(vec![]), "option"),
    ];
    for (i, (spec, want)) in cases.into_iter().enumerate() {
        let err = steps
            .submit(i as u64, &request(&e, spec, 0))
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "{err}");
    }
    assert_eq!(steps.num_live(), 0);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]

    /// The mask of a choice of strings allows only tokens whose text keeps the output a
    /// prefix of some option, and EOS only where it is one (llguidance may also leave out
    /// non-canonical spellings, e.g. "0" + "0" where the vocabulary has "00"), never nothing;
    /// a random walk through the allowed tokens ends on an option.
    #[test]
    fn the_mask_of_a_choice_is_exactly_its_prefixes(
        options in proptest::collection::vec("[a-z0-9 ]{1,9}", 1..5),
        picks in proptest::collection::vec(0usize..10_000, 12),
    ) {
        let e = model_cached();
        let vocab = e.model.config.vocab_size;
        let texts: Vec<String> = (0..vocab as u32).map(|t| e.tokenizer.decode(&[t]).unwrap()).collect();
        let special: Vec<bool> = (0..vocab as u32)
            .map(|t| e.tokenizer.inner().id_to_token(t).is_some_and(|s| s.starts_with("<|")))
            .collect();
        let mut c = e.grammars().unwrap().matcher(&ConstraintSpec::Choice(options.clone())).unwrap();
        let zeros = vec![0f32; vocab];
        let mut out = Vec::new();
        let mut text = String::new();
        for &pick in &picks {
            if c.is_done() {
                break;
            }
            c.masked(&zeros, &mut out).unwrap();
            let allowed: Vec<u32> = (0..vocab as u32).filter(|&t| out[t as usize] == 0.0).collect();
            for t in 0..vocab as u32 {
                let want = if e.tokenizer.is_eos(t) {
                    options.contains(&text)
                } else if special[t as usize] {
                    false
                } else {
                    let next = format!("{text}{}", texts[t as usize]);
                    !texts[t as usize].is_empty() && options.iter().any(|o| o.starts_with(&next))
                };
                proptest::prop_assert!(out[t as usize] != 0.0 || want,
                    "token {} {:?} allowed after {:?} (options {:?})", t, texts[t as usize], text, options);
            }
            proptest::prop_assert!(!allowed.is_empty(), "nothing allowed after {:?}", text);
            let t = allowed[pick % allowed.len()];
            c.accept(t).unwrap();
            if e.tokenizer.is_eos(t) {
                break;
            }
            text.push_str(&texts[t as usize]);
        }
        proptest::prop_assert!(options.iter().any(|o| o.starts_with(&text)), "{:?} {:?}", text, options);
        if c.is_done() {
            proptest::prop_assert!(options.contains(&text), "ended on {:?} {:?}", text, options);
        }
    }
}

/// One tiny Llama 3 engine for the proptest's cases.
fn model_cached() -> &'static Engine {
    static E: std::sync::OnceLock<Engine> = std::sync::OnceLock::new();
    E.get_or_init(|| model("llama3"))
}
