#!/usr/bin/env bash
# Builds llama.cpp's llama-bench and llama-batched-bench BESIDE the project (never inside it),
# for measuring Tessera next to it (tools/bench_vs_llama.py). The source is the copy vendored
# by the PyPI source package `llama-cpp-python` (llama.cpp's own repository is too large to
# fetch here). About 10 minutes on 2 cores; needs cmake, a C++ compiler and python3.
#
#   scripts/build-llama-cpp.sh [DIR]     (default: ~/.cache/tessera/llama.cpp)
#
# Prints the path of llama-bench at the end. Built for this CPU (GGML_NATIVE) but without AMX:
# a VM may report AMX in /proc/cpuinfo while the kernel refuses the tile state, and ggml's AMX
# path then dies on its first `ldtilecfg`.
set -euo pipefail
dir=${1:-$HOME/.cache/tessera/llama.cpp}
version=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
mkdir -p "$dir"
cd "$dir"
src="llama_cpp_python-$version/vendor/llama.cpp"
if [ ! -f "$src/CMakeLists.txt" ]; then
  url=$(python3 - "$version" <<'EOF'
import json, sys, urllib.request
v = sys.argv[1]
with urllib.request.urlopen("https://pypi.org/pypi/llama-cpp-python/json", timeout=60) as r:
    d = json.load(r)
u = [x["url"] for x in d["releases"][v] if x["packagetype"] == "sdist"][0]
print(u)
EOF
)
  case "$url" in
    http*) ;;
    # A relative link (as a registry mirror may give): files live under /packages/.
    *) url="https://pypi.org/packages/${url##*packages/}" ;;
  esac
  echo "fetching $url" >&2
  curl -fsSL --retry 3 -o sdist.tar.gz "$url"
  tar xzf sdist.tar.gz
  rm sdist.tar.gz
fi
flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON \
  -DLLAMA_BUILD_TESTS=OFF -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" >&2
cmake --build "$src/build" -j"$(nproc)" --target llama-bench llama-batched-bench >&2
echo "$dir/$src/build/bin/llama-bench"
