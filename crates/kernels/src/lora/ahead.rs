//! Software prefetch running a fixed distance ahead of a unit's factor reads.
//!
//! A decode step's LoRA work reads each adapter's A and Bᵀ once, a few KB to tens of KB per
//! task, each task's factors in another allocation. The hardware prefetchers barely ramp up
//! on runs that short, so without help each unit waits on memory with few lines in flight.
//! [`Ahead`] knows the unit's whole read sequence up front (its items' A then Bᵀ, in order)
//! and keeps the prefetches `LEAD` bytes ahead of the kernels' reads: the kernels report what
//! they consume, a line at a time, and each line consumed issues one prefetch `LEAD` bytes on,
//! so the memory system always has work in flight while the units compute.
//!
//! A hint only: prefetches read nothing architecturally and never fault, so no result
//! depends on this module.

/// How far ahead of the reads the prefetches run, in bytes: a few tasks' factors, well within
/// a core's L2 (prefetches go to L2) and far beyond the memory latency's worth of bandwidth.
const LEAD: usize = 48 << 10;
const LINE: usize = 64;

/// The byte runs a unit will read, in order, and a cursor `LEAD` bytes ahead of its reads.
pub(crate) struct Ahead {
    spans: Vec<(usize, usize)>,
    span: usize,
    off: usize,
    credit: usize,
}

impl Ahead {
    /// A cursor over `spans` (start address, bytes), prefetching the first `LEAD` bytes now.
    pub(crate) fn new(spans: impl IntoIterator<Item = (*const u8, usize)>) -> Ahead {
        let spans = spans
            .into_iter()
            .filter(|&(_, n)| n > 0)
            .map(|(p, n)| {
                // Whole lines: from the line holding the first byte to the one holding the last.
                let start = p as usize & !(LINE - 1);
                (start, p as usize + n - start)
            })
            .collect();
        let mut a = Ahead {
            spans,
            span: 0,
            off: 0,
            credit: 0,
        };
        for _ in 0..LEAD / LINE {
            a.next_line();
        }
        a
    }

    /// A cursor with nothing to prefetch.
    pub(crate) fn none() -> Ahead {
        Ahead {
            spans: Vec::new(),
            span: 0,
            off: 0,
            credit: 0,
        }
    }

    /// Reports `bytes` of factors read; issues one prefetch per line's worth.
    #[inline(always)]
    pub(crate) fn consume(&mut self, bytes: usize) {
        self.credit += bytes;
        while self.credit >= LINE {
            self.credit -= LINE;
            self.next_line();
        }
    }

    #[inline(always)]
    fn next_line(&mut self) {
        if let Some(addr) = self.advance() {
            crate::prefetch_l2(addr as *const u8);
        }
    }

    /// The next line's address, if any is left, moving the cursor past it.
    #[inline(always)]
    fn advance(&mut self) -> Option<usize> {
        let &(start, len) = self.spans.get(self.span)?;
        let addr = start + self.off;
        self.off += LINE;
        if self.off >= len {
            self.span += 1;
            self.off = 0;
        }
        Some(addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cursor walks every line of every span once, in order, from the line holding each
    /// span's first byte to the one holding its last, skipping empty spans, then stops.
    #[test]
    fn cursor_visits_each_line_once_in_order() {
        let buf = vec![0u8; 4096];
        let base = buf.as_ptr() as usize;
        let at = |off: usize| (base + off) as *const u8;
        let spans = [
            (at(10), 1),
            (at(100), 0),
            (at(130), 200),
            (at(1024), 64),
            (at(2000), 129),
        ];
        let mut want = Vec::new();
        for &(p, n) in spans.iter().filter(|s| s.1 > 0) {
            let first = p as usize & !(LINE - 1);
            let last = (p as usize + n - 1) & !(LINE - 1);
            want.extend((first..=last).step_by(LINE));
        }
        // A cursor built without its lead, to read its addresses one by one.
        let mut a = Ahead::none();
        a.spans = Ahead::new(spans).spans;
        let got: Vec<usize> = std::iter::from_fn(|| a.advance()).collect();
        assert_eq!(got, want);
        assert_eq!(a.advance(), None);
    }

    /// `consume` issues one line per 64 bytes reported, carrying the remainder.
    #[test]
    fn consume_advances_a_line_per_64_bytes() {
        let buf = vec![0u8; 1 << 20];
        let mut a = Ahead::none();
        a.spans = vec![(buf.as_ptr() as usize & !(LINE - 1), 1 << 19)];
        a.consume(63);
        assert_eq!((a.span, a.off), (0, 0));
        a.consume(1);
        assert_eq!(a.off, LINE);
        a.consume(64 * 5 + 10);
        assert_eq!((a.off, a.credit), (6 * LINE, 10));
    }
}
