"""Golden for the real Gemma 3 270M Q4_K_M GGUF (make_family_golden.py --family gemma-3-270m):
tests/golden/families/gemma-3-270m-q4_k_m.json, in the schema of the tiny-family goldens.

transformers loads the GGUF (every tensor dequantized to float32; the Gemma norm weights,
stored by the converter as 1 + w, get the 1 subtracted back) with the config it derives
from the GGUF metadata (checked below against the real google/gemma-3-270m config: 18
layers, every 6th global, sliding window 512, head_dim 256, query_pre_attn_scalar 256, rope
1e6 global / 10000 local, no rope scaling, no softcaps, tied embeddings). Ids come from
transformers' tokenizer built from the GGUF and must equal llama.cpp's tokenizer on the same
file. The GGUF has no chat template: the chat prompt uses Gemma 3's official one."""

from __future__ import annotations

import importlib.metadata
import os
import sys
import time
from pathlib import Path

import numpy as np
import tokenizers
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

import family_tokenizers as ft
from make_family_golden import (GOLDEN_DIR, GREEDY_STEPS, TOP_K, LlamaCppModel, LlamaCppVocab,
                                rnd, sha256_file, write_json)
from make_golden import CODE_PROMPT, PROSE_PROMPT

MODEL_PATH = Path(os.environ.get("TESSERA_CACHE", Path.home() / ".cache/tessera")) / \
    "models/gemma-3-270m-q4_k_m.gguf"
EXPECTED_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"  # warned about
OUT = GOLDEN_DIR / "gemma-3-270m-q4_k_m.json"

MIXED = "Le café coûte 3,50 € — 北京 2024年12月31日 🚀 done; x=0x1F, y=-7.25e-3.  Tabs\tand  spaces."
LONG_TEXT = PROSE_PROMPT + "\n\n" + ft._PROSE + "\n" + CODE_PROMPT
CHAT = [
    {"role": "system", "content": "Answer in one short sentence."},
    {"role": "user", "content": "What is the capital of France?"},
]
TOKENIZER_CASES = [
    "Hello world",
    "  two  spaces and\ttabs\n\nnew lines\n",
    " leading space",
    "12345 3.14159 1,000,000",
    "def f(x):\n    return x * 2  # double",
    "café naïve Zürich",
    "Привет, мир! 你好，世界！",
    "🚀 emoji 🙂👍",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text after bos<eos>",
    "don't I'm we'll they've",
    "\n\n\n    indented\n",
]

EXPECTED_CONFIG = {
    "num_hidden_layers": 18, "hidden_size": 640, "intermediate_size": 2048,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
    "query_pre_attn_scalar": 256, "sliding_window": 512, "vocab_size": 262144,
    "final_logit_softcapping": None, "attn_logit_softcapping": None,
    "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
}


@torch.no_grad()
def _last_logits(model, ids: list[int]) -> torch.Tensor:
    out = model(input_ids=torch.tensor([ids]), use_cache=False, logits_to_keep=1)
    return out.logits[0, -1].float()


@torch.no_grad()
def _greedy(model, ids: list[int], steps: int) -> tuple[list[int], list[float]]:
    seq = list(ids)
    out, margins = [], []
    for _ in range(steps):
        top2 = torch.topk(_last_logits(model, seq), 2)
        out.append(int(top2.indices[0]))
        margins.append(rnd(top2.values[0] - top2.values[1]))
        seq.append(out[-1])
    return out, margins


def gemma3_270m_golden() -> None:
    t0 = time.time()
    print(f"\n=== gemma-3-270m ({MODEL_PATH}) ===")
    if not MODEL_PATH.is_file():
        raise FileNotFoundError(MODEL_PATH)
    sha = sha256_file(MODEL_PATH)
    if EXPECTED_SHA256 and sha != EXPECTED_SHA256:
        print(f"WARNING: sha256 {sha} != expected {EXPECTED_SHA256}", file=sys.stderr)

    hf_tok = AutoTokenizer.from_pretrained(str(MODEL_PATH.parent), gguf_file=MODEL_PATH.name)
    assert hf_tok.chat_template is None  # the file has no tokenizer.chat_template
    lcpp = LlamaCppVocab(MODEL_PATH)
    print(f"  tokenizer: {type(hf_tok).__name__}, {len(hf_tok)} tokens; llama.cpp: {lcpp.source}")

    model = AutoModelForCausalLM.from_pretrained(
        str(MODEL_PATH.parent), gguf_file=MODEL_PATH.name, dtype=torch.float32,
        attn_implementation="eager")
    model.eval()
    cfg = model.config
    for k, v in EXPECTED_CONFIG.items():
        assert getattr(cfg, k) == v, (k, getattr(cfg, k), v)
    assert cfg.layer_types == [("full_attention" if (i + 1) % 6 == 0 else "sliding_attention")
                               for i in range(18)], cfg.layer_types
    rp = cfg.rope_parameters
    assert rp["full_attention"] == {"rope_type": "default", "rope_theta": 1000000.0}, rp
    assert rp["sliding_attention"] == {"rope_type": "default", "rope_theta": 10000.0}, rp
    print(f"  model loaded ({time.time() - t0:.0f}s); config as google/gemma-3-270m")

    chat_text = hf_tok.apply_chat_template(CHAT, chat_template=ft.GEMMA3_CHAT_TEMPLATE,
                                           add_generation_prompt=True, tokenize=False)
    specs = [("capital_france", "The capital of France is", None, True),
             ("mixed_unicode", MIXED, None, True),
             ("long_prose_code", LONG_TEXT, None, True),
             ("chat", chat_text, CHAT, False)]
    prompts = []
    min_margin = (float("inf"), None, None)
    min_greedy = (float("inf"), None, None)
    for name, text, msgs, add_special in specs:
        ids = hf_tok(text, add_special_tokens=add_special).input_ids
        lids = lcpp.encode(text, add_special)
        assert lids == ids, f"{name}: transformers {ids[:40]}... vs llama.cpp {lids[:40]}..."
        assert ids[0] == hf_tok.bos_token_id == 2
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
        assert logits.shape == (len(ids), 262144) and torch.isfinite(logits).all()
        top2 = torch.topk(logits, 2, dim=-1)
        argmax = top2.indices[:, 0].tolist()
        margin = [rnd(x) for x in (top2.values[:, 0] - top2.values[:, 1]).tolist()]
        top = torch.topk(logits[-1], TOP_K)
        top20 = [[int(i), rnd(v)] for i, v in zip(top.indices, top.values)]
        del logits, top2
        g_ids, g_margin = _greedy(model, ids, GREEDY_STEPS)
        assert g_ids[0] == argmax[-1]
        g_text = hf_tok.decode(g_ids, skip_special_tokens=False)
        prompts.append({
            "name": name, "text": text, "chat_messages": msgs, "add_special_tokens": add_special,
            "bos_prepended": True, "ids": ids, "ids_llama_cpp": lids, "ids_match_llama_cpp": True,
            "argmax": argmax, "margin": margin, "top20": top20,
            f"greedy{GREEDY_STEPS}": g_ids, f"greedy{GREEDY_STEPS}_margin": g_margin,
            f"greedy{GREEDY_STEPS}_text": g_text,
        })
        pos = int(np.argmin(margin))
        if margin[pos] < min_margin[0]:
            min_margin = (margin[pos], name, pos)
        gpos = int(np.argmin(g_margin))
        if g_margin[gpos] < min_greedy[0]:
            min_greedy = (g_margin[gpos], name, gpos)
        print(f"  [{name}] {len(ids)} ids; llama.cpp ids match; min margin {margin[pos]:.5f} @ {pos}; "
              f"min greedy margin {min(g_margin):.5f}; top1 {top20[0][1]:.3f} "
              f"({time.time() - t0:.0f}s)")
        print(f"    greedy: {g_text!r}")
    print(f"  smallest argmax margin {min_margin[0]:.6f} ({min_margin[1]}, position {min_margin[2]}); "
          f"smallest greedy margin {min_greedy[0]:.6f} ({min_greedy[1]}, step {min_greedy[2]})")

    # The long prompt exercises the 512-token window: the same forward with every layer global.
    long_ids = next(p["ids"] for p in prompts if p["name"] == "long_prose_code")
    ref_logits = None
    with torch.no_grad():
        ref_logits = model(input_ids=torch.tensor([long_ids]), use_cache=False).logits[0]
        # A window longer than the prompt (layer_types also pick each layer's rope base, so
        # they stay as they are).
        cfg.sliding_window = 1 << 20
        for layer in model.model.layers:
            if layer.self_attn.sliding_window is not None:
                layer.self_attn.sliding_window = 1 << 20
        full_logits = model(input_ids=torch.tensor([long_ids]), use_cache=False).logits[0]
    d_all = (ref_logits - full_logits).abs()
    changed = (ref_logits.argmax(-1) != full_logits.argmax(-1))
    first_changed = int(changed.nonzero()[0, 0]) if changed.any() else None
    sensitivity = [{"change": "sliding window off (window 2^20 on the 15 local layers, their rope base unchanged), long_prose_code only",
                    "max_abs_logit_diff": rnd(d_all.max()),
                    "max_abs_logit_diff_first_512": rnd(d_all[:512].max()),
                    "argmax_changes": int(changed.sum()), "positions": len(long_ids),
                    "first_changed_position": first_changed}]
    print(f"  sensitivity: {sensitivity[0]}")
    del ref_logits, full_logits, d_all
    cfg.sliding_window = 512

    # llama.cpp on the same file (information only: its quantized matmuls round the
    # activations to 8 bits, so logits differ by more than an exact float32 engine's would).
    lm = LlamaCppModel(lcpp, MODEL_PATH)
    lcpp_rows = []
    for p in prompts:
        with torch.no_grad():
            a = model(input_ids=torch.tensor([p["ids"]]), use_cache=False).logits[0].float().numpy()
        b = lm.logits(p["ids"], 1024)
        lcpp_rows.append({"name": p["name"], "max_abs_logit_diff": rnd(np.abs(a - b).max()),
                          "argmax_equal": int((a.argmax(-1) == b.argmax(-1)).sum()),
                          "positions": len(p["ids"])})
        del a, b
        print(f"  llama.cpp eval: {lcpp_rows[-1]}")
    lcpp_eval = {"n_ctx_requested": 1024, "n_ctx_used": lm.last_n_ctx, "kv_cache": "f32",
                 "flash_attn": False, "prompts": lcpp_rows,
                 "note": "information only: ggml's quantized matmuls quantize the activations "
                         "(Q8_0/Q8_K), and its GELU uses an fp16 table"}
    lm.close()

    cases = []
    for text in TOKENIZER_CASES:
        a = hf_tok(text, add_special_tokens=False).input_ids
        b = lcpp.encode(text, False)
        cases.append({"text": text, "ids_transformers": a, "ids_llama_cpp": b})
        if a != b:
            print(f"  tokenizer case differs: {text!r}: {a} vs llama.cpp {b}")
    n_same = sum(c["ids_transformers"] == c["ids_llama_cpp"] for c in cases)
    print(f"  tokenizer cases: {n_same}/{len(cases)} equal to llama.cpp's")
    source = lcpp.source
    lcpp.close()

    doc = {
        "family": "gemma3",
        "model_file": MODEL_PATH.name,
        "model_sha256": sha,
        "config_facts": {
            "config": {**EXPECTED_CONFIG, "layer_types": cfg.layer_types,
                       "rope_parameters": rp, "rms_norm_eps": 1e-6},
            "sliding_layers": [i for i, t in enumerate(cfg.layer_types) if t == "sliding_attention"],
            "full_layers": [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"],
            "window_semantics": "query at position i attends keys j with i - 512 < j <= i",
            "gguf_notes": "no chat template, no sliding_window_pattern key (llama.cpp and "
                          "transformers both default to every 6th layer global), no "
                          "rope.freq_base_swa key (both default the local base to 10000), no "
                          "query_pre_attn_scalar key (llama.cpp: 1/sqrt(head_dim) = 1/16 "
                          "except for the 27B), norm weights stored as 1 + w (F32)",
        },
        "generator": {
            "transformers": transformers.__version__, "torch": torch.__version__,
            "tokenizers": tokenizers.__version__, "gguf": importlib.metadata.version("gguf"),
            "script": "tools/reference/make_family_golden.py --family gemma-3-270m",
            "tokenizer_cross_check": f"every prompt's ids equal llama.cpp's ({source}, "
                                     "llama_tokenize add_special as the prompt's "
                                     "add_special_tokens, parse_special=true)",
            "notes": "float32 (GGUF dequantized by transformers, Gemma norms 1 + w stored, "
                     "w = stored - 1 loaded), CPU, eager attention; ids from transformers' "
                     "tokenizer built from the GGUF (GemmaTokenizer); plain prompts with BOS "
                     "(add_special_tokens), the chat prompt rendered with Gemma 3's official "
                     "template (it starts with <bos>) and tokenized without adding specials; "
                     "argmax/margin/top20 from one full-sequence forward; greedy by re-running "
                     "the full sequence each step, no EOS stop.",
        },
        "chat_template": ft.GEMMA3_CHAT_TEMPLATE,
        "greedy_steps": GREEDY_STEPS,
        "smallest_margin": {"value": min_margin[0], "prompt": min_margin[1], "position": min_margin[2]},
        "smallest_greedy_margin": {"value": min_greedy[0], "prompt": min_greedy[1], "step": min_greedy[2]},
        "prompts": prompts,
        "tokenizer_cases": cases,
        "sensitivity": sensitivity,
        "llama_cpp_eval": lcpp_eval,
    }
    write_json(doc, OUT)
    print(f"  done in {time.time() - t0:.0f}s")
