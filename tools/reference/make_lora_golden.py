#!/usr/bin/env python3
"""Write tests/golden/lora/goldens.json: reference outputs of SmolLM2-135M with each
LoRA adapter in tests/golden/lora/, computed with peft.

What it does
------------
Loads the base model as make_golden.py does (transformers' GGUF loader, float32,
eager attention, CPU), then for the base and for each adapter folder
(PeftModel.from_pretrained on that base; peft upcasts float16 adapter weights to
float32) runs the same prompts and records, per prompt, exactly the fields of
tests/golden/smollm2-135m-q4_1.json: ids (original digit-splitting tokenizer, no
BOS), argmax and top1-top2 margin at every position of one full-sequence forward,
the top-20 logits at the last position, and a 32-token greedy continuation
(full re-forward each step, no EOS stop) with its margins; plus greedy32_text
(the decoded continuation) and, for adapters, argmax_diff_vs_base (how many
positions' argmax differ from the base).

The base prompts that also exist in the main golden are checked against it
(same ids, argmax and greedy ids; logits within 1e-3), so both files describe
the same model.

How to run (from the repository root, after make_lora.py / train_lora.py /
make_lora_gguf.py; ~3 minutes on 2 cores):
    tools/reference/.venv/bin/python tools/reference/make_lora_golden.py [--model PATH] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import peft
import safetensors
import tokenizers
import torch
import transformers
from peft import PeftModel

from lora_common import (
    LORA_DIR, REPO_ROOT, build_original_tokenizer, chat_text, encode, load_base, model_path_from_env,
    set_threads, sha256_file, EXPECTED_SHA256,
)
from make_golden import CODE_PROMPT, GREEDY_STEPS, LOGIT_DECIMALS, TOP_K, argmax_and_margin, forward_logits, greedy

ADAPTERS = ["rand-all7", "rand-qv-rslora", "rand-ko", "pirate"]
MAIN_GOLDEN = REPO_ROOT / "tests/golden/smollm2-135m-q4_1.json"

STORY_PROMPT = "Once upon a time, in a small village by the sea, there lived an old fisherman who"


def prompt_specs(hf_tok):
    chat1 = [{"role": "user", "content": "What is the capital of France?"}]
    chat2 = [{"role": "user", "content": "Can you explain what a black hole is?"}]
    return [
        # from make_golden.py
        ("capital_france", "The capital of France is", None),
        ("chat_question", chat_text(hf_tok, chat1), chat1),
        ("code", CODE_PROMPT, None),
        ("single_token", "Hello", None),
        # new here
        ("chat_black_hole", chat_text(hf_tok, chat2), chat2),
        ("story", STORY_PROMPT, None),
    ]


def run_prompts(model, orig_tok, specs, base_argmax: dict[str, list[int]] | None):
    out = []
    for name, text, msgs in specs:
        ids = encode(orig_tok, text)
        logits = forward_logits(model, ids)
        assert torch.isfinite(logits).all()
        argmax, margin = argmax_and_margin(logits)
        top = torch.topk(logits[-1], TOP_K)
        top20 = [[int(i), round(float(v), LOGIT_DECIMALS)] for i, v in zip(top.indices, top.values)]
        g_ids, g_margin = greedy(model, ids, GREEDY_STEPS)
        assert g_ids[0] == argmax[-1], (name, g_ids[0], argmax[-1])
        rec = {
            "name": name,
            "text": text,
            "chat_messages": msgs,
            "ids": ids,
            "argmax": argmax,
            "margin": margin,
            "top20": top20,
            "greedy32": g_ids,
            "greedy32_margin": g_margin,
            "greedy32_text": orig_tok.decode(g_ids, skip_special_tokens=False),
        }
        if base_argmax is not None:
            rec["argmax_diff_vs_base"] = sum(a != b for a, b in zip(argmax, base_argmax[name]))
        out.append(rec)
        extra = "" if base_argmax is None else f", argmax differs from base at {rec['argmax_diff_vs_base']}/{len(ids)}"
        print(f"  [{name}] {len(ids)} ids, min margin {min(margin):.4f}, min greedy margin {min(g_margin):.4f}{extra}")
        print(f"    greedy32: {rec['greedy32_text']!r}")
    return out


def check_against_main_golden(prompts: list[dict]) -> None:
    if not MAIN_GOLDEN.is_file():
        print(f"  (no {MAIN_GOLDEN}, skipping cross-check)")
        return
    main = {p["name"]: p for p in json.loads(MAIN_GOLDEN.read_text())["prompts"]}
    n = 0
    for p in prompts:
        m = main.get(p["name"])
        if m is None:
            continue
        assert p["ids"] == m["ids"], p["name"]
        assert p["argmax"] == m["argmax"], p["name"]
        assert p["greedy32"] == m["greedy32"], p["name"]
        d = max(abs(a[1] - b[1]) for a, b in zip(p["top20"], m["top20"]))
        assert [a[0] for a in p["top20"]] == [b[0] for b in m["top20"]] and d < 1e-3, (p["name"], d)
        n += 1
    print(f"  base matches {MAIN_GOLDEN.name} on {n} shared prompts")


def adapter_config_summary(model, folder: Path) -> dict:
    cfg = json.loads((folder / "adapter_config.json").read_text())
    st = folder / "adapter_model.safetensors"
    with safetensors.safe_open(str(st), "pt") as f:
        dtypes = sorted({str(f.get_slice(k).get_dtype()) for k in f.keys()})
        n_tensors = len(list(f.keys()))
    # per module kind: rank and the scaling peft actually uses
    kinds: dict[str, dict] = {}
    for name, mod in model.named_modules():
        if hasattr(mod, "lora_A") and "default" in mod.lora_A:
            kind = name.rsplit(".", 1)[-1]
            r = mod.r["default"]
            s = float(mod.scaling["default"])
            prev = kinds.setdefault(kind, {"r": r, "scaling": s})
            assert prev == {"r": r, "scaling": s}, (kind, prev, r, s)
    return {
        "target_modules": sorted(kinds),
        "r": cfg["r"],
        "lora_alpha": cfg["lora_alpha"],
        "rank_pattern": cfg.get("rank_pattern") or {},
        "alpha_pattern": cfg.get("alpha_pattern") or {},
        "use_rslora": cfg.get("use_rslora", False),
        "safetensors_dtype": dtypes,
        "safetensors_bytes": st.stat().st_size,
        "n_tensors": n_tensors,
        "per_module": kinds,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--lora-dir", type=Path, default=LORA_DIR)
    ap.add_argument("--out", type=Path, default=LORA_DIR / "goldens.json")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    set_threads(args.threads)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)

    model_path = model_path_from_env(args.model)
    sha = sha256_file(model_path)
    if sha != EXPECTED_SHA256:
        print(f"WARNING: sha256 {sha} != expected {EXPECTED_SHA256}", file=sys.stderr)
    orig_tok, _ = build_original_tokenizer(model_path)
    hf_tok, base = load_base(model_path)
    specs = prompt_specs(hf_tok)

    print("[base]")
    base_prompts = run_prompts(base, orig_tok, specs, None)
    check_against_main_golden(base_prompts)
    base_argmax = {p["name"]: p["argmax"] for p in base_prompts}

    adapters = {}
    for name in ADAPTERS:
        folder = args.lora_dir / name
        if not (folder / "adapter_config.json").is_file():
            print(f"[{name}] missing {folder}, skipped", file=sys.stderr)
            continue
        print(f"[{name}]")
        model = PeftModel.from_pretrained(base, str(folder))
        model.eval()
        for n, p in model.named_parameters():
            if "lora_" in n:
                assert p.dtype == torch.float32, (n, p.dtype)
        summary = adapter_config_summary(model, folder)
        print(f"  config: {summary['per_module']}, rslora={summary['use_rslora']}, {summary['safetensors_dtype']}")
        gguf_path = args.lora_dir / f"{name}.gguf"
        entry = {
            "path": str((folder).resolve().relative_to(REPO_ROOT)),
            "gguf": str(gguf_path.resolve().relative_to(REPO_ROOT)) if gguf_path.is_file() else None,
            "config": summary,
            "prompts": run_prompts(model, orig_tok, specs, base_argmax),
        }
        adapters[name] = entry
        base = model.unload()
        del model

    doc = {
        "generator": {
            "script": "tools/reference/make_lora_golden.py",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
            "tokenizers": tokenizers.__version__,
            "notes": (
                "Same conventions as tests/golden/smollm2-135m-q4_1.json: float32 (GGUF dequantized by "
                "transformers), CPU, eager attention, ids from the original (digit-splitting) tokenizer, "
                "no BOS; argmax/margin/top20 from one full-sequence forward; greedy32 by re-running the "
                "full sequence each step, no EOS stop. Adapters applied with peft "
                "(PeftModel.from_pretrained) in HF layout: y = W x + scaling * B (A x) per targeted "
                "Linear, scaling = alpha/r, or alpha/sqrt(r) with use_rslora, with r from rank_pattern "
                "and alpha from alpha_pattern where they name the module (see config.per_module). "
                "float16 adapter weights are upcast to float32 before use. The .gguf files are the "
                "llama.cpp-format equivalents of the same adapters (q/k lora_b rows permuted for the "
                "GGUF base, rslora folded into adapter.lora.alpha) and must reproduce these same outputs."
            ),
        },
        "base_model": {"file": model_path.name, "sha256": sha},
        "base": {"prompts": base_prompts},
        "adapters": adapters,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"\nwrote {args.out} ({args.out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
