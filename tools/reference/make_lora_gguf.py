#!/usr/bin/env python3
"""Write llama.cpp-format GGUF LoRA files for PEFT adapters in tests/golden/lora/.

What it does
------------
Converts a PEFT adapter folder (adapter_config.json + adapter_model.safetensors,
HF layout) into the GGUF LoRA format that llama.cpp's convert_lora_to_gguf.py
writes and llama.cpp's src/llama-adapter.cpp loads, using the `gguf` package:

* KV: general.architecture = "llama", general.type = "adapter",
  adapter.type = "lora", general.name, adapter.lora.alpha (FLOAT32),
  general.quantization_version = 2.
* Tensors, F32: for every adapted Linear, `<base tensor name>.lora_a` and
  `<base tensor name>.lora_b`, base names from gguf's tensor-name map
  (model.layers.{i}.self_attn.q_proj -> blk.{i}.attn_q.weight, ...).
  lora_a is PEFT's lora_A [r, in] and lora_b is PEFT's lora_B [out, r], written
  as-is (numpy row-major), i.e. ggml ne: lora_a = [in, r], lora_b = [r, out].
* q_proj / k_proj lora_b rows are permuted exactly as the base q/k weights were
  when the GGUF base was made (LlamaModel.permute: n_head for q, n_kv_head for k);
  lora_a is unchanged.  (The converter does this by routing the A/B pair through
  the same modify_tensors as the base weights.)
* llama.cpp's scale per tensor is adapter.lora.alpha / ne0(lora_b) (= alpha / r).
  convert_lora_to_gguf.py stores only adapter_config's lora_alpha and ignores
  use_rslora, rank_pattern and alpha_pattern.  Here: a different rank per module is
  fine (llama.cpp reads r from each lora_b); use_rslora is folded into the alpha key
  (alpha * sqrt(r), so alpha/r becomes alpha/sqrt(r); needs one rank for all
  modules); alpha_pattern cannot be expressed and is refused.

After writing, the file is read back with gguf.GGUFReader and checked: KV values,
llama.cpp's own shape checks against the base GGUF (base ne0 == lora_a ne0,
base ne1 == lora_b ne1, lora_a ne1 == lora_b ne0), and, for every module, that
W_gguf + (alpha_gguf/r) * B_gguf A_gguf equals the q/k-permuted
W_hf + scaling_peft * B A (W_hf from transformers' GGUF loader), i.e. the GGUF
adapter applied to the GGUF base is the PEFT adapter applied to the HF model.

How to run (from the repository root, ~30 s):
    tools/reference/.venv/bin/python tools/reference/make_lora_gguf.py [NAME ...]
(default NAMEs: rand-ko rand-qv-rslora; writes tests/golden/lora/NAME.gguf)
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGUFReader, GGUFWriter
from safetensors.torch import load_file

from lora_common import LORA_DIR, load_base, model_path_from_env, permute_qk_rows, set_threads

DEFAULT_NAMES = ["rand-ko", "rand-qv-rslora"]
KEY_RE = re.compile(r"^base_model\.model\.(model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+))\.lora_([AB])\.weight$")
MODULE_ORDER = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def base_meta(model_path: Path) -> dict:
    r = GGUFReader(str(model_path))
    f = r.fields
    arch = f["general.architecture"].contents()
    meta = {
        "arch": arch,
        "n_head": int(f[f"{arch}.attention.head_count"].contents()),
        "n_head_kv": int(f[f"{arch}.attention.head_count_kv"].contents()),
        "n_layer": int(f[f"{arch}.block_count"].contents()),
        "tensors": {t.name: t for t in r.tensors},
    }
    return meta


def dequant(t) -> np.ndarray:
    """GGUF tensor -> float32 numpy in row-major [ne1, ne0] (= HF [out, in] orientation)."""
    return gguf.quants.dequantize(t.data, t.tensor_type).reshape(int(t.shape[1]), int(t.shape[0]))


def convert(name: str, folder: Path, out_path: Path, meta: dict) -> dict:
    cfg = json.loads((folder / "adapter_config.json").read_text())
    if cfg.get("alpha_pattern"):
        raise SystemExit(f"{name}: alpha_pattern {cfg['alpha_pattern']} has no GGUF LoRA equivalent")
    if cfg.get("use_dora") or cfg.get("lora_bias") or cfg.get("modules_to_save"):
        raise SystemExit(f"{name}: DoRA / lora_bias / modules_to_save are not plain LoRA")
    sd = load_file(str(folder / "adapter_model.safetensors"))
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, meta["n_layer"])

    pairs: dict[tuple[int, str], dict] = {}
    for key, t in sd.items():
        m = KEY_RE.match(key)
        if not m:
            raise SystemExit(f"{name}: unexpected tensor {key}")
        hf_name, layer, _, module, ab = m.group(1), int(m.group(2)), m.group(3), m.group(4), m.group(5)
        p = pairs.setdefault((layer, module), {"hf": hf_name})
        p[ab] = t.to(torch.float32)

    ranks = {p["A"].shape[0] for p in pairs.values()}
    alpha = float(cfg["lora_alpha"])
    if cfg.get("use_rslora"):
        if len(ranks) != 1:
            raise SystemExit(f"{name}: rslora with several ranks {ranks} cannot be folded into one alpha")
        (r,) = ranks
        alpha_gguf = alpha * math.sqrt(r)  # llama.cpp: scale = alpha_gguf / r = alpha / sqrt(r)
    else:
        alpha_gguf = alpha

    w = GGUFWriter(str(out_path), meta["arch"])  # general.architecture
    w.add_type(gguf.GGUFType.ADAPTER)  # general.type = "adapter"
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")  # adapter.type = "lora"
    w.add_name(f"SmolLM2-135M-Instruct LoRA {name}")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha_gguf)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    written = []
    for (layer, module) in sorted(pairs, key=lambda k: (k[0], MODULE_ORDER.index(k[1]))):
        p = pairs[(layer, module)]
        a, b = p["A"], p["B"]
        if module == "q_proj":
            b = permute_qk_rows(b, meta["n_head"])
        elif module == "k_proj":
            b = permute_qk_rows(b, meta["n_head_kv"])
        gname = name_map.get_name(p["hf"] + ".weight", try_suffixes=(".weight",))
        assert gname is not None, p["hf"]
        w.add_tensor(gname + ".lora_a", a.contiguous().numpy())
        w.add_tensor(gname + ".lora_b", b.contiguous().numpy())
        written.append((gname, layer, module))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {"cfg": cfg, "pairs": pairs, "alpha_gguf": alpha_gguf, "written": written}


@torch.no_grad()
def verify(name: str, out_path: Path, conv: dict, meta: dict, hf_model) -> None:
    r = GGUFReader(str(out_path))
    f = r.fields
    assert f["general.architecture"].contents() == meta["arch"]
    assert f["general.type"].contents() == "adapter"
    assert f["adapter.type"].contents() == "lora"
    alpha = float(f["adapter.lora.alpha"].contents())
    assert f["adapter.lora.alpha"].types == [gguf.GGUFValueType.FLOAT32]
    assert abs(alpha - conv["alpha_gguf"]) < 1e-5
    tensors = {t.name: t for t in r.tensors}
    assert len(tensors) == 2 * len(conv["written"])
    cfg = conv["cfg"]
    rslora = bool(cfg.get("use_rslora"))
    hf_mods = dict(hf_model.named_modules())
    worst = 0.0
    for gname, layer, module in conv["written"]:
        ta, tb = tensors[gname + ".lora_a"], tensors[gname + ".lora_b"]
        base_t = meta["tensors"][gname]
        assert ta.tensor_type == gguf.GGMLQuantizationType.F32 and tb.tensor_type == gguf.GGMLQuantizationType.F32
        # llama.cpp's checks (llama-adapter.cpp), in ggml ne order
        a_ne, b_ne, w_ne = [int(x) for x in ta.shape], [int(x) for x in tb.shape], [int(x) for x in base_t.shape]
        assert w_ne[0] == a_ne[0] and w_ne[1] == b_ne[1], (gname, w_ne, a_ne, b_ne)
        assert a_ne[1] == b_ne[0], (gname, a_ne, b_ne)
        rank = b_ne[0]
        a = torch.from_numpy(np.array(ta.data).reshape(a_ne[1], a_ne[0]))
        b = torch.from_numpy(np.array(tb.data).reshape(b_ne[1], b_ne[0]))
        p = conv["pairs"][(layer, module)]
        assert torch.equal(a, p["A"]), gname
        hf_lin = hf_mods[p["hf"]]
        s_peft = cfg["lora_alpha"] / (math.sqrt(rank) if rslora else rank)
        # GGUF base weight with the GGUF adapter merged, llama.cpp's scale
        w_gguf = torch.from_numpy(dequant(base_t)) + (alpha / rank) * (b @ a)
        # HF weight with the PEFT adapter merged, then permuted like the GGUF base
        w_hf = hf_lin.weight.float() + s_peft * (p["B"] @ p["A"])
        if module == "q_proj":
            w_hf = permute_qk_rows(w_hf, meta["n_head"])
        elif module == "k_proj":
            w_hf = permute_qk_rows(w_hf, meta["n_head_kv"])
        err = (w_gguf - w_hf).abs().max().item()
        worst = max(worst, err)
        assert err < 1e-5, (gname, err)
    print(f"  verified {len(conv['written'])} pairs: shapes pass llama.cpp's checks, "
          f"merged weights match the HF/PEFT ones (max |diff| {worst:.2e})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", default=DEFAULT_NAMES)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--lora-dir", type=Path, default=LORA_DIR)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    set_threads(args.threads)

    model_path = model_path_from_env(args.model)
    meta = base_meta(model_path)
    print(f"base: arch={meta['arch']} n_layer={meta['n_layer']} n_head={meta['n_head']} n_head_kv={meta['n_head_kv']}")
    _, hf_model = load_base(model_path)
    for name in args.names:
        folder = args.lora_dir / name
        out_path = args.lora_dir / f"{name}.gguf"
        print(f"[{name}] {folder} -> {out_path}")
        conv = convert(name, folder, out_path, meta)
        print(f"  adapter.lora.alpha = {conv['alpha_gguf']:.6f} (adapter_config lora_alpha "
              f"{conv['cfg']['lora_alpha']}, use_rslora {conv['cfg'].get('use_rslora', False)}), "
              f"{out_path.stat().st_size} bytes")
        verify(name, out_path, conv, meta, hf_model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
