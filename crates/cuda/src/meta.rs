//! One step's batch as the kernels read it: the prepared batch's per-row arrays (token,
//! position, KV slot, where its block table starts), the block tables, and the rows that
//! want logits, packed as `u32`s into one buffer so that a step uploads its metadata in one
//! copy. The batch is validated and laid out by the CPU path's own
//! [`PreparedBatch::prepare`]; this only packs it.

use std::ops::Range;

use tessera_model::PreparedBatch;

use crate::CudaError;

/// The packed metadata and where each array lies in it (in `u32`s).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepMeta {
    pub data: Vec<u32>,
    pub tokens: Range<usize>,
    pub positions: Range<usize>,
    pub slots: Range<usize>,
    /// Per row, the offset of its sequence's block table in `tables`.
    pub row_table: Range<usize>,
    pub tables: Range<usize>,
    pub logit_rows: Range<usize>,
}

impl StepMeta {
    /// Packs `b`; a value past `u32` (a KV slot of a cache over 2^32 values a layer) is an
    /// error.
    pub fn pack(b: &PreparedBatch) -> Result<Self, CudaError> {
        let mut m = StepMeta::default();
        let too_big = |what: &str, v: usize| CudaError::Unsupported {
            what: format!("{what} {v} does not fit the kernels' 32-bit indices"),
        };
        let put = |data: &mut Vec<u32>, vals: &mut dyn Iterator<Item = usize>, what: &str| {
            let start = data.len();
            for v in vals {
                data.push(u32::try_from(v).map_err(|_| too_big(what, v))?);
            }
            Ok::<_, CudaError>(start..data.len())
        };
        let d = &mut m.data;
        m.tokens = put(d, &mut b.tokens.iter().map(|&t| t as usize), "token")?;
        m.positions = put(d, &mut b.positions.iter().copied(), "position")?;
        m.slots = put(d, &mut b.kv_slots.iter().copied(), "KV slot")?;
        m.row_table = put(
            d,
            &mut b.row_seq.iter().map(|&s| b.seqs[s as usize].table.start),
            "table offset",
        )?;
        m.tables = put(d, &mut b.tables.iter().map(|&t| t as usize), "block")?;
        m.logit_rows = put(d, &mut b.logit_rows.iter().copied(), "row")?;
        Ok(m)
    }

    /// Rows of the step.
    pub fn rows(&self) -> usize {
        self.tokens.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_model::{BatchMeta, KvStorage, LogitsFor, SeqChunk};

    #[test]
    fn packs_every_array_with_each_row_pointing_at_its_table() {
        // The geometry alone: no layers, so nothing is allocated.
        let kv = KvStorage::new(0, 8, 4, 16).unwrap();
        let batch = BatchMeta {
            seqs: vec![
                SeqChunk::new(vec![5, 6, 7], 0, vec![3], LogitsFor::All),
                SeqChunk::new(vec![9], 5, vec![1, 2], LogitsFor::Last),
            ],
        };
        let mut p = PreparedBatch::default();
        p.prepare(&batch, &kv, 64, 10, 0).unwrap();
        let m = StepMeta::pack(&p).unwrap();
        let at = |r: &Range<usize>| m.data[r.clone()].to_vec();
        assert_eq!(m.rows(), 4);
        assert_eq!(at(&m.tokens), [5, 6, 7, 9]);
        assert_eq!(at(&m.positions), [0, 1, 2, 5]);
        // Slot = (block * block_size + pos % block_size) * kv_dim.
        assert_eq!(at(&m.slots), [96, 104, 112, 72]);
        assert_eq!(at(&m.tables), [3, 1, 2]);
        assert_eq!(at(&m.row_table), [0, 0, 0, 1]);
        assert_eq!(at(&m.logit_rows), [0, 1, 2, 3]);
    }

    #[test]
    fn values_past_32_bits_are_errors() {
        let mut p = PreparedBatch {
            tokens: vec![1],
            positions: vec![0],
            kv_slots: vec![1 << 33],
            row_seq: vec![0],
            ..Default::default()
        };
        p.seqs.push(tessera_model::prepared::PreparedSeq {
            rows: 0..1,
            table: 0..0,
            window: 0..0,
        });
        let e = StepMeta::pack(&p).unwrap_err().to_string();
        assert!(e.contains("KV slot"), "{e}");
    }
}
