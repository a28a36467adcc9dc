//! Sizing the window group: the KV blocks a model's sliding-window layers keep apart, enough
//! for every running sequence's window.

use tessera_scheduler::{SchedulerConfig, WindowGroup};

use crate::Engine;

/// The window group for `engine`'s model under `cfg`: its sliding-window layers' KV in
/// blocks enough for every running sequence's window (and a quarter more for the prefix
/// cache), where that is fewer than the full cache's; `None` without windowed layers, under
/// tensor parallelism, or where it would save nothing.
pub fn window_group(engine: &Engine, cfg: &SchedulerConfig) -> Option<WindowGroup> {
    let g = window_group_for(
        engine,
        cfg.block_size,
        cfg.max_num_seqs,
        cfg.max_prefill_chunk.min(cfg.max_num_batched_tokens),
    )?;
    (g.num_blocks < cfg.num_blocks).then_some(g)
}

/// The window group `engine`'s model needs for `max_num_seqs` sequences computing chunks of
/// up to `chunk` positions (a quarter more for the prefix cache); `None` without windowed
/// layers or under tensor parallelism.
pub fn window_group_for(
    engine: &Engine,
    block_size: usize,
    max_num_seqs: usize,
    chunk: usize,
) -> Option<WindowGroup> {
    let window = engine.model.window()?;
    if engine.tp_size() > 1 {
        return None;
    }
    let g = WindowGroup {
        window,
        num_blocks: 0,
    };
    let per = g.blocks_per_seq(block_size, chunk);
    let blocks = per.saturating_mul(max_num_seqs).saturating_mul(5) / 4 + per;
    Some(WindowGroup {
        window,
        num_blocks: blocks,
    })
}
