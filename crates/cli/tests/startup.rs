//! Start-up checks through the built `tessera`: a KV cache beyond the machine's memory, a
//! context beyond the KV cache and more threads than cores are caught before anything
//! runs, with an error or a note naming the flag, never an allocation abort or a server
//! that fails its requests later.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `tessera args`, killing it if it is still running after `secs` (a server that
/// started when it should have refused).
fn run(args: &[&str], secs: u64) -> (Output, bool) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let mut killed = false;
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            killed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    (child.wait_with_output().unwrap(), killed)
}

fn refused(args: &[&str]) -> String {
    let (out, killed) = run(args, 120);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!killed, "started instead of refusing: {stderr}");
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("memory allocation of"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

#[test]
fn a_kv_cache_beyond_the_memory_is_refused() {
    let e = refused(&["serve", "--port", "0", "--kv-memory-mb", "1000000000"]);
    // Where the system reports its free memory the cache is refused naming the flag;
    // elsewhere its allocation fails cleanly.
    assert!(
        (e.contains("memory is available") && e.contains("--kv-memory-mb"))
            || e.contains("cannot allocate"),
        "{e}"
    );
    let e = refused(&[
        "serve",
        "--port",
        "0",
        "--kv-memory-mb",
        &usize::MAX.to_string(),
    ]);
    assert!(e.contains("out of range"), "{e}");
}

#[test]
fn a_context_beyond_the_kv_cache_is_refused() {
    let e = refused(&[
        "serve",
        "--port",
        "0",
        "--kv-blocks",
        "8",
        "--max-model-len",
        "2048",
    ]);
    assert!(
        e.contains("--max-model-len 2048 does not fit the KV cache"),
        "{e}"
    );
}

#[test]
fn more_threads_than_cores_are_lowered_with_a_note() {
    let (out, killed) = run(
        &[
            "generate",
            "--prompt",
            "Hi",
            "--max-tokens",
            "1",
            "--threads",
            "4096",
        ],
        120,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!killed && out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--threads 4096 is more than the"),
        "{stderr}"
    );
    assert!(!stderr.contains("on 4096 threads"), "{stderr}");
}
