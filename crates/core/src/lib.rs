//! Tessera's core vocabulary: element and block formats ([`DType`], the `Block*` structs),
//! weight tensors that stay in their stored format ([`WeightTensor`]), the error type
//! shared by the layers above, and the one way to quote untrusted text in a message
//! ([`untrusted`]).
//!
//! Nothing here computes anything heavier than a reference dequantization; kernels live in
//! `tessera-kernels`.

pub mod blocks;
pub mod dtype;
pub mod error;
pub mod ggml_quants;
pub mod tensor;
pub mod untrusted;

pub use blocks::{BlockQ4_0, BlockQ4_1, BlockQ8_0, QK};
pub use dtype::DType;
pub use error::{
    group_unsupported, Error, Result, TemplateError, TemplateLimit, UnsupportedTypeUse,
};
pub use tensor::{TensorBytes, WeightTensor};

/// The user-wide cache folder (models, the tuning cache, the kernel variants measured per
/// CPU): `$TESSERA_CACHE`, else `$XDG_CACHE_HOME/tessera`, else `~/.cache/tessera`.
pub fn cache_dir() -> std::path::PathBuf {
    use std::path::PathBuf;
    if let Some(d) = std::env::var_os("TESSERA_CACHE") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("tessera");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    home.join(".cache").join("tessera")
}
