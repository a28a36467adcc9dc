#!/usr/bin/env python3
"""Tiny random-weight models of several families, their GGUF conversions and golden logits.

For each family (llama3, qwen3, gemma3, gemma2, phi3, mistral) this script

1. trains a tiny tokenizer (family_tokenizers.py: byte-level BPE with the family's regex,
   or a SentencePiece BPE model) and writes it as the family's tokenizer files, with the
   family's chat template, under tests/models/tiny-<family>/;
2. builds the transformers model from a scaled-down copy of the real model's config, fills
   every parameter from a seeded Gaussian (numpy PCG64, parameters in name order, a std per
   kind of tensor chosen so that attention is not uniform and logits are not near-ties),
   rounds it to the storage dtype (float32, or float16 if the folder would exceed ~600 KB)
   and saves it with save_pretrained (config.json, generation_config.json,
   model.safetensors);
3. converts the folder with llama.cpp's own convert_hf_to_gguf.py (family_convert.py;
   trained BPE tokenizers have an unknown pre-tokenizer hash, so the name is forced to the
   one whose regex the tokenizer uses) to tests/models/tiny-<family>.gguf and prints its
   metadata and block-0 tensors;
4. reloads the folder in float32 with eager attention and writes
   tests/golden/families/tiny-<family>.json: per prompt the ids (transformers' tokenizer,
   cross-checked against llama.cpp's tokenizer on the GGUF), argmax and top1-top2 margin at
   every position, the last position's top-20 and a 16-token greedy continuation; plus
   tokenizer cases, "sensitivity" (how much the logits move when a family feature such as
   the sliding window or a softcap is switched off, to show the golden exercises it) and a
   check that the GGUF loaded back by transformers gives the same logits.

`--family gemma-3-270m` instead makes tests/golden/families/gemma-3-270m-q4_k_m.json from
the real Gemma 3 270M Q4_K_M file (family_gemma3_270m.py).

    tools/reference/.venv/bin/python tools/reference/make_family_golden.py [--family NAME ...]

Deterministic (fixed corpus, seeds, one thread); re-running rewrites the same files.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import tokenizers
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
import family_tokenizers as ft  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
MODELS_DIR = REPO_ROOT / "tests/models"
GOLDEN_DIR = REPO_ROOT / "tests/golden/families"
LLAMA_CPP_DIR = Path(os.environ.get(
    "TESSERA_LLAMA_CPP_SRC",
    Path.home() / ".cache/tessera/llama.cpp/llama_cpp_python-0.3.36/vendor/llama.cpp"))

GREEDY_STEPS = 16
TOP_K = 20
DECIMALS = 6
F32_FOLDER_LIMIT = 600_000  # bytes: above this the weights are stored as float16
GGUF_LOGIT_TOL = 1e-4
MIN_MARGIN = 3e-3  # seeds are tried until no argmax / greedy margin is below this
MAX_SEED_TRIES = 40

# ---------------------------------------------------------------------------------------
# Prompts (original text written for these goldens)
# ---------------------------------------------------------------------------------------
P_CAPITAL = "The capital of France is"
P_SHORT_CODE = "x = 3 + 4"
P_CODE = '''def mean(values):
    """Average of a list."""
    total = 0
    for v in values:
        total += v
    return total / len(values)
'''
P_PROSE = (
    "The ferry left the harbour at dawn, and the captain watched the fog lift off the water. "
    "By noon the island was visible: a low green line with a white lighthouse at one end. "
    "The passengers came up on deck to look, and a child asked whether anyone lived there."
)
P_MIXED = "Le café coûte 3,50 € — 2024-03-15 🚀 Привет 你好; x=0x1F."
CHAT_MSGS = [{"role": "user", "content": "What is the capital of France?"}]
CHAT_MULTI = [
    {"role": "user", "content": "Write a function that adds two numbers."},
    {"role": "assistant", "content": "def add(a, b):\n    return a + b"},
    {"role": "user", "content": "Now make it add three."},
]
CHAT_SYSTEM = [
    {"role": "system", "content": "You are brief."},
    {"role": "user", "content": "Why is the sky blue?"},
]
CHAT_TINY = [{"role": "user", "content": "Hi!"}]

TOKENIZER_CASES = [
    "Hello world",
    "  two  spaces and\ttabs\n\nnew lines\n",
    " leading space",
    "12345 3.14159 1,000,000",
    "def f(x):\n    return x * 2  # double",
    "café naïve Zürich",
    "Привет, мир! 你好，世界！",
    "🚀 emoji 🙂👍",
    "don't I'm we'll they've",
    "CamelCase HTTPServer",
]


# ---------------------------------------------------------------------------------------
# Family specifications
# ---------------------------------------------------------------------------------------
@dataclass
class Family:
    name: str
    real_model: str
    config_cls: str                       # transformers config class name
    config: dict[str, Any]                # scaled-down config kwargs
    real_config_notes: dict[str, Any]     # the real model's values kept / changed
    tokenizer: str                        # "llama3-bpe" | "qwen2-bpe" | "gemma-spm" | "llama2-spm"
    chat_template: str
    prompts: list[tuple[str, Any, bool]]  # (name, text or chat messages, add_special_tokens)
    std: dict[str, float]                 # weight std per tensor kind
    seed: int
    force_bpe_pre: str | None = None
    norm_offset_one: bool = False         # Gemma: RMSNorm scales by (1 + w)
    variants: list[tuple[str, Callable]] = field(default_factory=list)
    # Full goldens (same ids) under another semantics, e.g. what llama.cpp computes from the
    # GGUF where that differs from transformers: (key, description, config change).
    variant_goldens: list[tuple[str, str, Callable]] = field(default_factory=list)
    phi3_regimes: bool = False


def _cfg_update(**kw):
    def f(cfg):
        for k, v in kw.items():
            setattr(cfg, k, v)
        return cfg
    return f


def _no_window(cfg):
    # A window longer than any prompt. (Not layer_types = all "full_attention": Gemma 3 also
    # picks each layer's rope base by its layer type.)
    cfg.sliding_window = 1 << 20
    return cfg


def _gemma3_no_linear_scaling(cfg):
    cfg.rope_parameters = copy.deepcopy(cfg.rope_parameters)
    cfg.rope_parameters["full_attention"] = {"rope_type": "default",
                                             "rope_theta": cfg.rope_parameters["full_attention"]["rope_theta"]}
    return cfg


def _gemma3_local_base_global(cfg):
    cfg.rope_parameters = copy.deepcopy(cfg.rope_parameters)
    cfg.rope_parameters["sliding_attention"]["rope_theta"] = cfg.rope_parameters["full_attention"]["rope_theta"]
    return cfg


def _llama3_no_scaling(cfg):
    cfg.rope_parameters = {"rope_type": "default", "rope_theta": cfg.rope_parameters["rope_theta"]}
    return cfg


def _phi3_swap_factors(cfg):
    rp = copy.deepcopy(cfg.rope_parameters)
    rp["short_factor"], rp["long_factor"] = rp["long_factor"], rp["short_factor"]
    cfg.rope_parameters = rp
    return cfg


def _phi3_no_attn_factor(cfg):
    rp = copy.deepcopy(cfg.rope_parameters)
    rp["attention_factor"] = 1.0
    cfg.rope_parameters = rp
    return cfg


def _phi3_always_long(cfg):
    rp = copy.deepcopy(cfg.rope_parameters)
    rp["short_factor"] = list(rp["long_factor"])
    cfg.rope_parameters = rp
    return cfg


def _qwen3_no_qk_norm(model):
    for layer in model.model.layers:
        layer.self_attn.q_norm = torch.nn.Identity()
        layer.self_attn.k_norm = torch.nn.Identity()
    return model


# Phi-3 longrope factors for rotary_dim/2 = 6 frequency pairs (distinct short/long lists,
# the shape of Phi-3.5-mini's: short close to 1, long growing towards the low frequencies).
PHI3_SHORT = [1.0, 1.02, 1.05, 1.1, 1.2, 1.35]
PHI3_LONG = [1.0, 1.25, 2.0, 4.0, 9.0, 20.0]

# Weight std per kind of tensor (hidden size 64). Larger than a real init (0.02) so that
# attention is far from uniform, the layers' outputs outweigh the (tied) input embedding
# (otherwise a random model just repeats its last token) and logits spread over several units.
BASE_STD = {"embed": 0.4, "lm_head": 0.4, "q": 0.3, "k": 0.3, "v": 0.1, "o": 0.2,
            "mlp": 0.2, "norm": 0.1}

FAMILIES: dict[str, Family] = {}


def _add(f: Family) -> None:
    FAMILIES[f.name] = f


_add(Family(
    name="llama3",
    real_model="meta-llama/Llama-3.2-1B-Instruct",
    config_cls="LlamaConfig",
    config=dict(
        architectures=["LlamaForCausalLM"], vocab_size=512, hidden_size=64,
        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=131072,
        rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        tie_word_embeddings=True, hidden_act="silu", attention_bias=False, mlp_bias=False,
        bos_token_id=None, eos_token_id=None),  # set from the tokenizer
    real_config_notes={"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
                       "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 8192,
                       "vocab_size": 128256, "kept": "rope_theta, rope_scaling (llama3), "
                       "rms_norm_eps, tie_word_embeddings, GQA 2:1 (real 4:1)"},
    tokenizer="llama3-bpe",
    chat_template=ft.LLAMA3_CHAT_TEMPLATE,
    prompts=[("capital_france", P_CAPITAL, True), ("code", P_CODE, True),
             ("prose", P_PROSE, True), ("mixed_unicode", P_MIXED, True),
             ("chat", CHAT_SYSTEM, False)],
    std=dict(BASE_STD),
    seed=3001,
    force_bpe_pre="llama-bpe",
    variants=[("rope_scaling llama3 -> none (plain rope_theta 500000)", _llama3_no_scaling)],
))

_add(Family(
    name="qwen3",
    real_model="Qwen/Qwen3-0.6B",
    config_cls="Qwen3Config",
    config=dict(
        architectures=["Qwen3ForCausalLM"], vocab_size=512, hidden_size=64,
        intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=40960,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True, hidden_act="silu",
        attention_bias=False, use_sliding_window=False, sliding_window=None,
        bos_token_id=None, eos_token_id=None),
    real_config_notes={"hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16,
                       "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072,
                       "vocab_size": 151936, "kept": "head_dim = 2 x hidden/heads, q_norm/k_norm, "
                       "no qkv bias, rope_theta 1e6, rms_norm_eps 1e-6, tied embeddings, GQA 2:1"},
    tokenizer="qwen2-bpe",
    chat_template=ft.CHATML_TEMPLATE,
    prompts=[("capital_france", P_CAPITAL, True), ("code", P_CODE, True),
             ("mixed_unicode", P_MIXED, True), ("chat", CHAT_MSGS, False),
             ("chat_multi_turn", CHAT_MULTI, False)],
    std=dict(BASE_STD, qk_norm_mean=1.0),
    seed=3002,
    force_bpe_pre="qwen2",
    variants=[("q_norm/k_norm removed", _qwen3_no_qk_norm)],
))

_add(Family(
    name="gemma3",
    real_model="google/gemma-3-270m (+ rope_scaling linear 8 of gemma-3-4b)",
    config_cls="Gemma3TextConfig",
    config=dict(
        architectures=["Gemma3ForCausalLM"], vocab_size=640, hidden_size=64,
        intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32,
        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
        rope_local_base_freq=10000.0, rope_scaling={"rope_type": "linear", "factor": 8.0},
        sliding_window=8,
        layer_types=["sliding_attention"] * 5 + ["full_attention"],
        attn_logit_softcapping=None, final_logit_softcapping=None,
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
        attention_bias=False, use_bidirectional_attention=False,
        pad_token_id=0, eos_token_id=1, bos_token_id=2),
    real_config_notes={"hidden_size": 640, "num_hidden_layers": 18, "num_attention_heads": 4,
                       "num_key_value_heads": 1, "head_dim": 256, "query_pre_attn_scalar": 256,
                       "intermediate_size": 2048, "sliding_window": 512, "vocab_size": 262144,
                       "rope_scaling": "null in 270m; {linear, factor 8} in gemma-3-4b",
                       "kept": "5 sliding : 1 full layer pattern, head_dim != hidden/heads, "
                       "query_pre_attn_scalar == head_dim (llama.cpp assumes that), "
                       "rope 1e6 global / 10000 local, q/k norms, 4 norms per block, "
                       "gelu_pytorch_tanh, sqrt(hidden) embedding scale, tied embeddings"},
    tokenizer="gemma-spm",
    chat_template=ft.GEMMA3_CHAT_TEMPLATE,
    prompts=[("capital_france", P_CAPITAL, True), ("code", P_CODE, True),
             ("prose", P_PROSE, True), ("chat", CHAT_SYSTEM, False)],
    std=dict(BASE_STD, embed=0.15, post_norm_mean=1.0, final_norm_mean=2.0, qk_norm_mean=1.0),
    seed=3003,
    norm_offset_one=True,
    variants=[("sliding window off (window 2^20 on the sliding layers)", _no_window),
              ("rope_scaling linear 8 on global layers -> none", _gemma3_no_linear_scaling),
              ("local rope base 10000 -> 1e6 (global base)", _gemma3_local_base_global)],
))

_add(Family(
    name="gemma2",
    real_model="google/gemma-2-2b-it",
    config_cls="Gemma2Config",
    config=dict(
        architectures=["Gemma2ForCausalLM"], vocab_size=640, hidden_size=64,
        intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=32,
        max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=10000.0,
        sliding_window=16, layer_types=["sliding_attention", "full_attention"] * 2,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
        attention_bias=False, pad_token_id=0, eos_token_id=1, bos_token_id=2),
    real_config_notes={"hidden_size": 2304, "num_hidden_layers": 26, "num_attention_heads": 8,
                       "num_key_value_heads": 4, "head_dim": 256, "query_pre_attn_scalar": 256,
                       "intermediate_size": 9216, "sliding_window": 4096, "vocab_size": 256000,
                       "kept": "attn_logit_softcapping 50, final_logit_softcapping 30, sliding "
                       "window on even layers (0, 2, ...), query_pre_attn_scalar == head_dim, "
                       "rope_theta 10000, 4 norms per block, gelu_pytorch_tanh, tied"},
    tokenizer="gemma-spm",
    chat_template=ft.GEMMA2_CHAT_TEMPLATE,
    prompts=[("capital_france", P_CAPITAL, True), ("code", P_CODE, True),
             ("prose", P_PROSE, True), ("chat_multi_turn", CHAT_MULTI, False)],
    # Larger q/k and final-norm scale so that attention scores and final logits reach the
    # softcaps' non-linear range (tanh(x/cap) with |x| ~ cap/2 and more).
    std=dict(BASE_STD, q=0.5, k=0.5, embed=0.25, post_norm_mean=2.0, final_norm_mean=3.0),
    seed=3004,
    norm_offset_one=True,
    variants=[("sliding window off (window 2^20 on the sliding layers)", _no_window),
              ("attn_logit_softcapping off", _cfg_update(attn_logit_softcapping=None)),
              ("final_logit_softcapping off", _cfg_update(final_logit_softcapping=None))],
))

_add(Family(
    name="phi3",
    real_model="microsoft/Phi-3.5-mini-instruct (+ partial_rotary_factor 0.75, GQA of Phi-4-mini)",
    config_cls="Phi3Config",
    config=dict(
        architectures=["Phi3ForCausalLM"], vocab_size=645, hidden_size=64,
        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256,
        original_max_position_embeddings=32, partial_rotary_factor=0.75,
        rope_theta=10000.0,
        rope_scaling={"type": "longrope", "short_factor": PHI3_SHORT, "long_factor": PHI3_LONG},
        rms_norm_eps=1e-5, sliding_window=262144, tie_word_embeddings=False,
        hidden_act="silu", bos_token_id=1, eos_token_id=None, pad_token_id=None),
    real_config_notes={"hidden_size": 3072, "num_hidden_layers": 32, "num_attention_heads": 32,
                       "num_key_value_heads": 32, "intermediate_size": 8192,
                       "original_max_position_embeddings": 4096,
                       "max_position_embeddings": 131072, "vocab_size": 32064,
                       "sliding_window": 262144,
                       "Phi-4-mini": "partial_rotary_factor 0.75, 24 heads / 8 kv heads, tied",
                       "kept": "fused qkv_proj / gate_up_proj, longrope short/long factors, "
                       "max/original ratio 8 -> attention factor sqrt(1+ln 8/ln 32), "
                       "rms_norm_eps 1e-5, untied lm_head (Phi-3.5)"},
    tokenizer="llama2-spm-phi3",
    chat_template=ft.PHI3_CHAT_TEMPLATE,
    prompts=[("capital_france", P_CAPITAL, False), ("short_code", P_SHORT_CODE, False),
             ("chat", CHAT_TINY, False), ("code_long", P_CODE, False),
             ("prose_long", P_PROSE, False)],
    std=dict(BASE_STD),
    seed=3005,
    phi3_regimes=True,
    variants=[("longrope short <-> long factor lists swapped", _phi3_swap_factors),
              ("longrope attention factor -> 1.0", _phi3_no_attn_factor)],
    variant_goldens=[("long_factors_always",
                      "long factors at every sequence length (llama.cpp picks rope_factors_long "
                      "whenever its context size n_ctx exceeds phi3.rope.scaling."
                      "original_context_length, whatever the sequence length; the attention "
                      "factor applies in both regimes); identical to the main golden for the "
                      "long-regime prompts", _phi3_always_long)],
))

_add(Family(
    name="mistral",
    real_model="mistralai/Mistral-7B-Instruct-v0.1",
    config_cls="MistralConfig",
    config=dict(
        architectures=["MistralForCausalLM"], vocab_size=640, hidden_size=64,
        intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=32768,
        rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=16,
        tie_word_embeddings=False, hidden_act="silu", bos_token_id=1, eos_token_id=2),
    real_config_notes={"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                       "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 14336,
                       "sliding_window": 4096, "vocab_size": 32000,
                       "kept": "sliding window on every layer, GQA 4:1, rope_theta 10000, "
                       "rms_norm_eps 1e-5, untied lm_head"},
    tokenizer="llama2-spm",
    chat_template=ft.MISTRAL_CHAT_TEMPLATE,
    prompts=[("capital_france", P_CAPITAL, True), ("code", P_CODE, True),
             ("prose", P_PROSE, True), ("chat_multi_turn", CHAT_MULTI, False)],
    std=dict(BASE_STD),
    seed=3006,
    variants=[("sliding window off", _cfg_update(sliding_window=None))],
    variant_goldens=[("no_sliding_window",
                      "no sliding window: what llama.cpp computes from this GGUF (the converter "
                      "writes no sliding-window key for the llama architecture)",
                      _cfg_update(sliding_window=None))],
))


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------
def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def rnd(x: float) -> float:
    return round(float(x), DECIMALS)


def write_json(doc: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {out.relative_to(REPO_ROOT)} ({out.stat().st_size} bytes)")


def write_pretty_json(obj: dict, path: Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=2)
        f.write("\n")


# ---------------------------------------------------------------------------------------
# Tokenizers
# ---------------------------------------------------------------------------------------
def _added_tokens_decoder(tok_json: dict) -> dict:
    return {str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip",
                                              "single_word", "special")}
            for t in tok_json["added_tokens"]}


def build_tokenizer(fam: Family, folder: Path) -> dict:
    """Write tokenizer.json / tokenizer_config.json (/ tokenizer.model) into `folder`.
    Returns facts about the tokenizer for the golden."""
    from transformers import PreTrainedTokenizerFast

    for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                 "special_tokens_map.json", "chat_template.jinja"):
        (folder / name).unlink(missing_ok=True)
    facts: dict[str, Any] = {"kind": fam.tokenizer}
    if fam.tokenizer == "llama3-bpe":
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                    "<|end_header_id|>", "<|eot_id|>"]
        tok = ft.train_bytelevel_bpe(ft.LLAMA3_REGEX, fam.config["vocab_size"] - len(specials),
                                     specials, ignore_merges=True, nfc=False,
                                     bos="<|begin_of_text|>")
        hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>",
                                     eos_token="<|eot_id|>", clean_up_tokenization_spaces=False)
        tcfg = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<|begin_of_text|>",
                "eos_token": "<|eot_id|>", "clean_up_tokenization_spaces": False,
                "model_input_names": ["input_ids", "attention_mask"],
                "model_max_length": 131072, "tokenizer_class": "PreTrainedTokenizerFast"}
        facts.update(pre_tokenizer="Split(Llama 3 regex, isolated) + ByteLevel(use_regex=false)",
                     ignore_merges=True, normalizer=None)
    elif fam.tokenizer == "qwen2-bpe":
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        tok = ft.train_bytelevel_bpe(ft.QWEN2_REGEX, fam.config["vocab_size"] - len(specials),
                                     specials, ignore_merges=False, nfc=True, bos=None)
        hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                     pad_token="<|endoftext|>", clean_up_tokenization_spaces=False)
        tcfg = {"add_bos_token": False, "add_prefix_space": False, "bos_token": None,
                "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                "clean_up_tokenization_spaces": False, "errors": "replace",
                "model_max_length": 131072, "split_special_tokens": False,
                "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}
        facts.update(pre_tokenizer="Split(Qwen2 regex, isolated) + ByteLevel(use_regex=false)",
                     ignore_merges=False, normalizer="NFC")
    elif fam.tokenizer == "gemma-spm":
        user = ["<mask>", "<start_of_turn>", "<end_of_turn>"]
        model = ft.train_spm(fam.config["vocab_size"], style="gemma", user_defined=user)
        (folder / "tokenizer.model").write_bytes(model)
        (folder / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "GemmaTokenizer", "add_bos_token": True}))
        hf = AutoTokenizer.from_pretrained(str(folder))
        tcfg = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<bos>",
                "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
                "mask_token": "<mask>", "clean_up_tokenization_spaces": False,
                "spaces_between_special_tokens": False, "model_max_length": 1000000000000000019884624838656,
                "sp_model_kwargs": {}, "tokenizer_class": "GemmaTokenizer"}
        facts.update(spm="BPE, byte_fallback, split_digits, no dummy prefix, identity "
                     "normalization, whitespace kept; <pad>=0 <eos>=1 <bos>=2 <unk>=3 "
                     "<mask>=4 <start_of_turn>=5 <end_of_turn>=6")
    elif fam.tokenizer in ("llama2-spm", "llama2-spm-phi3"):
        model = ft.train_spm(640, style="llama2", user_defined=[])
        (folder / "tokenizer.model").write_bytes(model)
        phi3 = fam.tokenizer == "llama2-spm-phi3"
        # Metaspace prepend_scheme "always" (a "▁" also after each special token, as the
        # real Mistral v0.1 / Phi-3 tokenizer.json files and llama.cpp's SPM tokenizer do);
        # transformers builds that from tokenizer.model when legacy is true.
        legacy = True
        (folder / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "LlamaTokenizer", "add_bos_token": not phi3, "legacy": legacy}))
        hf = AutoTokenizer.from_pretrained(str(folder))
        if phi3:
            from tokenizers import AddedToken
            extra = ["<|endoftext|>", "<|assistant|>", "<|system|>", "<|end|>", "<|user|>"]
            hf.add_tokens([AddedToken(t, special=True, normalized=False, rstrip=(t != "<|endoftext|>"))
                           for t in extra], special_tokens=True)
            tcfg = {"add_bos_token": False, "add_eos_token": False, "bos_token": "<s>",
                    "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                    "unk_token": "<unk>", "clean_up_tokenization_spaces": False,
                    "legacy": False, "model_max_length": 131072, "padding_side": "left",
                    "sp_model_kwargs": {}, "tokenizer_class": "LlamaTokenizer",
                    "use_default_system_prompt": False}
        else:
            tcfg = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>",
                    "eos_token": "</s>", "unk_token": "<unk>", "pad_token": None,
                    "clean_up_tokenization_spaces": False, "legacy": True,
                    "model_max_length": 1000000000000000019884624838656,
                    "spaces_between_special_tokens": False, "sp_model_kwargs": {},
                    "tokenizer_class": "LlamaTokenizer", "use_default_system_prompt": False}
        facts.update(spm="BPE, byte_fallback, split_digits, dummy prefix (add_dummy_prefix), "
                     "identity normalization, whitespace kept; <unk>=0 <s>=1 </s>=2",
                     legacy=legacy)
    else:
        raise ValueError(fam.tokenizer)

    hf.save_pretrained(str(folder))
    for name in ("special_tokens_map.json", "chat_template.jinja"):
        (folder / name).unlink(missing_ok=True)
    tok_json = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    if fam.tokenizer == "gemma-spm":
        # Gemma's turn markers and <mask> are special tokens (tokenizer_config of gemma-3-*-it).
        for t in tok_json["added_tokens"]:
            if t["content"] in ("<mask>", "<start_of_turn>", "<end_of_turn>"):
                t["special"] = True
        (folder / "tokenizer.json").write_text(json.dumps(tok_json, ensure_ascii=False, indent=2),
                                               encoding="utf-8")
    tcfg["added_tokens_decoder"] = _added_tokens_decoder(tok_json)
    tcfg["chat_template"] = fam.chat_template
    write_pretty_json(dict(sorted(tcfg.items())), folder / "tokenizer_config.json")

    hf2 = AutoTokenizer.from_pretrained(str(folder))
    facts["class"] = type(hf2).__name__
    facts["len"] = len(hf2)
    assert len(hf2) == fam.config["vocab_size"], (len(hf2), fam.config["vocab_size"])
    # The reloaded tokenizer must encode like the one it was saved from.
    for text in TOKENIZER_CASES + [P_CODE, P_MIXED]:
        a = hf(text, add_special_tokens=True).input_ids
        b = hf2(text, add_special_tokens=True).input_ids
        assert a == b, (fam.name, text, a, b)
    if (folder / "tokenizer.model").is_file():
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
        same = sum(sp.encode(t) == hf2(t, add_special_tokens=False).input_ids for t in TOKENIZER_CASES)
        facts["sentencepiece_agrees_on_cases"] = f"{same}/{len(TOKENIZER_CASES)}"
    specials = {k: getattr(hf2, k) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
    facts["special_tokens"] = {k: [v, hf2.convert_tokens_to_ids(v)] if v else None
                               for k, v in specials.items()}
    facts["added_tokens"] = {t["content"]: t["id"] for t in tok_json["added_tokens"]}
    return facts


# ---------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------
def _kind(name: str) -> str:
    n = name.lower()
    if "post_attention_layernorm" in n or "post_feedforward_layernorm" in n:
        return "post_norm"  # Gemma 2/3's norms on the attention / MLP outputs
    if n == "model.norm.weight":
        return "final_norm"
    if "q_norm" in n or "k_norm" in n:
        return "qk_norm"  # Qwen3 / Gemma 3 per-head RMSNorm of q and k
    if "norm" in n:
        return "norm"
    if "embed_tokens" in n:
        return "embed"
    if "lm_head" in n:
        return "lm_head"
    for k in ("q_proj", "k_proj", "v_proj", "o_proj"):
        if k in n:
            return k[0]
    if "qkv_proj" in n:
        return "qkv"
    if "mlp" in n:
        return "mlp"
    raise ValueError(name)


def fill_weights(model, fam: Family, seed: int) -> list[dict]:
    """Overwrite every parameter from a seeded Gaussian; returns a summary. Norm weights
    are mean + std * N(0, 1) with std["norm"] and mean std[kind + "_mean"] (0 unless set;
    Gemma's larger post-norm / final-norm scales keep the sqrt(hidden)-scaled tied embedding
    from dominating the residual stream, which makes a random model repeat its input)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    summary = []
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        kind = _kind(name)
        shape = tuple(p.shape)
        if kind in ("norm", "post_norm", "final_norm", "qk_norm"):
            w = fam.std.get(kind + "_mean", 0.0) + fam.std["norm"] * rng.standard_normal(shape)
            if not fam.norm_offset_one:
                w = 1.0 + w  # plain RMSNorm scales by w; Gemma's by (1 + w)
            else:
                # The converter adds the 1 in the checkpoint's dtype (float16 here), so
                # 1 + w must be exact in float16: snap w to f16(1 + w) - 1 (also exact in
                # float16, and in the float32 that transformers computes 1 + w in).
                w = (1.0 + w).astype(np.float16).astype(np.float32) - np.float32(1.0)
        elif kind == "qkv":
            # Phi-3 fused [q; k; v] rows: each part with its own std.
            cfg = model.config
            hd = cfg.hidden_size // cfg.num_attention_heads
            nq, nkv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
            w = np.concatenate([fam.std["q"] * rng.standard_normal((nq, shape[1])),
                                fam.std["k"] * rng.standard_normal((nkv, shape[1])),
                                fam.std["v"] * rng.standard_normal((nkv, shape[1]))])
        else:
            w = fam.std[kind] * rng.standard_normal(shape)
        with torch.no_grad():
            p.copy_(torch.from_numpy(w.astype(np.float32)))
        summary.append({"name": name, "shape": list(shape), "kind": kind})
    return summary


def make_config(fam: Family, tok_facts: dict):
    cls = getattr(transformers, fam.config_cls)
    kw = dict(fam.config)
    sp = tok_facts["special_tokens"]
    if fam.name == "llama3":
        kw["bos_token_id"] = sp["bos_token"][1]
        kw["eos_token_id"] = sp["eos_token"][1]
    elif fam.name == "qwen3":
        kw["bos_token_id"] = tok_facts["added_tokens"]["<|endoftext|>"]
        kw["eos_token_id"] = tok_facts["added_tokens"]["<|im_end|>"]
        kw["pad_token_id"] = tok_facts["added_tokens"]["<|endoftext|>"]
    elif fam.name == "phi3":
        kw["eos_token_id"] = tok_facts["added_tokens"]["<|endoftext|>"]
        kw["pad_token_id"] = tok_facts["added_tokens"]["<|endoftext|>"]
    cfg = cls(**kw)
    return cfg


def min_margins(model, prompt_ids: list[list[int]]) -> tuple[float, float]:
    """Smallest top1-top2 margin over every prompt position, and over the greedy steps."""
    m_arg, m_greedy = float("inf"), float("inf")
    for ids in prompt_ids:
        top2 = torch.topk(logits_of(model, ids), 2, dim=-1)
        m_arg = min(m_arg, float((top2.values[:, 0] - top2.values[:, 1]).min()))
        _, gm = greedy(model, ids, GREEDY_STEPS)
        m_greedy = min(m_greedy, min(gm))
    return m_arg, m_greedy


def build_model(fam: Family, folder: Path, tok_facts: dict, prompt_ids: list[list[int]]) -> dict:
    """Fill, round to the storage dtype and save the model. Seeds fam.seed, fam.seed + 1, ...
    are tried in turn until no argmax or greedy margin is below MIN_MARGIN (so that the
    goldens hold no near-ties that a correct float32 engine could flip)."""
    cfg = make_config(fam, tok_facts)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    if cfg.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    n_params = sum(p.numel() for p in model.parameters())
    tok_bytes = sum((folder / n).stat().st_size for n in
                    ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
                    if (folder / n).is_file())
    dtype = torch.float32 if n_params * 4 + tok_bytes + 4096 <= F32_FOLDER_LIMIT else torch.float16
    tried = []
    for seed in range(fam.seed, fam.seed + MAX_SEED_TRIES):
        summary = fill_weights(model, fam, seed)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(dtype).float())
        m_arg, m_greedy = min_margins(model, prompt_ids)
        tried.append({"seed": seed, "min_margin": rnd(m_arg), "min_greedy_margin": rnd(m_greedy)})
        print(f"  seed {seed}: smallest argmax margin {m_arg:.5f}, greedy {m_greedy:.5f}")
        if min(m_arg, m_greedy) >= MIN_MARGIN:
            break
    else:
        raise RuntimeError(f"{fam.name}: no seed in {MAX_SEED_TRIES} tries without near-ties")
    model = model.to(dtype)
    for name in ("model.safetensors", "config.json", "generation_config.json"):
        (folder / name).unlink(missing_ok=True)
    model.save_pretrained(str(folder))
    gen = GenerationConfig(bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id,
                           pad_token_id=getattr(cfg, "pad_token_id", None), do_sample=False)
    gen.save_pretrained(str(folder))
    return {"n_params": n_params, "dtype": str(dtype).replace("torch.", ""),
            "tensors": len(summary), "seed": seed, "seeds_tried": tried}


def load_reference(folder: Path):
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    assert model.dtype == torch.float32
    return model


# ---------------------------------------------------------------------------------------
# GGUF
# ---------------------------------------------------------------------------------------
def convert_gguf(fam: Family, folder: Path, out: Path, outtype: str) -> str:
    out.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve().parent / "family_convert.py"),
           str(LLAMA_CPP_DIR)]
    if fam.force_bpe_pre:
        cmd += ["--force-bpe-pre", fam.force_bpe_pre]
    cmd += [str(folder), "--outfile", str(out), "--outtype", outtype]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    log = r.stdout + r.stderr
    if r.returncode != 0:
        print(log[-4000:])
        raise RuntimeError(f"convert_hf_to_gguf failed for {fam.name}")
    notes = [ln for ln in log.splitlines() if "family_convert" in ln or "WARNING" in ln]
    for ln in notes:
        print("  converter:", ln)
    return "\n".join(notes)


def gguf_summary(path: Path) -> dict:
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    kv = {}
    arrays = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF."):
            continue
        try:
            v = f.contents()
        except Exception as e:  # pragma: no cover
            v = f"<{e}>"
        if isinstance(v, list) and (len(v) > 16 or k.startswith("tokenizer.ggml.")):
            arrays[k] = len(v)
            continue
        if isinstance(v, float):
            v = float(np.float32(v))
        kv[k] = v
    tensors = [{"name": t.name, "type": t.tensor_type.name, "shape": [int(x) for x in t.shape]}
               for t in r.tensors]
    return {"kv": kv, "arrays": arrays, "tensors": tensors}


def print_gguf(summary: dict) -> None:
    print("  GGUF metadata (arrays as lengths):")
    for k, v in summary["kv"].items():
        s = repr(v)
        if k == "tokenizer.chat_template":
            s = f"<{len(v)} chars>"
        print(f"    {k} = {s[:120]}")
    for k, n in summary["arrays"].items():
        print(f"    {k} = [{n} items]")
    print("  tensors (non-block and block 0):")
    for t in summary["tensors"]:
        if not t["name"].startswith("blk.") or t["name"].startswith("blk.0."):
            print(f"    {t['name']:32s} {t['type']:5s} {t['shape']}")


def gguf_logits_check(fam: Family, folder: Path, gguf_path: Path, ref, prompt_ids: list[list[int]]) -> dict:
    """Load the GGUF back with transformers (weights from the GGUF, config from the HF folder)
    and compare the logits with the HF folder's; also the GGUF's own config as transformers
    derives it, for information."""
    result: dict[str, Any] = {}
    cfg = AutoConfig.from_pretrained(str(folder))
    try:
        m = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                 config=cfg, dtype=torch.float32,
                                                 attn_implementation="eager")
        result["method"] = "from_pretrained(gguf_file=..., config=<the HF folder's config>)"
    except Exception as e:  # noqa: BLE001
        # e.g. Mistral: transformers maps the GGUF by the config's model_type, and gguf-py
        # has no "mistral" architecture (the converter writes "llama"). Load the GGUF with
        # the config transformers derives from it, then move its state dict into a model
        # built from the HF folder's config.
        first = f"{type(e).__name__}: {e}".splitlines()[0][:200]
        print(f"  GGUF via transformers with the HF config failed ({first}); "
              "loading with the GGUF's config and moving the weights")
        g = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                 dtype=torch.float32, attn_implementation="eager")
        m = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
        m.load_state_dict(g.state_dict(), strict=True)
        m.tie_weights()
        result["method"] = (f"with the HF config: {first}; so from_pretrained(gguf_file=...) "
                            f"as {type(g).__name__}, state dict moved into the HF-config model")
        del g
    m.eval()
    d = 0.0
    with torch.no_grad():
        for ids in prompt_ids:
            a = ref(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
            b = m(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
            d = max(d, float((a - b).abs().max()))
    result["with_hf_config"] = {"max_abs_logit_diff": d, "ok": d <= GGUF_LOGIT_TOL}
    print(f"  GGUF via transformers (HF config, GGUF weights): max |dlogit| = {d:.3g}")
    if d > GGUF_LOGIT_TOL:
        raise AssertionError(f"{fam.name}: GGUF weights differ from the HF folder's ({d})")
    del m
    try:
        m = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                 dtype=torch.float32, attn_implementation="eager")
        m.eval()
        d = 0.0
        with torch.no_grad():
            for ids in prompt_ids:
                a = ref(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
                b = m(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
                d = max(d, float((a - b).abs().max()))
        result["with_gguf_config"] = {"max_abs_logit_diff": d, "model_class": type(m).__name__}
        print(f"  GGUF via transformers (config derived from the GGUF): max |dlogit| = {d:.3g}"
              + ("" if d <= GGUF_LOGIT_TOL else "  (transformers' GGUF config lacks some of the "
                 "family's settings)"))
    except Exception as e:  # noqa: BLE001
        result["with_gguf_config"] = f"{type(e).__name__}: {e}"[:300]
        print(f"  GGUF via transformers (GGUF config): {result['with_gguf_config']}")
    return result


# ---------------------------------------------------------------------------------------
# llama.cpp tokenizer
# ---------------------------------------------------------------------------------------
class LlamaCppVocab:
    def __init__(self, gguf_path: Path):
        from golden_qwen2 import LlamaCppTokenizer, find_llama_cpp_lib

        lib = find_llama_cpp_lib()
        if lib is None:
            raise FileNotFoundError("no llama.cpp build (libllama.so) found")
        self.t = LlamaCppTokenizer(lib, gguf_path)
        self.source = self.t.source

    def encode(self, text: str, add_special: bool) -> list[int]:
        lc = self.t.lc
        b = text.encode("utf-8")
        n = len(b) + 16
        buf = (lc.llama_token * n)()
        got = lc.llama_tokenize(self.t.vocab, b, len(b), buf, n, add_special, True)
        if got < 0:
            raise RuntimeError(f"llama_tokenize needs {-got} tokens")
        return list(buf[:got])

    def close(self) -> None:
        self.t.lc.llama_model_free(self.t.model)


class LlamaCppModel:
    """The GGUF evaluated by llama.cpp itself (libllama through the same ctypes bindings, CPU):
    logits at every position of one prompt, in a fresh context of n_ctx tokens."""

    def __init__(self, vocab: LlamaCppVocab, gguf_path: Path, threads: int = 2):
        lc = vocab.t.lc
        self.lc = lc
        params = lc.llama_model_default_params()
        params.n_gpu_layers = 0
        self.model = lc.llama_model_load_from_file(str(gguf_path).encode(), params)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {gguf_path}")
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        self.threads = threads

    def logits(self, ids: list[int], n_ctx: int) -> np.ndarray:
        lc = self.lc
        cp = lc.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = cp.n_ubatch = max(len(ids), 8)
        cp.n_seq_max = 1
        cp.n_threads = cp.n_threads_batch = self.threads
        cp.no_perf = True
        cp.type_k = cp.type_v = 0  # GGML_TYPE_F32 KV cache (the default F16 costs ~1e-2)
        cp.flash_attn_type = 0     # LLAMA_FLASH_ATTN_TYPE_DISABLED
        ctx = lc.llama_init_from_model(self.model, cp)
        if not ctx:
            raise RuntimeError("llama_init_from_model failed")
        batch = lc.llama_batch_init(len(ids), 0, 1)
        try:
            batch.n_tokens = len(ids)
            for i, t in enumerate(ids):
                batch.token[i] = t
                batch.pos[i] = i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 1
            self.last_n_ctx = int(lc.llama_n_ctx(ctx))
            rc = lc.llama_decode(ctx, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
            out = np.empty((len(ids), self.n_vocab), dtype=np.float32)
            for i in range(len(ids)):
                ptr = lc.llama_get_logits_ith(ctx, i)
                out[i] = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
            return out
        finally:
            lc.llama_batch_free(batch)
            lc.llama_free(ctx)

    def close(self) -> None:
        self.lc.llama_model_free(self.model)


# ---------------------------------------------------------------------------------------
# Goldens
# ---------------------------------------------------------------------------------------
@torch.no_grad()
def logits_of(model, ids: list[int]) -> torch.Tensor:
    return model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False).logits[0].float()


@torch.no_grad()
def greedy(model, ids: list[int], steps: int) -> tuple[list[int], list[float]]:
    seq = list(ids)
    out, margins = [], []
    for _ in range(steps):
        top2 = torch.topk(logits_of(model, seq)[-1], 2)
        nxt = int(top2.indices[0])
        out.append(nxt)
        margins.append(rnd(top2.values[0] - top2.values[1]))
        seq.append(nxt)
    return out, margins


def variant_model(ref, folder: Path, cfg_fn: Callable):
    """The reference weights in a model built from a changed copy of the folder's config."""
    cfg = cfg_fn(AutoConfig.from_pretrained(str(folder)))
    m = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    m.load_state_dict(ref.state_dict(), strict=True)
    m.tie_weights()
    m.eval()
    return m


def prompt_golden(model, ids: list[int]) -> dict:
    logits = logits_of(model, ids)
    top2 = torch.topk(logits, 2, dim=-1)
    top = torch.topk(logits[-1], TOP_K)
    g_ids, g_margin = greedy(model, ids, GREEDY_STEPS)
    return {"argmax": top2.indices[:, 0].tolist(),
            "margin": [rnd(x) for x in (top2.values[:, 0] - top2.values[:, 1]).tolist()],
            "top20": [[int(i), rnd(v)] for i, v in zip(top.indices, top.values)],
            f"greedy{GREEDY_STEPS}": g_ids, f"greedy{GREEDY_STEPS}_margin": g_margin}


def llama_cpp_eval_check(fam: Family, folder: Path, gguf_path: Path, outtype: str, ref,
                         prompts: list[dict], n_ctx: int = 256) -> dict:
    """Evaluate the prompts with llama.cpp itself and compare its logits (every position) with
    transformers' (the main golden and each variant golden). An f16 GGUF is re-converted to
    f32 in a temporary folder first: ggml's CPU matmul with f16 weights rounds the
    activations to f16 (~1e-2 on these logits), which would hide what is being checked."""
    import tempfile

    result: dict[str, Any] = {"n_ctx_requested": n_ctx, "kv_cache": "f32", "flash_attn": False}
    with tempfile.TemporaryDirectory() as td:
        path = gguf_path
        if outtype != "f32":
            path = Path(td) / f"tiny-{fam.name}-f32.gguf"
            convert_gguf(fam, folder, path, "f32")
            result["gguf"] = "f32 re-conversion of the HF folder (same converter and options)"
        else:
            result["gguf"] = f"tests/models/{gguf_path.name}"
        vocab = LlamaCppVocab(path)
        lm = LlamaCppModel(vocab, path)
        variants = {key: variant_model(ref, folder, fn) for key, _, fn in fam.variant_goldens}
        rows = []
        for p in prompts:
            ids = p["ids"]
            b = lm.logits(ids, n_ctx)
            row = {"name": p["name"]}
            for key, m in [("main", ref)] + list(variants.items()):
                a = logits_of(m, ids).numpy()
                row[key] = {"max_abs_logit_diff": rnd(np.abs(a - b).max()),
                            "argmax_equal": int((a.argmax(-1) == b.argmax(-1)).sum()),
                            "positions": len(ids)}
            rows.append(row)
            print(f"  llama.cpp eval [{p['name']}]: " + "; ".join(
                f"{k}: max |dlogit| {v['max_abs_logit_diff']:.2e}, argmax {v['argmax_equal']}/{v['positions']}"
                for k, v in row.items() if k != "name"))
        result["n_ctx_used"] = lm.last_n_ctx
        result["prompts"] = rows
        lm.close()
        vocab.close()
    return result


def sensitivity(fam: Family, ref, folder: Path, prompt_ids: list[list[int]]) -> list[dict]:
    out = []
    base = [logits_of(ref, ids) for ids in prompt_ids]
    for label, fn in fam.variants:
        if fam.name == "qwen3":
            m = copy.deepcopy(ref)
            m = fn(m)
        else:
            m = variant_model(ref, folder, fn)
        m.eval()
        d, changed, total = 0.0, 0, 0
        for ids, a in zip(prompt_ids, base):
            b = logits_of(m, ids)
            d = max(d, float((a - b).abs().max()))
            changed += int((a.argmax(-1) != b.argmax(-1)).sum())
            total += len(ids)
        out.append({"change": label, "max_abs_logit_diff": rnd(d),
                    "argmax_changes": changed, "positions": total})
        print(f"  sensitivity: {label}: max |dlogit| {d:.4f}, argmax changes {changed}/{total}")
    return out


def config_facts(fam: Family, cfg) -> dict:
    c = cfg.to_dict()
    facts: dict[str, Any] = {"real_model": fam.real_model, "real_config": fam.real_config_notes}
    keep = ["model_type", "architectures", "vocab_size", "hidden_size", "intermediate_size",
            "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
            "max_position_embeddings", "rms_norm_eps", "rope_parameters", "tie_word_embeddings",
            "hidden_act", "hidden_activation", "sliding_window", "layer_types",
            "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
            "original_max_position_embeddings", "partial_rotary_factor", "use_sliding_window",
            "bos_token_id", "eos_token_id", "pad_token_id"]
    facts["config"] = {k: c[k] for k in keep if k in c}
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    facts["head_dim_effective"] = hd
    if getattr(cfg, "layer_types", None) and fam.name in ("gemma3", "gemma2"):
        facts["sliding_layers"] = [i for i, t in enumerate(cfg.layer_types) if t == "sliding_attention"]
        facts["full_layers"] = [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"]
    if fam.name == "mistral":
        facts["sliding_layers"] = list(range(cfg.num_hidden_layers))
    if getattr(cfg, "sliding_window", None) and fam.name in ("gemma3", "gemma2", "mistral"):
        facts["window_semantics"] = (
            f"query at position i attends keys j with i - {cfg.sliding_window} < j <= i "
            f"({cfg.sliding_window} keys including itself; transformers' sliding_window_overlay "
            "kv_idx > q_idx - sliding_window, llama.cpp's LLAMA_SWA_TYPE_STANDARD)")
    if fam.name == "gemma3":
        facts["rope"] = ("global (full_attention) layers: theta 1e6 with linear scaling factor 8 "
                         "(positions / 8); local (sliding) layers: theta 10000, no scaling")
        facts["attention_scale"] = f"query_pre_attn_scalar^-0.5 = {cfg.query_pre_attn_scalar}^-0.5"
        facts["embedding_scale"] = f"sqrt(hidden_size) = {cfg.hidden_size ** 0.5} (in the activation dtype)"
        facts["norms"] = "RMSNorm x * (1 + w); GGUF stores 1 + w"
    if fam.name == "gemma2":
        facts["attention_scale"] = f"query_pre_attn_scalar^-0.5 = {cfg.query_pre_attn_scalar}^-0.5"
        facts["softcapping"] = ("attention scores: 50 * tanh(s / 50) after scaling, before the "
                                "mask; final logits: 30 * tanh(l / 30)")
        facts["embedding_scale"] = f"sqrt(hidden_size) = {cfg.hidden_size ** 0.5}"
        facts["norms"] = "RMSNorm x * (1 + w); GGUF stores 1 + w"
    if fam.name == "phi3":
        rp = cfg.rope_parameters
        rot = int(hd * rp.get("partial_rotary_factor", 1.0))
        factor = cfg.max_position_embeddings / rp["original_max_position_embeddings"]
        import math
        attn = math.sqrt(1 + math.log(factor) / math.log(rp["original_max_position_embeddings"]))
        facts["rotary_dim"] = rot
        facts["longrope"] = {
            "short_factor": rp["short_factor"], "long_factor": rp["long_factor"],
            "original_max_position_embeddings": rp["original_max_position_embeddings"],
            "max_position_embeddings": cfg.max_position_embeddings,
            "attention_factor": attn,
            "rule": ("transformers: inv_freq[i] = 1 / (factor[i] * theta^(2i/rotary_dim)) with "
                     "the long factors when the sequence length (max position + 1) exceeds "
                     "original_max_position_embeddings, else the short ones, for the whole "
                     "forward; cos and sin are multiplied by attention_factor in both regimes; "
                     "rotary (NeoX halves) on the first rotary_dim dims of each head only")}
    return facts


def render_prompts(fam: Family, hf_tok) -> list[tuple]:
    """(name, add_special_tokens, chat messages or None, ids, text) per prompt: chat prompts
    rendered with the folder's template (add_generation_prompt) and tokenized without adding
    specials, plain ones with add_special_tokens as given."""
    out = []
    for name, content, add_special in fam.prompts:
        msgs = None
        if isinstance(content, list):
            msgs = content
            text = hf_tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        else:
            text = content
        ids = hf_tok(text, add_special_tokens=add_special).input_ids
        out.append((name, add_special, msgs, ids, text))
    return out


def family_golden(fam: Family) -> None:
    t0 = time.time()
    print(f"\n=== {fam.name} ({fam.real_model}) ===")
    folder = MODELS_DIR / f"tiny-{fam.name}"
    folder.mkdir(parents=True, exist_ok=True)
    gguf_path = MODELS_DIR / f"tiny-{fam.name}.gguf"

    tok_facts = build_tokenizer(fam, folder)
    print(f"  tokenizer: {tok_facts['class']}, {tok_facts['len']} tokens, "
          f"specials {tok_facts['special_tokens']}")
    hf_tok = AutoTokenizer.from_pretrained(str(folder))
    rendered = render_prompts(fam, hf_tok)
    model_facts = build_model(fam, folder, tok_facts, [r[3] for r in rendered])
    print(f"  model: {model_facts['n_params']} parameters, stored as {model_facts['dtype']}")
    outtype = "f32" if model_facts["dtype"] == "float32" else "f16"
    conv_notes = convert_gguf(fam, folder, gguf_path, outtype)
    gs = gguf_summary(gguf_path)
    print_gguf(gs)

    ref = load_reference(folder)
    vocab = ref.config.vocab_size
    lcpp = LlamaCppVocab(gguf_path)

    prompts = []
    min_margin = (float("inf"), None, None)
    min_greedy = (float("inf"), None, None)
    all_ids = []
    for name, add_special, msgs, ids, text in rendered:
        lids = lcpp.encode(text, add_special)
        assert lids == ids, f"{name}: llama.cpp ids {lids} vs transformers {ids}"
        logits = logits_of(ref, ids)
        assert logits.shape == (len(ids), vocab) and torch.isfinite(logits).all()
        top2 = torch.topk(logits, 2, dim=-1)
        argmax = top2.indices[:, 0].tolist()
        margin = [rnd(x) for x in (top2.values[:, 0] - top2.values[:, 1]).tolist()]
        top = torch.topk(logits[-1], TOP_K)
        top20 = [[int(i), rnd(v)] for i, v in zip(top.indices, top.values)]
        g_ids, g_margin = greedy(ref, ids, GREEDY_STEPS)
        assert g_ids[0] == argmax[-1]
        g_text = hf_tok.decode(g_ids, skip_special_tokens=False)
        entry = {
            "name": name, "text": text, "chat_messages": msgs,
            "add_special_tokens": add_special,
            "bos_prepended": bool(ids and ids[0] == hf_tok.bos_token_id and hf_tok.bos_token_id is not None),
            "ids": ids, "ids_llama_cpp": lids, "ids_match_llama_cpp": lids == ids,
            "argmax": argmax, "margin": margin, "top20": top20,
            f"greedy{GREEDY_STEPS}": g_ids, f"greedy{GREEDY_STEPS}_margin": g_margin,
            f"greedy{GREEDY_STEPS}_text": g_text,
        }
        if fam.phi3_regimes:
            orig = ref.config.rope_parameters["original_max_position_embeddings"]
            if len(ids) + GREEDY_STEPS <= orig:
                entry["rope_regime"] = "short"
            elif len(ids) > orig:
                entry["rope_regime"] = "long"
            else:
                raise AssertionError(f"{name}: {len(ids)} ids + {GREEDY_STEPS} crosses {orig}")
        prompts.append(entry)
        all_ids.append(ids)
        pos = int(np.argmin(margin))
        if margin[pos] < min_margin[0]:
            min_margin = (margin[pos], name, pos)
        gpos = int(np.argmin(g_margin))
        if g_margin[gpos] < min_greedy[0]:
            min_greedy = (g_margin[gpos], name, gpos)
        print(f"  [{name}] {len(ids)} ids{' (BOS)' if entry['bos_prepended'] else ''}"
              f"{' ' + entry['rope_regime'] if 'rope_regime' in entry else ''}; llama.cpp ids "
              f"{'match' if lids == ids else 'DIFFER'}; min margin {margin[pos]:.4f} @ {pos}; "
              f"min greedy margin {min(g_margin):.4f}; top1 {top20[0][1]:.3f}; "
              f"margins < 0.01: {sum(m < 0.01 for m in margin)}/{len(margin)}")
        print(f"    greedy: {g_text!r}")
    print(f"  smallest argmax margin {min_margin[0]:.6f} ({min_margin[1]}, position {min_margin[2]}); "
          f"smallest greedy margin {min_greedy[0]:.6f} ({min_greedy[1]}, step {min_greedy[2]})")

    cases = []
    n_diff = 0
    for text in TOKENIZER_CASES:
        a = hf_tok(text, add_special_tokens=False).input_ids
        b = lcpp.encode(text, False)
        cases.append({"text": text, "ids_transformers": a, "ids_llama_cpp": b})
        if a != b:
            n_diff += 1
            print(f"  tokenizer case differs: {text!r}: {a} vs llama.cpp {b}")
    print(f"  tokenizer cases: {len(cases) - n_diff}/{len(cases)} equal to llama.cpp's")
    lcpp_source = lcpp.source
    lcpp.close()

    sens = sensitivity(fam, ref, folder, all_ids)
    variant_docs = {}
    for key, desc, fn in fam.variant_goldens:
        m = variant_model(ref, folder, fn)
        vp = []
        for p in prompts:
            g = prompt_golden(m, p["ids"])
            g = {"name": p["name"], **g}
            vp.append(g)
        mm = min(min(g["margin"]) for g in vp)
        gm = min(min(g[f"greedy{GREEDY_STEPS}_margin"]) for g in vp)
        same = sum(g["argmax"] == p["argmax"] and g[f"greedy{GREEDY_STEPS}"] == p[f"greedy{GREEDY_STEPS}"]
                   for g, p in zip(vp, prompts))
        variant_docs[key] = {"description": desc, "smallest_margin": mm,
                             "smallest_greedy_margin": gm, "prompts": vp}
        print(f"  variant golden {key}: smallest margin {mm:.5f}, greedy {gm:.5f}; "
              f"{same}/{len(vp)} prompts with the main golden's argmax and greedy")
    gguf_check = gguf_logits_check(fam, folder, gguf_path, ref, all_ids)
    lcpp_eval = llama_cpp_eval_check(fam, folder, gguf_path, outtype, ref, prompts)

    st = folder / "model.safetensors"
    facts = config_facts(fam, ref.config)
    doc = {
        "family": fam.name,
        "model_file": f"tests/models/{gguf_path.name}",
        "model_sha256": sha256_file(gguf_path),
        "hf_folder": f"tests/models/{folder.name}",
        "safetensors_sha256": sha256_file(st),
        "weights_dtype": model_facts["dtype"],
        "gguf_outtype": outtype,
        "n_params": model_facts["n_params"],
        "seed": model_facts["seed"],
        "seeds_tried": model_facts["seeds_tried"],
        "weight_std": fam.std,
        "config_facts": facts,
        "tokenizer": tok_facts,
        "gguf": {"kv": {k: v for k, v in gs["kv"].items() if k != "tokenizer.chat_template"},
                 "arrays": gs["arrays"],
                 "chat_template_in_gguf": "tokenizer.chat_template" in gs["kv"],
                 "tensors_block0_and_global": [t for t in gs["tensors"] if not t["name"].startswith("blk.")
                                               or t["name"].startswith("blk.0.")],
                 "converter": "llama.cpp convert_hf_to_gguf.py (" + str(LLAMA_CPP_DIR.name) + ")",
                 "forced_bpe_pre": fam.force_bpe_pre,
                 "converter_notes": conv_notes},
        "generator": {
            "transformers": transformers.__version__, "torch": torch.__version__,
            "tokenizers": tokenizers.__version__, "gguf": importlib.metadata.version("gguf"),
            "sentencepiece": importlib.metadata.version("sentencepiece"),
            "script": "tools/reference/make_family_golden.py",
            "tokenizer_cross_check": f"llama_tokenize on the GGUF ({lcpp_source}, "
                                     "add_special as the prompt's add_special_tokens, parse_special=true)",
            "notes": "float32 compute on the stored weights (float16 ones upcast), CPU, eager "
                     "attention; ids from transformers' tokenizer of the HF folder (plain prompts "
                     "with add_special_tokens as recorded, chat prompts rendered with the "
                     "folder's chat template and tokenized without adding specials); argmax/"
                     "margin/top20 from one full-sequence forward; greedy by re-running the full "
                     "sequence each step, no EOS stop; greedy_text is transformers' decode.",
        },
        "greedy_steps": GREEDY_STEPS,
        "smallest_margin": {"value": min_margin[0], "prompt": min_margin[1], "position": min_margin[2]},
        "smallest_greedy_margin": {"value": min_greedy[0], "prompt": min_greedy[1], "step": min_greedy[2]},
        "prompts": prompts,
        "tokenizer_cases": cases,
        "sensitivity": sens,
        "variant_goldens": variant_docs,
        "gguf_reload_check": gguf_check,
        "llama_cpp_eval": lcpp_eval,
    }
    write_json(doc, GOLDEN_DIR / f"tiny-{fam.name}.json")
    sizes = {p.name: p.stat().st_size for p in sorted(folder.iterdir())}
    print(f"  files: {sizes}; gguf {gguf_path.stat().st_size} bytes; {time.time() - t0:.1f}s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", action="append",
                    help=f"one of {sorted(FAMILIES)} or gemma-3-270m (repeatable); default: all tiny ones")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    names = args.family or list(FAMILIES)
    for name in names:
        if name == "gemma-3-270m":
            from family_gemma3_270m import gemma3_270m_golden
            gemma3_270m_golden()
            continue
        if name not in FAMILIES:
            print(f"unknown family {name!r}", file=sys.stderr)
            return 1
        family_golden(FAMILIES[name])
    return 0


if __name__ == "__main__":
    sys.exit(main())
