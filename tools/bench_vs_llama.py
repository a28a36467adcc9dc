#!/usr/bin/env python3
"""Tessera's exact and fast paths beside llama.cpp's llama-bench, in one sitting.

The tests of issue 11, each run for `tessera bench model --precision exact`, `--precision
fast` and llama-bench on the same GGUF file with the same thread count:

  pp512       prompt processing, 512 tokens            (llama-bench -p 512 -n 0)
  tg128       generation, 128 tokens from empty context (llama-bench -p 0 -n 128)
  pp4096      prompt processing, 4,096 tokens           (llama-bench -p 4096 -n 0 -fa on)
  tg128@4000  generation, 128 tokens after 4,000 of context (llama-bench -n 128 -d 4000 -fa on;
              tessera: --prompt-tokens 4000 --tg-after-prompt)

The engines take turns round by round (tessera exact, tessera fast, llama.cpp, then again), so
the machine's drift hits all of them alike; each figure is the median over the rounds (and
over each engine's own repetitions inside a round). Prints a Markdown table with every ratio
against its target and writes the raw figures as JSON lines.

Usage:
  tools/bench_vs_llama.py --llama-bench PATH [--model GGUF] [--threads 2] [--rounds 3]
                          [--tests pp512,tg128,pp4096,tg128@4000] [--out FILE.jsonl]

Decode runs also report their memory bound (the weights a token reads over the DRAM read
bandwidth measured beside them) and each engine's fraction of it.
Only the Python standard library is needed. llama.cpp is built beside the project, never in
it (README: "Measuring beside llama.cpp").
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

DEFAULT_MODEL = os.path.expanduser(
    "~/.cache/tessera/models/SmolLM2-135M-Instruct.Q4_1.gguf"
)

# name: (kind, prompt tokens, generated tokens, depth, target exact/llama ratio)
TESTS = {
    "pp512": ("pp", 512, 0, 0, 1.5),
    "tg128": ("tg", 0, 128, 0, 1.2),
    "pp4096": ("pp", 4096, 0, 0, 1.5),
    "tg128@4000": ("tg", 0, 128, 4000, 1.0),
}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run_json(cmd):
    log("  $ " + " ".join(cmd))
    t0 = time.time()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    log(f"    ({time.time() - t0:.0f} s)")
    return out.stdout


def tessera_rate(args, precision, test):
    kind, pp, tg, depth, _ = TESTS[test]
    cmd = [args.tessera, "bench", "model", "--model", args.model, "--threads",
           str(args.threads), "--precision", precision, "--reps", str(args.reps), "--json"]
    if kind == "pp":
        cmd += ["--prompt-tokens", str(pp), "--gen-tokens", "0"]
    elif depth:
        cmd += ["--prompt-tokens", str(depth), "--gen-tokens", str(tg), "--tg-after-prompt"]
    else:
        cmd += ["--prompt-tokens", "0", "--gen-tokens", str(tg)]
    if args.kv_dtype:
        cmd += ["--kv-dtype", args.kv_dtype]
    obj = json.loads(run_json(cmd).strip().splitlines()[-1])
    if kind == "tg" and obj.get("tg_bound_tok_s"):
        BOUNDS.append(obj["tg_bound_tok_s"])
    return obj["pp_tok_s" if kind == "pp" else "tg_tok_s"]


# Decode's memory bound as `tessera bench model` measures it beside each decode run: the
# weights a step reads over the DRAM read bandwidth (tok/s).
BOUNDS = []


def llama_rate(args, test):
    kind, pp, tg, depth, _ = TESTS[test]
    cmd = [args.llama_bench, "-m", args.model, "-t", str(args.threads), "-r",
           str(args.reps), "-o", "json", "-p", str(pp), "-n", str(tg)]
    if test in ("pp4096", "tg128@4000"):
        cmd += ["-fa", "1"]
    if depth:
        cmd += ["-d", str(depth)]
    rows = json.loads(run_json(cmd))
    samples = [s for r in rows for s in r.get("samples_ts", [r["avg_ts"]])]
    return statistics.median(samples)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH"))
    ap.add_argument("--tessera", default="target/release/tessera")
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3, help="repetitions inside one round")
    ap.add_argument("--tests", default=",".join(TESTS))
    ap.add_argument("--kv-dtype", default=None, help="passed to tessera (f32|f16)")
    ap.add_argument("--out", default=None, help="JSON lines of every figure")
    args = ap.parse_args()
    if not args.llama_bench or not os.access(args.llama_bench, os.X_OK):
        sys.exit("need --llama-bench PATH (or $LLAMA_BENCH): llama.cpp's llama-bench, built "
                 "beside the project (README: Measuring beside llama.cpp)")
    if not os.path.exists(args.model):
        sys.exit(f"model file {args.model} not found (run `tessera generate` once to fetch it)")
    tests = [t.strip() for t in args.tests.split(",") if t.strip()]
    bad = [t for t in tests if t not in TESTS]
    if bad:
        sys.exit(f"unknown tests {bad}; known: {list(TESTS)}")

    engines = ["tessera-exact", "tessera-fast", "llama.cpp"]
    figures = {(e, t): [] for e in engines for t in tests}
    out = open(args.out, "w") if args.out else None
    for r in range(args.rounds):
        for t in tests:
            log(f"round {r + 1}/{args.rounds}, {t}")
            for e in engines:
                if e == "llama.cpp":
                    v = llama_rate(args, t)
                else:
                    v = tessera_rate(args, e.split("-")[1], t)
                figures[(e, t)].append(v)
                if out:
                    out.write(json.dumps({"round": r, "test": t, "engine": e,
                                          "tok_s": v, "threads": args.threads}) + "\n")
                    out.flush()
    med = {k: statistics.median(v) for k, v in figures.items()}
    print(f"\nmedians of {args.rounds} rounds x {args.reps} reps, {args.threads} threads, "
          f"{os.path.basename(args.model)}\n")
    print("| test | exact tok/s | fast tok/s | llama.cpp tok/s | exact/llama | target | "
          "fast/llama |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for t in tests:
        ex, fa, ll = (med[(e, t)] for e in engines)
        target = TESTS[t][4]
        verdict = "met" if ex / ll >= target else "missed"
        print(f"| {t} | {ex:.1f} | {fa:.1f} | {ll:.1f} | {ex / ll:.2f}x | "
              f"{target:.1f}x ({verdict}) | {fa / ll:.2f}x |")
    if BOUNDS:
        b = statistics.median(BOUNDS)
        print(f"\ndecode bound (weights a token / DRAM read bandwidth, median of "
              f"{len(BOUNDS)} measurements): {b:.1f} tok/s")
        for t in tests:
            if TESTS[t][0] == "tg":
                ex, fa, ll = (med[(e, t)] for e in engines)
                print(f"- {t}: exact {ex / b:.2f}, fast {fa / b:.2f}, llama.cpp {ll / b:.2f} "
                      f"of the bound")


if __name__ == "__main__":
    main()
