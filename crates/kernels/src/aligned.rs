//! Buffers whose first value sits on a 64-byte boundary (a cache line, and one AVX-512
//! vector). A `Vec` of more than a few hundred KiB comes from `mmap` through the system
//! allocator and starts 16 bytes past a page, so every 64-byte load from it straddles two
//! cache lines, and half the 32-byte ones. The outer-product tile's weight and sum vectors
//! (`exact::outer`) lost about a tenth of their rate to those split loads; the stream
//! kernels' records (`packed::PackedWeight`) are read 32 bytes at a time.

use std::fmt;
use std::ops::{Deref, DerefMut};

/// One cache line: the unit of allocation, aligned to 64 and zero when made.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; LINE]);

/// Bytes per [`Line`].
const LINE: usize = 64;

/// Value types an [`Aligned`] buffer may hold.
///
/// # Safety
/// Every bit pattern (all zeros included) is a valid value, the type has no padding, drop
/// glue or interior mutability, and its alignment divides 64.
pub unsafe trait Plain: Copy + 'static {}
// SAFETY: plain numbers: any bits are a value, no padding, alignment 1 or 4.
unsafe impl Plain for u8 {}
// SAFETY: as above.
unsafe impl Plain for f32 {}

/// A growable buffer of `T` starting on a 64-byte boundary; derefs to its `len` values.
/// Byte offsets that are multiples of 64 are 64-byte aligned too.
#[derive(Clone)]
pub struct Aligned<T: Plain> {
    lines: Vec<Line>,
    len: usize,
    _values: std::marker::PhantomData<T>,
}

/// Kernel scratch of f32 values.
pub type AlignedF32 = Aligned<f32>;

impl<T: Plain> Aligned<T> {
    /// An empty buffer (no allocation).
    pub const fn new() -> Self {
        Self {
            lines: Vec::new(),
            len: 0,
            _values: std::marker::PhantomData,
        }
    }

    /// `len` zero values.
    pub fn zeroed(len: usize) -> Self {
        let mut b = Self::new();
        b.grow(len);
        b
    }

    /// Makes the buffer at least `len` values long; new values are zero, old ones kept.
    pub fn grow(&mut self, len: usize) {
        if len > self.len {
            let bytes = len
                .checked_mul(std::mem::size_of::<T>())
                .expect("buffer size overflows");
            self.lines.resize(bytes.div_ceil(LINE), Line([0; LINE]));
            self.len = len;
        }
    }
}

impl<T: Plain> Default for Aligned<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Plain> fmt::Debug for Aligned<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Aligned({} values)", self.len)
    }
}

impl<T: Plain> Deref for Aligned<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `Line` is `repr(C)` over 64 initialized bytes with no padding, so `lines`
        // is `64 · lines.len()` contiguous initialized bytes, 64-aligned; `len` values of `T`
        // fit in them (`grow`), any bytes are a valid `T` and its alignment divides 64
        // (`Plain`). An empty Vec's dangling pointer is 64-aligned and non-null, valid for
        // a zero-length slice.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<T>(), self.len) }
    }
}

impl<T: Plain> DerefMut for Aligned<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as `deref`, through the unique borrow of `lines`.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<T>(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_aligned_and_keeps_values() {
        let mut b = AlignedF32::new();
        assert!(b.is_empty());
        for len in [1, 15, 16, 17, 1000, 4099] {
            let before = b.len();
            if before > 0 {
                b[before - 1] = before as f32;
            }
            b.grow(len);
            assert_eq!(b.len(), len.max(before));
            assert_eq!(b.as_ptr() as usize % 64, 0);
            if before > 0 {
                assert_eq!(b[before - 1], before as f32);
            }
            assert!(b[before..].iter().all(|&v| v == 0.0));
        }
        b.grow(3);
        assert_eq!(b.len(), 4099);
        let bytes = Aligned::<u8>::zeroed(100_001);
        assert_eq!((bytes.len(), bytes.as_ptr() as usize % 64), (100_001, 0));
        assert!(bytes.iter().all(|&v| v == 0));
        assert_eq!(bytes.clone().as_ptr() as usize % 64, 0);
    }
}
