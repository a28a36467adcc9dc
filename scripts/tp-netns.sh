#!/usr/bin/env bash
# Tensor parallelism across a real, rate-limited network link: two MPI ranks of
# `tessera bench tp --tp-backend mpi` in two network namespaces joined by a veth pair, the
# link shaped with tc (tbf; this kernel has no netem, so no delay is added), one CPU per rank.
# Prints bench tp's JSON rows on stdout and removes every namespace, link and file it made.
#
#   scripts/tp-netns.sh --rate 1gbit|10gbit [--tokens 16,64,256,1024] [--reps N]
#
# Needs root, iproute2 (ip, tc), taskset, Open MPI, and the binary built with
# `cargo build --release --features mpi -p tessera-cli`. Open MPI cannot start a rank inside
# another namespace on its own host (its local daemon is reached over loopback), so each
# namespace is a "host" of the job: mpirun runs in the first, and its launch agent starts the
# second host's daemon in the second namespace; the ranks' traffic goes over the veth pair.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${TESSERA_BIN:-$PWD/target/release/tessera}
rate=1gbit
bench_args=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --rate) rate=$2; shift 2 ;;
        --tokens|--reps|--precision|--model) bench_args+=("$1" "$2"); shift 2 ;;
        -h|--help) sed -n 2,13p "$0"; exit 0 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
case "$rate" in
    *gbit|*mbit) ;;
    *) echo "--rate: a tc rate such as 1gbit or 10gbit, got $rate" >&2; exit 2 ;;
esac
[[ $(id -u) -eq 0 ]] || { echo "needs root (network namespaces)" >&2; exit 2; }
for tool in ip tc taskset mpirun; do
    command -v "$tool" >/dev/null || { echo "needs $tool" >&2; exit 2; }
done
[[ -x $BIN ]] || { echo "no $BIN: cargo build --release --features mpi -p tessera-cli" >&2; exit 2; }
ncpu=$(nproc)
[[ $ncpu -ge 2 ]] || echo "note: $ncpu CPU; both ranks share it" >&2

id=$$
ns0=tessera-tp0-$id ns1=tessera-tp1-$id
va=tsa$id vb=tsb$id
subnet=10.231.$((id % 250)).0/24
ip0=10.231.$((id % 250)).1 ip1=10.231.$((id % 250)).2
tmp=$(mktemp -d)
cleanup() {
    ip netns pids "$ns0" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns pids "$ns1" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns0" 2>/dev/null || true
    ip netns del "$ns1" 2>/dev/null || true
    ip link del "$va" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

ip netns add "$ns0"
ip netns add "$ns1"
ip link add "$va" type veth peer name "$vb"
ip link set "$va" netns "$ns0"
ip link set "$vb" netns "$ns1"
ip -n "$ns0" addr add "$ip0/24" dev "$va"
ip -n "$ns1" addr add "$ip1/24" dev "$vb"
for ns in "$ns0" "$ns1"; do ip -n "$ns" link set lo up; done
ip -n "$ns0" link set "$va" up
ip -n "$ns1" link set "$vb" up
# Token bucket on each direction: the rate, a burst of about 1 ms of it (at least 128 KiB,
# above a segmentation-offload packet), and a queue of 50 ms.
bits=$(echo "$rate" | sed -E 's/gbit$/000000000/; s/mbit$/000000/')
burst=$(( bits / 8 / 1000 ))
(( burst < 131072 )) && burst=131072
tc -n "$ns0" qdisc add dev "$va" root tbf rate "$rate" burst "$burst" latency 50ms
tc -n "$ns1" qdisc add dev "$vb" root tbf rate "$rate" burst "$burst" latency 50ms

cat >"$tmp/agent.sh" <<AGENT
#!/bin/sh
# Open MPI's launch agent: "agent HOST COMMAND..." runs COMMAND in HOST's namespace.
host=\$1; shift
case "\$host" in
    $ip1) exec taskset -c $((ncpu > 1 ? 1 : 0)) ip netns exec $ns1 sh -c "\$*" ;;
    *) echo "unknown host \$host" >&2; exit 1 ;;
esac
AGENT
chmod +x "$tmp/agent.sh"
printf '%s slots=1\n%s slots=1\n' "$ip0" "$ip1" >"$tmp/hosts"

echo "tp-netns: 2 ranks over a veth pair shaped to $rate (tbf, burst $burst B)" >&2
taskset -c 0 ip netns exec "$ns0" mpirun --allow-run-as-root --hostfile "$tmp/hosts" \
    --mca plm_rsh_agent "$tmp/agent.sh" --mca btl self,tcp \
    --mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet" \
    --bind-to none --map-by node -np 2 \
    "$BIN" bench tp --tp 2 --tp-backend mpi --threads 1 --json --label "veth $rate" \
    "${bench_args[@]}" 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
grep -v '^{' "$tmp/err" >&2 || true
stats=$(tc -n "$ns0" -s qdisc show dev "$va" | awk '/Sent/ {gsub(",", "", $7); print $2, $7; exit}')
echo "tp-netns: ${stats% *} bytes went through the shaped link from rank 0, ${stats#* } packets dropped by the shaper" >&2
