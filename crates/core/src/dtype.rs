//! Element formats a weight tensor may be stored in.
//!
//! Block-quantized formats follow ggml's definitions (`ggml-common.h`): Q4_0, Q4_1, Q5_0,
//! Q5_1, Q8_0 and IQ4_NL hold 32 weights a block, the K-quants (Q2_K … Q6_K, Q8_K) and IQ4_XS
//! 256 (a super-block of 16 or 32-weight sub-blocks with their own scales). Q4_0, Q4_1 and
//! Q8_0 have their block structs in [`crate::blocks`]; the others are decoded by
//! [`crate::ggml_quants`], bitwise as ggml's reference.

use std::fmt;

use crate::ggml_quants::GgmlQuant;

/// How a tensor's elements are stored.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ4_NL,
    IQ4_XS,
}

impl DType {
    /// Every format, plain floats first.
    pub const ALL: [DType; 16] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::Q8_K,
        DType::IQ4_NL,
        DType::IQ4_XS,
    ];

    /// The block-quantized formats decoded by [`crate::ggml_quants`].
    pub const fn ggml_quant(self) -> Option<GgmlQuant> {
        Some(match self {
            DType::Q5_0 => GgmlQuant::Q5_0,
            DType::Q5_1 => GgmlQuant::Q5_1,
            DType::Q2_K => GgmlQuant::Q2_K,
            DType::Q3_K => GgmlQuant::Q3_K,
            DType::Q4_K => GgmlQuant::Q4_K,
            DType::Q5_K => GgmlQuant::Q5_K,
            DType::Q6_K => GgmlQuant::Q6_K,
            DType::Q8_K => GgmlQuant::Q8_K,
            DType::IQ4_NL => GgmlQuant::IQ4_NL,
            DType::IQ4_XS => GgmlQuant::IQ4_XS,
            _ => return None,
        })
    }

    /// Whether blocks are 256-weight super-blocks (the K-quants and IQ4_XS).
    pub const fn is_super_block(self) -> bool {
        self.block_len() == crate::ggml_quants::QK_K
    }

    /// Elements per storage block (1 for plain floats).
    pub const fn block_len(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 => crate::blocks::QK,
            _ => match self.ggml_quant() {
                Some(q) => q.block_len(),
                None => 1,
            },
        }
    }

    /// Bytes per storage block.
    pub const fn block_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q8_0 => std::mem::size_of::<crate::BlockQ8_0>(),
            DType::Q4_0 => std::mem::size_of::<crate::BlockQ4_0>(),
            DType::Q4_1 => std::mem::size_of::<crate::BlockQ4_1>(),
            _ => match self.ggml_quant() {
                Some(q) => q.block_bytes(),
                None => 0,
            },
        }
    }

    /// Bytes a row of `n` elements occupies, or `None` when `n` is not a whole number of blocks.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        if !n.is_multiple_of(self.block_len()) {
            return None;
        }
        (n / self.block_len()).checked_mul(self.block_bytes())
    }

    /// Whether the format is block-quantized.
    pub const fn is_quantized(self) -> bool {
        self.block_len() > 1
    }

    /// The ggml type id of this format (as stored in GGUF tensor infos).
    pub const fn ggml_type(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q4_1 => 3,
            DType::Q8_0 => 8,
            DType::BF16 => 30,
            _ => match self.ggml_quant() {
                Some(q) => q.ggml_type(),
                None => u32::MAX,
            },
        }
    }

    /// The format for a ggml type id, if Tessera supports it.
    pub const fn from_ggml_type(t: u32) -> Option<DType> {
        Some(match t {
            0 => DType::F32,
            1 => DType::F16,
            2 => DType::Q4_0,
            3 => DType::Q4_1,
            8 => DType::Q8_0,
            30 => DType::BF16,
            6 => DType::Q5_0,
            7 => DType::Q5_1,
            10 => DType::Q2_K,
            11 => DType::Q3_K,
            12 => DType::Q4_K,
            13 => DType::Q5_K,
            14 => DType::Q6_K,
            15 => DType::Q8_K,
            20 => DType::IQ4_NL,
            23 => DType::IQ4_XS,
            _ => return None,
        })
    }

    /// Human-readable name of a ggml type id, for error messages about unsupported types.
    pub fn ggml_type_name(t: u32) -> String {
        const NAMES: &[&str] = &[
            "F32",
            "F16",
            "Q4_0",
            "Q4_1",
            "Q4_2",
            "Q4_3",
            "Q5_0",
            "Q5_1",
            "Q8_0",
            "Q8_1",
            "Q2_K",
            "Q3_K",
            "Q4_K",
            "Q5_K",
            "Q6_K",
            "Q8_K",
            "IQ2_XXS",
            "IQ2_XS",
            "IQ3_XXS",
            "IQ1_S",
            "IQ4_NL",
            "IQ3_S",
            "IQ2_S",
            "IQ4_XS",
            "I8",
            "I16",
            "I32",
            "I64",
            "F64",
            "IQ1_M",
            "BF16",
            "Q4_0_4_4",
            "Q4_0_4_8",
            "Q4_0_8_8",
            "TQ1_0",
            "TQ2_0",
            "IQ4_NL_4_4",
            "IQ4_NL_4_8",
            "IQ4_NL_8_8",
            "MXFP4",
        ];
        NAMES
            .get(t as usize)
            .map(|s| s.to_string())
            .unwrap_or_else(|| format!("ggml type {t}"))
    }

    /// Parses a user-facing name such as `q4_1` or `bf16`.
    pub fn parse(s: &str) -> Option<DType> {
        let s = s.to_ascii_uppercase();
        DType::ALL.into_iter().find(|d| d.to_string() == s)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::Q8_0 => "Q8_0",
            DType::Q4_0 => "Q4_0",
            DType::Q4_1 => "Q4_1",
            DType::Q5_0 => "Q5_0",
            DType::Q5_1 => "Q5_1",
            DType::Q2_K => "Q2_K",
            DType::Q3_K => "Q3_K",
            DType::Q4_K => "Q4_K",
            DType::Q5_K => "Q5_K",
            DType::Q6_K => "Q6_K",
            DType::Q8_K => "Q8_K",
            DType::IQ4_NL => "IQ4_NL",
            DType::IQ4_XS => "IQ4_XS",
        };
        f.write_str(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ggml_ids_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_ggml_type(d.ggml_type()), Some(d));
            assert_eq!(DType::parse(&d.to_string()), Some(d));
            assert_eq!(DType::parse(&d.to_string().to_lowercase()), Some(d));
            assert_eq!(DType::ggml_type_name(d.ggml_type()), d.to_string());
        }
        assert_eq!(DType::from_ggml_type(16), None);
        assert_eq!(DType::ggml_type_name(16), "IQ2_XXS");
        assert_eq!(DType::Q4_K.block_len(), 256);
        assert_eq!(DType::Q4_K.block_bytes(), 144);
        assert_eq!(DType::Q6_K.block_bytes(), 210);
        assert_eq!(DType::Q5_0.block_bytes(), 22);
    }

    #[test]
    fn row_bytes_rejects_partial_blocks() {
        assert_eq!(DType::Q4_1.row_bytes(64), Some(40));
        assert_eq!(DType::Q8_0.row_bytes(32), Some(34));
        assert_eq!(DType::Q4_0.row_bytes(33), None);
        assert_eq!(DType::F16.row_bytes(3), Some(6));
    }
}
