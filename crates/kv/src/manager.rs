//! Per-sequence block tables over a [`BlockPool`], with prefix-cache lookup on admission and
//! registration of full blocks as they are computed.
//!
//! Owns: one table per live sequence (physical block ids in position order, the chained
//! hashes of its committed full blocks, its namespace). Invariants, all checked by
//! [`KvManager::check`]:
//! - a block's refcount equals the number of tables holding it;
//! - a table holds a block at most once;
//! - only registered blocks (full, hashed, immutable) are shared, and a registered block sits
//!   inside the committed prefix of every table holding it (`index < hashes.len()`).
//!
//! Hence **no copy-on-write**: a sequence writes only positions `>= num_computed`, which lie in
//! blocks past its committed prefix, and those blocks are private (refcount 1, unregistered);
//! [`KvManager::check_write`] verifies this for a chunk.
//!
//! Prefix reuse leaves at least one token to compute: a lookup only considers the full blocks
//! of `tokens[..len - 1]`, so a prompt cached in full reuses all blocks but the one holding its
//! last token (which is recomputed into a fresh private block). That block is the one the
//! next token is written into, and shared blocks must never be written. vLLM v1 makes the same
//! choice (`max_cache_hit_length = num_tokens - 1`).

use std::collections::HashMap;

use crate::hash::{BlockContent, BlockHash};
use crate::pool::BlockPool;
use crate::KvError;

/// Identifier of a sequence (the scheduler's request id).
pub type SeqId = u64;

#[derive(Debug, Clone)]
pub(crate) struct SeqTable {
    pub(crate) blocks: Vec<u32>,
    /// Chained hashes of the first `hashes.len()` blocks, whose content is final.
    pub(crate) hashes: Vec<BlockHash>,
    pub(crate) namespace: Option<u64>,
    /// With a window group: its block for each index of `blocks`, [`DROPPED`] where the
    /// sequence has moved past it (or never needed it).
    pub(crate) wblocks: Vec<u32>,
}

/// A window-group table entry the sequence no longer holds.
pub const DROPPED: u32 = u32::MAX;

/// The window group: blocks of the layers that attend only the last `window` positions, in
/// a pool of their own, held by a sequence only while some position it will still compute
/// attends them (see [`KvManager::with_window`]).
#[derive(Debug, Clone)]
pub(crate) struct Win {
    pub(crate) pool: BlockPool,
    pub(crate) window: usize,
}

/// Counters for logs and the metrics endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KvMetrics {
    pub capacity: usize,
    pub blocks_used: usize,
    pub blocks_cached: usize,
    pub blocks_free: usize,
    /// Tokens presented to prefix lookups on admission.
    pub prefix_query_tokens: u64,
    /// Of those, tokens found cached (not recomputed).
    pub prefix_hit_tokens: u64,
    pub evictions: u64,
}

impl KvMetrics {
    /// Fraction of queried tokens found cached (0 when nothing was queried).
    pub fn prefix_hit_rate(&self) -> f64 {
        if self.prefix_query_tokens == 0 {
            0.0
        } else {
            self.prefix_hit_tokens as f64 / self.prefix_query_tokens as f64
        }
    }
}

#[derive(Debug, Clone)]
pub struct KvManager {
    pool: BlockPool,
    pub(crate) seqs: HashMap<SeqId, SeqTable>,
    pub(crate) win: Option<Win>,
    prefix_caching: bool,
    query_tokens: u64,
    hit_tokens: u64,
}

impl KvManager {
    /// `num_blocks` blocks of `block_size` positions; `prefix_caching` off makes lookups miss
    /// and commits no-ops.
    pub fn new(
        num_blocks: usize,
        block_size: usize,
        prefix_caching: bool,
    ) -> Result<Self, KvError> {
        Ok(KvManager {
            pool: BlockPool::new(num_blocks, block_size)?,
            seqs: HashMap::new(),
            win: None,
            prefix_caching,
            query_tokens: 0,
            hit_tokens: 0,
        })
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }
    pub fn block_size(&self) -> usize {
        self.pool.block_size()
    }
    /// Blocks covering `positions` positions.
    pub fn blocks_for(&self, positions: usize) -> usize {
        positions.div_ceil(self.block_size())
    }
    pub fn has_seq(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }
    pub fn num_seqs(&self) -> usize {
        self.seqs.len()
    }
    pub fn block_table(&self, seq: SeqId) -> Option<&[u32]> {
        self.seqs.get(&seq).map(|t| t.blocks.as_slice())
    }
    /// Full blocks of `seq` whose content is final (hashed).
    pub fn num_committed_blocks(&self, seq: SeqId) -> usize {
        self.seqs.get(&seq).map_or(0, |t| t.hashes.len())
    }

    /// Cached blocks (and their hashes) forming the longest reusable prefix of `tokens`.
    fn find_prefix(&self, namespace: Option<u64>, tokens: &[u32]) -> Vec<(u32, BlockHash)> {
        if !self.prefix_caching {
            return Vec::new();
        }
        let bs = self.block_size();
        let limit = tokens.len().saturating_sub(1);
        let mut parent = None;
        let mut hits = Vec::new();
        for chunk in tokens[..limit].chunks_exact(bs) {
            let h = self.pool.hasher().block(namespace, parent, chunk);
            match self.pool.lookup(h, namespace, parent, chunk) {
                Some(b) => hits.push((b, h)),
                None => break,
            }
            parent = Some(h);
        }
        let keep = self.window_hits(namespace, tokens, &hits).0;
        hits.truncate(keep);
        hits
    }

    /// Tokens of `tokens` that [`KvManager::admit`] would find cached now (a multiple of the
    /// block size, always `< tokens.len()`). Changes nothing.
    pub fn peek_prefix(&self, namespace: Option<u64>, tokens: &[u32]) -> usize {
        self.find_prefix(namespace, tokens).len() * self.block_size()
    }

    /// Blocks an allocation could take right now (free plus evictable).
    pub fn available_blocks(&self) -> usize {
        self.pool.available()
    }

    /// Starts `seq`'s table: reuses the cached prefix of `tokens` (bumping refcounts) and
    /// allocates private blocks up to `positions` positions. All or nothing: on `OutOfBlocks`
    /// nothing changed. Returns the number of cached tokens, which count as computed.
    pub fn admit(
        &mut self,
        seq: SeqId,
        namespace: Option<u64>,
        tokens: &[u32],
        positions: usize,
    ) -> Result<usize, KvError> {
        if self.seqs.contains_key(&seq) {
            return Err(KvError::SeqExists { seq });
        }
        let hits = self.find_prefix(namespace, tokens);
        let total = self.blocks_for(positions).max(hits.len());
        let new = total - hits.len();
        // Hits that are cached now stop being evictable once held.
        let reclaimed = hits.iter().filter(|(b, _)| self.pool.is_cached(*b)).count();
        let available = self.pool.available() - reclaimed;
        if new > available {
            return Err(KvError::OutOfBlocks {
                needed: new,
                available,
            });
        }
        let (_, win_hits) = self.window_hits(namespace, tokens, &hits);
        self.check_window_room(&win_hits, new)?;
        // Hold the hits first so the allocation below cannot evict them.
        for &(b, _) in &hits {
            self.pool.incref(b)?;
        }
        let mut blocks: Vec<u32> = hits.iter().map(|&(b, _)| b).collect();
        blocks.extend(self.pool.allocate(new)?);
        let wblocks = self.admit_window(&win_hits, hits.len(), new)?;
        let cached = hits.len() * self.block_size();
        if self.prefix_caching {
            self.query_tokens += tokens.len() as u64;
            self.hit_tokens += cached as u64;
        }
        self.seqs.insert(
            seq,
            SeqTable {
                blocks,
                hashes: hits.iter().map(|&(_, h)| h).collect(),
                namespace,
                wblocks,
            },
        );
        Ok(cached)
    }

    /// Extra blocks `seq` needs to cover `positions` positions.
    pub fn blocks_needed(&self, seq: SeqId, positions: usize) -> usize {
        let have = self.seqs.get(&seq).map_or(0, |t| t.blocks.len());
        self.blocks_for(positions).saturating_sub(have)
    }

    /// Grows `seq`'s table to cover `positions` positions; all or nothing.
    pub fn allocate_for(&mut self, seq: SeqId, positions: usize) -> Result<(), KvError> {
        let need = self.blocks_needed(seq, positions);
        if !self.seqs.contains_key(&seq) {
            return Err(KvError::UnknownSeq { seq });
        }
        if need == 0 {
            return Ok(());
        }
        self.check_window_room(&[], need)?;
        let blocks = self.pool.allocate(need)?;
        let wblocks = match &mut self.win {
            Some(w) => w.pool.allocate(need)?,
            None => Vec::new(),
        };
        let table = self.seqs.get_mut(&seq).expect("checked above");
        table.blocks.extend(blocks);
        table.wblocks.extend(wblocks);
        Ok(())
    }

    /// Shrinks `seq`'s table to the blocks covering `positions` positions, releasing the
    /// rest (the KV of rejected speculative positions). Only uncommitted blocks can go: a
    /// table never shrinks into its registered prefix. Returns the blocks released.
    pub fn truncate(&mut self, seq: SeqId, positions: usize) -> Result<usize, KvError> {
        let keep = self.blocks_for(positions);
        let table = self.seqs.get_mut(&seq).ok_or(KvError::UnknownSeq { seq })?;
        if keep < table.hashes.len() {
            return Err(KvError::Invariant(format!(
                "sequence {seq}: truncating to {keep} blocks would drop committed ones"
            )));
        }
        let mut released = 0;
        while table.blocks.len() > keep {
            let b = table.blocks.pop().expect("longer than keep");
            self.pool.release(b)?;
            released += 1;
        }
        if let Some(w) = &mut self.win {
            while table.wblocks.len() > keep {
                let b = table.wblocks.pop().expect("longer than keep");
                if b != DROPPED {
                    w.pool.release(b)?;
                }
            }
        }
        Ok(released)
    }

    /// Releases all of `seq`'s blocks; registered ones stay cached. Tail blocks are released
    /// first so they are evicted before the prefix they extend (as vLLM v1 does).
    pub fn free_seq(&mut self, seq: SeqId) -> Result<(), KvError> {
        let table = self.seqs.remove(&seq).ok_or(KvError::UnknownSeq { seq })?;
        for &b in table.blocks.iter().rev() {
            self.pool.release(b)?;
        }
        // The window group's oldest blocks go first: a later prefix hit needs the blocks
        // just before its end, so those should be evicted last.
        if let Some(w) = &mut self.win {
            for &b in table.wblocks.iter().filter(|&&b| b != DROPPED) {
                w.pool.release(b)?;
            }
        }
        Ok(())
    }

    /// Registers the full blocks of `computed` (the tokens whose KV `seq` has computed, from
    /// position 0) not registered yet, so later requests can share them. Returns how many
    /// blocks became newly shareable.
    pub fn commit_full_blocks(&mut self, seq: SeqId, computed: &[u32]) -> Result<usize, KvError> {
        let bs = self.block_size();
        let table = self.seqs.get_mut(&seq).ok_or(KvError::UnknownSeq { seq })?;
        let full = computed.len() / bs;
        if full > table.blocks.len() {
            return Err(KvError::CommitBeyondTable {
                seq,
                full_blocks: full,
                table_len: table.blocks.len(),
            });
        }
        if !self.prefix_caching {
            return Ok(0);
        }
        let mut registered = 0;
        for i in table.hashes.len()..full {
            let chunk = &computed[i * bs..(i + 1) * bs];
            let parent = table.hashes.last().copied();
            let hash = self.pool.hasher().block(table.namespace, parent, chunk);
            let content = BlockContent {
                hash,
                namespace: table.namespace,
                parent,
                tokens: chunk.into(),
            };
            if let (Some(w), Some(&wb)) = (&mut self.win, table.wblocks.get(i)) {
                if wb != DROPPED {
                    w.pool.register(wb, content.clone());
                }
            }
            if self.pool.register(table.blocks[i], content) {
                registered += 1;
            }
            table.hashes.push(hash);
        }
        Ok(registered)
    }

    /// Verifies that writing positions `start..end` of `seq` touches only private, mutable
    /// blocks present in its table (the no-copy-on-write invariant).
    pub fn check_write(&self, seq: SeqId, start: usize, end: usize) -> Result<(), KvError> {
        if start >= end {
            return Ok(());
        }
        let table = self.seqs.get(&seq).ok_or(KvError::UnknownSeq { seq })?;
        let bs = self.block_size();
        for index in start / bs..=(end - 1) / bs {
            let Some(&block) = table.blocks.get(index) else {
                return Err(KvError::Invariant(format!(
                    "sequence {seq}: position {} has no block",
                    index * bs
                )));
            };
            if self.pool.ref_count(block) != 1 || self.pool.is_registered(block) {
                return Err(KvError::ImmutableWrite { seq, block, index });
            }
        }
        self.check_window_write(seq, start, end)
    }

    pub fn metrics(&self) -> KvMetrics {
        KvMetrics {
            capacity: self.pool.capacity(),
            blocks_used: self.pool.used(),
            blocks_cached: self.pool.cached(),
            blocks_free: self.pool.free(),
            prefix_query_tokens: self.query_tokens,
            prefix_hit_tokens: self.hit_tokens,
            evictions: self.pool.evictions(),
        }
    }

    /// All invariants of the pool and the tables (see the module docs). O(blocks + tables).
    pub fn check(&self) -> Result<(), KvError> {
        self.pool.check()?;
        self.check_window()?;
        let bad = |m: String| Err(KvError::Invariant(m));
        let mut holders = vec![0u32; self.pool.capacity()];
        for (&seq, t) in &self.seqs {
            if t.hashes.len() > t.blocks.len() {
                return bad(format!("sequence {seq} has more hashes than blocks"));
            }
            let mut seen = std::collections::HashSet::new();
            for (index, &b) in t.blocks.iter().enumerate() {
                if b as usize >= holders.len() || !seen.insert(b) {
                    return bad(format!(
                        "sequence {seq} holds block {b} twice or out of range"
                    ));
                }
                holders[b as usize] += 1;
                if self.pool.is_registered(b) && index >= t.hashes.len() {
                    return bad(format!(
                        "sequence {seq}: registered block {b} at index {index} outside its committed prefix"
                    ));
                }
            }
        }
        for (b, &h) in holders.iter().enumerate() {
            let b = b as u32;
            if self.pool.ref_count(b) != h {
                return bad(format!(
                    "block {b}: refcount {} but held by {h} tables",
                    self.pool.ref_count(b)
                ));
            }
            if h > 1 && !self.pool.is_registered(b) {
                return bad(format!("block {b} shared by {h} tables but not registered"));
            }
        }
        Ok(())
    }
}
