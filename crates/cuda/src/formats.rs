//! The weight formats the GPU reads as stored: per [`DType`] its kernels and block
//! geometry, which must agree with the CPU's definition (`tessera_core`) and with the
//! structs of `kernels/dequant.cuh` (checked in the tests).

use tessera_core::{DType, WeightTensor};

use crate::CudaError;

/// One weight format on the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Format {
    pub dtype: DType,
    /// Weights and bytes of one block as the kernels read it (plain floats: 32 weights).
    pub weights: usize,
    pub bytes: usize,
    pub matmul: &'static str,
    pub embed: &'static str,
}

macro_rules! gpu_format {
    ($dt:ident, $w:expr, $b:expr) => {
        Format {
            dtype: DType::$dt,
            weights: $w,
            bytes: $b,
            matmul: concat!("matmul_", stringify!($dt)),
            embed: concat!("embed_", stringify!($dt)),
        }
    };
}

/// Every format with kernels.
pub const FORMATS: [Format; 9] = [
    gpu_format!(F32, 32, 128),
    gpu_format!(F16, 32, 64),
    gpu_format!(BF16, 32, 64),
    gpu_format!(Q8_0, 32, 34),
    gpu_format!(Q4_0, 32, 18),
    gpu_format!(Q4_1, 32, 20),
    gpu_format!(Q4_K, 256, 144),
    gpu_format!(Q5_K, 256, 176),
    gpu_format!(Q6_K, 256, 210),
];

/// The GPU format of `dtype`, if it has kernels.
pub fn format_of(dtype: DType) -> Option<&'static Format> {
    FORMATS.iter().find(|f| f.dtype == dtype)
}

/// Checks `t` is a matrix the kernels read as stored: a supported format, rows of whole
/// 32-weight chunks and whole blocks, its bytes those of its shape.
pub fn check_matrix(t: &WeightTensor) -> Result<&'static Format, CudaError> {
    let f = format_of(t.dtype).ok_or_else(|| CudaError::Unsupported {
        what: format!(
            "tensor {} is stored as {}; the GPU kernels read {}",
            t.name,
            t.dtype,
            FORMATS
                .iter()
                .map(|f| f.dtype.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })?;
    let [rows, cols] = t.shape[..] else {
        return Err(CudaError::Unsupported {
            what: format!("tensor {} has shape {:?}, not a matrix", t.name, t.shape),
        });
    };
    if cols % f.weights != 0 || cols % 32 != 0 {
        return Err(CudaError::Unsupported {
            what: format!(
                "tensor {} has rows of {cols} weights, not whole blocks of {} for the GPU",
                t.name, f.weights
            ),
        });
    }
    let want = rows * (cols / f.weights) * f.bytes;
    if t.data().len() != want {
        return Err(CudaError::Unsupported {
            what: format!(
                "tensor {} holds {} bytes, its shape needs {want}",
                t.name,
                t.data().len()
            ),
        });
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::tensor::TensorBytes;

    #[test]
    fn geometry_agrees_with_the_cpu_definition_and_the_kernel_source() {
        let src = include_str!("../kernels/dequant.cuh");
        for f in FORMATS {
            // The CPU's block, in the kernels' units (plain floats are read 32 at a time).
            let per = f.weights / f.dtype.block_len();
            assert_eq!(f.bytes, per * f.dtype.block_bytes(), "{}", f.dtype);
            let decl = format!(
                "struct {} {{\n    static constexpr int WEIGHTS = {}, BYTES = {};",
                f.matmul.trim_start_matches("matmul_"),
                f.weights,
                f.bytes
            );
            assert!(src.contains(&decl), "dequant.cuh lacks {decl:?}");
        }
        assert!(format_of(DType::IQ4_XS).is_none());
    }

    #[test]
    fn matrices_are_checked_with_clear_errors() {
        let t = |dt: DType, rows: usize, cols: usize| {
            let bytes = vec![0u8; dt.row_bytes(cols).unwrap() * rows];
            WeightTensor::new("w", dt, vec![rows, cols], TensorBytes::owned(&bytes)).unwrap()
        };
        assert_eq!(check_matrix(&t(DType::Q4_K, 3, 512)).unwrap().bytes, 144);
        assert!(check_matrix(&t(DType::Q8_0, 2, 64)).is_ok());
        let e = check_matrix(&t(DType::F32, 2, 40)).unwrap_err().to_string();
        assert!(e.contains("whole blocks"), "{e}");
        let e = check_matrix(&t(DType::IQ4_NL, 2, 64))
            .unwrap_err()
            .to_string();
        assert!(e.contains("iq4_nl") || e.contains("IQ4_NL"), "{e}");
        let v = WeightTensor::from_f32("v", vec![64], &[0.0; 64]);
        assert!(check_matrix(&v)
            .unwrap_err()
            .to_string()
            .contains("not a matrix"));
    }
}
