//! Chat templates (Jinja, as shipped in `tokenizer.chat_template`) rendered with minijinja,
//! with Python string methods (`.strip()`, `.startswith()`…) and `raise_exception` available
//! as transformers provides them.
//!
//! A chat template is code written by whoever made the model file, so it runs bounded
//! ([`TemplateLimits`]): a budget of instructions (minijinja's fuel), of output bytes and of
//! nested macro calls, each scaled with the request so that an ordinary template never
//! comes near them. A template past a bound fails that render with
//! [`TemplateError::Limit`] naming it; nothing is shared between renders, so a render is
//! safe to run on any thread (a blocking pool) and concurrently with others.
//!
//! What the bounds do not cover: minijinja counts instructions, not the work inside one,
//! and caps its heaviest single operations itself (a string repeated to at most 100 MB, a
//! `range` of at most 100 000 items); a template that doubles a string by concatenating it
//! with itself in a loop can still build a large value in few instructions before its
//! output is written.

use minijinja::{Environment, ErrorKind};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tessera_core::{Result, TemplateError, TemplateLimit};

/// One turn of a conversation as chat templates read it. The tool fields are those of the
/// OpenAI messages that Hugging Face templates take: an assistant turn's `tool_calls`
/// (`[{"id", "type": "function", "function": {"name", "arguments": {...}}}]`, arguments as a
/// JSON object), and a `tool` turn's `tool_call_id` and `name`. Absent fields are undefined
/// to the template, as in transformers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }

    /// Bytes of text the message gives the template (for the render's bounds).
    fn text_len(&self) -> usize {
        self.role.len()
            + self.content.len()
            + self.tool_calls.as_ref().map_or(0, json_len)
            + self.tool_call_id.as_ref().map_or(0, String::len)
            + self.name.as_ref().map_or(0, String::len)
    }
}

fn json_len(v: &Value) -> usize {
    serde_json::to_string(v).map_or(0, |s| s.len())
}

/// What a chat template gets besides the messages: the request's tool definitions
/// (`tools`, OpenAI's list of `{"type": "function", "function": {...}}`) and extra template
/// variables (`chat_template_kwargs`, e.g. Qwen3's `enable_thinking`). A kwarg never
/// replaces the variables the renderer sets itself.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatExtras {
    pub tools: Option<Value>,
    pub kwargs: serde_json::Map<String, Value>,
}

impl ChatExtras {
    fn text_len(&self) -> usize {
        self.tools.as_ref().map_or(0, json_len)
            + self
                .kwargs
                .iter()
                .map(|(k, v)| k.len() + json_len(v))
                .sum::<usize>()
    }
}

/// The bounds a chat template renders under. Budgets grow with the request: a
/// conversation of `m` messages totalling `b` bytes gets `fuel + m * fuel_per_message`
/// instructions and `output_bytes + b * output_per_input_byte` bytes of output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TemplateLimits {
    pub fuel: u64,
    pub fuel_per_message: u64,
    pub output_bytes: usize,
    pub output_per_input_byte: usize,
    /// Deepest nesting of macro calls and includes (minijinja allows at most 500).
    pub recursion: usize,
}

impl Default for TemplateLimits {
    /// Generous for real templates: the longest ones in use (tool-calling templates) run a
    /// few hundred instructions per message; ChatML runs about fifteen.
    fn default() -> Self {
        TemplateLimits {
            fuel: 200_000,
            fuel_per_message: 10_000,
            output_bytes: 1 << 20,
            output_per_input_byte: 4,
            recursion: 64,
        }
    }
}

pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    limits: TemplateLimits,
}

thread_local! {
    /// The message of the `raise_exception` that ended the current render on this thread,
    /// which tells a template's refusal from its other failures.
    static RAISED: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

fn raise_exception(msg: String) -> std::result::Result<String, minijinja::Error> {
    RAISED.with(|r| *r.borrow_mut() = Some(msg.clone()));
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
}

/// transformers' `tojson`: Python's `json.dumps(x, ensure_ascii=False)` with its `indent`
/// and `sort_keys` options. minijinja's own filter writes compact, HTML-escaped JSON
/// (`\u003c` for `<`), which would change the prompts that templates build from tool
/// definitions and call arguments.
fn tojson(
    value: minijinja::Value,
    kwargs: minijinja::value::Kwargs,
) -> std::result::Result<String, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let bad =
        |e: serde_json::Error| minijinja::Error::new(ErrorKind::BadSerialization, e.to_string());
    let mut v = serde_json::to_value(&value).map_err(bad)?;
    if sort_keys == Some(true) {
        sort(&mut v);
    }
    let mut out = Vec::new();
    match indent {
        Some(n) => {
            let pad = vec![b' '; n];
            let f = serde_json::ser::PrettyFormatter::with_indent(&pad);
            serde::Serialize::serialize(
                &v,
                &mut serde_json::Serializer::with_formatter(&mut out, f),
            )
        }
        None => serde::Serialize::serialize(
            &v,
            &mut serde_json::Serializer::with_formatter(&mut out, PythonFormatter),
        ),
    }
    .map_err(bad)?;
    String::from_utf8(out)
        .map_err(|e| minijinja::Error::new(ErrorKind::BadSerialization, e.to_string()))
}

fn sort(v: &mut Value) {
    match v {
        Value::Object(o) => {
            let mut entries: Vec<(String, Value)> = std::mem::take(o).into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            for (k, mut x) in entries {
                sort(&mut x);
                o.insert(k, x);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(sort),
        _ => {}
    }
}

/// Python's default JSON separators: `", "` between items, `": "` after keys.
struct PythonFormatter;

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

/// Rendered text, refusing to grow past `max` bytes.
struct BoundedOutput {
    buf: Vec<u8>,
    max: usize,
    exceeded: bool,
}

impl std::io::Write for BoundedOutput {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + b.len() > self.max {
            self.exceeded = true;
            return Err(std::io::Error::other("chat template output limit"));
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl ChatTemplate {
    /// Compiles `source`; a template that does not parse is [`TemplateError::Syntax`].
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        Self::with_limits(source, bos_token, eos_token, TemplateLimits::default())
    }

    pub fn with_limits(
        source: &str,
        bos_token: &str,
        eos_token: &str,
        limits: TemplateLimits,
    ) -> Result<Self> {
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", tojson);
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_recursion_limit(limits.recursion);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| TemplateError::Syntax(e.to_string()))?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
            limits,
        })
    }

    pub fn limits(&self) -> TemplateLimits {
        self.limits
    }
    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// Renders `messages`; fails with a [`TemplateError`] (inside the crate's error) when
    /// the template refuses them, fails, or runs past a bound.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with(messages, add_generation_prompt, &ChatExtras::default())
    }

    /// Renders `messages` with `extras` (tools, template kwargs) in the template's context.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extras: &ChatExtras,
    ) -> Result<String> {
        let l = &self.limits;
        let input: usize =
            messages.iter().map(ChatMessage::text_len).sum::<usize>() + extras.text_len();
        let fuel = l
            .fuel
            .saturating_add(l.fuel_per_message.saturating_mul(messages.len() as u64));
        let max_out = l
            .output_bytes
            .saturating_add(input.saturating_mul(l.output_per_input_byte));
        // Cheap: the compiled template and the tables are shared behind `Arc`s.
        let mut env = self.env.clone();
        env.set_fuel(Some(fuel));
        let tmpl = env
            .get_template("chat")
            .map_err(|e| TemplateError::Failed(e.to_string()))?;
        let mut out = BoundedOutput {
            buf: Vec::new(),
            max: max_out,
            exceeded: false,
        };
        RAISED.with(|r| r.borrow_mut().take());
        let result = tmpl.render_captured_to(
            minijinja::context! {
                messages => minijinja::Value::from_serialize(messages),
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token.clone(),
                eos_token => self.eos_token.clone(),
                tools => extras.tools.as_ref().map(minijinja::Value::from_serialize),
                ..minijinja::Value::from_serialize(&extras.kwargs)
            },
            &mut out,
        );
        let raised = RAISED.with(|r| r.borrow_mut().take());
        match result {
            Ok(_) => String::from_utf8(out.buf)
                .map_err(|_| TemplateError::Failed("rendered text is not UTF-8".into()).into()),
            Err(_) if out.exceeded => Err(TemplateError::Limit {
                limit: TemplateLimit::Output,
                max: max_out as u64,
                detail: format!("bytes of text for {} message(s)", messages.len()),
            }
            .into()),
            Err(e) => Err(classify(e, raised, fuel, l.recursion).into()),
        }
    }
}

fn classify(e: minijinja::Error, raised: Option<String>, fuel: u64, depth: usize) -> TemplateError {
    // An error inside an include or a macro arrives wrapped: the cause is the innermost.
    let mut inner = &e;
    while let Some(src) =
        std::error::Error::source(inner).and_then(|s| s.downcast_ref::<minijinja::Error>())
    {
        inner = src;
    }
    let detail = inner.detail().unwrap_or_default();
    match inner.kind() {
        ErrorKind::OutOfFuel => TemplateError::Limit {
            limit: TemplateLimit::Fuel,
            max: fuel,
            detail: "instructions run (a loop that does not end?)".into(),
        },
        ErrorKind::InvalidOperation if detail == "recursion limit exceeded" => {
            TemplateError::Limit {
                limit: TemplateLimit::Recursion,
                max: depth as u64,
                detail: "nested macro calls or includes".into(),
            }
        }
        ErrorKind::InvalidOperation if raised.as_deref() == Some(detail) => {
            TemplateError::Rejected(detail.to_string())
        }
        _ => TemplateError::Failed(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::Error;

    fn template_error(r: Result<String>) -> TemplateError {
        match r {
            Err(Error::ChatTemplate(e)) => e,
            other => panic!("expected a template error, got {other:?}"),
        }
    }

    /// `tojson` as transformers has it (Python's json.dumps with ensure_ascii=False).
    #[test]
    fn tojson_writes_python_json() {
        let render = |src: &str| {
            ChatTemplate::new(src, "", "")
                .unwrap()
                .render(&[], false)
                .unwrap()
        };
        assert_eq!(
            render("{{ {'b': 1, 'a': [1, 'é<&>', none, true]} | tojson }}"),
            r#"{"b": 1, "a": [1, "é<&>", null, true]}"#
        );
        assert_eq!(
            render("{{ {'b': {'d': 1, 'c': 2}, 'a': 0} | tojson(sort_keys=true) }}"),
            r#"{"a": 0, "b": {"c": 2, "d": 1}}"#
        );
        assert_eq!(
            render("{{ {'a': [1]} | tojson(indent=2) }}"),
            "{\n  \"a\": [\n    1\n  ]\n}"
        );
    }

    fn hostile(src: &str) -> TemplateError {
        let t = ChatTemplate::new(src, "", "").unwrap();
        template_error(t.render(&[ChatMessage::new("user", "hi")], true))
    }

    #[test]
    fn renders_chatml_with_python_methods() {
        let src = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'].strip() + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        let out = t.render(&[ChatMessage::new("user", " hi ")], true).unwrap();
        assert_eq!(
            out,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn raise_exception_is_a_refusal_the_client_caused() {
        let t = ChatTemplate::new("{{ raise_exception('roles must alternate') }}", "", "").unwrap();
        let e = template_error(t.render(&[], false));
        assert_eq!(e, TemplateError::Rejected("roles must alternate".into()));
        assert!(e.is_client_error());
        let e = match ChatTemplate::new("{% for %}", "", "") {
            Err(Error::ChatTemplate(e)) => e,
            _ => panic!("a broken template must not compile"),
        };
        assert!(matches!(e, TemplateError::Syntax(_)), "{e}");
        assert!(!e.is_client_error());
    }

    #[test]
    fn endless_loops_run_out_of_fuel() {
        // minijinja caps one range at 100 000 items; nesting multiplies them.
        for src in [
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "{% for i in range(10**9) %}x{% endfor %}",
            "{% macro f(n) %}{% for i in range(100000) %}{{ n }}{% endfor %}{% endmacro %}{% for i in range(100000) %}{% set x = f(i) %}{% endfor %}",
        ] {
            let t0 = std::time::Instant::now();
            let e = hostile(src);
            assert!(
                matches!(
                    e,
                    TemplateError::Limit {
                        limit: TemplateLimit::Fuel,
                        ..
                    }
                ) || matches!(e, TemplateError::Failed(ref m) if m.contains("range has too many")),
                "{src}: {e}"
            );
            assert!(t0.elapsed().as_secs() < 10, "{src} took {:?}", t0.elapsed());
        }
        let e = hostile(
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        );
        assert!(e.to_string().contains("instruction (fuel) limit"), "{e}");
        assert!(!e.is_client_error());
    }

    #[test]
    fn huge_output_hits_the_output_limit() {
        let e = hostile("{% for i in range(100000) %}{{ 'x' * 10000 }}{% endfor %}");
        match &e {
            TemplateError::Limit {
                limit: TemplateLimit::Output,
                max,
                ..
            } => assert!(*max < 2 << 20, "{max}"),
            other => panic!("{other}"),
        }
        assert!(e.to_string().contains("output size limit"), "{e}");
    }

    #[test]
    fn deep_recursion_hits_the_recursion_limit_on_a_small_stack() {
        // A blocking-pool thread's stack (2 MiB) must hold the deepest allowed nesting.
        let h = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(|| {
                [
                    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
                    "{% include 'chat' %}",
                ]
                .map(hostile)
            })
            .unwrap();
        for e in h.join().unwrap() {
            assert!(
                matches!(
                    e,
                    TemplateError::Limit {
                        limit: TemplateLimit::Recursion,
                        ..
                    }
                ),
                "{e}"
            );
        }
    }

    #[test]
    fn ordinary_templates_stay_far_below_the_bounds() {
        let src = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}";
        let tight = TemplateLimits {
            fuel: 100,
            fuel_per_message: 100,
            output_bytes: 100,
            output_per_input_byte: 2,
            recursion: 4,
        };
        let t = ChatTemplate::with_limits(src, "", "", tight).unwrap();
        let msgs: Vec<ChatMessage> = (0..1000)
            .map(|i| ChatMessage::new("user", &"word ".repeat(i % 50)))
            .collect();
        assert!(t.render(&msgs, true).is_ok());
    }
}
