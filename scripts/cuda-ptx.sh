#!/usr/bin/env bash
# Compiles the CUDA kernels (crates/cuda/kernels/*.cu) to the committed PTX
# (crates/cuda/ptx/*.ptx) with NVRTC for sm_90, and reports each kernel's registers and
# spills from ptxas. `--check`: recompile, fail if the committed PTX differs or any kernel
# spills (CI). The compilers come from NVIDIA's pip wheels, pinned below, installed once into
# tools/cuda/.venv (gitignored): no CUDA toolkit or GPU is needed. The exit status is 3 when
# the wheels cannot be installed (no network), so that CI can say so and skip.
#
# Pins: NVRTC 12.9 writes PTX ISA 8.8, which driver 580 (CUDA 13.0, the device machines')
# and any driver from 575 on loads.
set -euo pipefail
cd "$(dirname "$0")/.."
NVRTC=12.9.86
PTXAS=12.9.86
venv=tools/cuda/.venv
site() { "$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
if [ ! -x "$venv/bin/python" ] || [ ! -e "$(site)/nvidia/cuda_nvrtc/lib/libnvrtc.so.12" ] \
  || [ ! -x "$(site)/nvidia/cuda_nvcc/bin/ptxas" ]; then
  python3 -m venv "$venv"
  if ! "$venv/bin/pip" install -q --disable-pip-version-check \
    "nvidia-cuda-nvrtc-cu12==$NVRTC" "nvidia-cuda-nvcc-cu12==$PTXAS"; then
    echo "cuda-ptx: could not install nvidia-cuda-nvrtc-cu12==$NVRTC and nvidia-cuda-nvcc-cu12==$PTXAS with pip" >&2
    exit 3
  fi
fi
lib="$(site)/nvidia/cuda_nvrtc/lib"
# libnvrtc loads its builtins library from the library path.
LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$venv/bin/python" tools/cuda/cuda_ptx.py \
  --nvrtc "$lib/libnvrtc.so.12" --ptxas "$(site)/nvidia/cuda_nvcc/bin/ptxas" "$@"
