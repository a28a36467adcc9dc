//! Round-to-nearest encoders for the ggml types of this module, for tests and tools.

use super::GgmlQuant;

/// Encodes `x` (a whole number of blocks) as `q`.
pub fn quantize_row(q: GgmlQuant, x: &[f32]) -> Result<Vec<u8>, String> {
    match q {
        GgmlQuant::Q8_K => Ok(super::quantize_row_q8_k(x)),
        _ => Err(format!("no encoder for {q} yet")),
    }
}
