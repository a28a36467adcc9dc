#!/usr/bin/env python3
"""Compiles crates/cuda/kernels/*.cu to PTX for sm_90 with NVRTC, and checks the result.

Run through scripts/cuda-ptx.sh, which installs the pinned NVRTC and ptxas wheels into
tools/cuda/.venv and passes their paths. Standard library only (ctypes on libnvrtc).

  cuda_ptx.py --nvrtc LIB --ptxas BIN            write crates/cuda/ptx/<name>.ptx
  cuda_ptx.py --nvrtc LIB --ptxas BIN --check    recompile, compare with the committed PTX,
                                                 run `ptxas -v` and fail on any spill

Each kernel's registers, spill bytes and shared memory are printed as a table.
"""

import argparse
import ctypes
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
KERNELS = ROOT / "crates" / "cuda" / "kernels"
PTX = ROOT / "crates" / "cuda" / "ptx"
ARCH = "sm_90"
# Deterministic output: no line info or debug, fused multiply-adds on (the kernels round
# what must match the CPU bit for bit with explicit __fmul_rn/__fadd_rn).
OPTIONS = [f"--gpu-architecture=compute_{ARCH[3:]}", "--std=c++17", f"-I{KERNELS}"]


def nvrtc_compile(lib, path):
    """PTX text of the .cu file at `path`, or raises with NVRTC's log."""
    src = path.read_bytes()
    prog = ctypes.c_void_p()
    check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), src, path.name.encode(), 0, None, None))
    try:
        opts = [o.encode() for o in OPTIONS]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        if rc != 0:
            raise RuntimeError(f"{path.name}: NVRTC failed:\n{log.value.decode(errors='replace')}")
        check(lib, lib.nvrtcGetPTXSize(prog, ctypes.byref(size)))
        buf = ctypes.create_string_buffer(size.value)
        check(lib, lib.nvrtcGetPTX(prog, buf))
        return buf.value.decode()
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def check(lib, rc):
    if rc != 0:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise RuntimeError(f"NVRTC error {rc}: {lib.nvrtcGetErrorString(rc).decode()}")


def ptxas_report(ptxas, ptx_path):
    """[(kernel, registers, spill store bytes, spill load bytes, shared bytes)] from ptxas -v."""
    with tempfile.TemporaryDirectory() as d:
        out = subprocess.run(
            [ptxas, "-v", f"-arch={ARCH}", str(ptx_path), "-o", f"{d}/k.cubin"],
            capture_output=True,
            text=True,
        )
    if out.returncode != 0:
        raise RuntimeError(f"ptxas failed on {ptx_path.name}:\n{out.stderr}")
    rows, name = [], None
    for line in out.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            name = m.group(1)
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and name:
            spill = (int(m.group(1)), int(m.group(2)))
        m = re.search(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?", line)
        if m and name:
            rows.append((name, int(m.group(1)), *spill, int(m.group(2) or 0)))
            name = None
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nvrtc", required=True, help="path of libnvrtc.so.12")
    ap.add_argument("--ptxas", required=True, help="path of ptxas")
    ap.add_argument("--check", action="store_true", help="compare with the committed PTX, fail on spills")
    args = ap.parse_args()
    lib = ctypes.CDLL(args.nvrtc)
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    print(f"NVRTC {major.value}.{minor.value}, {ARCH}")
    sources = sorted(KERNELS.glob("*.cu"))
    if not sources:
        sys.exit(f"no kernels in {KERNELS}")
    failed = []
    PTX.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for src in sources:
            ptx = nvrtc_compile(lib, src)
            name = src.stem + ".ptx"
            committed = PTX / name
            target = pathlib.Path(tmp) / name if args.check else committed
            target.write_text(ptx)
            if args.check:
                if not committed.exists():
                    failed.append(f"{name}: not committed (run scripts/cuda-ptx.sh)")
                elif committed.read_text() != ptx:
                    failed.append(f"{name}: differs from {src.name} compiled (run scripts/cuda-ptx.sh)")
            else:
                print(f"wrote {committed.relative_to(ROOT)} ({len(ptx)} bytes)")
            print(f"{'kernel':<28} {'regs':>5} {'spill st':>9} {'spill ld':>9} {'smem':>6}")
            for k, regs, st, ld, smem in ptxas_report(args.ptxas, target):
                print(f"{k:<28} {regs:>5} {st:>9} {ld:>9} {smem:>6}")
                if st or ld:
                    failed.append(f"{k}: spills ({st} bytes stored, {ld} loaded)")
    stale = {p.name for p in PTX.glob("*.ptx")} - {s.stem + ".ptx" for s in sources}
    failed += [f"{n}: no kernel source (delete it)" for n in sorted(stale)]
    if failed:
        print("FAILED:\n  " + "\n  ".join(failed))
        sys.exit(1)
    print("PTX " + ("matches the kernels; no spills" if args.check else "written; no spills"))


if __name__ == "__main__":
    main()
