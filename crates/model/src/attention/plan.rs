//! The attention's work items and their static assignment to compute units, as plain data.
//!
//! A tile is up to [`TILE_TOKENS`] consecutive rows of one sequence; an item is a tile
//! against one KV head, or — for a tile whose keys alone would keep a unit busy while the
//! others idle (a long decode) — against one segment of that head's keys
//! ([`tessera_kernels::attn::SEGMENT`]), its partial results merged afterwards. Items go
//! longest first onto the least loaded unit. None of this changes any result: the kernel's
//! arithmetic for a row is the same whole or in segments, in any tile, on any unit.

use std::ops::Range;

use tessera_kernels::attn::{partial_len, SEGMENT};

use crate::prepared::PreparedBatch;

/// Most tokens of one sequence in a query tile.
pub const TILE_TOKENS: usize = 16;

/// A work item: rows `rows` (of the step, one sequence's) against KV head `kvh`, all their
/// keys or one segment of a [`Split`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Item {
    pub rows: Range<usize>,
    pub kvh: usize,
    /// Keys attended, summed over the rows.
    pub cost: usize,
    /// `(split, segment)`: this item is segment `segment` of `splits[split]`.
    pub part: Option<(usize, usize)>,
}

/// A (tile, KV head) computed in segments: where its partial results go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Split {
    pub rows: Range<usize>,
    pub kvh: usize,
    /// The first segment with keys a row attends (past 0 in a window).
    pub first: usize,
    pub segments: usize,
    /// Offset of segment `first`'s partials in the partial buffer; segment `first + s`
    /// follows at `offset + s · query rows · partial_len`.
    pub offset: usize,
}

/// The items each unit runs, the splits to merge after, and the partial buffer's length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Work {
    pub per_unit: Vec<Vec<Item>>,
    pub splits: Vec<Split>,
    pub partial_floats: usize,
}

/// Tokens per tile: [`TILE_TOKENS`], fewer when the rows would give the units too few
/// items to share.
fn tile_tokens(rows: usize, kv_heads: usize, units: usize) -> usize {
    (rows * kv_heads / (4 * units.max(1))).clamp(1, TILE_TOKENS)
}

/// The work of attention over `rows` with `kv_heads` KV heads of `group` query heads of
/// `head_dim` each, each row attending its last `window` keys (all, if `None`), on `units`
/// units.
pub(crate) fn assign(
    batch: &PreparedBatch,
    rows: Range<usize>,
    kv_heads: usize,
    group: usize,
    head_dim: usize,
    window: Option<usize>,
    units: usize,
) -> Work {
    let units = units.max(1);
    let tile = tile_tokens(rows.len(), kv_heads, units);
    let mut tiles = Vec::new();
    let mut r = rows.start;
    while r < rows.end {
        let seq = batch.row_seq[r];
        let mut end = r + 1;
        while end < rows.end && end - r < tile && batch.row_seq[end] == seq {
            end += 1;
        }
        tiles.push(r..end);
        r = end;
    }
    let limits = |t: &Range<usize>| batch.positions[t.clone()].iter().map(|&p| p + 1);
    let start = |n: usize| window.map_or(0, |w| n.saturating_sub(w));
    let cost = |t: &Range<usize>| -> usize { limits(t).map(|n| n - start(n)).sum() };
    let total: usize = tiles.iter().map(cost).sum::<usize>() * kv_heads;
    // A tile worth more than half a unit's fair share is cut into segments.
    let big = total / (2 * units);
    let (mut items, mut splits, mut floats) = (Vec::new(), Vec::new(), 0);
    for t in tiles {
        let c = cost(&t);
        let max_n = limits(&t).max().unwrap_or(0);
        let first = limits(&t).map(start).min().unwrap_or(0) / SEGMENT;
        for kvh in 0..kv_heads {
            if units > 1 && c > big && max_n.div_ceil(SEGMENT) > first + 1 {
                let segments = max_n.div_ceil(SEGMENT) - first;
                for s in first..first + segments {
                    let (lo, hi) = (s * SEGMENT, (s + 1) * SEGMENT);
                    let cost = limits(&t)
                        .map(|n| n.clamp(lo, hi).saturating_sub(start(n).clamp(lo, hi)))
                        .sum();
                    items.push(Item {
                        rows: t.clone(),
                        kvh,
                        cost,
                        part: Some((splits.len(), s)),
                    });
                }
                splits.push(Split {
                    rows: t.clone(),
                    kvh,
                    first,
                    segments,
                    offset: floats,
                });
                floats += segments * t.len() * group * partial_len(head_dim);
            } else {
                items.push(Item {
                    rows: t.clone(),
                    kvh,
                    cost: c,
                    part: None,
                });
            }
        }
    }
    items.sort_by_key(|it| std::cmp::Reverse(it.cost));
    let mut per_unit: Vec<Vec<Item>> = vec![Vec::new(); units];
    let mut load = vec![0usize; units];
    for it in items {
        let u = (0..units).min_by_key(|&u| load[u]).expect("a unit");
        load[u] += it.cost;
        per_unit[u].push(it);
    }
    Work {
        per_unit,
        splits,
        partial_floats: floats,
    }
}
