# Shared by the serving benchmark scripts (bench-structured.sh, bench-spec.sh,
# bench-lora.sh): starting a
# server on a free local port and waiting for /health, stopping it (and a running client) on
# any exit. Expects HEALTH_TIMEOUT (seconds); sets SERVER_PID and PORT.

SERVER_PID=""
CLIENT_PID=""
HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-180}

stop_server() {
    if [[ -n "$SERVER_PID" ]]; then
        if kill -0 "$SERVER_PID" 2>/dev/null; then
            kill "$SERVER_PID" 2>/dev/null || true
            for _ in $(seq 1 50); do
                kill -0 "$SERVER_PID" 2>/dev/null || break
                sleep 0.1
            done
            kill -9 "$SERVER_PID" 2>/dev/null || true
        fi
        wait "$SERVER_PID" 2>/dev/null || true
        SERVER_PID=""
    fi
}

# A script's own clean-up, if it defines `bench_cleanup`, runs last.
cleanup() {
    if [[ -n "$CLIENT_PID" ]]; then
        kill "$CLIENT_PID" 2>/dev/null || true
        wait "$CLIENT_PID" 2>/dev/null || true
    fi
    stop_server
    if declare -F bench_cleanup >/dev/null; then
        bench_cleanup
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

die() {
    echo "${BENCH_NAME:-bench}: $*" >&2
    exit 1
}

# A local TCP port nothing listens on.
free_port() {
    local p
    for _ in $(seq 1 200); do
        p=$((20000 + RANDOM % 40000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "$p"
            return 0
        fi
    done
    return 1
}

# start_server LOG CMD ARGS... : starts CMD (with --host/--port appended), sets SERVER_PID
# and PORT, waits for /health.
start_server() {
    local log=$1
    shift
    PORT=$(free_port) || die "no free port"
    "$@" --host 127.0.0.1 --port "$PORT" >"$log" 2>&1 &
    SERVER_PID=$!
    local waited=0
    until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            tail -n 30 "$log" >&2
            SERVER_PID=""
            die "the server exited before answering /health (log: $log)"
        fi
        sleep 0.5
        waited=$((waited + 1))
        if ((waited > HEALTH_TIMEOUT * 2)); then
            tail -n 20 "$log" >&2
            die "the server did not answer /health within ${HEALTH_TIMEOUT}s"
        fi
    done
}
