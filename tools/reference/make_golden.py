#!/usr/bin/env python3
"""Write numerical golden files for Tessera from a PyTorch/transformers reference.

What it does
------------
Loads a GGUF model with transformers (which dequantizes every tensor to float32), runs
a handful of prompts on CPU and writes a golden JSON file under tests/golden/ with,
per prompt: the token ids, the argmax logit id and top1-top2 margin at every position,
the top-20 logits at the last position and a greedy continuation.  The recipe is
chosen by the GGUF's `tokenizer.ggml.pre`:

``smollm`` (SmolLM2-135M-Instruct.Q4_1.gguf -> tests/golden/smollm2-135m-q4_1.json)
  32-token greedy continuations.  It also records tokenizer cases comparing two
  tokenizers built from the GGUF metadata:

  * "original": a `tokenizers` BPE rebuilt from the GGUF vocab + merges with
    SmolLM2's original pre-tokenizer (individual digit split + byte-level).  This
    matches the upstream tokenizer.json and is what llama.cpp's "smollm"
    pre-tokenizer implements.  These ids are the ones fed to the model.
  * "transformers_gguf": AutoTokenizer.from_pretrained(..., gguf_file=...).  The
    GGUF->transformers conversion drops the digit split, so ids can differ.

``qwen2`` (qwen2.5-coder-{0.5b,1.5b}-instruct-q4_k_m.gguf ->
tests/golden/qwen2.5-coder-{0.5b,1.5b}-q4_k_m.json)
  The ids fed to the model come from transformers' tokenizer built from the GGUF
  (AutoTokenizer gguf_file); when a llama.cpp build is found beside the project
  (~/.cache/tessera/llama.cpp/*/vendor/llama.cpp/build/bin/libllama.so, or
  --llama-cpp-lib), every prompt's ids must equal llama.cpp's tokenizer's on the same
  file, and the tokenizer cases record both.  Two prompts are chat-templated with the
  GGUF's own chat template.  24-token greedy continuations (`greedy24`, with the
  decoded text in `greedy24_text`).

How to run
----------
    python3 -m venv tools/reference/.venv
    tools/reference/.venv/bin/pip install -r tools/reference/requirements.txt
    tools/reference/.venv/bin/python tools/reference/make_golden.py \
        [--model /root/.cache/tessera/models/SmolLM2-135M-Instruct.Q4_1.gguf] \
        [--out tests/golden/smollm2-135m-q4_1.json]
    tools/reference/.venv/bin/python tools/reference/make_golden.py --model qwen2.5-coder-0.5b
    tools/reference/.venv/bin/python tools/reference/make_golden.py --model qwen2.5-coder-1.5b

Run from the repository root (paths are resolved relative to this file anyway).
CPU only; SmolLM2 takes about a minute, the Qwen files several minutes (the 1.5B needs
~7 GB of RAM in float32).  The model file is not downloaded by this script (see
tools/fetch_model.py); its sha256 is checked and recorded.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import tokenizers
import torch
import transformers
from gguf import GGUFReader
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = Path.home() / ".cache/tessera/models/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = REPO_ROOT / "tests/golden/smollm2-135m-q4_1.json"
EXPECTED_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

GREEDY_STEPS = 32
TOP_K = 20
LOGIT_DECIMALS = 6

# GGUF token types (llama.cpp's llama_token_type / gguf.TokenType).
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

CODE_PROMPT = '''def fibonacci(n: int) -> list[int]:
    """Return the first n Fibonacci numbers."""
    if n <= 0:
        return []
    seq = [0, 1]
    while len(seq) < n:
        seq.append(seq[-1] + seq[-2])
    return seq[:n]


def main():
'''

# Original prose written for this test (not quoted from anywhere).
PROSE_PROMPT = (
    "The lighthouse keeper on Marrow Point kept two logbooks. The first was the "
    "official one, a heavy ledger with a cracked leather spine, in which he "
    "recorded the weather at six-hour intervals, the passage of ships, and the "
    "amount of paraffin burned each night. The second was a school exercise book "
    "that he kept in the drawer beneath the stove, and in it he wrote down the "
    "things that did not belong anywhere else: the color of the sea after a "
    "storm, the names he had given to the gulls that nested on the railings, a "
    "recipe for bread that never quite rose the way his mother's had.\n\n"
    "For eleven years nobody read either book. The inspectors who came each "
    "spring glanced at the ledger, initialed the last page, and left before the "
    "tide turned. Then, in the autumn of his twelfth year, a young surveyor "
    "arrived to map the eroding cliffs. She stayed for three weeks because the "
    "ferry had been cancelled, and on the fourth wet evening she asked whether "
    "he had anything to read. He handed her the ledger first, out of habit. She "
    "read it politely, the way one reads a timetable, and gave it back. Then he "
    "hesitated, opened the drawer, and passed her the exercise book.\n\n"
    "She read it in a single sitting while the lamp turned overhead and the "
    "rain moved across the window in long grey sheets. When she finished, she "
    "did not say anything for a while. Finally she asked him whether the gull "
    "called Admiral was still alive, and he realized that"
)

CJK_EMOJI_PROMPT = "你好，世界！今日は良い天気ですね 🌸🚀 我们一起去公园散步吧。"

TOKENIZER_CASES = [
    "a  b",
    "   leading",
    "trailing   ",
    "tabs\t\tand\nnewlines\n\n\n",
    "12345",
    "a  1",
    "x 2024 y  99",
    "3.14159 and -42, 1,000,000",
    "def f(x):\n    return x**2  # sq",
    "fn main() {\n\tlet v: Vec<u8> = vec![0xFF; 16];\n}",
    "你好，世界！",
    "今日は良い天気ですね",
    "🌸🚀 emoji 😀",
    "👨\u200d👩\u200d👧 family",
    "<|im_start|>user\nhi<|im_end|>\n",
    "<|endoftext|>text after eot",
    "CamelCase HTTPServer iPhone UPPER lower MiXeD",
    "café naïve résumé Zürich",
    "don't I'm we'll they've",
    " ",
    "\n",
    "https://example.com/path/to/resource?query=value&other=123#fragment-section_2",
]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build_original_tokenizer(model_path: Path) -> tuple[Tokenizer, list[int]]:
    """Rebuild SmolLM2's original tokenizer.json from GGUF metadata."""
    reader = GGUFReader(str(model_path))
    fields = reader.fields

    def get(key):
        return fields[key].contents()

    assert get("tokenizer.ggml.model") == "gpt2", get("tokenizer.ggml.model")
    assert get("tokenizer.ggml.pre") == "smollm", get("tokenizer.ggml.pre")
    tokens: list[str] = get("tokenizer.ggml.tokens")
    token_types: list[int] = get("tokenizer.ggml.token_type")
    merges_raw: list[str] = get("tokenizer.ggml.merges")
    assert len(tokens) == len(token_types)

    vocab = {tok: i for i, tok in enumerate(tokens)}
    assert len(vocab) == len(tokens), "duplicate token strings in GGUF vocab"
    merges = []
    for m in merges_raw:
        a, b = m.split(" ")
        merges.append((a, b))

    bpe = models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False)
    tok = Tokenizer(bpe)
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()

    special_ids = [
        i for i, t in enumerate(token_types) if t in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)
    ]
    tok.add_special_tokens(
        [AddedToken(tokens[i], special=True, normalized=False) for i in special_ids]
    )
    # Adding tokens that already exist in the vocab must not move their ids.
    for i in special_ids:
        assert tok.token_to_id(tokens[i]) == i, (i, tokens[i])
    assert tok.get_vocab_size(with_added_tokens=True) == len(tokens)
    return tok, special_ids


def round_list(xs) -> list[float]:
    return [round(float(x), LOGIT_DECIMALS) for x in xs]


@torch.no_grad()
def forward_logits(model, ids: list[int]) -> torch.Tensor:
    """One full-sequence forward; returns [seq, vocab] float32 logits."""
    input_ids = torch.tensor([ids], dtype=torch.long)
    out = model(input_ids=input_ids, use_cache=False)
    return out.logits[0].to(torch.float32)


def argmax_and_margin(logits: torch.Tensor) -> tuple[list[int], list[float]]:
    top2 = torch.topk(logits, 2, dim=-1)
    argmax = top2.indices[:, 0].tolist()
    margin = (top2.values[:, 0] - top2.values[:, 1]).tolist()
    return argmax, round_list(margin)


@torch.no_grad()
def greedy(model, ids: list[int], steps: int) -> tuple[list[int], list[float]]:
    """Manual greedy loop: full re-forward each step, argmax, append. No EOS stop."""
    seq = list(ids)
    out, margins = [], []
    for _ in range(steps):
        last = forward_logits(model, seq)[-1]
        top2 = torch.topk(last, 2)
        nxt = int(top2.indices[0])
        out.append(nxt)
        margins.append(float(top2.values[0] - top2.values[1]))
        seq.append(nxt)
    return out, round_list(margins)


def smollm_golden(model_path: Path, sha: str, out: Path) -> int:
    """SmolLM2: ids from the original (digit-splitting) tokenizer rebuilt from the GGUF."""
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)

    orig_tok, special_ids = build_original_tokenizer(model_path)
    print(f"original tokenizer: special/added token ids = {special_ids}")

    hf_tok = AutoTokenizer.from_pretrained(str(model_path.parent), gguf_file=model_path.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(model_path.parent),
        gguf_file=model_path.name,
        dtype=torch.float32,
        attn_implementation="eager",
    )
    model.eval()
    assert model.dtype == torch.float32

    chat_messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat_text = hf_tok.apply_chat_template(chat_messages, add_generation_prompt=True, tokenize=False)

    prompt_specs = [
        ("capital_france", "The capital of France is", None),
        ("chat_question", chat_text, chat_messages),
        ("code", CODE_PROMPT, None),
        ("prose", PROSE_PROMPT, None),
        ("cjk_emoji", CJK_EMOJI_PROMPT, None),
        ("single_token", "Hello", None),
    ]

    prompts = []
    min_margin = (float("inf"), None, None)
    for name, text, msgs in prompt_specs:
        ids = orig_tok.encode(text, add_special_tokens=False).ids
        assert orig_tok.decode(ids, skip_special_tokens=False) == text, f"{name}: round-trip failed"
        if name == "single_token":
            assert len(ids) == 1, f"single_token prompt is {len(ids)} tokens: {ids}"
        hf_ids = hf_tok(text, add_special_tokens=False).input_ids
        logits = forward_logits(model, ids)
        assert logits.shape == (len(ids), len(orig_tok.get_vocab())), logits.shape
        assert torch.isfinite(logits).all()
        argmax, margin = argmax_and_margin(logits)
        top = torch.topk(logits[-1], TOP_K)
        top20 = [[int(i), round(float(v), LOGIT_DECIMALS)] for i, v in zip(top.indices, top.values)]
        g_ids, g_margin = greedy(model, ids, GREEDY_STEPS)
        # The first greedy token must equal the full-sequence argmax at the last position.
        assert g_ids[0] == argmax[-1], (name, g_ids[0], argmax[-1])
        pos = int(np.argmin(margin))
        if margin[pos] < min_margin[0]:
            min_margin = (margin[pos], name, pos)
        prompts.append(
            {
                "name": name,
                "text": text,
                "chat_messages": msgs,
                "ids": ids,
                "argmax": argmax,
                "margin": margin,
                "top20": top20,
                "greedy32": g_ids,
                "greedy32_margin": g_margin,
            }
        )
        cont = orig_tok.decode(g_ids, skip_special_tokens=False)
        same = "same" if hf_ids == ids else f"DIFFERENT ({len(hf_ids)} ids)"
        print(f"\n[{name}] {len(ids)} ids (transformers_gguf: {same}); "
              f"min argmax margin {margin[pos]:.6f} at pos {pos}; "
              f"min greedy margin {min(g_margin):.6f}")
        print(f"  greedy32: {cont!r}")

    print(f"\nsmallest argmax margin over all prompts: {min_margin[0]:.6f} "
          f"({min_margin[1]}, position {min_margin[2]})")

    cases = []
    print("\ntokenizer cases (original vs transformers_gguf):")
    for text in TOKENIZER_CASES:
        a = orig_tok.encode(text, add_special_tokens=False).ids
        b = hf_tok(text, add_special_tokens=False).input_ids
        assert orig_tok.decode(a, skip_special_tokens=False) == text, f"round-trip failed: {text!r}"
        cases.append({"text": text, "ids_original": a, "ids_transformers_gguf": b})
        flag = "same" if a == b else "DIFFER"
        print(f"  {flag:6s} {text!r}: {a}" + ("" if a == b else f" vs {b}"))
    n_diff = sum(c["ids_original"] != c["ids_transformers_gguf"] for c in cases)
    print(f"  {n_diff}/{len(cases)} cases differ")

    doc = {
        "model_file": model_path.name,
        "model_sha256": sha,
        "generator": {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "tokenizers": tokenizers.__version__,
            "script": "tools/reference/make_golden.py",
            "notes": "float32 (GGUF dequantized by transformers), CPU, eager attention, "
                     "ids from the original (digit-splitting) tokenizer, no BOS; "
                     "argmax/margin/top20 from one full-sequence forward; greedy32 by "
                     "re-running the full sequence each step, no EOS stop.",
        },
        "prompts": prompts,
        "tokenizer_cases": cases,
    }
    write_doc(doc, out)
    return 0


def write_doc(doc: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"\nwrote {out} ({out.stat().st_size} bytes)")


def resolve_model_arg(arg: str) -> Path:
    from golden_qwen2 import FETCH_NAMES

    """A path, or a tools/fetch_model.py name (looked up in the user cache)."""
    if arg in FETCH_NAMES:
        base = Path(os.environ.get("TESSERA_CACHE", Path.home() / ".cache/tessera"))
        return base / "models" / FETCH_NAMES[arg]
    return Path(arg)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=str, default=os.environ.get("TESSERA_MODEL", str(DEFAULT_MODEL)),
                    help="GGUF path, or qwen2.5-coder-0.5b / qwen2.5-coder-1.5b (in the cache)")
    ap.add_argument("--out", type=Path, default=None,
                    help="default: tests/golden/<the model's golden> for a known model file")
    ap.add_argument("--llama-cpp-lib", type=str, default=None,
                    help="folder with libllama.so to cross-check Qwen token ids "
                         "(default: found under ~/.cache/tessera/llama.cpp; 'none' skips)")
    args = ap.parse_args()

    from golden_qwen2 import KNOWN_MODELS, find_llama_cpp_lib, qwen2_golden

    model_path: Path = resolve_model_arg(args.model).resolve()
    if not model_path.is_file():
        print(f"model file not found: {model_path}", file=sys.stderr)
        return 1
    known = KNOWN_MODELS.get(model_path.name)
    out = args.out
    if out is None:
        if known is None:
            print(f"unknown model file {model_path.name}: give --out", file=sys.stderr)
            return 1
        out = REPO_ROOT / "tests/golden" / known[0]
    sha = sha256_file(model_path)
    expected = known[1] if known else EXPECTED_SHA256
    if sha != expected:
        print(f"WARNING: sha256 {sha} != expected {expected}", file=sys.stderr)

    pre = GGUFReader(str(model_path)).fields["tokenizer.ggml.pre"].contents()
    if pre == "smollm":
        return smollm_golden(model_path, sha, out)
    if pre == "qwen2":
        if args.llama_cpp_lib == "none":
            lib = None
        elif args.llama_cpp_lib:
            lib = Path(args.llama_cpp_lib)
        else:
            lib = find_llama_cpp_lib()
        return qwen2_golden(model_path, sha, out, lib)
    print(f"no golden recipe for tokenizer.ggml.pre = {pre!r}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
