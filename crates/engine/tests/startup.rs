//! The engine's own start-up guards: a KV cache beyond the memory or the allocator is an
//! error from `new_kv` (every command and the server allocate through it), not an abort.

use tessera_engine::{store, Engine, KV_BLOCK_SIZE};

#[test]
fn an_impossible_kv_cache_is_an_error() {
    let path = store::resolve_model(None).expect("default model (run `tessera pull`)");
    let e = Engine::load(&path, 1).unwrap();
    let per_block = e.kv_bytes_per_block(KV_BLOCK_SIZE);
    assert_eq!(
        per_block,
        2 * e.config.n_layers * KV_BLOCK_SIZE * e.config.kv_dim() * 4
    );
    // About 50 PB, and a count whose size overflows.
    for blocks in [(1usize << 56) / per_block, usize::MAX / 2] {
        let err = e.new_kv(KV_BLOCK_SIZE, blocks).err().expect("refused");
        let msg = err.to_string();
        assert!(
            msg.contains("memory is available")
                || msg.contains("cannot allocate")
                || msg.contains("overflows"),
            "{msg}"
        );
    }
    assert_eq!(e.new_kv(KV_BLOCK_SIZE, 4).unwrap()[0].num_blocks(), 4);
}
