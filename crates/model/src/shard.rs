//! Tensor-parallel sharding of a model's files over R ranks, as plain data.
//!
//! Heads are split by KV-head group (unevenly where R does not divide the groups: 3 groups on
//! 2 ranks give 2 + 1); where R exceeds the groups, KV heads are replicated and a group's
//! query heads split among the ranks sharing it. q/k/v and gate/up are column-parallel (each
//! rank holds the output rows of its heads or of its slice of the MLP), o and down are
//! row-parallel (each rank holds the input columns of its heads or slice, on block
//! boundaries, and produces a partial sum for the all-reduce), and the embedding and output
//! head are split by vocabulary. Quantized blocks stay quantized; norms are replicated.
//!
//! The MLP is cut on multiples of the down projection's block (256 weights for the K-quants
//! and IQ4_XS), unevenly where the blocks do not divide (35 blocks on 2 ranks: 18 + 17). A
//! row-parallel slice that still cannot start and end on whole blocks (o's columns when a
//! rank's heads are 448 wide and the format's blocks 256) is decoded to f32, its exact
//! values: results are unchanged on the exact path, the slice takes 4 bytes a weight, and
//! the loader says so ([`ShardNotes`]).

use std::collections::HashMap;
use std::ops::Range;

use tessera_core::{Error, Result, WeightTensor};
use tessera_formats::{ModelConfig, ModelFiles};
use tessera_lora::{LoraAdapter, Target};
use tessera_runtime::{split_range, split_range_aligned};

/// What one rank holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankShard {
    pub q_heads: Range<usize>,
    pub kv_heads: Range<usize>,
    /// Columns of the MLP's intermediate dimension.
    pub ff: Range<usize>,
    /// Rows of the vocabulary (embedding and output head).
    pub vocab: Range<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpLayout {
    pub ranks: Vec<RankShard>,
}

/// The MLP is split on multiples of at least this (the block of the 32-weight formats).
const FF_ALIGN: usize = 32;

impl TpLayout {
    /// The layout of `files` over `size` ranks: the MLP cut on whole blocks of its down
    /// projection where it has enough of them (else on 32 weights, see the module doc).
    pub fn for_files(files: &ModelFiles, size: usize) -> Result<Self> {
        let block = files
            .tensors
            .iter()
            .filter(|(name, _)| name.ends_with("ffn_down.weight"))
            .map(|(_, t)| t.dtype.block_len())
            .max()
            .unwrap_or(1)
            .max(FF_ALIGN);
        let align = if files.config.intermediate_size / block >= size {
            block
        } else {
            FF_ALIGN
        };
        Self::aligned(&files.config, size, align)
    }

    /// The layout of `cfg` over `size` ranks, or why it cannot be split that way.
    pub fn new(cfg: &tessera_formats::ModelConfig, size: usize) -> Result<Self> {
        Self::aligned(cfg, size, FF_ALIGN)
    }

    /// [`Self::new`] with the MLP cut on multiples of `ff_align`.
    pub fn aligned(
        cfg: &tessera_formats::ModelConfig,
        size: usize,
        ff_align: usize,
    ) -> Result<Self> {
        let (nh, g) = (cfg.n_heads, cfg.n_kv_heads);
        let gs = nh / g.max(1);
        if size == 0 || size > nh {
            return Err(Error::Config(format!(
                "tensor parallelism over {size} ranks: the model has {nh} attention heads"
            )));
        }
        if cfg.intermediate_size / ff_align.max(1) < size {
            return Err(Error::Config(format!(
                "tensor parallelism over {size} ranks: the MLP width {} has too few blocks",
                cfg.intermediate_size
            )));
        }
        let mut ranks = Vec::with_capacity(size);
        for r in 0..size {
            let (q_heads, kv_heads) = if size <= g {
                let kv = split_range(g, size, r);
                (kv.start * gs..kv.end * gs, kv)
            } else {
                // Ranks per group: split_range(size, g, group); find this rank's group.
                let group = (0..g)
                    .find(|&grp| split_range(size, g, grp).contains(&r))
                    .expect("every rank falls in a group");
                let ranks_of = split_range(size, g, group);
                let q = split_range(gs, ranks_of.len(), r - ranks_of.start);
                if q.is_empty() {
                    return Err(Error::Config(format!(
                        "tensor parallelism over {size} ranks: a KV group has only {gs} query heads"
                    )));
                }
                (group * gs + q.start..group * gs + q.end, group..group + 1)
            };
            ranks.push(RankShard {
                q_heads,
                kv_heads,
                ff: split_range_aligned(cfg.intermediate_size, size, r, ff_align.max(1)),
                vocab: split_range(cfg.vocab_size, size, r),
            });
        }
        Ok(TpLayout { ranks })
    }

    pub fn size(&self) -> usize {
        self.ranks.len()
    }
}

fn rows(t: &WeightTensor, r: Range<usize>) -> Result<WeightTensor> {
    t.slice_rows(r)
}

/// The row-parallel slices a rank had to decode to f32 (not on whole blocks of their format).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardNotes {
    /// `(tensor, its format, the f32 bytes its slice now takes)`.
    pub decoded: Vec<(String, tessera_core::DType, usize)>,
}

impl ShardNotes {
    /// One line for the loader's output, if anything was decoded.
    pub fn line(&self) -> Option<String> {
        if self.decoded.is_empty() {
            return None;
        }
        let bytes: usize = self.decoded.iter().map(|d| d.2).sum();
        let first = &self.decoded[0];
        Some(format!(
            "tensor parallelism: {} row-parallel slice(s) cannot be cut on whole blocks and run as f32 ({:.1} MB; e.g. {} {})",
            self.decoded.len(),
            bytes as f64 / 1e6,
            first.0,
            first.1
        ))
    }
}

/// Columns `c` of `t`: the stored blocks where `c` starts and ends on whole blocks, else the
/// slice decoded to its exact f32 values (noted in `notes`).
fn cols(t: &WeightTensor, c: Range<usize>, notes: &mut ShardNotes) -> Result<WeightTensor> {
    let bl = t.dtype.block_len();
    if c.start.is_multiple_of(bl) && c.end.is_multiple_of(bl) {
        return t.slice_cols(c);
    }
    if t.shape.len() != 2 || c.end > t.cols() || c.start > c.end {
        return t.slice_cols(c);
    }
    let mut row = vec![0f32; t.cols()];
    let mut out = Vec::with_capacity(t.rows() * c.len());
    for r in 0..t.rows() {
        t.dequantize_row(r, &mut row);
        out.extend_from_slice(&row[c.clone()]);
    }
    notes.decoded.push((
        t.name.clone(),
        t.dtype,
        out.len() * std::mem::size_of::<f32>(),
    ));
    Ok(WeightTensor::from_f32(
        t.name.clone(),
        vec![t.rows(), c.len()],
        &out,
    ))
}

/// Rank `rank`'s files: every split tensor sliced, the configuration's head counts and MLP
/// width made the rank's (the vocabulary size stays the model's).
pub fn shard_files(files: &ModelFiles, layout: &TpLayout, rank: usize) -> Result<ModelFiles> {
    shard_files_noted(files, layout, rank).map(|(f, _)| f)
}

/// [`shard_files`], with what had to be decoded to f32.
pub fn shard_files_noted(
    files: &ModelFiles,
    layout: &TpLayout,
    rank: usize,
) -> Result<(ModelFiles, ShardNotes)> {
    let mut notes = ShardNotes::default();
    let s = layout
        .ranks
        .get(rank)
        .ok_or_else(|| Error::Config(format!("rank {rank} outside the layout")))?;
    let c = &files.config;
    let hd = c.head_dim;
    let q = s.q_heads.start * hd..s.q_heads.end * hd;
    let kv = s.kv_heads.start * hd..s.kv_heads.end * hd;
    let mut tensors: HashMap<String, WeightTensor> = HashMap::with_capacity(files.tensors.len());
    for (name, t) in &files.tensors {
        let (stem, suffix) = name.rsplit_once('.').unwrap_or((name, ""));
        let proj = stem.rsplit_once('.').map_or(stem, |x| x.1);
        let sliced = match (proj, suffix) {
            ("attn_q", "weight") => rows(t, q.clone())?,
            ("attn_q", "bias") => bias(t, q.clone())?,
            ("attn_k" | "attn_v", "weight") => rows(t, kv.clone())?,
            ("attn_k" | "attn_v", "bias") => bias(t, kv.clone())?,
            ("attn_output", "weight") => cols(t, q.clone(), &mut notes)?,
            ("ffn_gate" | "ffn_up", "weight") => rows(t, s.ff.clone())?,
            ("ffn_down", "weight") => cols(t, s.ff.clone(), &mut notes)?,
            // A row-parallel product's bias is added once, by rank 0.
            ("attn_output" | "ffn_down", "bias") if rank > 0 => continue,
            ("token_embd" | "output", "weight") => rows(t, s.vocab.clone())?,
            _ => {
                tensors.insert(name.clone(), t.clone());
                continue;
            }
        };
        // The whole tensor's pages were read to slice it; give them back (a mapped file's
        // pages are faulted in again where this rank's slice is used), so a rank's resident
        // memory is its shard, not the model.
        t.bytes.release_pages();
        tensors.insert(name.clone(), sliced);
    }
    let config = rank_config(c, s);
    let files = ModelFiles {
        name: files.name.clone(),
        config,
        tensors,
        tokenizer: files.tokenizer.clone(),
    };
    Ok((files, notes))
}

/// The configuration of a rank holding `s` of a model of `c`: its head counts and MLP width
/// (the vocabulary size stays the model's).
fn rank_config(c: &ModelConfig, s: &RankShard) -> ModelConfig {
    let mut config = c.clone();
    config.n_heads = s.q_heads.len();
    config.n_kv_heads = s.kv_heads.len();
    config.intermediate_size = s.ff.len();
    config
}

/// Rank `rank`'s part of `adapter` (made for the whole model `cfg`), sharded like the base:
/// for the column-parallel projections (q, k, v, gate, up) the rows of B that give the
/// rank's output columns, A whole; for the row-parallel ones (o, down) the columns of A that
/// read the rank's input slice, B whole. A row-parallel delta `B (A_r x_r)` is then the
/// rank's share of `B (A x)`: it joins the base's partial sum before the all-reduce, with no
/// collective of its own.
pub fn shard_adapter(
    adapter: &LoraAdapter,
    cfg: &ModelConfig,
    layout: &TpLayout,
    rank: usize,
) -> Result<LoraAdapter> {
    let s = layout
        .ranks
        .get(rank)
        .ok_or_else(|| Error::Config(format!("rank {rank} outside the layout")))?;
    let hd = cfg.head_dim;
    let q = s.q_heads.start * hd..s.q_heads.end * hd;
    let kv = s.kv_heads.start * hd..s.kv_heads.end * hd;
    adapter.map_modules(&rank_config(cfg, s), |_, target, m| match target {
        Target::Q => m.slice_out(q.clone()),
        Target::K | Target::V => m.slice_out(kv.clone()),
        Target::Gate | Target::Up => m.slice_out(s.ff.clone()),
        Target::O => m.slice_in(q.clone()),
        Target::Down => m.slice_in(s.ff.clone()),
    })
}

fn bias(t: &WeightTensor, r: Range<usize>) -> Result<WeightTensor> {
    let v = t.to_f32_vec();
    let part = v
        .get(r.clone())
        .ok_or_else(|| Error::Other(format!("bias {} has no elements {r:?}", t.name)))?;
    Ok(WeightTensor::from_f32(
        t.name.clone(),
        vec![part.len()],
        part,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(nh: usize, nkv: usize) -> tessera_formats::ModelConfig {
        tessera_formats::ModelConfig {
            arch: tessera_formats::Arch::Llama,
            vocab_size: 1000,
            hidden_size: nh * 64,
            intermediate_size: 1536,
            n_layers: 1,
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: 64,
            rms_eps: 1e-5,
            rope_theta: 1e4,
            rope_dim: 64,
            rope_style: tessera_formats::RopeStyle::Interleaved,
            rope_scaling: tessera_formats::RopeScaling::None,
            max_position: 128,
            tie_embeddings: true,
            block: Default::default(),
        }
    }

    #[test]
    fn heads_split_by_kv_group_unevenly_and_replicate_beyond_the_groups() {
        let l = TpLayout::new(&cfg(9, 3), 2).unwrap();
        assert_eq!(l.ranks[0].kv_heads, 0..2);
        assert_eq!(l.ranks[0].q_heads, 0..6);
        assert_eq!(l.ranks[1].kv_heads, 2..3);
        assert_eq!(l.ranks[1].q_heads, 6..9);
        let l = TpLayout::new(&cfg(9, 3), 4).unwrap();
        let kv: Vec<_> = l.ranks.iter().map(|r| r.kv_heads.clone()).collect();
        assert_eq!(kv, vec![0..1, 0..1, 1..2, 2..3]);
        let q: Vec<_> = l.ranks.iter().map(|r| r.q_heads.clone()).collect();
        assert_eq!(q, vec![0..2, 2..3, 3..6, 6..9]);
        for size in 1..=9 {
            let l = TpLayout::new(&cfg(9, 3), size).unwrap();
            let heads: usize = l.ranks.iter().map(|r| r.q_heads.len()).sum();
            assert_eq!(heads, 9, "size {size}");
            let ff: usize = l.ranks.iter().map(|r| r.ff.len()).sum();
            assert_eq!(ff, 1536);
            assert!(l.ranks.iter().all(|r| r.ff.start % FF_ALIGN == 0));
            let v: usize = l.ranks.iter().map(|r| r.vocab.len()).sum();
            assert_eq!(v, 1000);
        }
        assert!(TpLayout::new(&cfg(9, 3), 10).is_err());
    }

    #[test]
    fn slices_off_block_boundaries_are_decoded_to_their_exact_values() {
        use tessera_core::{DType, TensorBytes};
        let (n, k) = (3, 512);
        let x: Vec<f32> = (0..n * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let bytes: Vec<u8> = x
            .chunks(k)
            .flat_map(|r| tessera_core::tensor::quantize_row(DType::Q4_K, r))
            .collect();
        let t =
            WeightTensor::new("w", DType::Q4_K, vec![n, k], TensorBytes::owned(&bytes)).unwrap();
        let mut notes = ShardNotes::default();
        let whole = cols(&t, 256..512, &mut notes).unwrap();
        assert_eq!((whole.dtype, notes.decoded.len()), (DType::Q4_K, 0));
        let cut = cols(&t, 64..448, &mut notes).unwrap();
        assert_eq!(cut.dtype, DType::F32);
        assert_eq!(
            notes.decoded,
            vec![("w".to_string(), DType::Q4_K, n * 384 * 4)]
        );
        let full = t.to_f32_vec();
        for r in 0..n {
            let mut got = vec![0f32; 384];
            cut.dequantize_row(r, &mut got);
            let want = &full[r * k + 64..r * k + 448];
            assert!(got
                .iter()
                .zip(want)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
        }
        assert!(notes.line().unwrap().contains("1 row-parallel slice"));
    }
}
