#!/usr/bin/env bash
# Structured-output serving benchmark (issue 42): what a response_format constraint costs in
# time per output token, and how many outputs keep to the schema, in Tessera and in
# llama.cpp's llama-server, on one model, in one sitting.
#
#   scripts/bench-structured.sh [MODEL.gguf]
#
# MODEL defaults to the default model (SmolLM2-135M-Instruct Q4_1, `tessera pull`); e.g.
#   scripts/bench-structured.sh ~/.cache/tessera/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
# (tools/fetch_model.py qwen2.5-coder-1.5b fetches that one).
#
# Builds the release binary, then for each server (Tessera, then llama-server) starts it on a
# free 127.0.0.1 port, waits for /health, and at each client count (1 and 16) runs
#   tessera bench serve --endpoint chat --concurrency C --requests N --warmup 2 --json \
#     --prompt-file docs/bench/schemas/person-prompts.txt \
#     --response-format docs/bench/schemas/person.json --output-tokens 160
# (no ignore_eos: each output ends when the grammar is complete; 160 only bounds it), then the
# same load without the constraint, asking for the constrained run's mean output length with
# ignore_eos, so that both runs decode as many tokens per request and prefill as often and
# TPOT is compared like for like. The server is stopped after its runs.
#
# llama-server is started with `-np 16 -c 16*CTX_PER_SLOT --threads THREADS`. It reads
# response_format on the chat endpoint only; with ENDPOINT=completions bench serve also sends
# the schema as llama.cpp's `json_schema` field.
#
# Results go to $OUT_DIR (default ./bench-structured-DATE): results.jsonl (one line per run:
# {"server", "clients", "constrained", "bench": <the bench serve --json row>}), the server
# logs, and summary.md (printed too): per server and client count, TPOT p50 with and without
# the constraint, their ratio (target <= 1.05 at 16 clients), the valid share (target 100%
# with strict) and the outputs cut by max_tokens.
#
# Run it with the machine otherwise quiet: on a shared one the figures are a smoke test only
# (llama.cpp's threads in particular slow down badly when a core is taken). About 5 minutes
# for the default model on 2 cores. Knobs (environment):
#   CLIENTS="1 16" REQUESTS_1=16 REQUESTS_N=64 (requests at 1 client, at more)
#   OUTPUT_TOKENS=160 (max_tokens of constrained requests) WARMUP=2 THREADS=2
#   ENDPOINT=chat SCHEMA=<response_format file> PROMPTS=<prompt file, one per line>
#   LLAMA_SERVER=<path> (default: the newest ~/.cache/tessera/llama.cpp build; see
#   scripts/build-llama-cpp.sh) SKIP_LLAMA=1 CTX_PER_SLOT=512
#   OUT_DIR=<folder> SKIP_BUILD=1 (use the existing target/release/tessera)
# A tiny smoke run:
#   CLIENTS="1 2" REQUESTS_1=2 REQUESTS_N=4 WARMUP=0 scripts/bench-structured.sh
#
# No server is left behind: the one running is stopped on any exit (trap).

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TESSERA="$ROOT/target/release/tessera"

MODEL=${1:-${MODEL:-}}
CLIENTS=${CLIENTS:-"1 16"}
REQUESTS_1=${REQUESTS_1:-16}
REQUESTS_N=${REQUESTS_N:-64}
OUTPUT_TOKENS=${OUTPUT_TOKENS:-160}
WARMUP=${WARMUP:-2}
THREADS=${THREADS:-2}
ENDPOINT=${ENDPOINT:-chat}
SCHEMA=${SCHEMA:-$ROOT/docs/bench/schemas/person.json}
PROMPTS=${PROMPTS:-$ROOT/docs/bench/schemas/person-prompts.txt}
LLAMA_SERVER=${LLAMA_SERVER:-}
SKIP_LLAMA=${SKIP_LLAMA:-0}
CTX_PER_SLOT=${CTX_PER_SLOT:-512}
OUT_DIR=${OUT_DIR:-bench-structured-$(date +%Y%m%d-%H%M%S)}
SKIP_BUILD=${SKIP_BUILD:-0}
HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-180}

ROW=""
BENCH_NAME=bench-structured
# shellcheck source=lib/serve-bench.sh
source "$ROOT/scripts/lib/serve-bench.sh"

# bench SERVER CLIENTS CONSTRAINED OUTPUT_TOKENS : one bench serve run against the running
# server, its JSON row appended to the results and kept in ROW.
bench() {
    local server=$1 clients=$2 constrained=$3 out=$4
    local requests=$REQUESTS_N
    if ((clients == 1)); then
        requests=$REQUESTS_1
    fi
    local args=(bench serve --url "http://127.0.0.1:$PORT" --endpoint "$ENDPOINT"
        --concurrency "$clients" --requests "$requests" --output-tokens "$out"
        --prompt-file "$PROMPTS" --warmup "$WARMUP" --json)
    if [[ "$constrained" == true ]]; then
        args+=(--response-format "$SCHEMA")
    fi
    local row_file="$OUT_DIR/.row.json"
    # In the background and waited for, so that a signal stops everything at once.
    "$TESSERA" "${args[@]}" >"$row_file" &
    CLIENT_PID=$!
    if ! wait "$CLIENT_PID"; then
        CLIENT_PID=""
        die "tessera bench serve failed ($server, $clients clients, constrained $constrained)"
    fi
    CLIENT_PID=""
    ROW=$(<"$row_file")
    rm -f "$row_file"
    printf '{"server":"%s","clients":%d,"constrained":%s,"bench":%s}\n' \
        "$server" "$clients" "$constrained" "$ROW" >>"$RESULTS"
}

# The mean output tokens per completed request of a bench serve JSON row (at least 2).
mean_output() {
    python3 -c 'import json,sys
r = json.loads(sys.argv[1])
print(max(2, round(r["output_tokens"] / max(1, r["completed"]))))' "$1"
}

# run_server NAME : every client count, constrained then not, against the running server.
run_server() {
    local name=$1 c mean
    for c in $CLIENTS; do
        echo "== $name, $c clients, with --response-format"
        bench "$name" "$c" true "$OUTPUT_TOKENS"
        mean=$(mean_output "$ROW")
        echo "== $name, $c clients, without (--output-tokens $mean, the constrained mean)"
        bench "$name" "$c" false "$mean"
    done
}

command -v curl >/dev/null || die "curl is needed"
command -v python3 >/dev/null || die "python3 is needed"
[[ -f "$SCHEMA" ]] || die "no schema file $SCHEMA"
[[ -f "$PROMPTS" ]] || die "no prompt file $PROMPTS"
max_clients=0
for c in $CLIENTS; do
    [[ "$c" =~ ^[0-9]+$ ]] && ((c >= 1)) || die "CLIENTS holds $c; each must be a positive count"
    if ((c > max_clients)); then
        max_clients=$c
    fi
done
((max_clients > 0)) || die "CLIENTS is empty"

if [[ "$SKIP_BUILD" != 1 ]]; then
    echo "== building (cargo build --release -p tessera-cli)"
    (cd "$ROOT" && cargo build --release -p tessera-cli)
fi
[[ -x "$TESSERA" ]] || die "$TESSERA is missing (build it, or unset SKIP_BUILD)"

if [[ -z "$MODEL" ]]; then
    MODEL=$("$TESSERA" pull | tail -n 1)
fi
[[ -f "$MODEL" ]] || die "no model file $MODEL"

if [[ "$SKIP_LLAMA" != 1 && -z "$LLAMA_SERVER" ]]; then
    LLAMA_SERVER=$(ls -d "${TESSERA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}"/llama.cpp/llama_cpp_python-*/vendor/llama.cpp/build/bin/llama-server 2>/dev/null |
        sort -V | tail -n 1 || true)
fi
if [[ "$SKIP_LLAMA" != 1 ]]; then
    [[ -n "$LLAMA_SERVER" && -x "$LLAMA_SERVER" ]] ||
        die "llama-server not found (scripts/build-llama-cpp.sh builds it; or set LLAMA_SERVER, or SKIP_LLAMA=1)"
fi

mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
RESULTS="$OUT_DIR/results.jsonl"
: >"$RESULTS"
echo "model:   $MODEL"
echo "schema:  $SCHEMA"
echo "prompts: $PROMPTS"

echo "== starting tessera serve"
start_server "$OUT_DIR/server-tessera.log" "$TESSERA" serve --model "$MODEL" --threads "$THREADS"
run_server tessera
stop_server

if [[ "$SKIP_LLAMA" != 1 ]]; then
    echo "== starting llama-server ($LLAMA_SERVER)"
    slots=$((max_clients > 16 ? max_clients : 16))
    start_server "$OUT_DIR/server-llama.log" "$LLAMA_SERVER" -m "$MODEL" -np "$slots" \
        -c $((slots * CTX_PER_SLOT)) --threads "$THREADS" --no-webui
    run_server llama-server
    stop_server
fi

echo
echo "== summary ($RESULTS)"
python3 - "$RESULTS" <<'EOF' | tee "$OUT_DIR/summary.md"
import json, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
runs = {}
for r in rows:
    runs[(r["server"], r["clients"], r["constrained"])] = r["bench"]

def fmt(x, spec):
    return "-" if x is None else format(x, spec)

print("| server | clients | TPOT p50 with (ms) | TPOT p50 without (ms) | ratio | valid | cut by max_tokens | out tok/req | out tok/s with / without |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
seen = []
for r in rows:
    k = (r["server"], r["clients"])
    if k not in seen:
        seen.append(k)
for server, clients in seen:
    w = runs.get((server, clients, True))
    wo = runs.get((server, clients, False))
    if w is None:
        continue
    t_w = w["tpot_ms"]["p50"]
    t_wo = wo["tpot_ms"]["p50"] if wo else None
    ratio = t_w / t_wo if t_w and t_wo else None
    checked = w["completed"]
    valid = w.get("valid")
    share = f"{valid}/{checked} ({100 * valid / checked:.0f}%)" if valid is not None and checked else "-"
    per_req = w["output_tokens"] / checked if checked else None
    tput = f"{fmt(w['output_token_throughput'], '.1f')} / {fmt(wo['output_token_throughput'] if wo else None, '.1f')}"
    print(f"| {server} | {clients} | {fmt(t_w, '.1f')} | {fmt(t_wo, '.1f')} | {fmt(ratio, '.3f')} | {share} "
          f"| {fmt(w.get('truncated'), 'd')} | {fmt(per_req, '.0f')} | {tput} |")
    if w.get("failed") or (wo and wo.get("failed")):
        print(f"|   | failed: {w.get('failed')} with, {wo.get('failed') if wo else '-'} without; "
              f"first error: {w.get('first_error') or (wo or {}).get('first_error')} | | | | | | | |")
for (server, clients, constrained), b in runs.items():
    if constrained and b.get("first_invalid"):
        print(f"\n{server}, {clients} clients, first invalid output: {b['first_invalid']}")
EOF
echo "results: $RESULTS"
