#!/usr/bin/env bash
# Multi-LoRA serving benchmark, end to end on this machine.
#
# Builds the release binary, writes 16 rank-8 q/v adapters and 16 rank-16 all-module
# adapters (seeded random PEFT folders fitting the base model, factors in $DTYPE: bf16 by
# default, as PEFT training usually saves them) into a temporary folder, then
# for each run starts `tessera serve` on a free 127.0.0.1 port with one kind's adapters,
# waits for /health, runs
#   tessera bench serve --concurrency 16 --requests 64 --output-tokens 64 \
#     --prompt-tokens 100 --warmup 2 --json --adapters NAMES
# with NAMES the base model only, then 1, 4 and 16 adapters (requests round-robin over
# them), and stops the server. The 16-adapter runs are repeated with the server started
# with `--lora-batching serial` (one adapter per step, llama.cpp-style) for comparison.
#
# Results go to $OUT_DIR (default ./bench-lora-DATE): results.jsonl (one line per run:
# {"kind", "dtype", "batching", "n_adapters", "bench": <the bench serve --json row>}), the server
# logs, summary.txt (output tokens/s, ratio to base only, co-batching / serial at the
# largest count; printed too) and lora.svg (output tokens/s against the adapter count).
#
# Run it with the machine otherwise quiet; it takes a while. Knobs (environment):
#   COUNT=16 COUNTS="1 4 16" CONCURRENCY=16 REQUESTS=64 OUTPUT_TOKENS=64
#   PROMPT_TOKENS=100 WARMUP=2 THREADS=<server --threads> MODEL=<base model path>
#   DTYPE=bf16 (the adapters' factors: f32, f16 or bf16)
#   TP=<ranks> (serve with --tp TP: LoRA under tensor parallelism, against TP's base)
#   ONLY=all-r16 (run one adapter kind: qv-r8 or all-r16)
#   SERIAL=0 (skip the adapter-serial run)
#   OUT_DIR=<folder> SKIP_BUILD=1 (use the existing target/release/tessera)
# A tiny smoke run:
#   COUNT=2 COUNTS="1 2" REQUESTS=4 OUTPUT_TOKENS=8 CONCURRENCY=2 WARMUP=0 \
#     scripts/bench-lora.sh
#
# No server is left behind: the one running is stopped on any exit (trap).

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TESSERA="$ROOT/target/release/tessera"

COUNT=${COUNT:-16}
COUNTS=${COUNTS:-"1 4 16"}
CONCURRENCY=${CONCURRENCY:-16}
REQUESTS=${REQUESTS:-64}
OUTPUT_TOKENS=${OUTPUT_TOKENS:-64}
PROMPT_TOKENS=${PROMPT_TOKENS:-100}
WARMUP=${WARMUP:-2}
THREADS=${THREADS:-}
MODEL=${MODEL:-}
OUT_DIR=${OUT_DIR:-bench-lora-$(date +%Y%m%d-%H%M%S)}
SKIP_BUILD=${SKIP_BUILD:-0}
HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-180}
DTYPE=${DTYPE:-bf16}

# Adapter kinds: name, rank, targets.
KINDS=("qv-r8 8 q,v" "all-r16 16 all")
TP=${TP:-}
ONLY=${ONLY:-}
if [[ -n "$ONLY" ]]; then
    for k in "${KINDS[@]}"; do
        [[ "${k%% *}" == "$ONLY" ]] && KINDS=("$k") && break
    done
    [[ "${KINDS[0]%% *}" == "$ONLY" ]] || { echo "bench-lora: ONLY=$ONLY is not an adapter kind" >&2; exit 1; }
fi

BENCH_NAME=bench-lora
ADAPTER_DIR=""
# shellcheck source=lib/serve-bench.sh
source "$ROOT/scripts/lib/serve-bench.sh"
bench_cleanup() {
    if [[ -n "$ADAPTER_DIR" ]]; then
        rm -rf "$ADAPTER_DIR"
    fi
}

# start_lora_server LOG BATCHING LORA_ARGS... : starts the server with the knobs' flags,
# sets SERVER_PID and PORT, waits for /health.
start_lora_server() {
    local log=$1 batching=$2
    shift 2
    local args=(serve --served-model-name base --max-loras "$COUNT" --lora-batching "$batching")
    if [[ -n "$TP" ]]; then
        args+=(--tp "$TP")
    fi
    if [[ -n "$THREADS" ]]; then
        args+=(--threads "$THREADS")
    fi
    if [[ -n "$MODEL" ]]; then
        args+=(--model "$MODEL")
    fi
    start_server "$log" "$TESSERA" "${args[@]}" "$@"
}

# names N: "base" for 0, else a0,a1,...,a{N-1}.
names() {
    local n=$1
    if ((n == 0)); then
        echo base
        return
    fi
    local s="a0" i
    for ((i = 1; i < n; i++)); do
        s+=",a$i"
    done
    echo "$s"
}

command -v curl >/dev/null || die "curl is needed"
for n in $COUNTS; do
    [[ "$n" =~ ^[0-9]+$ ]] && ((n >= 1 && n <= COUNT)) ||
        die "COUNTS holds $n; each must be 1..COUNT ($COUNT)"
done
SERIAL_AT=0
for n in $COUNTS; do
    if ((n > SERIAL_AT)); then
        SERIAL_AT=$n
    fi
done
if ((SERIAL_AT == 0)); then
    die "COUNTS is empty"
fi

if [[ "$SKIP_BUILD" != 1 ]]; then
    echo "== building (cargo build --release -p tessera-cli)"
    (cd "$ROOT" && cargo build --release -p tessera-cli)
fi
[[ -x "$TESSERA" ]] || die "$TESSERA is missing (build it, or unset SKIP_BUILD)"

mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
RESULTS="$OUT_DIR/results.jsonl"
: >"$RESULTS"
ADAPTER_DIR=$(mktemp -d "${TMPDIR:-/tmp}/tessera-bench-lora.XXXXXX")

echo "== writing adapters into $ADAPTER_DIR"
for k in "${KINDS[@]}"; do
    read -r kind rank targets <<<"$k"
    "$TESSERA" bench make-adapters --out "$ADAPTER_DIR/$kind" --count "$COUNT" \
        --rank "$rank" --targets "$targets" --dtype "$DTYPE" ${MODEL:+--model "$MODEL"} >/dev/null
    echo "$kind: $COUNT $DTYPE adapters, rank $rank, targets $targets ($(du -sh "$ADAPTER_DIR/$kind" | cut -f1))"
done

# run KIND BATCHING N: one measurement on a fresh server, appended to the results.
run() {
    local kind=$1 batching=$2 n=$3
    local lora=() i
    for ((i = 0; i < COUNT; i++)); do
        lora+=(--lora "a$i=$ADAPTER_DIR/$kind/a$i")
    done
    local tag="$kind-$batching-$n"
    echo "== $kind, $batching batching, adapters: $(names "$n")"
    start_lora_server "$OUT_DIR/server-$tag.log" "$batching" "${lora[@]}"
    # In the background and waited for, so that a signal stops everything at once.
    local row_file="$OUT_DIR/.row-$tag.json"
    "$TESSERA" bench serve --url "http://127.0.0.1:$PORT" \
        --concurrency "$CONCURRENCY" --requests "$REQUESTS" \
        --output-tokens "$OUTPUT_TOKENS" --prompt-tokens "$PROMPT_TOKENS" \
        --warmup "$WARMUP" --json --adapters "$(names "$n")" >"$row_file" &
    CLIENT_PID=$!
    if ! wait "$CLIENT_PID"; then
        CLIENT_PID=""
        die "tessera bench serve failed ($tag; server log: $OUT_DIR/server-$tag.log)"
    fi
    CLIENT_PID=""
    stop_server
    local row
    row=$(<"$row_file")
    rm -f "$row_file"
    printf '{"kind":"%s","dtype":"%s","batching":"%s","n_adapters":%d,"bench":%s}\n' \
        "$kind" "$DTYPE" "$batching" "$n" "$row" >>"$RESULTS"
}

for k in "${KINDS[@]}"; do
    read -r kind _ _ <<<"$k"
    run "$kind" mixed 0
    for n in $COUNTS; do
        run "$kind" mixed "$n"
    done
    if [[ "${SERIAL:-1}" != 0 ]]; then
        run "$kind" serial "$SERIAL_AT"
    fi
done

echo
echo "== summary ($RESULTS)"
"$TESSERA" bench plot-lora "$RESULTS" --out "$OUT_DIR/lora.svg" | tee "$OUT_DIR/summary.txt"
echo "results: $RESULTS"
echo "chart:   $OUT_DIR/lora.svg"
