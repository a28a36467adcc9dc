//! The compute units Tessera runs on. Today: CPU cores, as a persistent [`ThreadPool`].
//!
//! A parallel operation hands every unit the same closure with its unit index; the work is
//! partitioned statically by the caller (contiguous ranges, see [`split_range`]), so a given
//! (operation, unit count) always assigns the same items to the same unit. That, not luck,
//! is what keeps results reproducible.

mod pool;

pub use pool::{allowed_cpus, pin_current_thread, ThreadPool};

/// The `unit`-th of `units` contiguous, near-equal parts of `0..n` (the first `n % units`
/// parts are one longer).
pub fn split_range(n: usize, units: usize, unit: usize) -> std::ops::Range<usize> {
    let units = units.max(1);
    let base = n / units;
    let extra = n % units;
    let start = unit * base + unit.min(extra);
    let len = base + usize::from(unit < extra);
    start.min(n)..(start + len).min(n)
}

/// Like [`split_range`], but every boundary is a multiple of `align` (except the end).
pub fn split_range_aligned(
    n: usize,
    units: usize,
    unit: usize,
    align: usize,
) -> std::ops::Range<usize> {
    let align = align.max(1);
    let blocks = n.div_ceil(align);
    let r = split_range(blocks, units, unit);
    (r.start * align).min(n)..(r.end * align).min(n)
}

/// A mutable buffer shared by the units of one parallel operation, each unit touching only
/// its own disjoint elements (rows, columns, blocks). It replaces a raw pointer per call
/// site; the bounds are checked, the disjointness is the caller's promise.
pub struct DisjointMut<'a, T> {
    ptr: *mut T,
    len: usize,
    _buf: std::marker::PhantomData<&'a mut [T]>,
}

impl<T> Clone for DisjointMut<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DisjointMut<'_, T> {}
// SAFETY: units only touch disjoint elements (the `slice`/`write` contract), so sharing the
// pointer across threads is as safe as splitting the slice would be.
unsafe impl<T: Send> Send for DisjointMut<'_, T> {}
unsafe impl<T: Send> Sync for DisjointMut<'_, T> {}

impl<'a, T> DisjointMut<'a, T> {
    pub fn new(buf: &'a mut [T]) -> Self {
        DisjointMut {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
            _buf: std::marker::PhantomData,
        }
    }

    /// Elements `start..start + len`.
    ///
    /// # Safety
    /// No other unit reads or writes these elements while the returned slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, start: usize, len: usize) -> &'a mut [T] {
        assert!(
            start.checked_add(len).is_some_and(|e| e <= self.len),
            "DisjointMut: {start}+{len} out of {}",
            self.len
        );
        std::slice::from_raw_parts_mut(self.ptr.add(start), len)
    }

    /// Writes element `i`.
    ///
    /// # Safety
    /// No other unit touches element `i` during the operation.
    pub unsafe fn write(&self, i: usize, v: T) {
        assert!(i < self.len, "DisjointMut: {i} out of {}", self.len);
        self.ptr.add(i).write(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn split_covers_exactly_once(n in 0usize..1000, units in 1usize..17, align in 1usize..9) {
            let mut next = 0;
            for u in 0..units {
                let r = split_range_aligned(n, units, u, align);
                prop_assert_eq!(r.start, next);
                next = r.end;
            }
            prop_assert_eq!(next, n);
        }
    }
}
