//! Model files into one in-memory model description ([`ModelFiles`]): the architecture's
//! hyper-parameters ([`ModelConfig`]), the weight tensors under canonical names (GGUF's,
//! e.g. `blk.3.attn_q.weight`), and what the tokenizer needs ([`TokenizerSpec`]).
//!
//! Two sources: a single GGUF file ([`gguf`]) or a Hugging Face model folder with
//! `config.json`, `*.safetensors` (sharded, with the index) and `tokenizer.json` ([`hf`]).
//! Tensors stay memory-mapped in their stored formats.

pub mod config;
pub mod family;
pub mod gguf;
pub mod hf;
pub mod load;

pub use config::{Activation, Arch, BlockSpec, ModelConfig, RopeScaling, RopeStyle};
pub use family::Family;
pub use load::{load_model, ModelFiles, TokenizerSource, TokenizerSpec};
