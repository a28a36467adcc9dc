//! An intrusive doubly linked list over block ids `0..n`: the eviction order of cached blocks.
//!
//! Owns only the links. Every operation is O(1): `push_back` (most recently released),
//! `pop_front` (least recently used, the eviction victim) and `remove` (a cached block hit by a
//! prefix lookup leaves the list). Invariant: a block is in the list at most once; `contains`
//! is exact. Same shape as vLLM v1's `FreeKVCacheBlockQueue`, without the uncached blocks
//! (those live on a plain free stack in [`crate::pool`]).

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
pub(crate) struct LruList {
    prev: Vec<u32>,
    next: Vec<u32>,
    linked: Vec<bool>,
    head: u32,
    tail: u32,
    len: usize,
}

impl LruList {
    pub(crate) fn new(n: usize) -> Self {
        LruList {
            prev: vec![NIL; n],
            next: vec![NIL; n],
            linked: vec![false; n],
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn contains(&self, b: u32) -> bool {
        self.linked[b as usize]
    }

    pub(crate) fn push_back(&mut self, b: u32) {
        debug_assert!(!self.contains(b), "block {b} already in the LRU");
        let i = b as usize;
        self.prev[i] = self.tail;
        self.next[i] = NIL;
        if self.tail == NIL {
            self.head = b;
        } else {
            self.next[self.tail as usize] = b;
        }
        self.tail = b;
        self.linked[i] = true;
        self.len += 1;
    }

    pub(crate) fn pop_front(&mut self) -> Option<u32> {
        if self.head == NIL {
            return None;
        }
        let b = self.head;
        self.remove(b);
        Some(b)
    }

    /// Unlinks `b`; returns whether it was linked.
    pub(crate) fn remove(&mut self, b: u32) -> bool {
        let i = b as usize;
        if !self.linked[i] {
            return false;
        }
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[i] = NIL;
        self.next[i] = NIL;
        self.linked[i] = false;
        self.len -= 1;
        true
    }

    /// Blocks from least to most recently used (for checks and tests; O(len)).
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let mut cur = self.head;
        std::iter::from_fn(move || {
            if cur == NIL {
                return None;
            }
            let b = cur;
            cur = self.next[b as usize];
            Some(b)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_and_removal() {
        let mut l = LruList::new(5);
        for b in [3, 1, 4] {
            l.push_back(b);
        }
        assert_eq!(l.iter().collect::<Vec<_>>(), [3, 1, 4]);
        assert!(l.remove(1));
        assert!(!l.remove(1));
        assert_eq!(l.iter().collect::<Vec<_>>(), [3, 4]);
        assert_eq!(l.pop_front(), Some(3));
        assert_eq!(l.pop_front(), Some(4));
        assert_eq!(l.pop_front(), None);
        assert_eq!(l.len(), 0);
        l.push_back(0);
        assert!(l.remove(0));
        assert_eq!(l.iter().count(), 0);
    }

    proptest::proptest! {
        #[test]
        fn matches_a_vec_model(ops in proptest::collection::vec((0u8..3, 0u32..8), 0..64)) {
            let mut l = LruList::new(8);
            let mut model: Vec<u32> = Vec::new();
            for (op, b) in ops {
                match op {
                    0 if !model.contains(&b) => { l.push_back(b); model.push(b); }
                    1 => {
                        let got = l.pop_front();
                        let want = if model.is_empty() { None } else { Some(model.remove(0)) };
                        proptest::prop_assert_eq!(got, want);
                    }
                    2 => {
                        let was = model.iter().position(|&x| x == b).map(|i| model.remove(i));
                        proptest::prop_assert_eq!(l.remove(b), was.is_some());
                    }
                    _ => {}
                }
                proptest::prop_assert_eq!(l.iter().collect::<Vec<_>>(), model.clone());
                proptest::prop_assert_eq!(l.len(), model.len());
            }
        }
    }
}
