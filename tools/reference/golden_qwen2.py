"""Qwen2 goldens for make_golden.py (tokenizer.ggml.pre == "qwen2"): the GGUF's own
tokenizer through transformers, cross-checked against llama.cpp's, chat prompts on the
GGUF's template. Run through make_golden.py, not on its own."""

from __future__ import annotations

import importlib.metadata
import os
import sys
from pathlib import Path

import numpy as np
import tokenizers
import torch
import transformers
from gguf import GGUFReader
from transformers import AutoModelForCausalLM, AutoTokenizer

from make_golden import (
    EXPECTED_SHA256,
    LOGIT_DECIMALS,
    TOKENIZER_CASES,
    TOP_K,
    argmax_and_margin,
    forward_logits,
    greedy,
    write_doc,
)

# Qwen2 (tokenizer.ggml.pre == "qwen2"): the GGUF's own tokenizer through transformers,
# cross-checked against llama.cpp's.

# Original text written for these goldens (not quoted from anywhere).
QWEN_CODE_PROMPT = '''from dataclasses import dataclass


@dataclass
class Interval:
    start: int
    end: int


def merge_intervals(intervals: list[Interval]) -> list[Interval]:
    """Merge overlapping intervals; the result is sorted by start."""
    if not intervals:
        return []
    ordered = sorted(intervals, key=lambda iv: iv.start)
    merged = [ordered[0]]
    for iv in ordered[1:]:
        last = merged[-1]
'''

QWEN_PROSE_PROMPT = (
    "Every Thursday the bakery on Alder Street sold out of rye bread by nine o'clock, and "
    "every Thursday Mrs. Okafor arrived at ten past nine to ask whether any rye was left. "
    "The baker, a patient man named Tobias, began to set one loaf aside for her under the "
    "counter. He never told her, and she never asked why the answer had changed. Years "
    "later, when the bakery finally closed,"
)

QWEN_MIXED_PROMPT = "Le café coûte 3,50 € — 北京 2024年12月31日 🚀 done; x=0x1F, y=-7.25e-3."

QWEN_CHAT_MESSAGES = [
    {
        "role": "user",
        "content": "Write a Python function that returns the n-th triangular number, "
                   "with a one-line docstring.",
    }
]

QWEN_CHAT_MULTI_MESSAGES = [
    {"role": "system", "content": "You are a terse assistant. Answer in one sentence."},
    {"role": "user", "content": "What does `git stash` do?"},
    {
        "role": "assistant",
        "content": "It shelves your uncommitted changes and resets the working tree to HEAD.",
    },
    {"role": "user", "content": "How do I get the changes back?"},
]

QWEN_TOKENIZER_CASES = TOKENIZER_CASES + [
    "e\u0301 vs \u00e9 (decomposed vs composed)",
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
    "<|im_start|>system\nx<|im_end|><|im_start|>assistant\n",
    "  \n\n  \t\n",
    "1234567890 0.001 1e-9 0b1010",
    "    if x:\n        return None\n",
    "Привет, мир! Ελληνικά עברית العربية हिन्दी",
    "'S 'LL 'Re it'S don'T",
]

# file name -> (golden under tests/golden, expected sha256); names as tools/fetch_model.py.
KNOWN_MODELS = {
    "SmolLM2-135M-Instruct.Q4_1.gguf": ("smollm2-135m-q4_1.json", EXPECTED_SHA256),
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf": (
        "qwen2.5-coder-0.5b-q4_k_m.json",
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf": (
        "qwen2.5-coder-1.5b-q4_k_m.json",
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
}
FETCH_NAMES = {
    "qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "qwen2.5-coder-1.5b": "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
}
QWEN_GREEDY_STEPS = 24


def find_llama_cpp_lib() -> Path | None:
    """The newest llama.cpp build beside the project (tools/bench_vs_llama.py's cache)."""
    root = Path.home() / ".cache/tessera/llama.cpp"
    cands = sorted(root.glob("*/vendor/llama.cpp/build/bin/libllama.so"))
    return cands[-1].parent if cands else None


class LlamaCppTokenizer:
    """llama.cpp's own tokenizer (libllama, vocab only) through the ctypes bindings that ship
    with llama-cpp-python's source tree beside the build (imported without the package's
    __init__, which needs extra dependencies)."""

    def __init__(self, lib_dir: Path, model_path: Path):
        import ctypes  # noqa: F401
        import types

        bindings = lib_dir.parents[3] / "llama_cpp"
        if not (bindings / "llama_cpp.py").is_file():
            raise FileNotFoundError(f"no llama_cpp/llama_cpp.py beside {lib_dir}")
        os.environ["LLAMA_CPP_LIB_PATH"] = str(lib_dir)
        if "llama_cpp" not in sys.modules:
            pkg = types.ModuleType("llama_cpp")
            pkg.__path__ = [str(bindings)]
            sys.modules["llama_cpp"] = pkg
        import llama_cpp.llama_cpp as lc

        self.lc = lc
        self.source = f"libllama of {bindings.parent.name}/vendor/llama.cpp"
        self._quiet = lc.llama_log_callback(lambda level, text, user: None)  # kept alive
        lc.llama_log_set(self._quiet, None)
        lc.llama_backend_init()
        params = lc.llama_model_default_params()
        params.vocab_only = True
        self.model = lc.llama_model_load_from_file(str(model_path).encode(), params)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load the vocabulary of {model_path}")
        self.vocab = lc.llama_model_get_vocab(self.model)

    def encode(self, text: str) -> list[int]:
        """Like `llama-tokenize --no-bos` with special tokens parsed (add_special=False,
        parse_special=True)."""
        b = text.encode("utf-8")
        n = len(b) + 8
        buf = (self.lc.llama_token * n)()
        got = self.lc.llama_tokenize(self.vocab, b, len(b), buf, n, False, True)
        if got < 0:
            raise RuntimeError(f"llama_tokenize needs {-got} tokens")
        return list(buf[:got])


def qwen2_golden(model_path: Path, sha: str, out: Path, llama_lib: Path | None) -> int:
    """Qwen2 GGUFs: ids from transformers' tokenizer built from the GGUF, each checked
    against llama.cpp's tokenizer on the same file where a build is found."""
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)

    reader = GGUFReader(str(model_path))
    pre = reader.fields["tokenizer.ggml.pre"].contents()
    add_bos = reader.fields["tokenizer.ggml.add_bos_token"].contents()
    assert pre == "qwen2" and add_bos is False, (pre, add_bos)
    gguf_template = reader.fields["tokenizer.chat_template"].contents()
    del reader

    hf_tok = AutoTokenizer.from_pretrained(str(model_path.parent), gguf_file=model_path.name)
    assert hf_tok.chat_template == gguf_template, "transformers did not take the GGUF's template"
    llama_tok = None
    if llama_lib is not None:
        llama_tok = LlamaCppTokenizer(llama_lib, model_path)
        print(f"llama.cpp tokenizer: {llama_tok.source}")
    else:
        print("llama.cpp tokenizer: not found; ids are NOT cross-checked", file=sys.stderr)

    def encode(text: str) -> list[int]:
        ids = hf_tok(text, add_special_tokens=False).input_ids
        if llama_tok is not None:
            lids = llama_tok.encode(text)
            assert lids == ids, f"transformers {ids} vs llama.cpp {lids} for {text!r}"
        return ids

    model = AutoModelForCausalLM.from_pretrained(
        str(model_path.parent),
        gguf_file=model_path.name,
        dtype=torch.float32,
        attn_implementation="eager",
    )
    model.eval()
    assert model.dtype == torch.float32
    vocab = model.config.vocab_size

    def chat(msgs):
        return hf_tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)

    prompt_specs = [
        ("capital_france", "The capital of France is", None),
        ("code", QWEN_CODE_PROMPT, None),
        ("prose", QWEN_PROSE_PROMPT, None),
        ("mixed_unicode", QWEN_MIXED_PROMPT, None),
        ("chat_code", chat(QWEN_CHAT_MESSAGES), QWEN_CHAT_MESSAGES),
        ("chat_multi_turn", chat(QWEN_CHAT_MULTI_MESSAGES), QWEN_CHAT_MULTI_MESSAGES),
    ]
    greedy_key = f"greedy{QWEN_GREEDY_STEPS}"

    prompts = []
    min_margin = (float("inf"), None, None)
    for name, text, msgs in prompt_specs:
        ids = encode(text)
        assert hf_tok.decode(ids, skip_special_tokens=False) == text, f"{name}: round-trip failed"
        logits = forward_logits(model, ids)
        assert logits.shape == (len(ids), vocab), logits.shape
        assert torch.isfinite(logits).all()
        argmax, margin = argmax_and_margin(logits)
        top = torch.topk(logits[-1], TOP_K)
        top20 = [[int(i), round(float(v), LOGIT_DECIMALS)] for i, v in zip(top.indices, top.values)]
        g_ids, g_margin = greedy(model, ids, QWEN_GREEDY_STEPS)
        assert g_ids[0] == argmax[-1], (name, g_ids[0], argmax[-1])
        g_text = hf_tok.decode(g_ids, skip_special_tokens=False)
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
                greedy_key: g_ids,
                f"{greedy_key}_margin": g_margin,
                f"{greedy_key}_text": g_text,
            }
        )
        print(f"\n[{name}] {len(ids)} ids; min argmax margin {margin[pos]:.6f} at pos {pos}; "
              f"min greedy margin {min(g_margin):.6f}; top-1 logit {top20[0][1]:.4f}")
        print(f"  {greedy_key}: {g_text!r}")

    print(f"\nsmallest argmax margin over all prompts: {min_margin[0]:.6f} "
          f"({min_margin[1]}, position {min_margin[2]})")

    cases = []
    print("\ntokenizer cases (transformers_gguf vs llama.cpp):")
    for text in QWEN_TOKENIZER_CASES:
        a = hf_tok(text, add_special_tokens=False).input_ids
        b = llama_tok.encode(text) if llama_tok is not None else None
        assert hf_tok.decode(a, skip_special_tokens=False) == text, f"round-trip failed: {text!r}"
        cases.append({"text": text, "ids_transformers_gguf": a, "ids_llama_cpp": b})
        flag = "-" if b is None else ("same" if a == b else "DIFFER")
        print(f"  {flag:6s} {text!r}: {a}" + ("" if b is None or a == b else f" vs {b}"))
    n_diff = sum(c["ids_llama_cpp"] is not None and c["ids_llama_cpp"] != c["ids_transformers_gguf"]
                 for c in cases)
    print(f"  {n_diff}/{len(cases)} cases differ")

    doc = {
        "model_file": model_path.name,
        "model_sha256": sha,
        "generator": {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "tokenizers": tokenizers.__version__,
            "gguf": importlib.metadata.version("gguf"),
            "script": "tools/reference/make_golden.py",
            "tokenizer_cross_check": None if llama_tok is None else (
                f"every prompt's ids equal llama.cpp's ({llama_tok.source}, llama_tokenize "
                "add_special=false, parse_special=true); "
                "tokenizer_cases.ids_llama_cpp likewise"),
            "notes": "float32 (GGUF dequantized by transformers), CPU, eager attention, "
                     "ids from transformers' tokenizer built from the GGUF "
                     "(AutoTokenizer gguf_file; pre-tokenizer qwen2), no BOS; chat prompts "
                     "rendered with the GGUF's chat template (add_generation_prompt); "
                     "argmax/margin/top20 from one full-sequence forward; "
                     f"{greedy_key} by re-running the full sequence each step, no EOS stop; "
                     f"{greedy_key}_text is transformers' decode of those ids.",
        },
        "greedy_steps": QWEN_GREEDY_STEPS,
        "prompts": prompts,
        "tokenizer_cases": cases,
    }
    write_doc(doc, out)
    return 0

