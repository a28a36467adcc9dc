//! The block pool: which physical blocks are free, referenced or cached, and the prefix-cache
//! index from content hash to block.
//!
//! Every block is in exactly one state:
//! - **free**: refcount 0, no content; on the free stack.
//! - **referenced**: refcount > 0 (held by that many block tables); may have content.
//! - **cached**: refcount 0 with registered content; in the LRU, evictable.
//!
//! So `free() + used() + cached() == capacity()`. Allocation pops the free stack first and only
//! then evicts the least recently used cached block, dropping its index entry. A cached block
//! hit by a lookup leaves the LRU when its refcount goes back above 0. All of allocate, release,
//! incref and evict are O(1); a lookup is one hash-map probe plus a `block_size` comparison.
//! Only registered (full, immutable) blocks are ever shared, so there is no copy-on-write.
//! Design after vLLM v1 `vllm/v1/core/block_pool.py` and mistral.rs's block engine.

use std::collections::HashMap;

use crate::hash::{BlockContent, BlockHash, ChainHasher};
use crate::lru::LruList;
use crate::KvError;

#[derive(Debug, Clone)]
pub struct BlockPool {
    block_size: usize,
    ref_count: Vec<u32>,
    content: Vec<Option<BlockContent>>,
    free: Vec<u32>,
    lru: LruList,
    index: HashMap<BlockHash, u32>,
    hasher: ChainHasher,
    evictions: u64,
}

impl BlockPool {
    /// A pool of `num_blocks` blocks of `block_size` positions, all free.
    pub fn new(num_blocks: usize, block_size: usize) -> Result<Self, KvError> {
        if block_size == 0 {
            return Err(KvError::InvalidConfig {
                reason: "block_size must be positive".into(),
            });
        }
        if num_blocks >= u32::MAX as usize {
            return Err(KvError::InvalidConfig {
                reason: format!("{num_blocks} blocks do not fit u32 block ids"),
            });
        }
        Ok(BlockPool {
            block_size,
            ref_count: vec![0; num_blocks],
            content: vec![None; num_blocks],
            // Reversed so that block 0 is handed out first (readable tests and tables).
            free: (0..num_blocks as u32).rev().collect(),
            lru: LruList::new(num_blocks),
            index: HashMap::new(),
            hasher: ChainHasher::default(),
            evictions: 0,
        })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }
    pub fn capacity(&self) -> usize {
        self.ref_count.len()
    }
    /// Blocks with no content and no holder.
    pub fn free(&self) -> usize {
        self.free.len()
    }
    /// Blocks held by at least one table.
    pub fn used(&self) -> usize {
        self.capacity() - self.free.len() - self.lru.len()
    }
    /// Unheld blocks kept for their content (evictable).
    pub fn cached(&self) -> usize {
        self.lru.len()
    }
    /// Blocks an allocation may take: free plus evictable.
    pub fn available(&self) -> usize {
        self.free.len() + self.lru.len()
    }
    /// Cached blocks evicted so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }
    pub fn ref_count(&self, block: u32) -> u32 {
        self.ref_count.get(block as usize).copied().unwrap_or(0)
    }
    /// Whether `block` holds registered content (is shareable and immutable).
    pub fn is_registered(&self, block: u32) -> bool {
        matches!(self.content.get(block as usize), Some(Some(_)))
    }
    /// Whether `block` is cached: unheld, evictable, with content.
    pub fn is_cached(&self, block: u32) -> bool {
        (block as usize) < self.capacity() && self.lru.contains(block)
    }

    pub(crate) fn hasher(&self) -> &ChainHasher {
        &self.hasher
    }

    /// Takes `n` blocks (refcount 1 each), or none at all.
    pub fn allocate(&mut self, n: usize) -> Result<Vec<u32>, KvError> {
        if n > self.available() {
            return Err(KvError::OutOfBlocks {
                needed: n,
                available: self.available(),
            });
        }
        Ok((0..n).filter_map(|_| self.take_one()).collect())
    }

    fn take_one(&mut self) -> Option<u32> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let b = self.lru.pop_front()?;
                if let Some(c) = self.content[b as usize].take() {
                    self.index.remove(&c.hash);
                }
                self.evictions += 1;
                b
            }
        };
        self.ref_count[b as usize] = 1;
        Some(b)
    }

    /// One more holder of `block` (a prefix-cache hit); a cached block leaves the LRU.
    pub fn incref(&mut self, block: u32) -> Result<(), KvError> {
        let i = block as usize;
        if i >= self.capacity() {
            return Err(KvError::Invariant(format!(
                "incref of unknown block {block}"
            )));
        }
        if self.ref_count[i] == 0 && !self.lru.remove(block) {
            return Err(KvError::Invariant(format!(
                "incref of free block {block} (only cached or held blocks can be shared)"
            )));
        }
        self.ref_count[i] += 1;
        Ok(())
    }

    /// One holder fewer; at zero the block becomes cached (with content) or free.
    pub fn release(&mut self, block: u32) -> Result<(), KvError> {
        let i = block as usize;
        match self.ref_count.get(i) {
            Some(&r) if r > 0 => {}
            _ => {
                return Err(KvError::Invariant(format!(
                    "release of unheld block {block}"
                )))
            }
        }
        self.ref_count[i] -= 1;
        if self.ref_count[i] == 0 {
            if self.content[i].is_some() {
                self.lru.push_back(block);
            } else {
                self.free.push(block);
            }
        }
        Ok(())
    }

    /// The block registered for this exact content, if any (full comparison, not just hash).
    pub(crate) fn lookup(
        &self,
        hash: BlockHash,
        namespace: Option<u64>,
        parent: Option<BlockHash>,
        tokens: &[u32],
    ) -> Option<u32> {
        let &b = self.index.get(&hash)?;
        let c = self.content[b as usize].as_ref()?;
        c.matches(namespace, parent, tokens).then_some(b)
    }

    /// Registers the content of a held, full block. Returns false (and leaves the block
    /// private) when the hash is already registered, by an identical block computed
    /// concurrently or by a colliding one.
    pub(crate) fn register(&mut self, block: u32, content: BlockContent) -> bool {
        let i = block as usize;
        if self.ref_count[i] == 0 || self.content[i].is_some() {
            return false;
        }
        if self.index.contains_key(&content.hash) {
            return false;
        }
        self.index.insert(content.hash, block);
        self.content[i] = Some(content);
        true
    }

    /// Pool-level invariants (see the module doc).
    pub fn check(&self) -> Result<(), KvError> {
        let bad = |m: String| Err(KvError::Invariant(m));
        let n = self.capacity();
        let mut on_free = vec![false; n];
        for &b in &self.free {
            let i = b as usize;
            if i >= n || on_free[i] {
                return bad(format!("free stack holds block {b} twice or out of range"));
            }
            on_free[i] = true;
            if self.ref_count[i] != 0 || self.content[i].is_some() {
                return bad(format!("free block {b} is referenced or has content"));
            }
        }
        let mut lru_len = 0;
        for b in self.lru.iter() {
            lru_len += 1;
            let i = b as usize;
            if on_free[i] || self.ref_count[i] != 0 || self.content[i].is_none() {
                return bad(format!("cached block {b} is free, referenced or empty"));
            }
        }
        if lru_len != self.lru.len() {
            return bad("LRU length mismatch".into());
        }
        let referenced = self.ref_count.iter().filter(|&&r| r > 0).count();
        if self.free.len() + referenced + lru_len != n {
            return bad(format!(
                "free {} + referenced {referenced} + cached {lru_len} != capacity {n}",
                self.free.len()
            ));
        }
        for (h, &b) in &self.index {
            match &self.content[b as usize] {
                Some(c) if c.hash == *h => {}
                _ => return bad(format!("index entry {h:?} -> {b} without that content")),
            }
        }
        let with_content = self.content.iter().filter(|c| c.is_some()).count();
        if with_content != self.index.len() {
            return bad("a block has content but is not indexed".into());
        }
        Ok(())
    }
}
