#!/usr/bin/env bash
# Tensor parallelism over MPI, end to end with mpirun on this machine (part of scripts/test):
#  1. logits and greedy text of `--tp R --tp-backend mpi` (R = 2, 3) are bitwise those of
#     the in-process backend at the same R;
#  2. a rank stalled with SIGSTOP makes rank 0 stop within --tp-timeout with an error naming
#     rank 1, and mpirun ends the job;
#  3. a rank killed with SIGKILL ends the job within a bounded time with an error naming it.
#  4. LoRA: `--lora` logits over MPI equal the local backend's; a server over MPI ranks loads,
#     unloads and reloads an adapter at run time with the local backend's text.
# Per-rank resident memory at R = 2 is printed. Needs the binary built with --features mpi.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=target/release/tessera
MPIRUN=(mpirun --allow-run-as-root --oversubscribe)
tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    pkill -9 -f "tessera-mpi-test-marker" 2>/dev/null || true
    [[ -n "${KEEP:-}" ]] || rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAILED: $*" >&2; exit 1; }
passed=0

tokens=$($BIN tokenize "The capital of France is a city of" 2>/dev/null | tr -d '[] ')
for r in 2 3 4; do
    $BIN logits --tokens "$tokens" --tp "$r" 2>/dev/null >"$tmp/local.json"
    "${MPIRUN[@]}" -np "$r" $BIN logits --tokens "$tokens" --tp "$r" --tp-backend mpi \
        2>"$tmp/mpi.err" >"$tmp/mpi.json" || { cat "$tmp/mpi.err"; fail "mpirun logits, R=$r"; }
    cmp -s "$tmp/local.json" "$tmp/mpi.json" || fail "R=$r: MPI logits differ from the local backend's"
    gen=(generate --prompt "The capital of France is" --max-tokens 24 --temperature 0 --tp "$r")
    $BIN "${gen[@]}" 2>/dev/null >"$tmp/local.txt"
    "${MPIRUN[@]}" -np "$r" $BIN "${gen[@]}" --tp-backend mpi 2>/dev/null >"$tmp/mpi.txt"
    cmp -s "$tmp/local.txt" "$tmp/mpi.txt" || fail "R=$r: MPI greedy text differs"
    # Pipelined over sub-batches: the same logits again.
    "${MPIRUN[@]}" -np "$r" $BIN logits --tokens "$tokens" --tp "$r" --tp-backend mpi \
        --sub-batches 3 --split-by tokens 2>/dev/null >"$tmp/mpi3.json"
    cmp -s "$tmp/local.json" "$tmp/mpi3.json" || fail "R=$r: 3 sub-batches over MPI change the logits"
    echo "ok: R=$r MPI logits (1 and 3 sub-batches) and greedy text bitwise equal to the local backend"
    passed=$((passed + 1))
done
# An f16 KV cache on every rank: the followers allocate theirs in rank 0's dtype.
$BIN logits --tokens "$tokens" --tp 2 2>/dev/null >"$tmp/local32.json"
$BIN logits --tokens "$tokens" --tp 2 --kv-dtype f16 2>/dev/null >"$tmp/local16.json"
"${MPIRUN[@]}" -np 2 $BIN logits --tokens "$tokens" --tp 2 --tp-backend mpi --kv-dtype f16 \
    2>"$tmp/mpi.err" >"$tmp/mpi16.json" || { cat "$tmp/mpi.err"; fail "mpirun logits, f16 KV"; }
cmp -s "$tmp/local16.json" "$tmp/mpi16.json" || fail "f16 KV: MPI logits differ from the local backend's"
! cmp -s "$tmp/local32.json" "$tmp/local16.json" || fail "--kv-dtype f16 changes no logit"
echo "ok: R=2 f16 KV over MPI bitwise equal to the local backend (and not to f32 KV)"
passed=$((passed + 1))

# LoRA under tensor parallelism: each follower loads and shards the adapter rank 0 names.
lora=tests/golden/lora/rand-all7
$BIN logits --tokens "$tokens" --tp 2 --lora "$lora" 2>/dev/null >"$tmp/local-lora.json"
"${MPIRUN[@]}" -np 2 $BIN logits --tokens "$tokens" --tp 2 --tp-backend mpi --lora "$lora" \
    2>"$tmp/mpi.err" >"$tmp/mpi-lora.json" || { cat "$tmp/mpi.err"; fail "mpirun logits with --lora"; }
cmp -s "$tmp/local-lora.json" "$tmp/mpi-lora.json" || fail "--lora: MPI logits differ from the local backend's"
! cmp -s "$tmp/local32.json" "$tmp/local-lora.json" || fail "--lora changes no logit"
echo "ok: R=2 LoRA over MPI bitwise equal to the local backend (and not to the base)"
passed=$((passed + 1))

# Adapters loaded and unloaded at run time reach every rank: a server over 2 MPI ranks and
# one over 2 local ranks give the same greedy text under an adapter loaded by request,
# before and after an unload and a reload (the followers drop the adapter, then load it
# again under its new id).
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
serve_lora() { # $1: label, then the command; writes the two texts to serve-LABEL.txt
    local label=$1
    shift
    local port=$((20000 + RANDOM % 40000))
    while ! port_free $port; do port=$((20000 + RANDOM % 40000)); done
    "$@" --host 127.0.0.1 --port $port >"$tmp/serve-$label.log" 2>&1 &
    local pid=$!
    pids+=("$pid")
    local url=http://127.0.0.1:$port
    for _ in $(seq 1 600); do
        curl -sf "$url/health" >/dev/null 2>&1 && break
        kill -0 $pid 2>/dev/null || { cat "$tmp/serve-$label.log"; fail "$label: the server exited"; }
        sleep 0.2
    done
    local load='{"lora_name":"a","lora_path":"'"$PWD/$lora"'"}'
    local req='{"model":"a","prompt":"The capital of France is","max_tokens":16,"temperature":0}'
    complete() { curl -sf "$url/v1/completions" -H 'Content-Type: application/json' -d "$req" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["choices"][0]["text"]))'; }
    curl -sf "$url/v1/load_lora_adapter" -H 'Content-Type: application/json' -d "$load" >/dev/null || fail "$label: load"
    complete >"$tmp/serve-$label.txt" || fail "$label: completion"
    curl -sf "$url/v1/unload_lora_adapter" -H 'Content-Type: application/json' -d '{"lora_name":"a"}' >/dev/null || fail "$label: unload"
    local code
    code=$(curl -s -o /dev/null -w '%{http_code}' "$url/v1/completions" -H 'Content-Type: application/json' -d "$req")
    [[ $code == 404 ]] || fail "$label: an unloaded adapter answered $code"
    # A base request runs a step: the followers drop the unloaded adapter's parts.
    curl -sf "$url/v1/completions" -H 'Content-Type: application/json' \
        -d '{"prompt":"Hi","max_tokens":2}' >/dev/null || fail "$label: base request"
    curl -sf "$url/v1/load_lora_adapter" -H 'Content-Type: application/json' -d "$load" >/dev/null || fail "$label: reload"
    complete >>"$tmp/serve-$label.txt" || fail "$label: completion after reload"
    kill -TERM $pid 2>/dev/null || true
    wait $pid 2>/dev/null || true
}
serve_lora local $BIN serve --tp 2
serve_lora mpi "${MPIRUN[@]}" -np 2 $BIN serve --tp 2 --tp-backend mpi
[[ -s "$tmp/serve-local.txt" ]] || fail "run-time LoRA: no text"
[[ "$(sed -n 1p "$tmp/serve-local.txt")" == "$(sed -n 2p "$tmp/serve-local.txt")" ]] || fail "run-time LoRA: the reloaded adapter's text differs"
cmp -s "$tmp/serve-local.txt" "$tmp/serve-mpi.txt" || { diff "$tmp/serve-local.txt" "$tmp/serve-mpi.txt"; fail "run-time LoRA: MPI text differs from the local backend's"; }
echo "ok: R=2 adapters loaded, unloaded and reloaded at run time over MPI: the same text as the local backend"
passed=$((passed + 1))

# The pid of the tessera process of MPI rank $1 (the newest one); waits up to 10 s for it.
rank_pid() {
    for _ in $(seq 1 100); do
        for p in $(pgrep -f "tessera-mpi-test-marker" | sort -rn); do
            if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1"; then
                echo "$p"
                return
            fi
        done
        sleep 0.1
    done
}

# A long generation over 2 ranks; waits until it has produced text.
start_long() {
    # The previous run's output must not count as this one's: remove it before starting
    # (the background job's own truncation may come after the first check below).
    rm -f "$tmp/long.out" "$tmp/long.err"
    "${MPIRUN[@]}" -np 2 $BIN generate --prompt "tessera-mpi-test-marker Once upon a time" \
        --max-tokens 100000 --ignore-eos --temperature 0 --tp 2 --tp-backend mpi \
        --tp-timeout 2 >"$tmp/long.out" 2>"$tmp/long.err" &
    MPI_PID=$!
    pids+=("$MPI_PID")
    for _ in $(seq 1 300); do
        [[ -s "$tmp/long.out" ]] && return 0
        sleep 0.1
    done
    cat "$tmp/long.err"
    fail "the long generation produced no text"
}

# Waits up to $1 seconds for mpirun to end; returns its exit status.
wait_end() {
    for _ in $(seq 1 $(($1 * 10))); do
        if ! kill -0 "$MPI_PID" 2>/dev/null; then
            wait "$MPI_PID" && return 0 || return $?
        fi
        sleep 0.1
    done
    fail "mpirun still running after $1 s"
}

start_long
r0=$(rank_pid 0); r1=$(rank_pid 1)
[[ -n "$r0" && -n "$r1" ]] || fail "cannot find the rank processes"
echo "per-rank resident memory at R=2 (MPI), while generating:"
for p in "$r0" "$r1"; do grep -E "VmRSS|VmHWM" "/proc/$p/status" | tr -s ' ' | sed "s/^/  pid $p: /"; done
kill -STOP "$r1"
t0=$(date +%s)
status=0; wait_end 30 || status=$?
kill -9 "$r1" 2>/dev/null || true
elapsed=$(($(date +%s) - t0))
((status != 0)) || fail "a stalled rank: mpirun exited 0"
# Rank 0's own error must name rank 1 (mpirun may wake the stopped rank to end it, and that
# rank then reports rank 0 gone, which is not what this checks).
grep -q "rank(s) \[1\] did not answer" "$tmp/long.err" || { cat "$tmp/long.err"; fail "a stalled rank: rank 0 did not name rank 1"; }
((elapsed <= 10)) || fail "a stalled rank: ${elapsed}s to end the job with a 2s timeout"
echo "ok: stalled rank 1 -> job ended in ${elapsed}s (timeout 2s): $(grep -m1 'rank(s) \[1\]' "$tmp/long.err")"
passed=$((passed + 1))

start_long
r1=$(rank_pid 1)
[[ -n "$r1" ]] || fail "cannot find rank 1"
kill -9 "$r1"
t0=$(date +%s)
status=0; wait_end 30 || status=$?
elapsed=$(($(date +%s) - t0))
((status != 0)) || fail "a killed rank: mpirun exited 0"
grep -qiE "rank 1|rank \[?1\]?" "$tmp/long.err" || { cat "$tmp/long.err"; fail "a killed rank: no error naming rank 1"; }
echo "ok: killed rank 1 -> job ended in ${elapsed}s: $(grep -m1 -iE 'rank 1' "$tmp/long.err")"
passed=$((passed + 1))

echo "$passed passed, 0 failed"
