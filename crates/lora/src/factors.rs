//! The values of a LoRA factor in the element type the adapter file stores: f32, or f16 and
//! bf16 at 2 bytes a value (what PEFT training usually saves). The kernels convert halves
//! to f32 in registers, exactly, and accumulate in f32, so a module held in halves gives
//! bitwise the delta of the same values held as f32, at half the bytes read per step.
//!
//! Every rearrangement here (slices, transposes, row permutations) moves values without
//! converting them, so it is exact for every element type.

use std::ops::Range;

use half::{bf16, f16};
use tessera_core::DType;

/// One factor's values, row-major, in the file's element type.
#[derive(Debug, Clone, PartialEq)]
pub enum Factors {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
}

/// `$e` (an expression of the values `$v`, a `Vec` of the same element type) in the
/// variant of `$f`.
macro_rules! same_type {
    ($f:expr, $v:ident => $e:expr) => {
        match $f {
            Factors::F32($v) => Factors::F32($e),
            Factors::F16($v) => Factors::F16($e),
            Factors::BF16($v) => Factors::BF16($e),
        }
    };
}

/// `$e` of the values `$v`, whatever their element type.
macro_rules! any_type {
    ($f:expr, $v:ident => $e:expr) => {
        match $f {
            Factors::F32($v) => $e,
            Factors::F16($v) => $e,
            Factors::BF16($v) => $e,
        }
    };
}

impl Factors {
    pub fn len(&self) -> usize {
        any_type!(self, v => v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type: `F32`, `F16` or `BF16`.
    pub fn dtype(&self) -> DType {
        match self {
            Factors::F32(_) => DType::F32,
            Factors::F16(_) => DType::F16,
            Factors::BF16(_) => DType::BF16,
        }
    }

    /// Bytes of one value (4 or 2).
    pub fn elem_bytes(&self) -> usize {
        match self {
            Factors::F32(_) => 4,
            Factors::F16(_) | Factors::BF16(_) => 2,
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.len() * self.elem_bytes()
    }

    /// Value `i` as f32 (exact).
    pub fn get(&self, i: usize) -> f32 {
        any_type!(self, v => widen(v[i]))
    }

    /// The values as f32 (exact).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        any_type!(self, v => v.iter().map(|&x| widen(x)).collect())
    }

    /// Whether every value is finite.
    pub fn all_finite(&self) -> bool {
        any_type!(self, v => v.iter().all(|&x| widen(x).is_finite()))
    }

    /// `values` rounded to nearest in `dtype` (`F32`, `F16` or `BF16`; `None` for another).
    pub fn from_f32(values: &[f32], dtype: DType) -> Option<Factors> {
        Some(match dtype {
            DType::F32 => Factors::F32(values.to_vec()),
            DType::F16 => Factors::F16(values.iter().map(|&x| f16::from_f32(x)).collect()),
            DType::BF16 => Factors::BF16(values.iter().map(|&x| bf16::from_f32(x)).collect()),
            _ => return None,
        })
    }

    /// The values of little-endian `bytes` of `dtype` (`F32`, `F16` or `BF16`; `None` for
    /// another, or a length that is not a whole number of values).
    pub fn from_le_bytes(bytes: &[u8], dtype: DType) -> Option<Factors> {
        let size = match dtype {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            _ => return None,
        };
        if !bytes.len().is_multiple_of(size) {
            return None;
        }
        let u16s = || {
            bytes
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
        };
        Some(match dtype {
            DType::F32 => Factors::F32(
                bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
            DType::F16 => Factors::F16(u16s().map(f16::from_bits).collect()),
            _ => Factors::BF16(u16s().map(bf16::from_bits).collect()),
        })
    }

    /// The values as little-endian bytes of their element type, as files store them.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        match self {
            Factors::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Factors::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Factors::BF16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }

    /// Values `r`.
    pub fn slice(&self, r: Range<usize>) -> Factors {
        same_type!(self, v => v[r].to_vec())
    }

    /// Of each row of `width` values, columns `r`.
    pub fn cols(&self, width: usize, r: Range<usize>) -> Factors {
        same_type!(self, v => take_cols(v, width, r))
    }

    /// The `rows × cols` matrix transposed.
    pub fn transposed(&self, rows: usize, cols: usize) -> Factors {
        same_type!(self, v => crate::transpose(v, rows, cols))
    }

    /// Rows of `cols` values rearranged by [`crate::permute_rows`] for `heads` heads.
    pub fn rows_permuted(&self, heads: usize, cols: usize) -> Factors {
        same_type!(self, v => crate::permute_rows(v, heads, cols))
    }
}

impl From<Vec<f32>> for Factors {
    fn from(v: Vec<f32>) -> Factors {
        Factors::F32(v)
    }
}

/// A value as f32 (exact for every element type held).
fn widen<T: Into<f32>>(x: T) -> f32 {
    x.into()
}

fn take_cols<T: Copy>(v: &[T], width: usize, r: Range<usize>) -> Vec<T> {
    v.chunks(width.max(1))
        .flat_map(|row| &row[r.clone()])
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn each(values: &[f32]) -> [Factors; 3] {
        [DType::F32, DType::F16, DType::BF16].map(|d| Factors::from_f32(values, d).unwrap())
    }

    #[test]
    fn bytes_roundtrip_and_sizes() {
        let v: Vec<f32> = (0..12).map(|i| i as f32 * 0.37 - 2.0).collect();
        for f in each(&v) {
            let b = f.to_le_bytes();
            assert_eq!(b.len(), f.bytes());
            assert_eq!(f.bytes(), f.len() * f.elem_bytes());
            assert_eq!(Factors::from_le_bytes(&b, f.dtype()).unwrap(), f);
            // Halves -> f32 -> the same half: exact.
            assert_eq!(Factors::from_f32(&f.to_f32_vec(), f.dtype()).unwrap(), f);
            assert_eq!(f.get(5), f.to_f32_vec()[5]);
        }
        assert!(Factors::from_le_bytes(&[0; 3], DType::F16).is_none());
        assert!(Factors::from_le_bytes(&[0; 4], DType::Q8_0).is_none());
        assert_eq!(each(&v)[1].bytes(), 24);
    }

    /// Slices, transposes and permutations move values: the same in every element type as
    /// on the f32 values.
    #[test]
    fn rearrangements_commute_with_conversion() {
        let v: Vec<f32> = (0..24).map(|i| (i as f32 - 7.5) / 3.0).collect();
        for f in each(&v) {
            let x = f.to_f32_vec();
            let back = |w: Vec<f32>| Factors::from_f32(&w, f.dtype()).unwrap();
            assert_eq!(f.slice(3..9), back(x[3..9].to_vec()));
            assert_eq!(f.cols(6, 1..4), back(take_cols(&x, 6, 1..4)));
            assert_eq!(f.transposed(4, 6), back(crate::transpose(&x, 4, 6)));
            assert_eq!(f.rows_permuted(2, 3), back(crate::permute_rows(&x, 2, 3)));
            assert_eq!(f.transposed(4, 6).transposed(6, 4), f);
        }
    }

    #[test]
    fn non_finite_values_are_seen_in_every_type() {
        for f in each(&[1.0, f32::INFINITY]) {
            assert!(!f.all_finite(), "{:?}", f.dtype());
        }
        // f16 overflows to infinity on rounding.
        assert!(!Factors::from_f32(&[1e6], DType::F16).unwrap().all_finite());
        assert!(Factors::from_f32(&[1e6], DType::BF16).unwrap().all_finite());
    }
}
