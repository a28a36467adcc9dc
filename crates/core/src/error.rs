//! The error type shared by the model-loading and compute layers.
//!
//! Its messages are safe to print: every variant's text goes through
//! [`crate::untrusted::sanitize`] when displayed (control characters escaped, length
//! bounded), whatever a file put into it; code that builds a message quoting file bytes
//! also quotes them with [`crate::untrusted::quote`].

use std::path::PathBuf;

use crate::untrusted::{Name, Safe};

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong below the engine, each variant naming the thing at fault.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {}: {}", Safe(&path.to_string_lossy()), Safe(&source.to_string()))]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("malformed {format} file: {}", Safe(msg))]
    Malformed { format: &'static str, msg: String },
    #[error("unsupported tensor type {} for tensor {}", Name(ty), Name(name))]
    UnsupportedTensorType { ty: String, name: String },
    #[error("missing tensor {}", Name(name))]
    MissingTensor { name: String },
    #[error("tensor {} has shape {got:?}, expected {expected:?}", Name(name))]
    ShapeMismatch {
        name: String,
        got: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error(
        "unsupported architecture {} (supported: llama, mistral, qwen2, smollm)",
        crate::untrusted::quote(arch)
    )]
    UnknownArchitecture { arch: String },
    /// Everything a model file needs that this build lacks, found in one pass: its
    /// architecture if unknown, and every unsupported tensor type with how many tensors use
    /// it (in the order of first use).
    #[error("{}", unsupported_model_message(arch.as_deref(), types))]
    UnsupportedModel {
        arch: Option<String>,
        types: Vec<UnsupportedTypeUse>,
    },
    #[error("invalid model configuration: {}", Safe(.0))]
    Config(String),
    #[error("tokenizer: {}", Safe(.0))]
    Tokenizer(String),
    /// The model's chat template failed; [`TemplateError`] says whose fault it is.
    #[error(transparent)]
    ChatTemplate(#[from] TemplateError),
    /// A problem with one sequence of a batch (its index in the step's batch), so the caller
    /// can fail that request alone.
    #[error("sequence {seq}: {}", Safe(reason))]
    Sequence { seq: usize, reason: String },
    #[error("{}", Safe(.0))]
    Other(String),
}

/// Which bound a chat template ran into (see `tessera_tokenizer::chat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateLimit {
    /// Instructions executed (minijinja's fuel).
    Fuel,
    /// Bytes of rendered text.
    Output,
    /// Depth of nested macro calls and includes.
    Recursion,
}

impl std::fmt::Display for TemplateLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TemplateLimit::Fuel => "instruction (fuel)",
            TemplateLimit::Output => "output size",
            TemplateLimit::Recursion => "recursion depth",
        })
    }
}

/// Why a chat template gave no prompt. [`TemplateError::is_client_error`] tells a server
/// which side is at fault: the request (HTTP 400) or the model's template (HTTP 500).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TemplateError {
    /// The model carries no chat template (a chat request to a base model).
    #[error("this model has no chat template")]
    Missing,
    /// The template in the model file is not valid Jinja; the model's fault, reported on
    /// every use of chat (the rest of the model still works).
    #[error("the model's chat template does not parse: {}", Safe(.0))]
    Syntax(String),
    /// The template called `raise_exception`: it refuses these messages (roles out of
    /// order, an unsupported role...).
    #[error("the chat template refuses these messages: {}", Safe(.0))]
    Rejected(String),
    /// The template ran past one of the bounds model-supplied code runs under.
    #[error(
        "the chat template exceeded its {limit} limit of {max}: {}",
        Safe(detail)
    )]
    Limit {
        limit: TemplateLimit,
        max: u64,
        detail: String,
    },
    /// Any other failure while rendering (an undefined method, a type error...).
    #[error("the chat template failed: {}", Safe(.0))]
    Failed(String),
}

impl TemplateError {
    /// True when the request is at fault (no template to chat with, or the template
    /// explicitly refused the messages); false when the model's template is.
    pub fn is_client_error(&self) -> bool {
        matches!(self, TemplateError::Missing | TemplateError::Rejected(_))
    }
}

impl Error {
    pub fn malformed(format: &'static str, msg: impl Into<String>) -> Self {
        Error::Malformed {
            format,
            msg: msg.into(),
        }
    }
    pub fn sequence(seq: usize, reason: impl Into<String>) -> Self {
        Error::Sequence {
            seq,
            reason: reason.into(),
        }
    }
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

/// One unsupported tensor type in a model file: its name, how many tensors use it and the
/// first of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsupportedTypeUse {
    pub ty: String,
    pub count: usize,
    pub first: String,
}

/// Groups `(type, tensor)` pairs by type, in the order of each type's first tensor.
pub fn group_unsupported(
    uses: impl IntoIterator<Item = (String, String)>,
) -> Vec<UnsupportedTypeUse> {
    let mut out: Vec<UnsupportedTypeUse> = Vec::new();
    for (ty, name) in uses {
        match out.iter_mut().find(|u| u.ty == ty) {
            Some(u) => u.count += 1,
            None => out.push(UnsupportedTypeUse {
                ty,
                count: 1,
                first: name,
            }),
        }
    }
    out
}

const SUPPORTED_ARCHS: &str = "llama, mistral, qwen2, smollm";

fn unsupported_model_message(arch: Option<&str>, types: &[UnsupportedTypeUse]) -> String {
    let mut parts = Vec::new();
    if let Some(a) = arch {
        parts.push(format!(
            "unsupported architecture {} (supported: {SUPPORTED_ARCHS})",
            crate::untrusted::quote(a)
        ));
    }
    if !types.is_empty() {
        let list: Vec<String> = types
            .iter()
            .map(|u| match u.count {
                1 => format!("{} (1 tensor: {})", Name(&u.ty), Name(&u.first)),
                n => format!("{} ({n} tensors, first {})", Name(&u.ty), Name(&u.first)),
            })
            .collect();
        let noun = if types.len() == 1 { "type" } else { "types" };
        parts.push(format!("unsupported tensor {noun}: {}", list.join(", ")));
    }
    parts.join("; ")
}
