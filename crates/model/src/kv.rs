//! Paged KV storage: the tensors only. Which blocks belong to which sequence is the caller's
//! business (block tables arrive with the batch); allocation, reference counts and prefix
//! sharing live in the KV bookkeeping, which holds no tensors.
//!
//! Layout per layer: `[block][slot][kv_dim]` f32, for K and V separately, so one position's
//! key for all KV heads is contiguous. The buffers are allocated zeroed and fallibly: a
//! cache the allocator cannot give is an error, not an abort, and its pages are only
//! touched as positions are written.

use tessera_core::{Error, Result};

/// `n` zeros, or an error when the allocator cannot give them (instead of aborting).
pub fn zeroed_f32(n: usize) -> Result<Vec<f32>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let too_big = || Error::Config(format!("cannot allocate {n} floats for the KV cache"));
    let layout = std::alloc::Layout::array::<f32>(n).map_err(|_| too_big())?;
    // SAFETY: `layout` has a non-zero size (n > 0).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<f32>();
    if ptr.is_null() {
        return Err(too_big());
    }
    // SAFETY: `ptr` comes from the global allocator with the layout of `[f32; n]`, so a
    // `Vec` of capacity `n` may own it; all-zero bytes are `n` valid `0.0` values.
    Ok(unsafe { Vec::from_raw_parts(ptr, n, n) })
}

#[derive(Default)]
pub struct KvStorage {
    block_size: usize,
    num_blocks: usize,
    kv_dim: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    /// An identity for storages that live partly elsewhere (other ranks' shards of it).
    pub tag: u64,
}

impl KvStorage {
    /// Storage for `num_blocks` blocks of `block_size` positions in each of `layers` layers.
    pub fn new(layers: usize, kv_dim: usize, block_size: usize, num_blocks: usize) -> Result<Self> {
        if block_size == 0 {
            return Err(Error::Config("KV block size must be positive".into()));
        }
        let per_layer = num_blocks
            .checked_mul(block_size)
            .and_then(|x| x.checked_mul(kv_dim))
            .ok_or_else(|| Error::Config("KV storage size overflows".into()))?;
        Ok(KvStorage {
            tag: 0,
            block_size,
            num_blocks,
            kv_dim,
            k: (0..layers)
                .map(|_| zeroed_f32(per_layer))
                .collect::<Result<_>>()?,
            v: (0..layers)
                .map(|_| zeroed_f32(per_layer))
                .collect::<Result<_>>()?,
        })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }
    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }
    /// Number of layers held.
    pub fn layers(&self) -> usize {
        self.k.len()
    }
    /// Bytes held (K and V, all layers).
    pub fn bytes(&self) -> usize {
        2 * self.k.len() * self.num_blocks * self.block_size * self.kv_dim * 4
    }

    /// Element offset of `pos` of a sequence with `table`, within one layer's buffer.
    #[inline]
    pub fn offset(&self, table: &[u32], pos: usize) -> usize {
        let block = table[pos / self.block_size] as usize;
        (block * self.block_size + pos % self.block_size) * self.kv_dim
    }

    /// Checks a block table can hold `len` positions and names only existing blocks.
    pub fn check_table(&self, table: &[u32], len: usize) -> Result<()> {
        let need = len.div_ceil(self.block_size);
        if table.len() < need {
            return Err(Error::Other(format!(
                "block table has {} blocks, {len} positions need {need}",
                table.len()
            )));
        }
        if let Some(b) = table[..need]
            .iter()
            .find(|&&b| b as usize >= self.num_blocks)
        {
            return Err(Error::Other(format!(
                "block {b} does not exist (storage has {})",
                self.num_blocks
            )));
        }
        Ok(())
    }

    pub fn layer(&self, layer: usize) -> (&[f32], &[f32]) {
        (&self.k[layer], &self.v[layer])
    }

    pub fn layer_mut(&mut self, layer: usize) -> (&mut [f32], &mut [f32]) {
        (&mut self.k[layer], &mut self.v[layer])
    }

    /// Copies one block's contents (all layers) to another: copy-on-write for shared prefixes.
    pub fn copy_block(&mut self, from: u32, to: u32) {
        let n = self.block_size * self.kv_dim;
        let (f, t) = (from as usize * n, to as usize * n);
        for l in 0..self.k.len() {
            self.k[l].copy_within(f..f + n, t);
            self.v[l].copy_within(f..f + n, t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_failures_are_errors() {
        assert_eq!(zeroed_f32(3).unwrap(), [0.0; 3]);
        assert!(zeroed_f32(0).unwrap().is_empty());
        assert!(zeroed_f32(usize::MAX / 2).is_err());
        // 32 PB: more than any address space gives.
        let e = KvStorage::new(30, 576, 16, 1 << 40).err().unwrap();
        assert!(e.to_string().contains("cannot allocate"), "{e}");
    }
}
