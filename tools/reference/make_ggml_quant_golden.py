#!/usr/bin/env python3
"""Golden for Tessera's reference dequantization of the ggml block types Q5_0, Q5_1, Q2_K,
Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_NL and IQ4_XS (crates/core/src/ggml_quants.rs).

Synthetic blocks made here from a fixed seed: random bytes for the quants and packed
scales, and the f16 scale fields (the f32 `d` of Q8_K) drawn from ordinary values and the
edges (+0, -0, the smallest subnormal, the largest subnormal, the smallest normal, the
largest finite, 1.0, -1.0, negative values, and one row of inf/NaN). The expected f32
values come from gguf-py's numpy dequantization (`gguf.quants.dequantize`); Q8_K, which
gguf-py does not dequantize, and `quantize_row_q8_K_ref` use the numpy transcriptions
below. With `--ggml-lib` (found automatically in Tessera's llama.cpp build cache), every
row is also run through ggml's own C functions in libggml-base and must agree bitwise.

Writes tests/golden/ggml_quants.json: per row the input bytes and the expected outputs as
base64 of little-endian bytes (f32 outputs as their u32 bit patterns).

Dev-only: python3 -m venv target/py-ggml-quants && target/py-ggml-quants/bin/pip install gguf numpy
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import glob
import json
import os
import sys
from importlib.metadata import version

import numpy as np
from gguf.constants import GGMLQuantizationType as T
from gguf import quants

SEED = 40_2025
QK_K = 256

# name, ggml type, weights per block, bytes per block, offsets of the f16 scale fields,
# ggml C function.
TYPES = [
    ("q5_0", T.Q5_0, 32, 22, [0], "dequantize_row_q5_0"),
    ("q5_1", T.Q5_1, 32, 24, [0, 2], "dequantize_row_q5_1"),
    ("q2_K", T.Q2_K, QK_K, 84, [80, 82], "dequantize_row_q2_K"),
    ("q3_K", T.Q3_K, QK_K, 110, [108], "dequantize_row_q3_K"),
    ("q4_K", T.Q4_K, QK_K, 144, [0, 2], "dequantize_row_q4_K"),
    ("q5_K", T.Q5_K, QK_K, 176, [0, 2], "dequantize_row_q5_K"),
    ("q6_K", T.Q6_K, QK_K, 210, [208], "dequantize_row_q6_K"),
    ("q8_K", T.Q8_K, QK_K, 292, None, "dequantize_row_q8_K"),
    ("iq4_nl", T.IQ4_NL, 32, 18, [0], "dequantize_row_iq4_nl"),
    ("iq4_xs", T.IQ4_XS, QK_K, 136, [0], "dequantize_row_iq4_xs"),
]

ORD = "ordinary"
NEG = "negative ordinary"
# f16 scale schedule: block k of a type gets F16_EDGES[k] in its first scale field and
# F16_EDGES[(k + 5) % 12] in its second, so every edge is seen in every field.
F16_EDGES = [ORD, 0x0000, 0x8000, 0x0001, 0x7BFF, NEG, 0x3C00, 0x8001, ORD, 0xFBFF, 0x03FF, 0xBC00]
F16_NONFINITE = [0x7C00, 0x7E00]  # +inf, NaN (second field: NaN; single field: inf)
F32_EDGES = [ORD, 0x00000000, 0x80000000, 0x00000001, 0x7F7FFFFF, NEG, 0x3F800000, 0x80000001,
             ORD, 0xFF7FFFFF, 0x007FFFFF, 0xBF800000]
F32_NONFINITE = 0x7F800000
ROW_BLOCKS = [1, 2, 3, 1, 3, 2]  # 12 blocks, then one row of one non-finite block
ALL_FF_BLOCK, ALL_00_BLOCK = 4, 8  # quants/scales bytes all 0xff / all 0x00 in these blocks


def b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode("ascii")


def f16_value(rng: np.random.Generator, v) -> int:
    if v in (ORD, NEG):
        x = np.float16(rng.uniform(1e-4, 0.05) if v == ORD else -rng.uniform(1e-4, 0.05))
        return int(x.view(np.uint16))
    return v


def f32_value(rng: np.random.Generator, v) -> int:
    if v in (ORD, NEG):
        x = np.float32(rng.uniform(1e-4, 0.05) * (1 if v == ORD else -1))
        return int(x.view(np.uint32))
    return v


def make_block(rng, k: int, nbytes: int, f16_offsets, nonfinite: bool) -> np.ndarray:
    blk = rng.integers(0, 256, size=nbytes, dtype=np.uint8)
    if k == ALL_FF_BLOCK:
        blk[:] = 0xFF
    elif k == ALL_00_BLOCK:
        blk[:] = 0x00
    if f16_offsets is None:  # Q8_K: f32 d at 0; qs random i8; bsums are not read
        bits = F32_NONFINITE if nonfinite else f32_value(rng, F32_EDGES[k % 12])
        blk[0:4] = np.frombuffer(np.uint32(bits).tobytes(), dtype=np.uint8)
        return blk
    for f, off in enumerate(f16_offsets):
        if nonfinite:
            bits = F16_NONFINITE[f] if len(f16_offsets) > 1 else F16_NONFINITE[0]
        else:
            bits = f16_value(rng, F16_EDGES[(k + 5 * f) % 12])
        blk[off:off + 2] = np.frombuffer(np.uint16(bits).tobytes(), dtype=np.uint8)
    return blk


def numpy_dequantize(name: str, qtype, data: np.ndarray) -> np.ndarray:
    if qtype == T.Q8_K:  # not in gguf-py: y = d * q, as ggml's dequantize_row_q8_K
        blocks = data.reshape(-1, 292)
        d = blocks[:, 0:4].copy().view(np.float32)
        q = blocks[:, 4:4 + QK_K].view(np.int8).astype(np.float32)
        return (d * q).reshape(-1)
    return quants.dequantize(data, qtype).reshape(-1).astype(np.float32, copy=False)


def nearest_int(f: np.float32) -> int:
    val = np.float32(f + np.float32(12582912.0))
    i = int(val.view(np.int32))
    return (i & 0x007FFFFF) - 0x00400000


def quantize_q8_k(x: np.ndarray) -> np.ndarray:
    """numpy transcription of ggml's quantize_row_q8_K_ref, f32 throughout."""
    out = []
    with np.errstate(all="ignore"):
        for blk in x.reshape(-1, QK_K):
            amax = np.float32(0.0)
            mx = np.float32(0.0)
            for v in blk:
                ax = np.float32(abs(v))
                if ax > amax:
                    amax, mx = ax, v
            if amax == 0:
                out.append(np.zeros(292, dtype=np.uint8))
                continue
            iscale = np.float32(np.float32(-127.0) / mx)
            qs = np.array([min(127, nearest_int(np.float32(iscale * v))) for v in blk], dtype=np.int64)
            qs = qs.astype(np.uint8).view(np.int8)  # int -> int8_t wraps
            bsums = qs.reshape(16, 16).astype(np.int32).sum(axis=1).astype(np.int16)
            d = np.float32(np.float32(1.0) / iscale)
            out.append(np.concatenate([
                np.frombuffer(d.tobytes(), np.uint8), qs.view(np.uint8), bsums.view(np.uint8)]))
    return np.concatenate(out)


def q8_k_inputs(rng) -> list[tuple[str, np.ndarray]]:
    n = QK_K
    rows = []
    rows.append(("normal", rng.standard_normal(2 * n).astype(np.float32)))
    r = (rng.standard_normal(n) * 1e-3).astype(np.float32)
    r[17] = np.float32(-0.5)  # the largest magnitude is negative
    rows.append(("negative max", r))
    r = rng.uniform(-1, 1, n).astype(np.float32)
    r[3], r[200] = np.float32(2.0), np.float32(-2.0)  # tie: the first wins
    rows.append(("magnitude tie", r))
    z = np.zeros(n, dtype=np.float32)
    z[5] = np.float32(-0.0)
    rows.append(("all zero, then halves", np.concatenate([z, (rng.integers(-254, 255, n) / 2).astype(np.float32)])))
    rows.append(("subnormal only", (rng.integers(-3, 4, n) * np.float32(1e-45)).astype(np.float32)))
    r = rng.standard_normal(n).astype(np.float32)
    r[9] = np.float32(np.inf)
    with np.errstate(over="ignore"):
        r2 = rng.standard_normal(n).astype(np.float32) * np.float32(3e38)
    rows.append(("inf; huge", np.concatenate([r, r2])))
    r = rng.standard_normal(n).astype(np.float32)
    r[100] = np.float32(np.nan)
    rows.append(("one NaN", r))
    return rows


def find_ggml_lib() -> str | None:
    cache = os.environ.get("TESSERA_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tessera")
    hits = sorted(glob.glob(os.path.join(cache, "llama.cpp", "*", "vendor", "llama.cpp", "build", "bin",
                                         "libggml-base.so")))
    return hits[-1] if hits else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/golden/ggml_quants.json")
    ap.add_argument("--ggml-lib", default=None, help="libggml-base.so to cross-check against ('none' to skip)")
    args = ap.parse_args()

    lib_path = find_ggml_lib() if args.ggml_lib is None else (None if args.ggml_lib == "none" else args.ggml_lib)
    lib = ctypes.CDLL(lib_path) if lib_path else None
    print(f"cross-check against ggml: {lib_path or 'no (library not found)'}")

    rng = np.random.default_rng(SEED)
    rows = []
    mismatches = 0
    for name, qtype, nel, nbytes, f16_offsets, cfn in TYPES:
        k = 0
        for r, nb in enumerate(ROW_BLOCKS + [1]):
            nonfinite = r == len(ROW_BLOCKS)
            blocks = []
            for _ in range(nb):
                blocks.append(make_block(rng, k, nbytes, f16_offsets, nonfinite))
                k += 1
            data = np.concatenate(blocks)
            with np.errstate(all="ignore"):
                y = np.ascontiguousarray(numpy_dequantize(name, qtype, data), dtype=np.float32)
            assert y.shape == (nb * nel,), (name, y.shape)
            if lib is not None:
                c = np.zeros(nb * nel, dtype=np.float32)
                f = getattr(lib, cfn)
                f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
                f.restype = None
                f(data.ctypes.data, c.ctypes.data, nb * nel)
                same = (c.view(np.uint32) == y.view(np.uint32)) | (np.isnan(c) & np.isnan(y))
                if not same.all():
                    mismatches += 1
                    i = int(np.argmin(same))
                    print(f"MISMATCH {name} row {r}: {int(np.sum(~same))} values, first at {i}: "
                          f"numpy {y[i]!r} ggml {c[i]!r}", file=sys.stderr)
            rows.append({"type": name, "ggml_type": int(qtype), "blocks": nb,
                         "note": "inf/NaN scales" if nonfinite else "",
                         "bytes": b64(data), "expected_f32_bits": b64(y.view(np.uint32))})

    q8 = []
    for note, x in q8_k_inputs(rng):
        x = np.ascontiguousarray(x, dtype=np.float32)
        y = quantize_q8_k(x)
        if lib is not None:
            c = np.zeros(len(y), dtype=np.uint8)
            f = lib.quantize_row_q8_K_ref
            f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
            f.restype = None
            f(x.ctypes.data, c.ctypes.data, len(x))
            if not np.array_equal(c, y):
                mismatches += 1
                print(f"MISMATCH quantize_row_q8_K_ref '{note}': bytes {np.nonzero(c != y)[0][:8]}", file=sys.stderr)
        q8.append({"note": note, "input_f32_bits": b64(x.view(np.uint32)), "expected_bytes": b64(y)})

    golden = {
        "about": "Reference dequantization of ggml block types; see tools/reference/make_ggml_quant_golden.py. "
                 "Base64 of little-endian bytes; f32 values as their u32 bit patterns.",
        "generator": {"gguf": version("gguf"), "numpy": np.__version__, "seed": SEED,
                      "cross_checked_with_ggml": lib is not None and mismatches == 0},
        "dequantize": rows,
        "quantize_q8_k": q8,
    }
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as fh:
        fh.write("{\n")
        fh.write(f' "about": {json.dumps(golden["about"])},\n')
        fh.write(f' "generator": {json.dumps(golden["generator"])},\n')
        for key in ("dequantize", "quantize_q8_k"):
            fh.write(f' "{key}": [\n')
            fh.write(",\n".join("  " + json.dumps(r) for r in golden[key]))
            fh.write("\n ]" + ("," if key == "dequantize" else "") + "\n")
        fh.write("}\n")
    print(f"wrote {args.out}: {len(rows)} dequantize rows, {len(q8)} q8_K quantize rows, "
          f"{os.path.getsize(args.out)} bytes")
    if mismatches:
        print(f"{mismatches} rows disagree with ggml", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
