"""Shared helpers for the LoRA reference scripts (make_lora.py, train_lora.py,
make_lora_golden.py, make_lora_gguf.py).  Not a script; imported by them.

Everything here works on the base model exactly as make_golden.py loads it:
transformers' GGUF loader, dequantized to float32, eager attention, CPU.  In that
layout (Hugging Face's LlamaForCausalLM) q_proj/k_proj rows are in HF order;
the GGUF file itself stores them permuted for llama.cpp's RoPE (see
permute_qk_rows and README.md).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from make_golden import DEFAULT_MODEL, EXPECTED_SHA256, REPO_ROOT, build_original_tokenizer, sha256_file

LORA_DIR = REPO_ROOT / "tests/golden/lora"
DATA_DIR = Path(__file__).resolve().parent / "lora_data"

# The upstream model the GGUF was converted from.  transformers un-permutes the
# GGUF's q/k rows, so adapters made against the GGUF-loaded model are in this
# model's HF layout and apply to it unchanged.
BASE_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"

ALL7 = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def model_path_from_env(arg: Path | None) -> Path:
    return Path(arg or os.environ.get("TESSERA_MODEL", DEFAULT_MODEL)).resolve()


def set_threads(n: int) -> None:
    """Keep CPU use modest (the dev machine has 2 cores shared with cargo)."""
    torch.set_num_threads(n)
    torch.set_num_interop_threads(1)


def load_base(model_path: Path):
    """(hf_tokenizer, model): float32, eager attention, eval mode, CPU."""
    hf_tok = AutoTokenizer.from_pretrained(str(model_path.parent), gguf_file=model_path.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(model_path.parent),
        gguf_file=model_path.name,
        dtype=torch.float32,
        attn_implementation="eager",
    )
    model.eval()
    assert model.dtype == torch.float32
    return hf_tok, model


def chat_text(hf_tok, messages: list[dict]) -> str:
    """Chat template with the generation prompt (SmolLM2 adds its default system turn)."""
    return hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def encode(orig_tok, text: str) -> list[int]:
    """Same tokenization as make_golden.py: original (digit-splitting) tokenizer, no BOS."""
    ids = orig_tok.encode(text, add_special_tokens=False).ids
    assert orig_tok.decode(ids, skip_special_tokens=False) == text, "round-trip failed"
    return ids


def permute_qk_rows(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """HF row order -> GGUF/llama.cpp row order for q_proj/k_proj (and their lora_B).

    Same operation as llama.cpp's convert_hf_to_gguf.py LlamaModel.permute: within
    each head the rows [first half | second half] (HF's rotate_half RoPE pairs i
    and i+d/2) become interleaved [0, d/2, 1, d/2+1, ...] (llama.cpp's RoPE pairs
    2i and 2i+1).  For k_proj pass n_head = n_kv_head.  Only dim 0 (output rows)
    moves, so for a LoRA pair only lora_B is permuted; lora_A is unchanged.
    """
    out = w.shape[0]
    return w.reshape(n_head, 2, out // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def save_adapter(peft_model, out: Path) -> None:
    """peft save_pretrained, made reproducible: base_model_name_or_path is the upstream
    model id (not this machine's cache folder), target_modules sorted (peft keeps a set,
    so its order would change between runs), and peft's empty README.md template removed."""
    peft_model.peft_config["default"].base_model_name_or_path = BASE_MODEL_ID
    peft_model.save_pretrained(str(out))
    (out / "README.md").unlink(missing_ok=True)
    cfg_path = out / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    if isinstance(cfg.get("target_modules"), list):
        cfg["target_modules"] = sorted(cfg["target_modules"])
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True))


@torch.no_grad()
def greedy_cached(model, ids: list[int], steps: int, stop_ids: tuple[int, ...] = ()) -> list[int]:
    """Fast greedy with the KV cache, for human-readable answers only (goldens use
    make_golden.greedy, which re-runs the full sequence each step)."""
    out = model.generate(
        torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        max_new_tokens=steps, do_sample=False, eos_token_id=list(stop_ids) or None,
        pad_token_id=2,
    )
    return out[0, len(ids):].tolist()


__all__ = [
    "ALL7", "BASE_MODEL_ID", "DATA_DIR", "DEFAULT_MODEL", "EXPECTED_SHA256", "LORA_DIR", "REPO_ROOT",
    "build_original_tokenizer", "chat_text", "encode", "greedy_cached", "load_base",
    "model_path_from_env", "permute_qk_rows", "save_adapter", "set_threads", "sha256_file",
]
