//! Weight tensors kept in their stored format.
//!
//! A [`WeightTensor`] is a name, a [`DType`], a row-major shape (outermost first, so a linear
//! layer's weight is `[out_features, in_features]`, each output row contiguous) and the bytes,
//! usually a window into a memory-mapped file. Nothing is dequantized at load: a Q4_1 model's
//! resident memory stays near its file size.

use std::sync::Arc;

use memmap2::Mmap;

use crate::{DType, Error, Result};

/// Where a tensor's bytes live.
#[derive(Clone)]
pub enum TensorBytes {
    /// A window into a memory-mapped file.
    Mapped {
        map: Arc<Mmap>,
        offset: usize,
        len: usize,
    },
    /// Bytes owned by the tensor, 8-byte aligned (stored as `u64` words).
    Owned { words: Arc<Vec<u64>>, len: usize },
}

impl TensorBytes {
    /// Copies `bytes` into an owned, 8-byte-aligned buffer.
    pub fn owned(bytes: &[u8]) -> Self {
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        // SAFETY: `words` has at least `bytes.len()` bytes; u64 has no invalid bit patterns.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                words.as_mut_ptr() as *mut u8,
                bytes.len(),
            )
        };
        TensorBytes::Owned {
            words: Arc::new(words),
            len: bytes.len(),
        }
    }

    pub fn from_f32(values: &[f32]) -> Self {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Self::owned(&bytes)
    }

    pub fn as_slice(&self) -> &[u8] {
        match self {
            TensorBytes::Mapped { map, offset, len } => &map[*offset..*offset + *len],
            TensorBytes::Owned { words, len } => {
                // SAFETY: the buffer holds at least `len` initialised bytes.
                unsafe { std::slice::from_raw_parts(words.as_ptr() as *const u8, *len) }
            }
        }
    }
}

impl TensorBytes {
    /// Tells the OS the mapped pages are not needed now (a repacked copy replaced them), so
    /// they leave the resident set; touching them again reads them back from the file.
    /// Only whole pages inside the window are released. Owned bytes are left alone.
    pub fn release_pages(&self) {
        #[cfg(unix)]
        if let TensorBytes::Mapped { map, offset, len } = self {
            const PAGE: usize = 4096;
            let start = offset.div_ceil(PAGE) * PAGE;
            let end = (offset + len) / PAGE * PAGE;
            if end > start {
                // SAFETY: the map is a read-only file mapping; MADV_DONTNEED on it only drops
                // clean page-cache-backed pages, which are re-read from the file on access,
                // so no data any reader can see changes.
                let _ = unsafe {
                    map.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        start,
                        end - start,
                    )
                };
            }
        }
    }
}

impl std::fmt::Debug for TensorBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TensorBytes::Mapped { offset, len, .. } => {
                write!(f, "Mapped {{ offset: {offset}, len: {len} }}")
            }
            TensorBytes::Owned { len, .. } => write!(f, "Owned {{ len: {len} }}"),
        }
    }
}

/// A named tensor in its stored format.
#[derive(Clone, Debug)]
pub struct WeightTensor {
    pub name: String,
    pub dtype: DType,
    /// Row-major, outermost first.
    pub shape: Vec<usize>,
    pub bytes: TensorBytes,
}

impl WeightTensor {
    /// Builds a tensor, checking that the byte length matches shape and dtype.
    pub fn new(
        name: impl Into<String>,
        dtype: DType,
        shape: Vec<usize>,
        bytes: TensorBytes,
    ) -> Result<Self> {
        let name = name.into();
        let inner = *shape.last().unwrap_or(&1);
        let rows: usize = shape
            .iter()
            .rev()
            .skip(1)
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| {
                Error::malformed(
                    "tensor",
                    format!("tensor {name}: shape {shape:?} overflows"),
                )
            })?;
        let row_bytes = dtype.row_bytes(inner).ok_or_else(|| {
            Error::malformed(
                "tensor",
                format!("tensor {name}: row length {inner} is not a multiple of the {dtype} block size {}", dtype.block_len()),
            )
        })?;
        let want = rows.checked_mul(row_bytes).ok_or_else(|| {
            Error::malformed(
                "tensor",
                format!("tensor {name}: shape {shape:?} overflows"),
            )
        })?;
        let got = bytes.as_slice().len();
        if got != want {
            return Err(Error::malformed(
                "tensor",
                format!("tensor {name}: {got} bytes, but {dtype} {shape:?} needs {want}"),
            ));
        }
        Ok(WeightTensor {
            name,
            dtype,
            shape,
            bytes,
        })
    }

    pub fn from_f32(name: impl Into<String>, shape: Vec<usize>, values: &[f32]) -> Self {
        let t = Self::new(name, DType::F32, shape, TensorBytes::from_f32(values));
        t.expect("from_f32: shape must match the number of values")
    }

    /// Rows `rows` of a 2-D tensor (a window into the same bytes).
    pub fn slice_rows(&self, rows: std::ops::Range<usize>) -> Result<Self> {
        if self.shape.len() != 2 || rows.end > self.rows() || rows.start > rows.end {
            return Err(Error::Other(format!(
                "tensor {}: cannot take rows {rows:?} of shape {:?}",
                self.name, self.shape
            )));
        }
        let rb = self.row_bytes();
        let bytes = match &self.bytes {
            TensorBytes::Mapped { map, offset, .. } => TensorBytes::Mapped {
                map: map.clone(),
                offset: offset + rows.start * rb,
                len: rows.len() * rb,
            },
            TensorBytes::Owned { .. } => {
                TensorBytes::owned(&self.data()[rows.start * rb..rows.end * rb])
            }
        };
        Self::new(
            self.name.clone(),
            self.dtype,
            vec![rows.len(), self.cols()],
            bytes,
        )
    }

    /// Columns `cols` of a 2-D tensor, copied; block-quantized tensors split on block
    /// boundaries only.
    pub fn slice_cols(&self, cols: std::ops::Range<usize>) -> Result<Self> {
        let bl = self.dtype.block_len();
        if self.shape.len() != 2
            || cols.end > self.cols()
            || cols.start > cols.end
            || !cols.start.is_multiple_of(bl)
            || !cols.end.is_multiple_of(bl)
        {
            return Err(Error::Other(format!(
                "tensor {}: cannot take columns {cols:?} of shape {:?} ({} blocks of {bl})",
                self.name, self.shape, self.dtype
            )));
        }
        let per_block = self.row_bytes() / (self.cols() / bl).max(1);
        let (b0, b1) = (cols.start / bl * per_block, cols.end / bl * per_block);
        let mut out = Vec::with_capacity(self.rows() * (b1 - b0));
        for r in 0..self.rows() {
            out.extend_from_slice(&self.row(r)[b0..b1]);
        }
        Self::new(
            self.name.clone(),
            self.dtype,
            vec![self.rows(), cols.len()],
            TensorBytes::owned(&out),
        )
    }

    /// Number of rows: the product of all but the innermost dimension.
    pub fn rows(&self) -> usize {
        self.shape.iter().rev().skip(1).product()
    }

    /// The innermost dimension (elements per row).
    pub fn cols(&self) -> usize {
        *self.shape.last().unwrap_or(&1)
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn data(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    pub fn row_bytes(&self) -> usize {
        self.dtype
            .row_bytes(self.cols())
            .expect("checked at construction")
    }

    /// The stored bytes of row `r`.
    pub fn row(&self, r: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.data()[r * rb..(r + 1) * rb]
    }

    /// Dequantizes row `r` into `out` (`out.len() == cols`).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        dequantize_row(self.dtype, self.row(r), out)
    }

    /// The whole tensor as f32 (for small tensors: norms, biases).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.numel()];
        let c = self.cols();
        for (r, chunk) in out.chunks_mut(c.max(1)).enumerate() {
            self.dequantize_row(r, chunk);
        }
        out
    }
}

/// Reference conversion of one stored row to f32.
pub fn dequantize_row(dtype: DType, row: &[u8], out: &mut [f32]) {
    use crate::blocks::*;
    match dtype {
        DType::F32 => {
            for (o, c) in out.iter_mut().zip(row.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DType::F16 => {
            for (o, c) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = f16_bits_to_f32([c[0], c[1]]);
            }
        }
        DType::BF16 => {
            for (o, c) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
            }
        }
        DType::Q8_0 => {
            for (b, o) in as_blocks::<BlockQ8_0>(row)
                .unwrap()
                .iter()
                .zip(out.chunks_mut(QK))
            {
                b.dequantize(o)
            }
        }
        DType::Q4_0 => {
            for (b, o) in as_blocks::<BlockQ4_0>(row)
                .unwrap()
                .iter()
                .zip(out.chunks_mut(QK))
            {
                b.dequantize(o)
            }
        }
        DType::Q4_1 => {
            for (b, o) in as_blocks::<BlockQ4_1>(row)
                .unwrap()
                .iter()
                .zip(out.chunks_mut(QK))
            {
                b.dequantize(o)
            }
        }
        _ => {
            let q = dtype
                .ggml_quant()
                .expect("every other format is a ggml quant");
            crate::ggml_quants::dequantize_row(q, row, out)
                .expect("a stored row holds whole blocks (checked at load)")
        }
    }
}

/// Reference conversion of f32 values to a stored row (used by tests and tools).
pub fn quantize_row(dtype: DType, x: &[f32]) -> Vec<u8> {
    use crate::blocks::*;
    match dtype {
        DType::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::F16 => x.iter().flat_map(|&v| f32_to_f16_bits(v)).collect(),
        DType::BF16 => x
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes())
            .collect(),
        DType::Q8_0 => {
            let b: Vec<BlockQ8_0> = x.chunks(QK).map(BlockQ8_0::quantize).collect();
            blocks_as_bytes(&b).to_vec()
        }
        DType::Q4_0 => {
            let b: Vec<BlockQ4_0> = x.chunks(QK).map(BlockQ4_0::quantize).collect();
            blocks_as_bytes(&b).to_vec()
        }
        DType::Q4_1 => {
            let b: Vec<BlockQ4_1> = x.chunks(QK).map(BlockQ4_1::quantize).collect();
            blocks_as_bytes(&b).to_vec()
        }
        _ => {
            let q = dtype
                .ggml_quant()
                .expect("every other format is a ggml quant");
            crate::ggml_quants::quantize_row(q, x).expect("a whole number of blocks")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_checks_byte_length() {
        let e = WeightTensor::new(
            "w",
            DType::Q4_1,
            vec![2, 64],
            TensorBytes::owned(&[0u8; 79]),
        );
        assert!(e.unwrap_err().to_string().contains("needs 80"));
        let e = WeightTensor::new(
            "w",
            DType::Q4_1,
            vec![2, 33],
            TensorBytes::owned(&[0u8; 80]),
        );
        assert!(e.unwrap_err().to_string().contains("block size"));
        let t = WeightTensor::new(
            "w",
            DType::Q4_1,
            vec![2, 64],
            TensorBytes::owned(&[0u8; 80]),
        )
        .unwrap();
        assert_eq!((t.rows(), t.cols(), t.row(1).len()), (2, 64, 40));
    }

    #[test]
    fn quantize_then_dequantize_rows() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
        for d in [
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::Q8_0,
            DType::Q4_0,
            DType::Q4_1,
        ] {
            let bytes = quantize_row(d, &x);
            let t = WeightTensor::new("w", d, vec![1, 64], TensorBytes::owned(&bytes)).unwrap();
            let y = t.to_f32_vec();
            let err = x
                .iter()
                .zip(&y)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(err <= 0.13, "{d}: {err}");
        }
    }
}
