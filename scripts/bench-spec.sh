#!/usr/bin/env bash
# Speculative decoding served (issue 43): Tessera and llama.cpp's llama-server on one target
# model, each plain, with n-gram drafting and with a draft model, in one sitting, on the
# workloads of docs/bench/spec/workloads.json (code editing, summarizing and quoting, chat).
#
#   scripts/bench-spec.sh [TARGET.gguf [DRAFT.gguf]]
#
# Defaults: Qwen2.5-Coder-1.5B-Instruct Q4_K_M drafted by Qwen2.5-Coder-0.5B-Instruct Q4_K_M
# (tools/fetch_model.py qwen2.5-coder-1.5b, qwen2.5-coder-0.5b).
#
# For each server configuration (tessera: plain, --speculative ngram, --speculative
# draft:DRAFT, with --spec-tokens $SPEC_TOKENS; llama-server: plain, --spec-type ngram-simple,
# -md DRAFT, with --spec-draft-n-max $LLAMA_DRAFT_MAX) the server is started on a free
# 127.0.0.1 port and, per workload and client count, `tessera bench serve --endpoint chat
# --temperature 0 --output-tokens $OUTPUT_TOKENS` (ignore_eos: every request makes as many
# tokens) sends the workload's prompts in turn. Results go to $OUT_DIR: results.jsonl (one
# line per run: {"server", "config", "workload", "clients", "bench": <bench serve --json>}),
# the server logs, and summary.md (printed too): output tokens/s and TPOT p50 per run, and
# the speedup over the same server plain.
#
# Knobs (environment): WORKLOADS="code summary chat" CLIENTS="1 16" REQUESTS=4 (per client
# count: REQUESTS x clients requests) OUTPUT_TOKENS=96 SPEC_TOKENS=auto LLAMA_DRAFT_MAX=8
# THREADS=2 CONFIGS="plain ngram draft" SKIP_LLAMA=1 SKIP_BUILD=1 OUT_DIR=<folder>
# LLAMA_SERVER=<path>. Run it on an otherwise quiet machine.

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH_NAME=bench-spec
# shellcheck source=lib/serve-bench.sh
source "$ROOT/scripts/lib/serve-bench.sh"
TESSERA="$ROOT/target/release/tessera"
CACHE=${TESSERA_CACHE:-$HOME/.cache/tessera}
TARGET=${1:-$CACHE/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}
DRAFT=${2:-$CACHE/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
WORKLOADS=${WORKLOADS:-"code summary chat"}
CLIENTS=${CLIENTS:-"1 16"}
REQUESTS=${REQUESTS:-4}
OUTPUT_TOKENS=${OUTPUT_TOKENS:-96}
SPEC_TOKENS=${SPEC_TOKENS:-auto}
LLAMA_DRAFT_MAX=${LLAMA_DRAFT_MAX:-8}
THREADS=${THREADS:-2}
CONFIGS=${CONFIGS:-"plain ngram draft"}
SKIP_LLAMA=${SKIP_LLAMA:-0}
SKIP_BUILD=${SKIP_BUILD:-0}
LLAMA_SERVER=${LLAMA_SERVER:-}
OUT_DIR=${OUT_DIR:-bench-spec-$(date +%Y%m%d-%H%M%S)}

[[ -f "$TARGET" ]] || die "no target model $TARGET"
[[ -f "$DRAFT" ]] || die "no draft model $DRAFT"
mkdir -p "$OUT_DIR"
RESULTS="$OUT_DIR/results.jsonl"
: >"$RESULTS"
if [[ "$SKIP_BUILD" != 1 ]]; then
    (cd "$ROOT" && cargo build --release -p tessera-cli)
fi
if [[ "$SKIP_LLAMA" != 1 && -z "$LLAMA_SERVER" ]]; then
    LLAMA_SERVER=$(ls -t "$CACHE"/llama.cpp/*/vendor/llama.cpp/build/bin/llama-server 2>/dev/null | head -1 || true)
    [[ -x "$LLAMA_SERVER" ]] || die "no llama-server: run scripts/build-llama-cpp.sh or set SKIP_LLAMA=1"
fi
# One prompt file (a JSON array) per workload.
for w in $WORKLOADS; do
    python3 -c 'import json,sys
d = json.load(open(sys.argv[1]))
json.dump(d[sys.argv[2]], open(sys.argv[3], "w"))' "$ROOT/docs/bench/spec/workloads.json" "$w" "$OUT_DIR/$w.json" ||
        die "no workload $w"
done

run_config() {
    local server=$1 config=$2 w c
    for w in $WORKLOADS; do
        for c in $CLIENTS; do
            echo "== $server $config, $w, $c client(s)"
            local row="$OUT_DIR/.row.json"
            "$TESSERA" bench serve --url "http://127.0.0.1:$PORT" --endpoint chat \
                --concurrency "$c" --requests $((REQUESTS * c)) --warmup 1 \
                --output-tokens "$OUTPUT_TOKENS" --temperature 0 \
                --prompt-file "$OUT_DIR/$w.json" --json >"$row" &
            CLIENT_PID=$!
            wait "$CLIENT_PID" || die "bench serve failed ($server $config $w $c)"
            CLIENT_PID=""
            printf '{"server":"%s","config":"%s","workload":"%s","clients":%d,"bench":%s}\n' \
                "$server" "$config" "$w" "$c" "$(<"$row")" >>"$RESULTS"
            rm -f "$row"
        done
    done
}

for config in $CONFIGS; do
    args=(serve --model "$TARGET" --threads "$THREADS" --max-num-seqs 16)
    case $config in
        plain) ;;
        ngram) args+=(--speculative ngram --spec-tokens "$SPEC_TOKENS") ;;
        draft) args+=(--speculative "draft:$DRAFT" --spec-tokens "$SPEC_TOKENS") ;;
        *) die "unknown config $config (plain, ngram, draft)" ;;
    esac
    echo "== starting tessera serve ($config)"
    start_server "$OUT_DIR/tessera-$config.log" "$TESSERA" "${args[@]}"
    run_config tessera "$config"
    stop_server
done
if [[ "$SKIP_LLAMA" != 1 ]]; then
    for config in $CONFIGS; do
        args=(-m "$TARGET" --threads "$THREADS" -np 16 -c $((16 * 2048)))
        case $config in
            plain) ;;
            ngram) args+=(--spec-type ngram-simple --spec-draft-n-max "$LLAMA_DRAFT_MAX") ;;
            draft) args+=(--spec-type draft-simple -md "$DRAFT" --spec-draft-n-max "$LLAMA_DRAFT_MAX") ;;
        esac
        echo "== starting llama-server ($config)"
        start_server "$OUT_DIR/llama-$config.log" "$LLAMA_SERVER" "${args[@]}"
        run_config llama-server "$config"
        stop_server
    done
fi

python3 - "$RESULTS" >"$OUT_DIR/summary.md" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
base = {(r["server"], r["workload"], r["clients"]): r["bench"]["output_token_throughput"]
        for r in rows if r["config"] == "plain"}
print("| server | drafter | workload | clients | out tok/s | TPOT p50 (ms) | vs plain |")
print("|---|---|---|---:|---:|---:|---:|")
for r in rows:
    b = r["bench"]
    k = (r["server"], r["workload"], r["clients"])
    ratio = b["output_token_throughput"] / base[k] if base.get(k) else float("nan")
    print(f'| {r["server"]} | {r["config"]} | {r["workload"]} | {r["clients"]} | '
          f'{b["output_token_throughput"]:.1f} | {b["tpot_ms"]["p50"]:.1f} | {ratio:.2f}x |')
PY
cat "$OUT_DIR/summary.md"
echo "results: $RESULTS"
