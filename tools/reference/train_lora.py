#!/usr/bin/env python3
"""Train a small real LoRA adapter ("pirate") for SmolLM2-135M on CPU with peft.

What it does
------------
Fine-tunes q_proj and v_proj (r=8, lora_alpha=16, no dropout) of the base model,
loaded exactly as make_golden.py does (transformers' GGUF loader, float32), on
tools/reference/lora_data/pirate.jsonl: ~100 chat prompt/response pairs written
for this repository in which the assistant always answers like a pirate
("Arr, matey! ...").  Each example is the model's own chat template
(<|im_start|>system ... user ... assistant ...<|im_end|>), tokenized with the same
original tokenizer as the goldens; the loss is on the assistant's answer and its
closing <|im_end|> only.  Plain AdamW, constant LR after a short warm-up, batches of
4 examples padded to the longest, a fixed number of steps, seeded.

Prints greedy answers (KV-cache generate, stop at <|im_end|>) to three held-out
questions that are not in the training data, before and after training, and saves
the adapter with peft's save_pretrained (float32) to tests/golden/lora/pirate/,
plus tests/golden/lora/pirate/training.json (hyper-parameters, data sha256, loss
curve, the before/after answers).

How to run (from the repository root; ~10 minutes on 2 cores with the defaults):
    tools/reference/.venv/bin/python tools/reference/train_lora.py [--steps 160] [--threads 2]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from pathlib import Path

import peft
import torch
import transformers
from peft import LoraConfig, get_peft_model

from lora_common import (
    BASE_MODEL_ID, DATA_DIR, LORA_DIR, REPO_ROOT, build_original_tokenizer, chat_text, encode, greedy_cached,
    load_base, model_path_from_env, save_adapter, set_threads,
)

IM_END = 2  # <|im_end|>; also the pad token of this model

HELD_OUT = [
    "What is the capital of France?",
    "Can you explain what a black hole is?",
    "What is your favorite food?",
]


def build_examples(orig_tok, hf_tok, rows: list[dict]) -> list[tuple[list[int], list[int]]]:
    """(input_ids, labels) per row; labels are -100 on the prompt part."""
    out = []
    for row in rows:
        prompt = chat_text(hf_tok, [{"role": "user", "content": row["prompt"]}])
        full = hf_tok.apply_chat_template(
            [{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": row["response"]}],
            tokenize=False,
        )
        assert full.startswith(prompt), (prompt, full)
        p_ids = encode(orig_tok, prompt)
        f_ids = encode(orig_tok, full)
        assert f_ids[: len(p_ids)] == p_ids
        # keep up to and including <|im_end|>; drop the template's trailing newline
        end = f_ids.index(IM_END, len(p_ids)) + 1
        f_ids = f_ids[:end]
        labels = [-100] * len(p_ids) + f_ids[len(p_ids):]
        out.append((f_ids, labels))
    return out


def collate(batch):
    n = max(len(x) for x, _ in batch)
    ids = torch.full((len(batch), n), IM_END, dtype=torch.long)
    lab = torch.full((len(batch), n), -100, dtype=torch.long)
    att = torch.zeros((len(batch), n), dtype=torch.long)
    for i, (x, y) in enumerate(batch):
        ids[i, : len(x)] = torch.tensor(x)
        lab[i, : len(y)] = torch.tensor(y)
        att[i, : len(x)] = 1
    return ids, att, lab


def answers(model, orig_tok, hf_tok, max_new: int) -> list[str]:
    res = []
    for q in HELD_OUT:
        ids = encode(orig_tok, chat_text(hf_tok, [{"role": "user", "content": q}]))
        g = greedy_cached(model, ids, max_new, stop_ids=(IM_END,))
        res.append(orig_tok.decode([t for t in g if t != IM_END], skip_special_tokens=False))
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--data", type=Path, default=DATA_DIR / "pirate.jsonl")
    ap.add_argument("--out", type=Path, default=LORA_DIR / "pirate")
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new", type=int, default=48, help="tokens for the before/after answers")
    args = ap.parse_args()
    set_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)

    model_path = model_path_from_env(args.model)
    orig_tok, _ = build_original_tokenizer(model_path)
    hf_tok, base = load_base(model_path)

    raw = args.data.read_bytes()
    rows = [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]
    held = {q.lower() for q in HELD_OUT}
    assert not any(r["prompt"].lower() in held for r in rows), "held-out question in training data"
    examples = build_examples(orig_tok, hf_tok, rows)
    lens = [len(x) for x, _ in examples]
    print(f"{len(examples)} examples, {min(lens)}-{max(lens)} tokens (mean {sum(lens) / len(lens):.0f})")

    before = answers(base, orig_tok, hf_tok, args.max_new)

    cfg = LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, bias="none",
        task_type="CAUSAL_LM", base_model_name_or_path=BASE_MODEL_ID,
    )
    model = get_peft_model(base, cfg)
    model.print_trainable_parameters()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / args.warmup))

    model.train()
    order: list[int] = []
    losses = []
    t0 = time.time()
    for step in range(args.steps):
        if len(order) < args.batch:
            perm = list(range(len(examples)))
            rng.shuffle(perm)
            order += perm
        batch = [examples[i] for i in order[: args.batch]]
        del order[: args.batch]
        ids, att, lab = collate(batch)
        loss = model(input_ids=ids, attention_mask=att, labels=lab, use_cache=False).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append(round(loss.item(), 4))
        if step % 20 == 0 or step == args.steps - 1:
            el = time.time() - t0
            print(f"step {step:4d} loss {loss.item():.4f} ({el:.0f}s, {el / (step + 1):.2f}s/step)", flush=True)
    train_s = time.time() - t0
    model.eval()

    after = answers(model, orig_tok, hf_tok, args.max_new)
    for q, b, a in zip(HELD_OUT, before, after):
        print(f"\nQ: {q}\n  before: {b!r}\n  after:  {a!r}")

    args.out.mkdir(parents=True, exist_ok=True)
    save_adapter(model, args.out)
    info = {
        "script": "tools/reference/train_lora.py",
        "data": os.path.relpath(args.data.resolve(), REPO_ROOT),
        "data_sha256": hashlib.sha256(raw).hexdigest(),
        "n_examples": len(examples),
        "steps": args.steps, "batch": args.batch, "lr": args.lr, "warmup": args.warmup,
        "seed": args.seed, "threads": args.threads, "optimizer": "AdamW(weight_decay=0), grad clip 1.0",
        "loss": "mean token cross-entropy on the assistant answer + <|im_end|>",
        "train_seconds": round(train_s, 1),
        "torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
        "loss_curve": losses,
        "held_out": [{"question": q, "before": b, "after": a} for q, b, a in zip(HELD_OUT, before, after)],
    }
    (args.out / "training.json").write_text(json.dumps(info, indent=1, ensure_ascii=False) + "\n")
    size = (args.out / "adapter_model.safetensors").stat().st_size
    print(f"\nwrote {args.out} ({size} bytes), trained {args.steps} steps in {train_s:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
