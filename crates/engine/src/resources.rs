//! Start-up resource checks, shared by every command that runs a model: compute threads
//! against the cores this process may use ([`choose_threads`]), the KV cache against the
//! memory the machine has left ([`check_memory`], called by `Engine::new_kv`), and the
//! context length against what the KV cache holds ([`size_kv`]).
//!
//! Each refuses with an error naming the flag to change, or adjusts and returns a note for
//! the caller to print, instead of failing later (an allocation abort, a request that
//! passed the context check failing for lack of blocks, a hundredfold slowdown from more
//! threads than cores).

use tessera_core::{Error, Result};

/// Cores this process may run on (its CPU affinity and cgroup quota included).
pub fn available_cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Compute threads for `requested` (`None`: every available core). More than the available
/// cores is clamped to them with a note, unless `force`.
pub fn choose_threads(requested: Option<usize>, force: bool) -> Result<(usize, Option<String>)> {
    threads_on(requested, force, available_cores())
}

fn threads_on(
    requested: Option<usize>,
    force: bool,
    cores: usize,
) -> Result<(usize, Option<String>)> {
    match requested {
        None => Ok((cores, None)),
        Some(0) => Err(Error::Config("--threads must be at least 1".into())),
        Some(n) if n > cores && !force => Ok((
            cores,
            Some(format!(
                "--threads {n} is more than the {cores} cores available; using {cores} \
                 (threads beyond the cores wait on each other; --force-threads keeps {n})"
            )),
        )),
        Some(n) => Ok((n, None)),
    }
}

/// Bytes of memory this process can still allocate, if the system says: Linux's
/// `MemAvailable`, lowered to what the process's cgroup (v2 or v1) has left. `None`
/// elsewhere (the allocation itself is still fallible there).
pub fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let mut avail = meminfo.as_deref().and_then(mem_available);
    if let Some(left) = cgroup_left() {
        avail = Some(avail.map_or(left, |a| a.min(left)));
    }
    avail
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

fn read_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Memory the process's cgroup still allows (limit minus usage), when it has a limit.
fn cgroup_left() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok();
    let v2_path = own
        .as_deref()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("0::")))
        .unwrap_or("/");
    for dir in [
        format!("/sys/fs/cgroup{}", v2_path.trim_end_matches('/')),
        "/sys/fs/cgroup".into(),
    ] {
        if let Some(max) = read_u64(&format!("{dir}/memory.max")) {
            let used = read_u64(&format!("{dir}/memory.current")).unwrap_or(0);
            return Some(max.saturating_sub(used));
        }
    }
    let max = read_u64("/sys/fs/cgroup/memory/memory.limit_in_bytes")?;
    // v1 reports "no limit" as a huge number.
    if max >= 1 << 60 {
        return None;
    }
    let used = read_u64("/sys/fs/cgroup/memory/memory.usage_in_bytes").unwrap_or(0);
    Some(max.saturating_sub(used))
}

fn mb(bytes: u64) -> String {
    format!("{:.0} MB", bytes as f64 / 1e6)
}

/// Refuses `bytes` for `what` when the machine has less memory available.
pub fn check_memory(bytes: u64, what: &str, hint: &str) -> Result<()> {
    check_memory_against(bytes, available_memory(), what, hint)
}

fn check_memory_against(bytes: u64, avail: Option<u64>, what: &str, hint: &str) -> Result<()> {
    match avail {
        Some(a) if bytes > a => Err(Error::Config(format!(
            "{what} needs {} but only {} of memory is available{hint}",
            mb(bytes),
            mb(a)
        ))),
        _ => Ok(()),
    }
}

/// What the KV flags of a server ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvRequest {
    /// Blocks, when given outright (`--kv-blocks`).
    pub blocks: Option<usize>,
    /// Otherwise a budget in MiB (`--kv-memory-mb`).
    pub memory_mb: usize,
    /// The context asked for (`--max-model-len`); `None`: the model's, at most
    /// `default_context`.
    pub max_model_len: Option<usize>,
    pub default_context: usize,
}

/// The KV cache and context a server runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvSizing {
    pub num_blocks: usize,
    pub bytes: u64,
    pub max_model_len: usize,
    /// Set when the context was lowered to what the cache holds.
    pub note: Option<String>,
}

/// Sizes the KV cache (blocks of `block_size` positions, `bytes_per_block` each) and the
/// context for a model of `model_context` positions. The cache must fit the available
/// memory; the context must fit the cache, so that every prompt the context admits finds
/// its blocks: a context asked for beyond it is refused, the default one is lowered to it
/// with a note.
pub fn size_kv(
    req: &KvRequest,
    bytes_per_block: usize,
    block_size: usize,
    model_context: usize,
) -> Result<KvSizing> {
    size_kv_with(
        req,
        bytes_per_block,
        block_size,
        model_context,
        available_memory(),
    )
}

fn size_kv_with(
    req: &KvRequest,
    bytes_per_block: usize,
    block_size: usize,
    model_context: usize,
    avail: Option<u64>,
) -> Result<KvSizing> {
    let per_block = bytes_per_block.max(1) as u64;
    let num_blocks = match req.blocks {
        Some(b) => b,
        None => {
            let budget = (req.memory_mb as u64).checked_mul(1 << 20).ok_or_else(|| {
                Error::Config(format!("--kv-memory-mb {} is out of range", req.memory_mb))
            })?;
            usize::try_from(budget / per_block).unwrap_or(usize::MAX)
        }
    };
    if num_blocks == 0 {
        return Err(Error::Config(format!(
            "the KV cache holds no block: one block of {block_size} positions takes {} bytes \
             (raise --kv-memory-mb or --kv-blocks)",
            per_block
        )));
    }
    let bytes = (num_blocks as u64)
        .checked_mul(per_block)
        .ok_or_else(|| Error::Config(format!("--kv-blocks {num_blocks} is out of range")))?;
    check_memory_against(
        bytes,
        avail,
        &format!("a KV cache of {num_blocks} blocks"),
        " (lower --kv-memory-mb or --kv-blocks)",
    )?;
    let holds = num_blocks.saturating_mul(block_size);
    let (max_model_len, note) = match req.max_model_len {
        Some(0) => return Err(Error::Config("--max-model-len must be at least 1".into())),
        Some(n) if n > holds => {
            let need = (n.div_ceil(block_size) as u64).saturating_mul(per_block);
            return Err(Error::Config(format!(
                "--max-model-len {n} does not fit the KV cache, which holds {holds} positions \
                 ({num_blocks} blocks of {block_size}); give the cache at least {} \
                 (--kv-memory-mb {}) or lower --max-model-len",
                mb(need),
                need.div_ceil(1 << 20)
            )));
        }
        Some(n) => (n.min(model_context), None),
        None => {
            let want = model_context.min(req.default_context);
            if want > holds {
                let note = format!(
                    "context lowered from {want} to {holds} positions: what the KV cache of \
                     {} holds (raise --kv-memory-mb for more)",
                    mb(bytes)
                );
                (holds, Some(note))
            } else {
                (want, None)
            }
        }
    };
    Ok(KvSizing {
        num_blocks,
        bytes,
        max_model_len,
        note,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_beyond_the_cores_are_clamped_unless_forced() {
        assert_eq!(threads_on(None, false, 2).unwrap(), (2, None));
        assert_eq!(threads_on(Some(1), false, 2).unwrap(), (1, None));
        let (n, note) = threads_on(Some(16), false, 2).unwrap();
        assert_eq!(n, 2);
        assert!(note
            .unwrap()
            .contains("--threads 16 is more than the 2 cores"));
        assert_eq!(threads_on(Some(16), true, 2).unwrap(), (16, None));
        assert!(threads_on(Some(0), true, 2).is_err());
    }

    #[test]
    fn meminfo_is_read_in_bytes() {
        let text = "MemTotal:       16384 kB\nMemFree:    100 kB\nMemAvailable:    2048 kB\n";
        assert_eq!(mem_available(text), Some(2048 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
        // Whatever this machine is, the reading is plausible when there is one.
        if let Some(a) = available_memory() {
            assert!(a > 0);
        }
    }

    fn req(blocks: Option<usize>, mb: usize, ctx: Option<usize>) -> KvRequest {
        KvRequest {
            blocks,
            memory_mb: mb,
            max_model_len: ctx,
            default_context: 8192,
        }
    }

    #[test]
    fn a_kv_cache_beyond_the_memory_is_refused() {
        let gb = 1u64 << 30;
        let e = size_kv_with(&req(None, 64 << 10, None), 1 << 20, 16, 8192, Some(gb))
            .unwrap_err()
            .to_string();
        assert!(e.contains("only 1074 MB of memory is available"), "{e}");
        assert!(e.contains("--kv-memory-mb"), "{e}");
        // Absurd budgets are errors, not overflows or aborts.
        assert!(size_kv_with(&req(None, usize::MAX, None), 1, 16, 8192, None).is_err());
        assert!(size_kv_with(&req(Some(usize::MAX), 0, None), 1 << 20, 16, 8192, None).is_err());
        assert!(size_kv_with(&req(None, 0, None), 1 << 20, 16, 8192, None).is_err());
        // Within the memory: fine.
        let s = size_kv_with(&req(None, 256, None), 1 << 20, 16, 1024, Some(gb)).unwrap();
        assert_eq!((s.num_blocks, s.max_model_len, s.note), (256, 1024, None));
    }

    #[test]
    fn the_context_fits_the_cache() {
        // 10 blocks of 16 positions hold 160 positions.
        let tiny = |ctx| size_kv_with(&req(Some(10), 0, ctx), 1000, 16, 8192, None);
        let s = tiny(None).unwrap();
        assert_eq!(s.max_model_len, 160);
        assert!(s.note.unwrap().contains("context lowered from 8192 to 160"));
        let e = tiny(Some(4096)).unwrap_err().to_string();
        assert!(e.contains("--max-model-len 4096 does not fit"), "{e}");
        assert_eq!(tiny(Some(100)).unwrap().max_model_len, 100);
        // Never beyond the model's own context.
        let s = size_kv_with(&req(Some(1000), 0, Some(9000)), 1000, 16, 2048, None).unwrap();
        assert_eq!(s.max_model_len, 2048);
    }
}
