//! The error type shared by the model-loading and compute layers.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong below the engine, each variant naming the thing at fault.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("malformed {format} file: {msg}")]
    Malformed { format: &'static str, msg: String },
    #[error("unsupported tensor type {ty} for tensor {name}")]
    UnsupportedTensorType { ty: String, name: String },
    #[error("missing tensor {name}")]
    MissingTensor { name: String },
    #[error("tensor {name} has shape {got:?}, expected {expected:?}")]
    ShapeMismatch {
        name: String,
        got: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("unsupported architecture {arch:?} (supported: llama, mistral, qwen2, smollm)")]
    UnknownArchitecture { arch: String },
    #[error("invalid model configuration: {0}")]
    Config(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A problem with one sequence of a batch (its index in the step's batch), so the caller
    /// can fail that request alone.
    #[error("sequence {seq}: {reason}")]
    Sequence { seq: usize, reason: String },
    #[error("{0}")]
    Other(String),
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
