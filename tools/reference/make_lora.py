#!/usr/bin/env python3
"""Write seeded random PEFT LoRA adapters for SmolLM2-135M into tests/golden/lora/.

What it does
------------
Loads the base model the same way make_golden.py does (transformers' GGUF loader,
float32, HF LlamaForCausalLM layout), wraps it with peft for each adapter spec
below, overwrites every lora_A / lora_B with seeded Gaussian values and saves a
standard PEFT folder (adapter_config.json + adapter_model.safetensors) with
peft's save_pretrained.  PEFT's own init sets lora_B = 0 (a no-op adapter), so
the random values are what make these adapters useful as test data.

Scaling: for every adapted module the pair is scaled so that the effective
update  dW = scaling * B @ A  (scaling = alpha/r, or alpha/sqrt(r) with rslora,
per module after rank_pattern / alpha_pattern) has Frobenius norm
REL * ||W||_F, split evenly between A and B.  REL per adapter was tuned so the
adapter visibly changes logits (top-1 changes at a fraction of positions, the
greedy continuation diverges) while the model still writes sensible text;
the script prints those statistics for the prompts of make_golden.py.

Adapters written (name: target modules, r, alpha, options, saved dtype):

* rand-all7       all 7 projections, r=4, alpha=8, rank_pattern {down_proj: 6},
                  alpha_pattern {gate_proj: 3}; weights saved as float16.
* rand-qv-rslora  q_proj, v_proj, r=8, alpha=16, use_rslora (scaling 16/sqrt(8)); float32.
* rand-ko         k_proj, o_proj, r=2, alpha=2; float32.

The float16 adapter is rounded to float16 *before* anything is evaluated, so the
saved file is exactly the adapter the goldens describe.

How to run (from the repository root, ~1 minute on 2 cores):
    tools/reference/.venv/bin/python tools/reference/make_lora.py [--model PATH] [--only NAME]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model

from lora_common import (
    ALL7, BASE_MODEL_ID, LORA_DIR, build_original_tokenizer, chat_text, encode, load_base,
    model_path_from_env, save_adapter, set_threads,
)
from make_golden import CODE_PROMPT, PROSE_PROMPT, forward_logits


@dataclass
class Spec:
    name: str
    target_modules: list[str]
    r: int
    alpha: float
    seed: int
    rel: float  # ||scaling * B @ A||_F / ||W||_F for every adapted module
    dtype: torch.dtype = torch.float32
    use_rslora: bool = False
    rank_pattern: dict[str, int] = field(default_factory=dict)
    alpha_pattern: dict[str, float] = field(default_factory=dict)


SPECS = [
    Spec("rand-all7", ALL7, r=4, alpha=8, seed=1001, rel=0.05, dtype=torch.float16,
         rank_pattern={"down_proj": 6}, alpha_pattern={"gate_proj": 3}),
    Spec("rand-qv-rslora", ["q_proj", "v_proj"], r=8, alpha=16, seed=1002, rel=0.12, use_rslora=True),
    Spec("rand-ko", ["k_proj", "o_proj"], r=2, alpha=2, seed=1003, rel=0.12),
]


def lora_config(spec: Spec) -> LoraConfig:
    return LoraConfig(
        r=spec.r,
        lora_alpha=spec.alpha,
        target_modules=list(spec.target_modules),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
        use_rslora=spec.use_rslora,
        rank_pattern=dict(spec.rank_pattern),
        alpha_pattern=dict(spec.alpha_pattern),
        base_model_name_or_path=BASE_MODEL_ID,
    )


@torch.no_grad()
def randomize(peft_model, spec: Spec) -> None:
    """Overwrite every lora_A/lora_B (module order = named_modules order) with seeded values."""
    gen = torch.Generator().manual_seed(spec.seed)
    n = 0
    for name, mod in peft_model.named_modules():
        if not hasattr(mod, "lora_A") or "default" not in mod.lora_A:
            continue
        a = mod.lora_A["default"].weight  # [r, in]
        b = mod.lora_B["default"].weight  # [out, r]
        w = mod.get_base_layer().weight   # [out, in]
        s = mod.scaling["default"]
        ra = torch.randn(a.shape, generator=gen)
        rb = torch.randn(b.shape, generator=gen)
        c = spec.rel * w.norm() / (s * (rb @ ra).norm())
        a.copy_((ra * c.sqrt()).to(spec.dtype).to(a.dtype))
        b.copy_((rb * c.sqrt()).to(spec.dtype).to(b.dtype))
        n += 1
    assert n > 0
    print(f"  randomized {n} modules (seed {spec.seed}, rel {spec.rel})")


def effect_report(peft_model, base_logits: dict[str, torch.Tensor], prompts: dict[str, list[int]]) -> None:
    for pname, ids in prompts.items():
        lg = forward_logits(peft_model, ids)
        bl = base_logits[pname]
        changed = (lg.argmax(-1) != bl.argmax(-1)).float().mean().item()
        top2 = torch.topk(lg, 2, dim=-1).values
        margin = (top2[:, 0] - top2[:, 1])
        p, q = torch.log_softmax(bl, -1), torch.log_softmax(lg, -1)
        kl = (p.exp() * (p - q)).sum(-1).mean().item()
        print(f"    {pname:14s} {len(ids):4d} pos: top-1 changed {changed:6.1%}, "
              f"mean KL(base||lora) {kl:.3f}, max |dlogit| {(lg - bl).abs().max().item():.2f}, "
              f"median margin {margin.median().item():.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--out-dir", type=Path, default=LORA_DIR)
    ap.add_argument("--only", action="append", help="write only this adapter (repeatable)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    set_threads(args.threads)
    torch.manual_seed(0)

    model_path = model_path_from_env(args.model)
    orig_tok, _ = build_original_tokenizer(model_path)
    hf_tok, base = load_base(model_path)

    prompts = {
        "capital_france": encode(orig_tok, "The capital of France is"),
        "chat_question": encode(orig_tok, chat_text(hf_tok, [{"role": "user", "content": "What is the capital of France?"}])),
        "code": encode(orig_tok, CODE_PROMPT),
        "prose": encode(orig_tok, PROSE_PROMPT),
    }
    base_logits = {k: forward_logits(base, v) for k, v in prompts.items()}

    for spec in SPECS:
        if args.only and spec.name not in args.only:
            continue
        print(f"\n[{spec.name}]")
        peft_model = get_peft_model(base, lora_config(spec))
        peft_model.eval()
        randomize(peft_model, spec)
        effect_report(peft_model, base_logits, prompts)

        out = args.out_dir / spec.name
        out.mkdir(parents=True, exist_ok=True)
        # Save the lora tensors in the spec's dtype (float16 for rand-all7).
        if spec.dtype != torch.float32:
            for n, p in peft_model.named_parameters():
                if "lora_" in n:
                    p.data = p.data.to(spec.dtype)
        save_adapter(peft_model, out)
        cfg = json.loads((out / "adapter_config.json").read_text())
        size = (out / "adapter_model.safetensors").stat().st_size
        print(f"  wrote {out} ({size} bytes; r={cfg['r']} alpha={cfg['lora_alpha']} "
              f"rslora={cfg['use_rslora']} rank_pattern={cfg['rank_pattern']} "
              f"alpha_pattern={cfg['alpha_pattern']})")

        base = peft_model.unload()  # drop the lora layers, back to the plain base model
        del peft_model
        # unload must give back the untouched base.
        chk = forward_logits(base, prompts["capital_france"])
        assert torch.equal(chk, base_logits["capital_france"]), "base changed after unload"
    return 0


if __name__ == "__main__":
    sys.exit(main())
