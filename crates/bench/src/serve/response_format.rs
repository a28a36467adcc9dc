//! `--response-format FILE.json`: the OpenAI `response_format` object every request sends
//! (`{"type": "json_object"}` or `{"type": "json_schema", "json_schema": {"name": ...,
//! "strict": true, "schema": {...}}}`), and the check of each output against it.
//!
//! A constrained request sends no `ignore_eos`: its output ends when the grammar is
//! complete, and `max_tokens` only bounds it. Each completed output (the streamed content
//! concatenated) gets a [`Verdict`]: valid when it parses as JSON (an object, for
//! `json_object`) that the schema accepts (`format` keywords checked too), else cut when the
//! server ended it at `max_tokens`, else invalid with the first reason. [`Validity`] counts
//! them over a measurement; a cut output counts as invalid and is also reported apart.
//!
//! On `/v1/completions` the schema is also sent as llama.cpp's `json_schema` field (`{"type":
//! "object"}` for `json_object`): llama-server reads `response_format` on the chat endpoint
//! only. Tessera and vLLM read `response_format` on both and ignore the extra field.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use super::stats::Timing;
use super::Endpoint;

/// What a response format asks of an output.
enum Check {
    /// Any JSON object.
    JsonObject,
    /// A value the schema accepts.
    Schema(Box<jsonschema::Validator>),
}

/// A parsed `response_format` object and its compiled check.
pub struct ResponseFormat {
    /// The object as sent.
    value: Value,
    /// The JSON schema (`{"type": "object"}` for `json_object`), for llama.cpp's field.
    schema: Value,
    check: Check,
}

impl std::fmt::Debug for ResponseFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ResponseFormat({})", self.value)
    }
}

/// How one completed output measured up.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Valid,
    /// Not valid, and the server stopped it at `max_tokens`.
    Truncated,
    /// Not valid although the output ended on its own; the first reason.
    Invalid(String),
}

impl ResponseFormat {
    /// Reads a `response_format` object from a JSON file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading --response-format {}", path.display()))?;
        let v: Value = serde_json::from_str(&text)
            .with_context(|| format!("--response-format {}: not JSON", path.display()))?;
        Self::from_value(v).with_context(|| format!("--response-format {}", path.display()))
    }

    /// Checks a `response_format` object and compiles its schema.
    pub fn from_value(value: Value) -> Result<Self> {
        let kind = value
            .get("type")
            .and_then(Value::as_str)
            .ok_or_else(|| anyhow!("a response_format object needs a \"type\""))?;
        let (schema, check) = match kind {
            "json_object" => (json!({"type": "object"}), Check::JsonObject),
            "json_schema" => {
                let schema = value
                    .pointer("/json_schema/schema")
                    .filter(|s| s.is_object() || s.is_boolean())
                    .cloned()
                    .ok_or_else(|| anyhow!("json_schema needs json_schema.schema (an object)"))?;
                let validator = jsonschema::options()
                    .should_validate_formats(true)
                    .build(&schema)
                    .map_err(|e| anyhow!("the schema does not compile: {e}"))?;
                (schema, Check::Schema(Box::new(validator)))
            }
            other => bail!("response_format type {other:?}: expected json_object or json_schema"),
        };
        Ok(ResponseFormat {
            value,
            schema,
            check,
        })
    }

    /// `json_object` or `json_schema`.
    pub fn kind(&self) -> &'static str {
        match self.check {
            Check::JsonObject => "json_object",
            Check::Schema(_) => "json_schema",
        }
    }

    /// Adds the constraint to a request body and drops `ignore_eos`.
    pub fn apply(&self, body: &mut Value, endpoint: Endpoint) {
        if let Some(o) = body.as_object_mut() {
            o.remove("ignore_eos");
            if endpoint == Endpoint::Responses {
                // Responses' `text.format` is Chat's `json_schema` object flattened.
                let mut format = self.value.get("json_schema").cloned().unwrap_or_default();
                match format.as_object_mut() {
                    Some(f) => {
                        f.insert("type".into(), Value::from("json_schema"));
                    }
                    None => format = self.value.clone(),
                }
                o.insert("text".into(), serde_json::json!({ "format": format }));
                return;
            }
            o.insert("response_format".into(), self.value.clone());
            if endpoint == Endpoint::Completions {
                o.insert("json_schema".into(), self.schema.clone());
            }
        }
    }

    /// The verdict on a complete output; `cut`: the server stopped it at `max_tokens`.
    pub fn check(&self, text: &str, cut: bool) -> Verdict {
        let reason = match serde_json::from_str::<Value>(text) {
            Err(e) => format!("not JSON ({e})"),
            Ok(v) => match &self.check {
                Check::JsonObject if v.is_object() => return Verdict::Valid,
                Check::JsonObject => "not a JSON object".to_string(),
                Check::Schema(s) => match s.validate(&v) {
                    Ok(()) => return Verdict::Valid,
                    Err(e) => format!("schema: {e} at {:?}", e.instance_path().as_str()),
                },
            },
        };
        if cut {
            Verdict::Truncated
        } else {
            Verdict::Invalid(reason)
        }
    }
}

/// Whether an output stopped at `max_tokens`: the server's `finish_reason` says `length`,
/// or, when it sent none, the output reached `max_tokens`.
pub fn was_cut(finish_reason: Option<&str>, output_tokens: usize, max_tokens: usize) -> bool {
    match finish_reason {
        Some(r) => r == "length",
        None => output_tokens >= max_tokens,
    }
}

/// The verdicts of a measurement's completed outputs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Validity {
    /// Outputs checked (the completed requests).
    pub checked: usize,
    pub valid: usize,
    /// Every output not valid, the cut ones included.
    pub invalid: usize,
    /// Outputs cut by `max_tokens` (counted in `invalid` too).
    pub truncated: usize,
    /// The reason of the first (lowest-index) output invalid though not cut.
    pub first_invalid: Option<String>,
}

impl Validity {
    /// Counts the verdicts of completed requests, in request order; `None` when no output
    /// was checked (no `--response-format`).
    pub fn tally<'a>(timings: impl IntoIterator<Item = &'a Timing>) -> Option<Validity> {
        let mut v = Validity::default();
        for t in timings {
            let Some(verdict) = &t.verdict else { continue };
            v.checked += 1;
            match verdict {
                Verdict::Valid => v.valid += 1,
                Verdict::Truncated => {
                    v.invalid += 1;
                    v.truncated += 1;
                }
                Verdict::Invalid(why) => {
                    v.invalid += 1;
                    v.first_invalid.get_or_insert_with(|| why.clone());
                }
            }
        }
        (v.checked > 0).then_some(v)
    }

    /// The valid share in percent.
    pub fn percent(&self) -> f64 {
        if self.checked == 0 {
            f64::NAN
        } else {
            100.0 * self.valid as f64 / self.checked as f64
        }
    }

    /// `valid: N/M (P%)`, then the invalid ones and how many were cut.
    pub fn line(&self) -> String {
        let mut s = format!(
            "valid: {}/{} ({:.1}%)",
            self.valid,
            self.checked,
            self.percent()
        );
        if self.invalid > 0 {
            s.push_str(&format!(
                "; invalid {}, of which {} cut by max_tokens",
                self.invalid, self.truncated
            ));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn person() -> ResponseFormat {
        ResponseFormat::from_value(json!({
            "type": "json_schema",
            "json_schema": {"name": "p", "strict": true, "schema": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "age": {"type": "integer", "minimum": 0},
                    "email": {"type": "string", "format": "email"},
                    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 1}
                },
                "required": ["name", "age"],
                "additionalProperties": false
            }}
        }))
        .unwrap()
    }

    fn timing(verdict: Option<Verdict>) -> Timing {
        Timing {
            ttft: 0.1,
            tpot: Some(0.01),
            e2e: 0.5,
            output_tokens: 10,
            prompt_tokens: 5,
            prompt_tokens_exact: true,
            verdict,
        }
    }

    #[test]
    fn parsing_and_request_bodies() {
        assert!(ResponseFormat::from_value(json!({"type": "text"})).is_err());
        assert!(ResponseFormat::from_value(json!({"json_schema": {}})).is_err());
        assert!(ResponseFormat::from_value(json!({"type": "json_schema"})).is_err());
        let bad = json!({"type": "json_schema", "json_schema": {"schema": {"type": 5}}});
        assert!(ResponseFormat::from_value(bad).is_err());

        let rf = person();
        assert_eq!(rf.kind(), "json_schema");
        let mut chat = json!({"messages": [], "ignore_eos": true, "max_tokens": 8});
        rf.apply(&mut chat, Endpoint::Chat);
        assert!(chat.get("ignore_eos").is_none());
        assert_eq!(chat["max_tokens"], 8);
        assert_eq!(chat["response_format"]["json_schema"]["name"], "p");
        assert!(chat.get("json_schema").is_none());
        let mut cmpl = json!({"prompt": "x", "ignore_eos": true});
        rf.apply(&mut cmpl, Endpoint::Completions);
        assert_eq!(cmpl["json_schema"]["required"], json!(["name", "age"]));
        assert_eq!(cmpl["response_format"]["type"], "json_schema");

        let obj = ResponseFormat::from_value(json!({"type": "json_object"})).unwrap();
        assert_eq!(obj.kind(), "json_object");
        let mut cmpl = json!({"prompt": "x"});
        obj.apply(&mut cmpl, Endpoint::Completions);
        assert_eq!(cmpl["json_schema"], json!({"type": "object"}));
        // Responses: text.format, flattened.
        let mut resp = json!({"input": "x", "ignore_eos": true});
        rf.apply(&mut resp, Endpoint::Responses);
        assert!(resp.get("ignore_eos").is_none() && resp.get("response_format").is_none());
        let f = &resp["text"]["format"];
        assert_eq!(
            (&f["type"], &f["name"]),
            (&json!("json_schema"), &json!("p"))
        );
        assert_eq!(f["schema"]["required"], json!(["name", "age"]));
        let mut resp = json!({"input": "x"});
        obj.apply(&mut resp, Endpoint::Responses);
        assert_eq!(resp["text"]["format"], json!({"type": "json_object"}));
    }

    #[test]
    fn verdicts() {
        let rf = person();
        let ok = r#" {"name": "Ann", "age": 31, "email": "ann@example.com", "tags": ["a"]} "#;
        assert_eq!(rf.check(ok, false), Verdict::Valid);
        // A complete valid output that happened to end at max_tokens is valid.
        assert_eq!(rf.check(ok, true), Verdict::Valid);
        assert_eq!(rf.check(r#"{"name": "Ann", "ag"#, true), Verdict::Truncated);
        let why = |text: &str| match rf.check(text, false) {
            Verdict::Invalid(w) => w,
            v => panic!("{text}: {v:?}"),
        };
        assert!(why(r#"{"name": "Ann", "ag"#).starts_with("not JSON"));
        assert!(why(r#"{"name": "Ann"}"#).contains("age"));
        assert!(why(r#"{"name": "A", "age": 1.5}"#).contains("/age"));
        assert!(why(r#"{"name": "A", "age": 1, "email": "nope"}"#).contains("email"));
        assert!(why(r#"{"name": "A", "age": 1, "tags": ["a", "b"]}"#).contains("tags"));
        assert!(why(r#"{"name": "A", "age": 1, "x": 0}"#).contains("x"));
        assert!(why(r#"{"name": "A", "age": 1} trailing"#).starts_with("not JSON"));

        let obj = ResponseFormat::from_value(json!({"type": "json_object"})).unwrap();
        assert_eq!(obj.check(r#"{"anything": [1, 2]}"#, false), Verdict::Valid);
        assert_eq!(
            obj.check("[1, 2]", false),
            Verdict::Invalid("not a JSON object".into())
        );
        assert_eq!(obj.check("{\"a\": ", true), Verdict::Truncated);

        assert!(was_cut(Some("length"), 3, 64));
        assert!(!was_cut(Some("stop"), 64, 64));
        assert!(was_cut(None, 64, 64));
        assert!(!was_cut(None, 63, 64));
    }

    #[test]
    fn the_sample_schema_loads_and_checks() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/bench/schemas");
        let rf = ResponseFormat::load(&dir.join("person.json")).unwrap();
        assert_eq!(rf.kind(), "json_schema");
        let ok = r#"{"name": "Ann Lee", "age": 34, "email": "ann.lee@mail.com", "tags": ["work", "music"], "address": {"street": "12 Oak Road", "city": "Leeds", "country": "UK"}}"#;
        assert_eq!(rf.check(ok, false), Verdict::Valid);
        let bad_email = ok.replace("ann.lee@mail.com", "Ann Lee at mail");
        assert!(matches!(rf.check(&bad_email, false), Verdict::Invalid(w) if w.contains("email")));
        let four_tags = ok.replace(
            r#"["work", "music"]"#,
            r#"["work", "music", "friend", "family"]"#,
        );
        assert!(matches!(rf.check(&four_tags, false), Verdict::Invalid(_)));
        let prompts = std::fs::read_to_string(dir.join("person-prompts.txt")).unwrap();
        assert!(prompts.lines().count() >= 4);
        assert!(ResponseFormat::load(&dir.join("missing.json")).is_err());
    }

    #[test]
    fn validity_accounting() {
        let ts = [
            timing(Some(Verdict::Valid)),
            timing(Some(Verdict::Invalid("first".into()))),
            timing(Some(Verdict::Truncated)),
            timing(Some(Verdict::Valid)),
            timing(Some(Verdict::Invalid("second".into()))),
            timing(Some(Verdict::Valid)),
            timing(Some(Verdict::Truncated)),
            timing(Some(Verdict::Valid)),
        ];
        let v = Validity::tally(&ts).unwrap();
        assert_eq!((v.checked, v.valid, v.invalid, v.truncated), (8, 4, 4, 2));
        assert_eq!(v.first_invalid.as_deref(), Some("first"));
        assert_eq!(v.percent(), 50.0);
        assert_eq!(
            v.line(),
            "valid: 4/8 (50.0%); invalid 4, of which 2 cut by max_tokens"
        );
        let all = Validity::tally(&ts[..1]).unwrap();
        assert_eq!(all.line(), "valid: 1/1 (100.0%)");
        // No response format: nothing checked, no figures.
        assert_eq!(Validity::tally(&[timing(None), timing(None)]), None);
        assert_eq!(Validity::tally(&[]), None);
    }
}
