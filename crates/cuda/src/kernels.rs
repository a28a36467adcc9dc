//! Names of the kernels the forward launches (besides the per-format ones in
//! [`crate::formats`]), and the head dimensions attention is compiled for.

pub const RMS_NORM: &str = "rms_norm";
pub const ROPE: &str = "rope";
pub const KV_WRITE: &str = "kv_write";
pub const SILU_MUL: &str = "silu_mul";
pub const ADD_ASSIGN: &str = "add_assign";

/// Head dimensions with an attention kernel (`attention_hd<D>`).
pub const HEAD_DIMS: [usize; 5] = [32, 64, 96, 128, 256];

pub const ALL: [&str; 10] = [
    RMS_NORM,
    ROPE,
    KV_WRITE,
    SILU_MUL,
    ADD_ASSIGN,
    "attention_hd32",
    "attention_hd64",
    "attention_hd96",
    "attention_hd128",
    "attention_hd256",
];

/// The attention kernel for heads of `head_dim`, if there is one.
pub fn attention(head_dim: usize) -> Option<&'static str> {
    HEAD_DIMS
        .iter()
        .position(|&d| d == head_dim)
        .map(|i| ALL[5 + i])
}

/// Rows of activations one matmul pass takes (`MT` in `matmul.cu`) and warps per block
/// (`WARPS`): the launch grid is derived from them.
pub const MATMUL_ROWS: usize = 8;
pub const MATMUL_WARPS: usize = 4;

#[cfg(test)]
mod tests {
    #[test]
    fn attention_kernels_cover_the_listed_head_dims() {
        assert_eq!(super::attention(64), Some("attention_hd64"));
        assert_eq!(super::attention(128), Some("attention_hd128"));
        assert_eq!(super::attention(80), None);
        // The constants match the kernel source.
        let src = include_str!("../kernels/matmul.cu");
        assert!(src.contains(&format!("#define MT {}", super::MATMUL_ROWS)));
        assert!(src.contains(&format!("#define WARPS {}", super::MATMUL_WARPS)));
    }
}
