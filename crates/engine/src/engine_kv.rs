//! The engine's KV storage: its size per block, and the storage itself for every rank (with
//! the sliding-window layers kept apart where the model has them).

use tessera_core::Result;
use tessera_model::KvStorage;

use crate::Engine;

impl Engine {
    /// Bytes one KV block of `block_size` positions takes in this process, over every
    /// local rank (K and V, every layer, in [`Engine::kv_dtype`]).
    pub fn kv_bytes_per_block(&self, block_size: usize) -> usize {
        let dims: usize = match &self.tp {
            None => self.config.kv_dim(),
            Some(g) => g
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .local_kv_dims(self.config.head_dim)
                .iter()
                .sum(),
        };
        2usize
            .saturating_mul(self.config.n_layers)
            .saturating_mul(block_size)
            .saturating_mul(dims)
            .saturating_mul(self.kv_dtype.bytes())
    }

    /// KV storage for every rank (one entry without tensor parallelism). A cache larger
    /// than the memory available, or than the allocator gives, is an error.
    pub fn new_kv(&self, block_size: usize, num_blocks: usize) -> Result<Vec<KvStorage>> {
        let bytes = (self.kv_bytes_per_block(block_size) as u64).saturating_mul(num_blocks as u64);
        crate::resources::check_memory(
            bytes,
            &format!("a KV cache of {num_blocks} blocks of {block_size} positions"),
            "",
        )?;
        match &self.tp {
            None => Ok(vec![self.model.new_kv_storage_of(
                block_size,
                num_blocks,
                self.kv_dtype,
            )?]),
            Some(g) => g.lock().unwrap_or_else(|e| e.into_inner()).new_kv(
                &self.config,
                block_size,
                num_blocks,
                self.kv_dtype,
            ),
        }
    }

    /// Bytes one KV block of `block_size` positions takes in the layers outside the window
    /// group and in those inside it (one rank; `(all, 0)` without windowed layers).
    pub fn kv_bytes_per_block_groups(&self, block_size: usize) -> (usize, usize) {
        let all = self.kv_bytes_per_block(block_size);
        let windowed = (0..self.config.n_layers)
            .filter(|&l| self.config.window(l).is_some())
            .count();
        let per_layer = all / self.config.n_layers.max(1);
        (all - windowed * per_layer, windowed * per_layer)
    }

    /// [`Engine::new_kv`] with the model's sliding-window layers kept apart in
    /// `window_blocks` blocks (one rank; a model without windowed layers gets the plain
    /// storage).
    pub fn new_kv_windowed(
        &self,
        block_size: usize,
        num_blocks: usize,
        window_blocks: usize,
    ) -> Result<Vec<KvStorage>> {
        if self.tp.is_some() {
            return Err(tessera_core::Error::Config(
                "a KV window group runs on one rank only".into(),
            ));
        }
        let kv = self.model.new_kv_storage_windowed(
            block_size,
            num_blocks,
            window_blocks,
            self.kv_dtype,
        )?;
        crate::resources::check_memory(
            kv.bytes() as u64,
            &format!("a KV cache of {num_blocks} blocks (window group {window_blocks})"),
            "",
        )?;
        Ok(vec![kv])
    }
}
