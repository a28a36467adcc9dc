//! Prefetch hints for the next `nc` block's weights, spread over the current block's tiles.
//! The outer-product tile (`outer`) decodes an `nc` block of strips in a phase of its own
//! before its tiles run; from DRAM (a model's step) that phase waits on memory unless the
//! block was hinted into L2 while the previous block computed. (The macro tile, `packed`,
//! hinted the same way, runs level or up to 7% slower, warm and cold, Zen 4: not used there.)

use std::ops::Range;

use crate::gemm::GemmWeight;

/// The bytes the kernels' weight packs read for weight rows `rows`: the repack's 8-row
/// groups that hold them, or the stored rows (empty when they span two stacked parts).
fn weight_bytes(w: &GemmWeight, rows: Range<usize>) -> &[u8] {
    if rows.is_empty() {
        return &[];
    }
    if let Some(pw) = &w.packed {
        let group = crate::packed::GROUP;
        return pw.group_bytes(rows.start / group..rows.end.div_ceil(group).min(pw.groups));
    }
    w.stored_rows(rows).unwrap_or(&[])
}

/// This CPU's L2 bytes (sysfs, read once; 512 KiB when it does not say).
fn l2_bytes() -> usize {
    static L2: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *L2.get_or_init(|| crate::calibrate::cache_bytes("L2", 512 << 10))
}

/// Prefetch hints over a byte range, spread over `steps` calls of [`Ahead::step`]: each call
/// hints the next share of its 64-byte lines into L2 (hints only: they never fault and
/// change no value; on other architectures, nothing).
pub(super) struct Ahead<'a> {
    bytes: &'a [u8],
    at: usize,
    per_step: usize,
}

impl<'a> Ahead<'a> {
    /// Hints for weight rows `next` (the next `nc` block, empty when there is none) over
    /// `steps` calls; none when they pass an eighth of L2: larger blocks (f32 strips, K =
    /// 11,008 on Q8_0) evict the current block's strips and run 1-8% slower (outer tile,
    /// Zen 4).
    pub(super) fn next_block(w: &'a GemmWeight, next: Range<usize>, steps: usize) -> Self {
        let bytes = weight_bytes(w, next);
        let bytes = if bytes.len() <= l2_bytes() / 8 {
            bytes
        } else {
            &[]
        };
        Self::new(bytes, steps)
    }

    fn new(bytes: &'a [u8], steps: usize) -> Self {
        let lines = bytes.len().div_ceil(64);
        Ahead {
            bytes,
            at: 0,
            per_step: lines.div_ceil(steps.max(1)) * 64,
        }
    }

    pub(super) fn step(&mut self) {
        let end = (self.at + self.per_step).min(self.bytes.len());
        while self.at < end {
            crate::prefetch_l2(self.bytes.as_ptr().wrapping_add(self.at));
            self.at += 64;
        }
        self.at = end;
    }
}
