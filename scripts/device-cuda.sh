#!/usr/bin/env bash
# The GPU checks of the CUDA backend (docs/cuda.md), in two halves.
#
#   scripts/device-cuda.sh --prepare   here: builds `tessera` with `--features cuda`, writes
#                                      the default model's tokenizer header, and puts both in
#                                      .device/ (gitignored; about 9 MB, the binary xz-compressed), to be carried.
#   scripts/device-cuda.sh             on the GPU machine (needs only libcuda.so.1 and the
#                                      carried .device/): writes seeded synthetic models at
#                                      real shapes in every format the GPU reads, and runs
#                                      `tessera cuda-check` on each: logits parity with the
#                                      CPU's exact path on the machine's cores (within 1e-3
#                                      of max |logit|), greedy tokens equal wherever the
#                                      top-2 margin exceeds that, continuous batching, and
#                                      decode tokens/s against the bandwidth floor.
#
# Output: each check's lines, then a summary; with $OUT set, the log and summary are
# written there too. A real model placed at .device/model.gguf is checked as well.
# Expected time on an H100: about 4 minutes, most of it writing the models.
set -uo pipefail
cd "$(dirname "$0")/.."
dev=.device
if [ "${1:-}" = "--prepare" ]; then
  set -e
  cargo build --release --features cuda -p tessera-cli
  mkdir -p "$dev"
  cp target/release/tessera "$dev/tessera"
  strip "$dev/tessera" 2>/dev/null || true
  model=$(target/release/tessera pull)
  "$dev/tessera" synth header --from "$model" --out "$dev/tokenizer.gguf"
  # Compressed: the working tree and what is carried travel together, 64 MiB a call.
  xz -9 -T2 -f "$dev/tessera"
  du -sh "$dev"/*
  echo "carry .device (and run scripts/device-cuda.sh there)"
  exit 0
fi
out=${OUT:-/tmp/device-cuda}
mkdir -p "$out"
work=$(mktemp -d)
log="$out/device-cuda.log"
: > "$log"
say() { echo "$@" | tee -a "$log"; }
bin="$dev/tessera"
if [ ! -x "$bin" ] && [ -f "$bin.xz" ]; then
  python3 -c 'import lzma, sys; open(sys.argv[2], "wb").write(lzma.open(sys.argv[1]).read())' "$bin.xz" "$bin"
  chmod +x "$bin"
fi
if [ ! -x "$bin" ] || [ ! -f "$dev/tokenizer.gguf" ]; then
  echo "missing $bin or $dev/tokenizer.gguf: run scripts/device-cuda.sh --prepare here and carry .device" >&2
  exit 2
fi
say "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$log"
nproc | sed 's/^/cores: /' | tee -a "$log"
if ldd "$bin" | grep -q "not found"; then
  ldd "$bin" | tee -a "$log"
  exit 2
fi
# The CPU reference runs the portable and AVX2 kernels without timing variants first.
export TESSERA_KERNEL_CHECK=skip
runs=(
  "smollm2-135m f32" "smollm2-135m f16" "smollm2-135m bf16" "smollm2-135m q8_0"
  "smollm2-135m q4_0" "smollm2-135m q4_1" "llama-256 q4_k" "llama-256 q5_k"
  "llama-256 q6_k" "qwen2.5-0.5b q4_0"
)
# DEVICE_RUNS="shape dtype;shape dtype": a subset.
if [ -n "${DEVICE_RUNS:-}" ]; then IFS=';' read -ra runs <<<"$DEVICE_RUNS"; fi
status=0
for r in "${runs[@]}"; do
  set -- $r
  f="$work/$1-$2.gguf"
  say "== $1 $2"
  if ! "$bin" synth model --shape "$1" --dtype "$2" --seed 1 --tokenizer "$dev/tokenizer.gguf" --out "$f" >>"$log" 2>&1; then
    say "FAIL: writing the model"; status=1; continue
  fi
  timeout 240 "$bin" cuda-check --model "$f" 2>>"$log" | tee -a "$log" || status=1
  rm -f "$f"
done
if [ -f "$dev/model.gguf" ]; then
  say "== real model"
  timeout 240 "$bin" cuda-check --model "$dev/model.gguf" 2>>"$log" | tee -a "$log" || status=1
fi
{
  echo "== summary"
  grep -E "^(== |prefill parity|greedy decode|continuous batching|decode speed|FAIL|error)" "$log"
  echo "overall: $([ $status = 0 ] && echo PASS || echo FAIL)"
} | tee "$out/summary.txt"
rm -rf "$work"
exit $status
