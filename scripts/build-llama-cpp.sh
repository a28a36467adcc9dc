#!/usr/bin/env bash
# Builds llama.cpp BESIDE the project (never inside it), for measuring Tessera next to it
# (tools/bench_vs_llama.py, `tessera bench serve` against llama-server, perplexity) and for
# making other quantization types of a model (llama-quantize). The source is the copy vendored
# in the `llama-cpp-python` source package, fetched with pip. About 10 minutes on 2 cores;
# needs cmake, a C++ compiler and python3 with pip.
#
#   scripts/build-llama-cpp.sh [DIR]     (default: ~/.cache/tessera/llama.cpp)
#
# Builds llama-bench, llama-batched-bench, llama-server, llama-perplexity and llama-quantize
# and prints the folder holding them. Built for this CPU (GGML_NATIVE) but without AMX: a VM
# may report AMX in /proc/cpuinfo while the kernel refuses the tile state, and ggml's AMX path
# then dies on its first `ldtilecfg`.
set -euo pipefail
dir=${1:-$HOME/.cache/tessera/llama.cpp}
version=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
mkdir -p "$dir"
cd "$dir"
src="llama_cpp_python-$version/vendor/llama.cpp"
if [ ! -f "$src/CMakeLists.txt" ]; then
  # Only the package itself as source: its build requirements (cmake among them) come as
  # wheels, or pip would compile cmake from source to read the metadata.
  python3 -m pip download --quiet --no-binary llama-cpp-python --no-deps --dest . \
    "llama-cpp-python==$version" >&2
  tar xzf "llama_cpp_python-$version.tar.gz"
  rm "llama_cpp_python-$version.tar.gz"
fi
flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON \
  -DLLAMA_BUILD_TESTS=OFF -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" >&2
cmake --build "$src/build" -j"$(nproc)" --target llama-bench llama-batched-bench \
  llama-server llama-perplexity llama-quantize >&2
echo "$dir/$src/build/bin"
