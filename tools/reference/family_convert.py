#!/usr/bin/env python3
"""Run llama.cpp's convert_hf_to_gguf.py (from the llama.cpp source tree given as the first
argument) with the remaining arguments, optionally forcing the BPE pre-tokenizer name.

    family_convert.py LLAMA_CPP_DIR [--force-bpe-pre NAME] MODEL_DIR --outfile X --outtype f32

The converter identifies a byte-level BPE pre-tokenizer by hashing the token ids of a fixed
check string; a freshly trained tokenizer has an unknown hash and the converter refuses it.
--force-bpe-pre replaces `TextModel.get_vocab_base_pre` so that the given name (e.g.
"llama-bpe", "qwen2") is written to `tokenizer.ggml.pre`; the tokenizer's regex must be the
one llama.cpp implements for that name. Used by make_family_golden.py (run as a subprocess
so that the converter's own gguf-py is the one imported)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path


def main() -> None:
    llama_dir = Path(sys.argv[1]).resolve()
    args = sys.argv[2:]
    forced = None
    if args[:1] == ["--force-bpe-pre"]:
        forced = args[1]
        args = args[2:]
    sys.path.insert(0, str(llama_dir))
    sys.path.insert(1, str(llama_dir / "gguf-py"))
    import conversion.base as base  # noqa: E402  (llama.cpp's conversion package)

    if forced is not None:
        original = base.TextModel.get_vocab_base_pre

        def get_vocab_base_pre(self, tokenizer) -> str:
            try:
                real = original(self, tokenizer)
            except NotImplementedError:
                real = None
            print(f"family_convert: BPE pre-tokenizer hash -> {real!r}; writing {forced!r}",
                  file=sys.stderr)
            return forced

        base.TextModel.get_vocab_base_pre = get_vocab_base_pre
    sys.argv = [str(llama_dir / "convert_hf_to_gguf.py"), *args]
    runpy.run_path(str(llama_dir / "convert_hf_to_gguf.py"), run_name="__main__")


if __name__ == "__main__":
    main()
