//! The window group of a [`KvManager`]: the blocks of the layers that attend only the last
//! `window` positions (Gemma's local layers, Mistral's), in a pool of their own.
//!
//! A sequence's window table runs parallel to its block table (index `i` covers positions
//! `[i·bs, (i + 1)·bs)`), but it holds a block only while a position the sequence will
//! still compute attends it: [`KvManager::slide`] releases the blocks wholly before
//! `start + 1 - window` as the sequence moves on. Released blocks that were committed stay
//! in the pool's cache, under the same hashes as the full group's blocks, until evicted, so
//! the prefix cache keeps working: a hit of `k` tokens needs the window group's blocks of
//! `[k + 1 - window, k)` only (the next position attends no earlier key), and a hit is cut
//! back to the longest prefix whose window blocks are all still cached. Per sequence the
//! group holds at most `⌈(window - 1 + chunk) / bs⌉ + 1` blocks, whatever the context.

use crate::hash::BlockHash;
use crate::manager::{KvManager, SeqId, Win, DROPPED};
use crate::pool::BlockPool;
use crate::KvError;

impl KvManager {
    /// A manager whose window group (layers attending the last `window` positions) keeps
    /// `window_blocks` blocks of its own; see the module docs.
    pub fn with_window(
        num_blocks: usize,
        block_size: usize,
        prefix_caching: bool,
        window: usize,
        window_blocks: usize,
    ) -> Result<Self, KvError> {
        if window == 0 {
            return Err(KvError::Invariant("a window of 0 positions".into()));
        }
        let mut m = KvManager::new(num_blocks, block_size, prefix_caching)?;
        m.win = Some(Win {
            pool: BlockPool::new(window_blocks, block_size)?,
            window,
        });
        Ok(m)
    }

    /// The window group's pool, if there is one.
    pub fn window_pool(&self) -> Option<&BlockPool> {
        self.win.as_ref().map(|w| &w.pool)
    }

    /// `seq`'s window table ([`DROPPED`] where it holds no block), with a window group.
    pub fn window_table(&self, seq: SeqId) -> Option<&[u32]> {
        self.win.as_ref()?;
        self.seqs.get(&seq).map(|t| t.wblocks.as_slice())
    }

    /// The first block index a sequence computing from position `start` still attends.
    fn first_needed(&self, start: usize) -> usize {
        let w = self.win.as_ref().map_or(usize::MAX, |w| w.window);
        (start + 1).saturating_sub(w) / self.block_size()
    }

    /// Releases `seq`'s window blocks that no position from `start` on attends.
    pub fn slide(&mut self, seq: SeqId, start: usize) -> Result<(), KvError> {
        let first = self.first_needed(start);
        let Some(w) = &mut self.win else {
            return Ok(());
        };
        let table = self.seqs.get_mut(&seq).ok_or(KvError::UnknownSeq { seq })?;
        for b in table.wblocks.iter_mut().take(first) {
            if *b != DROPPED {
                w.pool.release(*b)?;
                *b = DROPPED;
            }
        }
        Ok(())
    }

    /// Of the full group's prefix hits, how many the window group can serve, and its cached
    /// blocks for them (indices `first_needed(h·bs)..h`).
    pub(crate) fn window_hits(
        &self,
        namespace: Option<u64>,
        tokens: &[u32],
        hits: &[(u32, BlockHash)],
    ) -> (usize, Vec<u32>) {
        let Some(w) = &self.win else {
            return (hits.len(), Vec::new());
        };
        let bs = self.block_size();
        let found = |i: usize| -> Option<u32> {
            let parent = i.checked_sub(1).map(|p| hits[p].1);
            w.pool
                .lookup(hits[i].1, namespace, parent, &tokens[i * bs..(i + 1) * bs])
        };
        for h in (0..=hits.len()).rev() {
            let got: Option<Vec<u32>> = (self.first_needed(h * bs)..h).map(found).collect();
            if let Some(blocks) = got {
                return (h, blocks);
            }
        }
        (0, Vec::new())
    }

    /// Fails with `OutOfBlocks` unless the window group can hold `hits` and take `new`
    /// blocks besides.
    pub(crate) fn check_window_room(&self, hits: &[u32], new: usize) -> Result<(), KvError> {
        let Some(w) = &self.win else {
            return Ok(());
        };
        let reclaimed = hits.iter().filter(|&&b| w.pool.is_cached(b)).count();
        let available = w.pool.available() - reclaimed;
        if new > available {
            return Err(KvError::OutOfBlocks {
                needed: new,
                available,
            });
        }
        Ok(())
    }

    /// A new sequence's window table: its `hits` held (the last of `n_hits` blocks), earlier
    /// indices dropped, `new` fresh blocks after.
    pub(crate) fn admit_window(
        &mut self,
        hits: &[u32],
        n_hits: usize,
        new: usize,
    ) -> Result<Vec<u32>, KvError> {
        let Some(w) = &mut self.win else {
            return Ok(Vec::new());
        };
        for &b in hits {
            w.pool.incref(b)?;
        }
        let mut table = vec![DROPPED; n_hits - hits.len()];
        table.extend_from_slice(hits);
        table.extend(w.pool.allocate(new)?);
        Ok(table)
    }

    /// With a window group: its blocks for written positions `start..end` of `seq` are held,
    /// private and unregistered.
    pub(crate) fn check_window_write(
        &self,
        seq: SeqId,
        start: usize,
        end: usize,
    ) -> Result<(), KvError> {
        let (Some(w), Some(t)) = (&self.win, self.seqs.get(&seq)) else {
            return Ok(());
        };
        let bs = self.block_size();
        for index in start / bs..=(end - 1) / bs {
            match t.wblocks.get(index) {
                Some(&b) if b != DROPPED => {
                    if w.pool.ref_count(b) != 1 || w.pool.is_registered(b) {
                        return Err(KvError::ImmutableWrite {
                            seq,
                            block: b,
                            index,
                        });
                    }
                }
                _ => {
                    return Err(KvError::Invariant(format!(
                        "sequence {seq}: position {} has no window block",
                        index * bs
                    )))
                }
            }
        }
        Ok(())
    }

    /// The window group's invariants: its pool's, a table entry per block index, refcounts
    /// equal to holders, shared blocks registered.
    pub(crate) fn check_window(&self) -> Result<(), KvError> {
        let Some(w) = &self.win else {
            return Ok(());
        };
        w.pool.check()?;
        let bad = |m: String| Err(KvError::Invariant(m));
        let mut holders = vec![0u32; w.pool.capacity()];
        for (&seq, t) in &self.seqs {
            if t.wblocks.len() != t.blocks.len() {
                return bad(format!(
                    "sequence {seq}: window table and block table differ in length"
                ));
            }
            for &b in t.wblocks.iter().filter(|&&b| b != DROPPED) {
                if b as usize >= holders.len() {
                    return bad(format!("sequence {seq}: window block {b} out of range"));
                }
                holders[b as usize] += 1;
            }
        }
        for (b, &h) in holders.iter().enumerate() {
            let b = b as u32;
            if w.pool.ref_count(b) != h {
                return bad(format!(
                    "window block {b}: refcount {} but held {h} times",
                    w.pool.ref_count(b)
                ));
            }
            if h > 1 && !w.pool.is_registered(b) {
                return bad(format!(
                    "window block {b} shared by {h} tables but not registered"
                ));
            }
        }
        Ok(())
    }
}
