#!/usr/bin/env python3
"""Steps filled by predicted time against steps filled by tokens alone, in one sitting.

For each server configuration (precision x `--step-time-budget-ms`), round by round, this
starts `tessera serve` on a free 127.0.0.1 port, waits for /health, and runs

  tessera bench serve --scenario long-prefill --json      (a short request's TTFT while
                                                           three ~3,600-token prompts prefill,
                                                           against the idle server's)
  tessera bench serve --concurrency 16 --requests 64 --output-tokens 64 --json

then stops the server. Odd rounds take the configurations in reverse order. It prints, per
configuration, the medians over the rounds of the long-prefill TTFT ratio (during / idle,
p50s; target <= 2), of the 16-client output tokens/s, and of its ratio to the same round's
tokens-only run of the same precision.

  tools/bench_step_budget.py [--rounds 2] [--configs exact:0,exact:auto,fast:0,fast:auto]
                             [--out rows.jsonl]

Run it with the machine otherwise quiet. No server is left behind.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

DEFAULT_MODEL = os.path.expanduser(
    "~/.cache/tessera/models/SmolLM2-135M-Instruct.Q4_1.gguf")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_health(url, proc, timeout=180):
    start = time.time()
    while time.time() - start < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("server not healthy in time")


def bench(tessera, url, extra):
    cmd = [tessera, "bench", "serve", "--url", url, "--json"] + extra
    log("  $ " + " ".join(cmd))
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return rows[-1]


def run_config(args, precision, budget, log_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [args.tessera, "serve", "--model", args.model, "--port", str(port),
           "--precision", precision, "--step-time-budget-ms", budget]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    log(f"  $ {' '.join(cmd)}")
    with open(log_path, "a") as lf:
        proc = subprocess.Popen(cmd, stdout=lf, stderr=lf)
    try:
        wait_health(url, proc)
        lp = bench(args.tessera, url, ["--scenario", "long-prefill"])
        load = bench(args.tessera, url, [
            "--concurrency", "16", "--requests", str(args.requests),
            "--output-tokens", "64", "--prompt-tokens", "100", "--warmup", "2"])
        return lp, load
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tessera", default="target/release/tessera")
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--configs", default="exact:0,exact:auto,fast:0,fast:auto",
                    help="precision:budget pairs (budget 0: steps by tokens alone)")
    ap.add_argument("--out", default=None, help="JSON lines of every run")
    ap.add_argument("--server-log", default="bench-step-budget-server.log")
    args = ap.parse_args()
    configs = [tuple(c.split(":", 1)) for c in args.configs.split(",")]
    results = {c: [] for c in configs}
    out = open(args.out, "a") if args.out else None
    for r in range(args.rounds):
        # Odd rounds run the configurations in reverse (ABBA), so a drift of the machine
        # over the sitting does not favour the one that always runs first.
        for c in (configs if r % 2 == 0 else configs[::-1]):
            log(f"round {r + 1}/{args.rounds}, precision {c[0]}, budget {c[1]}")
            lp, load = run_config(args, c[0], c[1], args.server_log)
            ratio = lp.get("ratio_p50")
            tps = load.get("output_token_throughput")
            log(f"    TTFT ratio {ratio}, idle p50 {lp['idle_ttft_ms']['p50']:.0f} ms, "
                f"16-client {tps:.1f} tok/s")
            results[c].append((ratio, tps, lp, load))
            if out:
                out.write(json.dumps({"round": r, "precision": c[0], "budget": c[1],
                                      "long_prefill": lp, "load": load}) + "\n")
                out.flush()

    def med(vals):
        vals = [v for v in vals if v is not None]
        return statistics.median(vals) if vals else float("nan")

    print(f"\nmedians of {args.rounds} rounds; long-prefill: 3 prompts of ~3,600 tokens, "
          "short requests of ~30; load: 16 clients, 64 requests, 100 -> 64 tokens\n")
    print("| precision | step budget | idle TTFT p50 ms | TTFT during / idle (target <= 2) "
          "| 16-client out tok/s | vs tokens-only |")
    print("|---|---|---:|---:|---:|---:|")
    for c in configs:
        rows = results[c]
        ratio = med([x[0] for x in rows])
        tps = med([x[1] for x in rows])
        idle = med([x[2]["idle_ttft_ms"]["p50"] for x in rows])
        base = results.get((c[0], "0"))
        # The median of the per-round ratios (each against the same round's tokens-only run).
        rel = med([x[1] / b[1] for x, b in zip(rows, base)]) if base else float("nan")
        print(f"| {c[0]} | {c[1]} | {idle:.0f} | {ratio:.2f}x | {tps:.1f} | {rel:.2f}x |")


if __name__ == "__main__":
    main()
