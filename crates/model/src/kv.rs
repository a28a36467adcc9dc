//! Paged KV storage: the tensors only. Which blocks belong to which sequence is the caller's
//! business (block tables arrive with the batch); allocation, reference counts and prefix
//! sharing live in the KV bookkeeping, which holds no tensors.
//!
//! Layout per layer: `[block][slot][kv_dim]` in the storage's [`KvDtype`] (f32, or f16
//! converted on write and read back exactly as f32 by the attention kernel), for K and V
//! separately, so one position's key for all KV heads is contiguous. The buffers are
//! allocated zeroed and fallibly: a cache the allocator cannot give is an error, not an
//! abort, and its pages are only touched as positions are written.

use std::fmt;
use std::str::FromStr;

use half::f16;
use tessera_core::{Error, Result};
use tessera_kernels::attn::KvRows;

/// Element type of the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvDtype {
    #[default]
    F32,
    /// IEEE half: half the memory; values rounded to nearest on write, saturating at
    /// ±65504.
    F16,
}

impl KvDtype {
    /// Bytes per stored value.
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
        }
    }
}

impl fmt::Display for KvDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvDtype {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "f32" => Ok(KvDtype::F32),
            "f16" => Ok(KvDtype::F16),
            _ => Err(format!("unknown KV dtype {s:?} (expected f32 or f16)")),
        }
    }
}

/// Element types whose all-zero bytes are the value 0.
trait ZeroBits: Copy {}
impl ZeroBits for f32 {}
impl ZeroBits for f16 {}

/// `n` zeros, or an error when the allocator cannot give them (instead of aborting).
fn zeroed<T: ZeroBits>(n: usize) -> Result<Vec<T>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let too_big = || Error::Config(format!("cannot allocate {n} values for the KV cache"));
    let layout = std::alloc::Layout::array::<T>(n).map_err(|_| too_big())?;
    // SAFETY: `layout` has a non-zero size (n > 0, and both `ZeroBits` types are sized > 0).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if ptr.is_null() {
        return Err(too_big());
    }
    // SAFETY: `ptr` comes from the global allocator with the layout of `[T; n]`, so a `Vec`
    // of capacity `n` may own it; all-zero bytes are `n` valid zeros (`ZeroBits`).
    Ok(unsafe { Vec::from_raw_parts(ptr, n, n) })
}

/// `n` f32 zeros, or an error when the allocator cannot give them (instead of aborting).
pub fn zeroed_f32(n: usize) -> Result<Vec<f32>> {
    zeroed(n)
}

/// One layer's K or V buffer.
enum Buf {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

impl Buf {
    fn zeroed(dtype: KvDtype, n: usize) -> Result<Buf> {
        Ok(match dtype {
            KvDtype::F32 => Buf::F32(zeroed(n)?),
            KvDtype::F16 => Buf::F16(zeroed(n)?),
        })
    }
    fn rows(&self) -> KvRows<'_> {
        match self {
            Buf::F32(b) => KvRows::F32(b),
            Buf::F16(b) => KvRows::F16(b),
        }
    }
    fn write(&mut self, off: usize, x: &[f32]) {
        match self {
            Buf::F32(b) => b[off..off + x.len()].copy_from_slice(x),
            // Saturating: a value beyond f16's range is stored as ±65504, not as infinity.
            Buf::F16(b) => {
                for (d, &v) in b[off..off + x.len()].iter_mut().zip(x) {
                    *d = f16::from_f32(v.clamp(-f16::MAX.to_f32(), f16::MAX.to_f32()));
                }
            }
        }
    }
    fn copy_within(&mut self, src: std::ops::Range<usize>, dst: usize) {
        match self {
            Buf::F32(b) => b.copy_within(src, dst),
            Buf::F16(b) => b.copy_within(src, dst),
        }
    }
}

#[derive(Default)]
pub struct KvStorage {
    block_size: usize,
    num_blocks: usize,
    /// Layers of the window group (kept apart, in `window_blocks` blocks), if any, and the
    /// positions they attend back (the group's largest window).
    window_layers: Vec<bool>,
    window_blocks: usize,
    window: usize,
    kv_dim: usize,
    dtype: KvDtype,
    k: Vec<Buf>,
    v: Vec<Buf>,
    /// An identity for storages that live partly elsewhere (other ranks' shards of it).
    pub tag: u64,
}

impl KvStorage {
    /// f32 storage for `num_blocks` blocks of `block_size` positions in each of `layers`
    /// layers.
    pub fn new(layers: usize, kv_dim: usize, block_size: usize, num_blocks: usize) -> Result<Self> {
        Self::with_dtype(layers, kv_dim, block_size, num_blocks, KvDtype::F32)
    }

    /// Storage of `dtype` values for `num_blocks` blocks of `block_size` positions in each
    /// of `layers` layers.
    pub fn with_dtype(
        layers: usize,
        kv_dim: usize,
        block_size: usize,
        num_blocks: usize,
        dtype: KvDtype,
    ) -> Result<Self> {
        Self::with_window_group(layers, kv_dim, block_size, num_blocks, &[], 0, 0, dtype)
    }

    /// [`KvStorage::with_dtype`] with the layers marked in `window_layers` (sliding-window
    /// layers attending at most `window` positions) kept apart in `window_blocks` blocks of
    /// their own, addressed by each sequence's window table (`SeqChunk::window_table`).
    /// Empty `window_layers`: none.
    #[allow(clippy::too_many_arguments)]
    pub fn with_window_group(
        layers: usize,
        kv_dim: usize,
        block_size: usize,
        num_blocks: usize,
        window_layers: &[bool],
        window_blocks: usize,
        window: usize,
        dtype: KvDtype,
    ) -> Result<Self> {
        if block_size == 0 {
            return Err(Error::Config("KV block size must be positive".into()));
        }
        if !window_layers.is_empty() && window_layers.len() != layers {
            return Err(Error::Config(format!(
                "{} window-group flags for {layers} layers",
                window_layers.len()
            )));
        }
        let size = |blocks: usize| {
            blocks
                .checked_mul(block_size)
                .and_then(|x| x.checked_mul(kv_dim))
                .ok_or_else(|| Error::Config("KV storage size overflows".into()))
        };
        let (full, win) = (size(num_blocks)?, size(window_blocks)?);
        let len = |l: usize| match window_layers.get(l) {
            Some(true) => win,
            _ => full,
        };
        Ok(KvStorage {
            tag: 0,
            block_size,
            num_blocks,
            window_layers: window_layers.to_vec(),
            window_blocks,
            window,
            kv_dim,
            dtype,
            k: (0..layers)
                .map(|l| Buf::zeroed(dtype, len(l)))
                .collect::<Result<_>>()?,
            v: (0..layers)
                .map(|l| Buf::zeroed(dtype, len(l)))
                .collect::<Result<_>>()?,
        })
    }

    /// Whether layer `layer` is in the window group (kept apart, addressed by window
    /// tables).
    pub fn in_window_group(&self, layer: usize) -> bool {
        self.window_layers.get(layer).copied().unwrap_or(false)
    }

    /// Whether some layers are kept in a window group.
    pub fn has_window_group(&self) -> bool {
        self.window_layers.iter().any(|&w| w)
    }

    /// Blocks of the window group's storage.
    pub fn window_blocks(&self) -> usize {
        self.window_blocks
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
    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }
    /// Bytes held (K and V, all layers).
    pub fn bytes(&self) -> usize {
        let per_block = self.block_size * self.kv_dim * self.dtype.bytes();
        (0..self.k.len())
            .map(|l| {
                let blocks = if self.in_window_group(l) {
                    self.window_blocks
                } else {
                    self.num_blocks
                };
                2 * blocks * per_block
            })
            .sum()
    }

    /// Element offset of `pos` of a sequence with `table`, within one layer's buffer.
    #[inline]
    pub fn offset(&self, table: &[u32], pos: usize) -> usize {
        let block = table[pos / self.block_size] as usize;
        (block * self.block_size + pos % self.block_size) * self.kv_dim
    }

    /// Checks a window table holds, in existing window-group blocks, every position a chunk
    /// from `start` to `len` attends (from `start + 1 - window`: earlier entries may be
    /// dropped).
    pub fn check_window_table(&self, table: &[u32], start: usize, len: usize) -> Result<()> {
        let first = (start + 1).saturating_sub(self.window);
        let need = len.div_ceil(self.block_size);
        if table.len() < need {
            return Err(Error::Other(format!(
                "window table has {} blocks, {len} positions need {need}",
                table.len()
            )));
        }
        if let Some(b) = table[first / self.block_size..need]
            .iter()
            .find(|&&b| b as usize >= self.window_blocks)
        {
            return Err(Error::Other(format!(
                "window block {b} does not exist or was dropped (window group has {})",
                self.window_blocks
            )));
        }
        Ok(())
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

    /// Layer `layer`'s K and V buffers, as stored.
    pub fn layer(&self, layer: usize) -> (KvRows<'_>, KvRows<'_>) {
        (self.k[layer].rows(), self.v[layer].rows())
    }

    /// Stores one position's K and V (all this storage's heads: `kv_dim` values each) at
    /// element offset `off` of layer `layer` (converted to the storage's dtype).
    pub fn write(&mut self, layer: usize, off: usize, k: &[f32], v: &[f32]) {
        assert!(k.len() == self.kv_dim && v.len() == self.kv_dim);
        self.k[layer].write(off, k);
        self.v[layer].write(off, v);
    }

    /// Copies one block's contents (every layer outside the window group) to another:
    /// copy-on-write for shared prefixes.
    pub fn copy_block(&mut self, from: u32, to: u32) {
        let n = self.block_size * self.kv_dim;
        let (f, t) = (from as usize * n, to as usize * n);
        let groups = &self.window_layers;
        for (l, (k, v)) in self.k.iter_mut().zip(&mut self.v).enumerate() {
            if groups.get(l).copied().unwrap_or(false) {
                continue;
            }
            k.copy_within(f..f + n, t);
            v.copy_within(f..f + n, t);
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
        let e = KvStorage::with_dtype(30, 576, 16, 1 << 40, KvDtype::F16)
            .err()
            .unwrap();
        assert!(e.to_string().contains("cannot allocate"), "{e}");
    }

    #[test]
    fn f16_storage_halves_the_bytes_and_rounds_on_write() {
        let a = KvStorage::new(2, 3, 4, 5).unwrap();
        let mut b = KvStorage::with_dtype(2, 3, 4, 5, KvDtype::F16).unwrap();
        assert_eq!(a.bytes(), 2 * b.bytes());
        assert_eq!(b.dtype(), KvDtype::F16);
        let off = b.offset(&[3, 1], 6);
        b.write(1, off, &[1.0, 1.0 / 3.0, -7e4], &[0.5, 1e-8, 2.0]);
        let KvRows::F16(k) = b.layer(1).0 else {
            panic!("f16 storage gives f32 rows")
        };
        let got: Vec<f32> = k[off..off + 3].iter().map(|x| x.to_f32()).collect();
        assert_eq!(
            got,
            [1.0, f16::from_f32(1.0 / 3.0).to_f32(), -f16::MAX.to_f32()]
        );
        b.copy_block(1, 0);
        let KvRows::F16(k) = b.layer(1).0 else {
            unreachable!()
        };
        assert_eq!(k[off - 4 * 3].to_f32(), 1.0);
        assert_eq!("f16".parse::<KvDtype>(), Ok(KvDtype::F16));
        assert!("bf16"
            .parse::<KvDtype>()
            .unwrap_err()
            .contains("f32 or f16"));
    }
}
