//! Behaviour of the block pool and the per-sequence tables, through the public API.

use proptest::prelude::*;
use tessera_kv::{BlockPool, KvError, KvManager};

const BS: usize = 4;

fn toks(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32).map(|i| seed * 1000 + i).collect()
}

#[test]
fn pool_allocates_each_block_once_and_counts() {
    let mut p = BlockPool::new(5, BS).unwrap();
    assert_eq!((p.capacity(), p.free(), p.used(), p.cached()), (5, 5, 0, 0));
    let a = p.allocate(3).unwrap();
    let b = p.allocate(2).unwrap();
    let mut all: Vec<u32> = a.iter().chain(&b).copied().collect();
    all.sort();
    assert_eq!(all, [0, 1, 2, 3, 4]);
    assert_eq!(p.used(), 5);
    assert_eq!(
        p.allocate(1),
        Err(KvError::OutOfBlocks {
            needed: 1,
            available: 0
        })
    );
    for x in a {
        p.release(x).unwrap();
    }
    assert_eq!((p.free(), p.used()), (3, 2));
    p.check().unwrap();
    assert!(
        p.release(0).is_err(),
        "double release is reported, not absorbed"
    );
    assert!(p.incref(0).is_err(), "free blocks cannot be shared");
}

#[test]
fn pool_rejects_bad_config() {
    assert!(matches!(
        BlockPool::new(4, 0),
        Err(KvError::InvalidConfig { .. })
    ));
}

#[test]
fn allocation_is_all_or_nothing() {
    let mut kv = KvManager::new(4, BS, true).unwrap();
    kv.admit(1, None, &[], 8).unwrap();
    assert_eq!(kv.block_table(1).unwrap().len(), 2);
    let err = kv.allocate_for(1, 8 + 3 * BS).unwrap_err();
    assert_eq!(
        err,
        KvError::OutOfBlocks {
            needed: 3,
            available: 2
        }
    );
    assert_eq!(kv.block_table(1).unwrap().len(), 2, "no partial growth");
    assert!(kv.admit(2, None, &[], 3 * BS).is_err());
    assert!(!kv.has_seq(2), "failed admission leaves no table");
    kv.allocate_for(1, 9).unwrap();
    assert_eq!(kv.block_table(1).unwrap().len(), 3);
    kv.allocate_for(1, 5).unwrap();
    assert_eq!(kv.block_table(1).unwrap().len(), 3, "never shrinks");
    kv.check().unwrap();
    kv.free_seq(1).unwrap();
    assert_eq!(kv.pool().used(), 0);
    assert_eq!(kv.free_seq(1), Err(KvError::UnknownSeq { seq: 1 }));
    assert_eq!(kv.allocate_for(9, 1), Err(KvError::UnknownSeq { seq: 9 }));
    kv.check().unwrap();
}

/// Admits `seq` for all of `tokens`, "computes" them and commits; returns cached tokens.
fn run_prompt(kv: &mut KvManager, seq: u64, ns: Option<u64>, tokens: &[u32]) -> usize {
    let cached = kv.admit(seq, ns, tokens, tokens.len()).unwrap();
    kv.check_write(seq, cached, tokens.len()).unwrap();
    kv.commit_full_blocks(seq, tokens).unwrap();
    kv.check().unwrap();
    cached
}

#[test]
fn shared_prefix_reuses_physical_blocks() {
    let mut kv = KvManager::new(16, BS, true).unwrap();
    let prefix = toks(3 * BS, 7);
    let mut a = prefix.clone();
    a.extend([1, 2]);
    let mut b = prefix.clone();
    b.extend([3, 4, 5]);
    assert_eq!(run_prompt(&mut kv, 1, None, &a), 0);
    assert_eq!(kv.peek_prefix(None, &b), 3 * BS);
    assert_eq!(run_prompt(&mut kv, 2, None, &b), 3 * BS);
    let (ta, tb) = (kv.block_table(1).unwrap(), kv.block_table(2).unwrap());
    assert_eq!(ta[..3], tb[..3]);
    assert_ne!(ta[3], tb[3], "the partial last block is private");
    for &blk in &ta[..3] {
        assert_eq!(kv.pool().ref_count(blk), 2);
    }
    // Decode writes go to each sequence's own last block, never a shared one.
    kv.check_write(1, a.len(), a.len() + 1).unwrap();
    kv.check_write(2, b.len(), b.len() + 1).unwrap();
    assert!(matches!(
        kv.check_write(2, 0, 1),
        Err(KvError::ImmutableWrite { index: 0, .. })
    ));
    let m = kv.metrics();
    assert_eq!(m.prefix_hit_tokens, 3 * BS as u64);
    assert_eq!(m.prefix_query_tokens, (a.len() + b.len()) as u64);
    assert_eq!(m.blocks_used, 5);
}

#[test]
fn fully_cached_prompt_backs_off_one_block() {
    let mut kv = KvManager::new(16, BS, true).unwrap();
    let p = toks(2 * BS, 3);
    run_prompt(&mut kv, 1, None, &p);
    kv.free_seq(1).unwrap();
    assert_eq!(kv.pool().cached(), 2);
    // The whole prompt is cached, yet the last block is recomputed: one token must remain.
    assert_eq!(kv.peek_prefix(None, &p), BS);
    assert_eq!(run_prompt(&mut kv, 2, None, &p), BS);
    // One token more and both blocks are reusable.
    let mut q = p.clone();
    q.push(99);
    assert_eq!(kv.peek_prefix(None, &q), 2 * BS);
    kv.check().unwrap();
}

#[test]
fn namespaces_never_share() {
    let mut kv = KvManager::new(16, BS, true).unwrap();
    let p = toks(3 * BS, 1);
    run_prompt(&mut kv, 1, Some(10), &p);
    assert_eq!(kv.peek_prefix(Some(11), &p), 0);
    assert_eq!(kv.peek_prefix(None, &p), 0);
    assert_eq!(kv.peek_prefix(Some(10), &p), 2 * BS);
    assert_eq!(run_prompt(&mut kv, 2, Some(11), &p), 0);
    let (t1, t2) = (kv.block_table(1).unwrap(), kv.block_table(2).unwrap());
    assert!(t1.iter().all(|b| !t2.contains(b)));
}

#[test]
fn different_prefix_same_block_tokens_do_not_match() {
    let mut kv = KvManager::new(16, BS, true).unwrap();
    let mut a = toks(BS, 1);
    a.extend(toks(BS, 2));
    a.push(0);
    let mut b = toks(BS, 3);
    b.extend(toks(BS, 2));
    b.push(0);
    run_prompt(&mut kv, 1, None, &a);
    assert_eq!(
        kv.peek_prefix(None, &b),
        0,
        "second block matches only under its parent"
    );
}

#[test]
fn cached_blocks_are_evicted_lru_after_free_ones() {
    let mut kv = KvManager::new(4, BS, true).unwrap();
    let p = toks(2 * BS + 1, 5);
    run_prompt(&mut kv, 1, None, &p);
    kv.free_seq(1).unwrap();
    assert_eq!((kv.pool().free(), kv.pool().cached()), (2, 2));
    // Free blocks go first: the cached prefix survives a 2-block allocation.
    kv.admit(2, None, &[], 2 * BS).unwrap();
    assert_eq!(kv.peek_prefix(None, &p), 2 * BS);
    assert_eq!(kv.metrics().evictions, 0);
    // The next allocation must evict; the tail block (released first) goes before its parent.
    kv.allocate_for(2, 3 * BS).unwrap();
    assert_eq!(kv.metrics().evictions, 1);
    assert_eq!(kv.peek_prefix(None, &p), BS);
    kv.check().unwrap();
    kv.allocate_for(2, 4 * BS).unwrap();
    assert_eq!(kv.peek_prefix(None, &p), 0);
    assert_eq!(kv.pool().available(), 0);
    kv.check().unwrap();
}

#[test]
fn a_hit_on_a_cached_block_takes_it_out_of_the_lru() {
    let mut kv = KvManager::new(3, BS, true).unwrap();
    let p = toks(2 * BS + 1, 5);
    run_prompt(&mut kv, 1, None, &p);
    kv.free_seq(1).unwrap();
    // 2 cached + 1 free. Admission reusing both cached blocks needs 1 new block: fits.
    assert_eq!(kv.admit(2, None, &p, p.len()).unwrap(), 2 * BS);
    assert_eq!(kv.pool().available(), 0);
    kv.check().unwrap();
    kv.free_seq(2).unwrap();
    // 17 positions = 5 blocks: 2 reused + 3 new, but only 1 block is left once the hits are held.
    let err = kv.admit(3, None, &p, p.len() + 2 * BS).unwrap_err();
    assert_eq!(
        err,
        KvError::OutOfBlocks {
            needed: 3,
            available: 1
        }
    );
    assert_eq!(kv.pool().cached(), 2, "the failed admission held nothing");
    kv.check().unwrap();
}

#[test]
fn duplicate_content_is_registered_once() {
    let mut kv = KvManager::new(8, BS, true).unwrap();
    let p = toks(BS + 1, 4);
    // Both admitted before either commits: identical blocks computed twice.
    kv.admit(1, None, &p, p.len()).unwrap();
    kv.admit(2, None, &p, p.len()).unwrap();
    assert_eq!(kv.commit_full_blocks(1, &p).unwrap(), 1);
    assert_eq!(kv.commit_full_blocks(2, &p).unwrap(), 0);
    kv.check().unwrap();
    kv.free_seq(2).unwrap();
    assert_eq!(
        kv.pool().cached(),
        0,
        "the unregistered duplicate went to the free list"
    );
    kv.free_seq(1).unwrap();
    assert_eq!(kv.pool().cached(), 1);
    kv.check().unwrap();
}

#[test]
fn commit_beyond_table_is_an_error() {
    let mut kv = KvManager::new(8, BS, true).unwrap();
    kv.admit(1, None, &[], BS).unwrap();
    let p = toks(2 * BS, 1);
    assert!(matches!(
        kv.commit_full_blocks(1, &p),
        Err(KvError::CommitBeyondTable { .. })
    ));
    assert_eq!(
        kv.admit(1, None, &[], 1),
        Err(KvError::SeqExists { seq: 1 })
    );
}

#[test]
fn prefix_caching_off_never_shares() {
    let mut kv = KvManager::new(8, BS, false).unwrap();
    let p = toks(2 * BS + 1, 1);
    run_prompt(&mut kv, 1, None, &p);
    assert_eq!(kv.peek_prefix(None, &p), 0);
    kv.free_seq(1).unwrap();
    assert_eq!((kv.pool().cached(), kv.pool().free()), (0, 8));
}

#[derive(Debug, Clone)]
enum Op {
    /// Admit a new sequence with prompt family `fam` and length `len`.
    Admit {
        fam: u32,
        len: usize,
        ns: bool,
    },
    /// Grow sequence number `i` (mod live) by `n` positions and commit what it computed.
    Grow {
        i: usize,
        n: usize,
    },
    Free {
        i: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u32..3, 1usize..20, any::<bool>()).prop_map(|(fam, len, ns)| Op::Admit { fam, len, ns }),
        (0usize..8, 1usize..9).prop_map(|(i, n)| Op::Grow { i, n }),
        (0usize..8).prop_map(|i| Op::Free { i }),
    ]
}

proptest! {
    /// Random admissions (from a few shared prompt families), growth and frees keep every
    /// invariant; writes only ever touch private blocks; everything returns at the end.
    #[test]
    fn random_workload_keeps_invariants(ops in proptest::collection::vec(op(), 1..80),
                                        blocks in 4usize..24) {
        let mut kv = KvManager::new(blocks, BS, true).unwrap();
        // Live sequences: (id, tokens computed so far).
        let mut live: Vec<(u64, Vec<u32>)> = Vec::new();
        let mut next = 0u64;
        let family = |fam: u32, len: usize| -> Vec<u32> { (0..len as u32).map(|i| fam * 100 + i).collect() };
        for o in ops {
            match o {
                Op::Admit { fam, len, ns } => {
                    let t = family(fam, len);
                    let ns = ns.then_some(fam as u64);
                    let before = kv.pool().available();
                    match kv.admit(next, ns, &t, t.len()) {
                        Ok(cached) => {
                            prop_assert!(cached < t.len());
                            prop_assert_eq!(cached % BS, 0);
                            kv.check_write(next, cached, t.len()).unwrap();
                            kv.commit_full_blocks(next, &t).unwrap();
                            live.push((next, t));
                            next += 1;
                        }
                        Err(KvError::OutOfBlocks { .. }) => {
                            prop_assert_eq!(kv.pool().available(), before);
                            prop_assert!(!kv.has_seq(next));
                        }
                        Err(e) => return Err(TestCaseError::fail(e.to_string())),
                    }
                }
                Op::Grow { i, n } if !live.is_empty() => {
                    let k = i % live.len();
                    let (id, ref mut t) = live[k];
                    let old = t.len();
                    match kv.allocate_for(id, old + n) {
                        Ok(()) => {
                            kv.check_write(id, old, old + n).unwrap();
                            t.extend((0..n as u32).map(|j| 7000 + id as u32 * 10 + j));
                            kv.commit_full_blocks(id, t).unwrap();
                        }
                        Err(KvError::OutOfBlocks { .. }) => {}
                        Err(e) => return Err(TestCaseError::fail(e.to_string())),
                    }
                }
                Op::Free { i } if !live.is_empty() => {
                    let (id, _) = live.remove(i % live.len());
                    kv.free_seq(id).unwrap();
                }
                _ => {}
            }
            kv.check().map_err(|e| TestCaseError::fail(e.to_string()))?;
            let p = kv.pool();
            prop_assert_eq!(p.free() + p.used() + p.cached(), p.capacity());
        }
        for (id, _) in live {
            kv.free_seq(id).unwrap();
        }
        kv.check().unwrap();
        prop_assert_eq!(kv.pool().used(), 0);
        prop_assert_eq!(kv.pool().available(), blocks);
    }
}
