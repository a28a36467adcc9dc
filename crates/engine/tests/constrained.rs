//! Constrained decoding (llguidance): outputs held to a JSON schema, any JSON object, a
//! regex or a choice parse as asked, on a random tiny model that left alone writes
//! gibberish; a constrained request's tokens are the same alone or beside others; a bad
//! schema is refused at submission, naming the problem; the masks of a choice, JSON schemas
//! and a regex against their grammars along random walks.

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

/// Masks computed beside the forward give the tokens of masks computed after it, for
/// requests of every kind of constraint batched with an unconstrained one.
#[test]
fn overlapped_and_serial_masks_give_the_same_outputs() {
    let e = model("llama3");
    let schema = json!({"type": "object", "properties": {"a": {"type": "string", "maxLength": 12},
        "n": {"type": "integer", "minimum": 0, "maximum": 999}},
        "required": ["a", "n"], "additionalProperties": false});
    let specs = [
        Some(ConstraintSpec::JsonSchema(schema)),
        Some(ConstraintSpec::Regex("[a-z]{2,8}(-[0-9]{2})?".into())),
        Some(ConstraintSpec::Choice(vec!["alpha".into(), "beta".into()])),
        Some(ConstraintSpec::JsonObject),
        None,
    ];
    let outputs = |overlap: bool| {
        let mut cfg = SchedulerConfig::new(128, tessera_engine::KV_BLOCK_SIZE);
        cfg.max_model_len = 512;
        let mut steps = StepEngine::new(&e, cfg).unwrap();
        steps.overlap_masks(overlap);
        for (i, spec) in specs.iter().enumerate() {
            let mut req = request(&e, ConstraintSpec::JsonObject, 1 + i as u64);
            req.constraint = spec.clone();
            req.max_tokens = 40;
            steps.submit(i as u64, &req).unwrap();
        }
        let mut texts = vec![String::new(); specs.len()];
        while steps.has_work() {
            for (id, ev) in steps.step().events {
                match ev {
                    RequestEvent::Text { text, .. } => texts[id as usize].push_str(&text),
                    RequestEvent::Finished { .. } => {}
                    RequestEvent::Failed { message } => panic!("{id}: {message}"),
                }
            }
        }
        texts
    };
    let on = outputs(true);
    assert_eq!(on, outputs(false));
    assert!(on[2] == "alpha" || on[2] == "beta", "{on:?}");
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
        let Vocab { texts, special } = vocab_cached();
        let vocab = texts.len();
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

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// Random walks through a JSON schema's masks, each token drawn uniformly among those
    /// allowed (the mask prepared ahead, as the step engine does, or computed when applied):
    /// EOS is allowed only where the text so far is a complete value valid against the
    /// schema, and a walk that ends, ends on one.
    #[test]
    fn walks_through_a_json_schema_mask_end_valid(
        which in 0usize..3,
        picks in proptest::collection::vec(0usize..10_000, 160),
        ahead in proptest::collection::vec(proptest::bool::ANY, 160),
    ) {
        let e = model_cached();
        let schema = &schemas()[which];
        let mut c = e.grammars().unwrap().matcher(&ConstraintSpec::JsonSchema(schema.clone())).unwrap();
        let vocab = vocab_cached().texts.len();
        let zeros = vec![0f32; vocab];
        let mut out = Vec::new();
        let mut tokens = Vec::new();
        let mut ended = false;
        for (&pick, &ahead) in picks.iter().zip(&ahead) {
            if c.is_done() {
                ended = true;
                break;
            }
            if ahead {
                c.prepare();
            }
            c.masked(&zeros, &mut out).unwrap();
            let text = e.tokenizer.decode(&tokens).unwrap();
            let allowed: Vec<u32> = (0..vocab as u32).filter(|&t| out[t as usize] == 0.0).collect();
            if allowed.iter().any(|&t| e.tokenizer.is_eos(t)) {
                let v: Result<Value, _> = serde_json::from_str(&text);
                proptest::prop_assert!(v.as_ref().is_ok_and(|v| valid(schema, v)),
                    "EOS allowed after {:?}, not a valid value of {}", text, schema);
            }
            proptest::prop_assert!(!allowed.is_empty(), "nothing allowed after {:?}", text);
            let t = allowed[pick % allowed.len()];
            c.accept(t).unwrap();
            if e.tokenizer.is_eos(t) {
                ended = true;
                break;
            }
            tokens.push(t);
        }
        ended |= c.is_done();
        let text = e.tokenizer.decode(&tokens).unwrap();
        if ended {
            let v: Value = serde_json::from_str(&text)
                .map_err(|err| proptest::test_runner::TestCaseError::fail(format!("{text:?}: {err}")))?;
            proptest::prop_assert!(valid(schema, &v), "{} does not follow {}", v, schema);
        } else {
            proptest::prop_assert!(text.starts_with('{'), "{:?}", text);
        }
    }

    /// The mask of `[a-z]{1,5}(-[0-9]{2,3})?` along random walks: every allowed token keeps
    /// the text a prefix of a match (EOS only on a full match), every rejected token
    /// spelled with the regex's characters breaks that (so do a sample of the other rejected
    /// ones), and a walk that ends, ends on a full match.
    #[test]
    fn the_mask_of_a_regex_is_exactly_its_prefixes(
        picks in proptest::collection::vec(0usize..10_000, 14),
        ahead in proptest::collection::vec(proptest::bool::ANY, 14),
        others in proptest::collection::vec(0usize..10_000, 16),
    ) {
        let e = model_cached();
        let Vocab { texts, special } = vocab_cached();
        let vocab = texts.len();
        let spec = ConstraintSpec::Regex("[a-z]{1,5}(-[0-9]{2,3})?".into());
        let mut c = e.grammars().unwrap().matcher(&spec).unwrap();
        let zeros = vec![0f32; vocab];
        let mut out = Vec::new();
        let mut text = String::new();
        let mut ended = false;
        for (&pick, &ahead) in picks.iter().zip(&ahead) {
            if c.is_done() {
                ended = true;
                break;
            }
            if ahead {
                c.prepare();
            }
            c.masked(&zeros, &mut out).unwrap();
            let mut rejected = Vec::new();
            for t in 0..vocab as u32 {
                let s = &texts[t as usize];
                let next = format!("{text}{s}");
                let keeps = if e.tokenizer.is_eos(t) {
                    code_matches(&text)
                } else {
                    !special[t as usize] && !s.is_empty() && code_prefix(&next)
                };
                if out[t as usize] == 0.0 {
                    proptest::prop_assert!(keeps, "token {} {:?} allowed after {:?}", t, s, text);
                } else if s.chars().all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '-') {
                    proptest::prop_assert!(!keeps, "token {} {:?} refused after {:?}", t, s, text);
                } else {
                    rejected.push(t);
                }
            }
            for &o in &others {
                if let Some(&t) = rejected.get(o % rejected.len().max(1)) {
                    let next = format!("{text}{}", texts[t as usize]);
                    proptest::prop_assert!(!code_prefix(&next) || special[t as usize],
                        "token {} {:?} refused after {:?}", t, texts[t as usize], text);
                }
            }
            let allowed: Vec<u32> = (0..vocab as u32).filter(|&t| out[t as usize] == 0.0).collect();
            proptest::prop_assert!(!allowed.is_empty(), "nothing allowed after {:?}", text);
            let t = allowed[pick % allowed.len()];
            c.accept(t).unwrap();
            if e.tokenizer.is_eos(t) {
                ended = true;
                break;
            }
            text.push_str(&texts[t as usize]);
        }
        ended |= c.is_done();
        proptest::prop_assert!(code_prefix(&text), "{:?}", text);
        if ended {
            proptest::prop_assert!(code_matches(&text), "ended on {:?}", text);
        }
    }
}

/// `s` split as `[a-z]*` then, after a `-`, `[0-9]*`: the count of letters and of digits
/// (`None` without the dash); `None` overall if `s` has any other shape.
fn code_parts(s: &str) -> Option<(usize, Option<usize>)> {
    let letters = s.bytes().take_while(u8::is_ascii_lowercase).count();
    let rest = &s[letters..];
    if rest.is_empty() {
        return Some((letters, None));
    }
    let digits = rest.strip_prefix('-')?;
    digits
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then_some((letters, Some(digits.len())))
}

/// Whether `s` fully matches `[a-z]{1,5}(-[0-9]{2,3})?`.
fn code_matches(s: &str) -> bool {
    match code_parts(s) {
        Some((l, None)) => (1..=5).contains(&l),
        Some((l, Some(d))) => (1..=5).contains(&l) && (2..=3).contains(&d),
        None => false,
    }
}

/// Whether some completion of `s` matches `[a-z]{1,5}(-[0-9]{2,3})?`: at most five
/// letters, and after the dash (which needs a letter before it) at most three digits;
/// any such `s` completes (add a letter, or digits up to two).
fn code_prefix(s: &str) -> bool {
    match code_parts(s) {
        Some((l, None)) => l <= 5,
        Some((l, Some(d))) => (1..=5).contains(&l) && d <= 3,
        None => false,
    }
}

/// The schemas of the random walks: required string, integer, enum and array fields; a
/// nested object; arrays of bounded integers. Every string, number and array is bounded,
/// so that a walk ends.
fn schemas() -> [Value; 3] {
    [
        json!({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "role": {"enum": ["admin", "user", "guest"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 3}},
            "required": ["name", "age", "role", "tags"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
            "id": {"type": "integer", "minimum": 1, "maximum": 999},
            "owner": {"type": "object", "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 5},
                "active": {"type": "boolean"}},
                "required": ["name", "active"], "additionalProperties": false}},
            "required": ["id", "owner"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
            "scores": {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5},
                       "minItems": 1, "maxItems": 4},
            "level": {"enum": ["low", "mid", "high"]}},
            "required": ["scores", "level"], "additionalProperties": false}),
    ]
}

/// Whether `v` follows `schema`, for the keywords [`schemas`] uses.
fn valid(schema: &Value, v: &Value) -> bool {
    if let Some(options) = schema.get("enum").and_then(Value::as_array) {
        return options.contains(v);
    }
    let num = |k: &str| schema.get(k).and_then(Value::as_f64);
    let count = |k: &str| schema.get(k).and_then(Value::as_u64).map(|n| n as usize);
    match schema["type"].as_str() {
        Some("boolean") => v.is_boolean(),
        // Any number of integral value (JSON Schema's integer): the grammar writes `-0`,
        // which serde_json reads as a float.
        Some("integer") => v.as_f64().is_some_and(|n| {
            n.fract() == 0.0
                && num("minimum").is_none_or(|m| n >= m)
                && num("maximum").is_none_or(|m| n <= m)
        }),
        Some("string") => v.as_str().is_some_and(|s| {
            let n = s.chars().count();
            count("minLength").is_none_or(|m| n >= m) && count("maxLength").is_none_or(|m| n <= m)
        }),
        Some("array") => v.as_array().is_some_and(|a| {
            count("minItems").is_none_or(|m| a.len() >= m)
                && count("maxItems").is_none_or(|m| a.len() <= m)
                && a.iter().all(|x| valid(&schema["items"], x))
        }),
        Some("object") => v.as_object().is_some_and(|o| {
            let props = schema["properties"].as_object().unwrap();
            let required = schema["required"].as_array().unwrap();
            required.iter().all(|k| o.contains_key(k.as_str().unwrap()))
                && o.iter()
                    .all(|(k, x)| props.get(k).is_some_and(|p| valid(p, x)))
        }),
        other => panic!("the validator does not know the type {other:?}"),
    }
}

/// The tiny Llama 3's vocabulary: each token's text alone, and whether it is a special
/// token (`<|...|>`, which no grammar allows but EOS).
struct Vocab {
    texts: Vec<String>,
    special: Vec<bool>,
}

fn vocab_cached() -> &'static Vocab {
    static V: std::sync::OnceLock<Vocab> = std::sync::OnceLock::new();
    V.get_or_init(|| {
        let e = model_cached();
        let n = e.model.config.vocab_size as u32;
        Vocab {
            texts: (0..n).map(|t| e.tokenizer.decode(&[t]).unwrap()).collect(),
            special: (0..n)
                .map(|t| {
                    e.tokenizer
                        .inner()
                        .id_to_token(t)
                        .is_some_and(|s| s.starts_with("<|"))
                })
                .collect(),
        }
    })
}

/// One tiny Llama 3 engine for the proptest's cases.
fn model_cached() -> &'static Engine {
    static E: std::sync::OnceLock<Engine> = std::sync::OnceLock::new();
    E.get_or_init(|| model("llama3"))
}
