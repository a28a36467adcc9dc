//! The window group: a sequence holds window blocks only for the positions it still attends,
//! prefix hits reuse cached window blocks and are cut back where they were evicted, and the
//! invariants hold throughout.

use proptest::prelude::*;
use tessera_kv::{KvError, KvManager, DROPPED};

const BS: usize = 4;

fn toks(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32).map(|i| seed * 1000 + i).collect()
}

/// Runs `tokens` through `seq` in chunks of `chunk` as a scheduler would: slide, grow,
/// check the write, commit; returns the most window blocks it held at once.
fn run(kv: &mut KvManager, seq: u64, tokens: &[u32], start: usize, chunk: usize) -> usize {
    let mut most = 0;
    let mut pos = start;
    while pos < tokens.len() {
        let end = (pos + chunk).min(tokens.len());
        kv.slide(seq, pos).unwrap();
        kv.allocate_for(seq, end).unwrap();
        kv.check_write(seq, pos, end).unwrap();
        let held = kv
            .window_table(seq)
            .unwrap()
            .iter()
            .filter(|&&b| b != DROPPED)
            .count();
        most = most.max(held);
        kv.commit_full_blocks(seq, &tokens[..end]).unwrap();
        kv.check().unwrap();
        pos = end;
    }
    most
}

#[test]
fn a_long_sequence_holds_only_its_window() {
    let w = 10;
    let mut kv = KvManager::with_window(64, BS, true, w, 16).unwrap();
    let t = toks(200, 1);
    kv.admit(1, None, &t, 8).unwrap();
    let most = run(&mut kv, 1, &t, 0, 8);
    // Keys from pos + 1 - w for a chunk of 8: at most ⌈(w - 1 + 8) / bs⌉ + 1 blocks.
    assert!(most <= (w - 1 + 8).div_ceil(BS) + 1, "held {most}");
    let table = kv.window_table(1).unwrap();
    assert_eq!(table.len(), 50);
    assert!(table[..45].iter().all(|&b| b == DROPPED));
    kv.free_seq(1).unwrap();
    kv.check().unwrap();
}

#[test]
fn prefix_hits_reuse_window_blocks_and_stop_where_they_were_evicted() {
    let w = 6;
    let mut kv = KvManager::with_window(64, BS, true, w, 8).unwrap();
    let prompt = toks(40, 2);
    kv.admit(1, None, &prompt, 4).unwrap();
    run(&mut kv, 1, &prompt, 0, 4);
    kv.free_seq(1).unwrap();
    // The same prompt again: all full blocks but the last are hits (39 tokens: 9 blocks);
    // the window blocks of positions 31..36 (indices 7 and 8) are still cached.
    assert_eq!(kv.peek_prefix(None, &prompt), 36);
    assert_eq!(kv.admit(2, None, &prompt, 40).unwrap(), 36);
    let t = kv.window_table(2).unwrap();
    assert!(t[..7].iter().all(|&b| b == DROPPED) && t[7..].iter().all(|&b| b != DROPPED));
    kv.check().unwrap();
    kv.free_seq(2).unwrap();
    // Another sequence fills the window pool, evicting those cached window blocks: the hit
    // is cut back to where the window group still has what the next position attends.
    kv.admit(3, None, &toks(32, 3), 32).unwrap();
    assert_eq!(kv.peek_prefix(None, &prompt), 0);
    kv.free_seq(3).unwrap();
    kv.check().unwrap();
}

#[test]
fn the_window_pool_bounds_admission() {
    let mut kv = KvManager::with_window(64, BS, false, 4, 3).unwrap();
    assert!(matches!(
        kv.admit(1, None, &toks(16, 4), 16),
        Err(KvError::OutOfBlocks { .. })
    ));
    // Nothing changed: the full group gave its blocks back.
    assert_eq!(kv.metrics().blocks_used, 0);
    kv.admit(1, None, &toks(16, 4), 8).unwrap();
    assert!(matches!(
        kv.allocate_for(1, 16),
        Err(KvError::OutOfBlocks { .. })
    ));
    kv.slide(1, 8).unwrap();
    kv.allocate_for(1, 16).unwrap();
    kv.check().unwrap();
}

proptest! {
    /// Any interleaving of sequences, chunks and frees keeps every invariant and always
    /// holds the window blocks a sequence still attends.
    #[test]
    fn invariants_hold(
        w in 1usize..20,
        ops in proptest::collection::vec((0u64..4, 1usize..60, 1usize..9, 0u32..3), 1..12),
    ) {
        let mut kv = KvManager::with_window(400, BS, true, w, 400).unwrap();
        for (seq, len, chunk, seed) in ops {
            if kv.has_seq(seq) {
                kv.free_seq(seq).unwrap();
                continue;
            }
            let t = toks(len, seed);
            let cached = kv.admit(seq, None, &t, len.min(chunk)).unwrap();
            run(&mut kv, seq, &t, cached, chunk);
            let table = kv.window_table(seq).unwrap();
            let last = len - 1;
            let first = (last + 1).saturating_sub(w) / BS;
            prop_assert!(table[first..].iter().all(|&b| b != DROPPED), "a needed window block is missing");
        }
        kv.check().unwrap();
    }
}
