//! Content identity of full blocks: a hash chained over (parent block's hash, the block's
//! token ids), with the namespace (a LoRA adapter id) at the root.
//!
//! The hash is keyed SipHash (`std::collections::hash_map::RandomState`, random keys per
//! pool), so users cannot craft colliding prompts. Hashes are only a map key: every cached
//! block also stores its [`BlockContent`] (namespace, parent hash, tokens) and a lookup
//! compares it in full, walking from the root. By induction a hit therefore always has exactly
//! the looked-up tokens in the same namespace; a hash collision can only cost a miss (the
//! second block with that hash is not registered), never a wrong reuse. This is the
//! block-hash scheme of vLLM v1's automatic prefix caching, plus the full comparison.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash, Hasher};

/// Identity of one full block of tokens and everything before it, within one pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u64);

/// What a cached block holds: compared in full on every lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BlockContent {
    pub hash: BlockHash,
    pub namespace: Option<u64>,
    /// `None` for a sequence's first block.
    pub parent: Option<BlockHash>,
    pub tokens: Box<[u32]>,
}

impl BlockContent {
    pub(crate) fn matches(
        &self,
        namespace: Option<u64>,
        parent: Option<BlockHash>,
        tokens: &[u32],
    ) -> bool {
        self.namespace == namespace && self.parent == parent && *self.tokens == *tokens
    }
}

#[derive(Debug, Clone, Default)]
pub(crate) struct ChainHasher {
    state: RandomState,
}

impl ChainHasher {
    /// Hash of a block whose predecessor has hash `parent` (`None`: first block, rooted at
    /// `namespace`).
    pub(crate) fn block(
        &self,
        namespace: Option<u64>,
        parent: Option<BlockHash>,
        tokens: &[u32],
    ) -> BlockHash {
        let mut h = self.state.build_hasher();
        match parent {
            // The namespace only enters at the root; the chain carries it onwards.
            None => (0u8, namespace).hash(&mut h),
            Some(p) => (1u8, p.0).hash(&mut h),
        }
        tokens.hash(&mut h);
        BlockHash(h.finish())
    }

    /// Hashes of every full block of `tokens`.
    #[cfg(test)]
    pub(crate) fn chain(
        &self,
        namespace: Option<u64>,
        tokens: &[u32],
        block_size: usize,
    ) -> Vec<BlockHash> {
        let mut parent = None;
        tokens
            .chunks_exact(block_size)
            .map(|c| {
                let h = self.block(namespace, parent, c);
                parent = Some(h);
                h
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_depends_on_prefix_and_namespace() {
        let h = ChainHasher::default();
        let a = h.chain(None, &[1, 2, 3, 4], 2);
        let b = h.chain(None, &[9, 9, 3, 4], 2);
        let c = h.chain(Some(7), &[1, 2, 3, 4], 2);
        assert_eq!(a.len(), 2);
        assert_eq!(
            a,
            h.chain(None, &[1, 2, 3, 4, 5], 2),
            "partial block ignored"
        );
        assert_ne!(a[1], b[1], "same tokens, different parent");
        assert_ne!(a[0], c[0], "different namespace");
        assert_ne!(h.chain(Some(0), &[1, 2], 2), h.chain(None, &[1, 2], 2));
    }
}
