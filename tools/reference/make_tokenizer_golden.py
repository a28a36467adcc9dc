#!/usr/bin/env python3
"""Tokenizer goldens: token ids of awkward strings from Hugging Face transformers and from
llama.cpp, for the tokenizers of the model families Tessera serves.

Each tokenizer is a GGUF file (a model, or a vocabulary-only file); for every string this
records the ids of transformers' tokenizer built from that GGUF
(`AutoTokenizer.from_pretrained(dir, gguf_file=...)`, no special tokens added, special
tokens written in the text parsed), the ids of llama.cpp's own tokenizer on the same file
(`llama_tokenize`, add_special=False, parse_special=True) and transformers' decoding of
its ids (skip_special_tokens=False). Where a SentencePiece model is the source, the
`sentencepiece` library's ids are recorded too. Tessera's ids must equal the ids named by
the golden's `expect` (transformers', except where the note says otherwise):
crates/tokenizer/tests/golden_tokenizers.rs.

Output: tests/golden/tokenizers/<name>.json
  {name, model_file, sha256, expect, note, add_bos, bos_id, versions,
   cases: [{text, ids_transformers, ids_llama_cpp, decoded_transformers[, ids_sentencepiece]}]}

Tokenizers (`--only NAME,...` picks some; a missing file is skipped with a message). CACHE
is Tessera's cache folder: $TESSERA_CACHE, else $XDG_CACHE_HOME/tessera, else
~/.cache/tessera.
  gemma3         CACHE/models/gemma-3-270m-q4_k_m.gguf (SentencePiece-style, 262k tokens;
                 tools/fetch_model.py gemma3-270m)
  qwen2.5-coder  CACHE/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf (pre qwen2;
                 tools/fetch_model.py qwen2.5-coder-0.5b)
  smollm2        CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf (pre smollm; `tessera pull`)
  llama3-bpe     llama.cpp's models/ggml-vocab-llama-bpe.gguf (Llama 3's 128k vocabulary)
  llama2-spm     llama.cpp's models/ggml-vocab-llama-spm.gguf (Llama 2's 32k SentencePiece)
  phi3           llama.cpp's models/ggml-vocab-phi-3.gguf (Phi-3's 32k SentencePiece)
  mistral-v3     made from the SentencePiece model shipped in the `mistral-common` wheel
                 (--mistral-common WHEEL_OR_DIR, e.g. from `pip download --no-deps
                 mistral-common`; written to CACHE/tokenizers/mistral-v3-vocab.gguf)
  tiny-spm, tiny-spm-noprefix, tiny-llama3-bpe
                 small vocabularies trained here (sentencepiece BPE; tokenizers BPE with the
                 Llama 3 split), written as tokenizer-only GGUFs to tests/golden/tokenizers/
                 and committed, so CI checks them without any model file.

The llama.cpp vocabulary files ship in llama-cpp-python's source tree, which
tools/bench_vs_llama.py unpacks (and builds) under CACHE/llama.cpp/; its libllama.so is the
llama.cpp tokenizer used here. The golden records where its file is (`model_file`:
`tests/...` or `cache:...`) and, for the model files tools/fetch_model.py fetches, that
tool's name for it (`fetch`).

Run from the repository root:
    tools/reference/.venv/bin/python tools/reference/make_tokenizer_golden.py [--only gemma3]
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import importlib.metadata
import json
import os
import sys
import tempfile
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
OUT_DIR = REPO_ROOT / "tests/golden/tokenizers"


def cache_dir() -> Path:
    """Tessera's cache folder (as tools/fetch_model.py and tessera_core::cache_dir)."""
    if os.environ.get("TESSERA_CACHE"):
        return Path(os.environ["TESSERA_CACHE"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "tessera"
    return Path.home() / ".cache" / "tessera"


LLAMA_CPP_MODELS = "cache:llama.cpp/*/vendor/llama.cpp/models"
GENERATED = "cache:tokenizers"

# Strings people write. Original text written for these goldens.
COMMON_CASES = [
    "",
    " ",
    "a",
    "Hello, world!",
    " Hello",
    "Hello ",
    "  two leading spaces",
    "trailing spaces   ",
    "   both ends   ",
    "a  b   c    d     e",
    " " * 40,
    "\n",
    "\n\n\n",
    "\n" * 40,
    "line one\nline two\r\nline three\rend",
    "\r\n\r\n",
    "  \n  \n\t \n",
    "a\tb\t\tc",
    "\t\tindented with tabs",
    "\t" * 40,
    "def f(x):\n    return {'a': [1, 2, 3]}\n",
    "if (a && b) {\n\tfoo();\n} else {\n\tbar(x->y);\n}\n",
    "class A:\n        def m(self):\n                pass\n",
    "fn main() { println!(\"{}\", 1 << 4); }",
    "x = 1_000_000; y = 0xFF; z = 1e9; w = -0.5e-10",
    "1234567890123456789012345",
    "3.14159 2.71828 6.02214076",
    "$1,234.56 and 100% of 7/8",
    "2024-01-15T10:30:00Z",
    "I'm don't you'll we've THEY'RE she'd",
    "ALL CAPS SHOUTING",
    "snake_case_identifier camelCaseIdentifier",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "!!!???...,,,;;;:::",
    "https://example.com/path?q=1&r=2#frag",
    '{"key": "value", "n": 42, "arr": [true, null]}',
    "C:\\Users\\name\\file.txt",
    "<div><ul><li>item</li></ul></div>",
    "# Title\n\n- item 1\n- item 2\n\n```python\nprint('hi')\n```\n",
    "日本語のテキストです。",
    "中文字符测试，你好！",
    "한국어 텍스트입니다",
    "Mixed 中英文 text with 数字123",
    "Привет, мир!",
    "Ελληνικά γράμματα",
    "مرحبا بالعالم",
    "שלום עולם",
    "हिन्दी भाषा",
    "ภาษาไทย",
    "café naïve résumé Ångström",
    "cafe\u0301 nai\u0308ve",
    "emoji 😀👍🏽 family 👨\u200d👩\u200d👧\u200d👦 flag 🇫🇷",
    "❤️ ✔ ☃",
    "∑_{i=1}^{n} x_i² ≤ ∞",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \U0001f9ff \ue000",
    "ﬁ ① Ǆ ｆｕｌｌｗｉｄｔｈ",
    "hello\u00a0world\u3000wide\u2028sep",
    "zero\u200bwidth\u200d",
    "a\x07b\x1bc\x7f",
    "\u2581",
    "\u2581\u2581hello \u2581 world",
    "<unk> <s> </s> <pad>",
    "The quick brown fox jumps over the lazy dog. " * 3,
]

SPECIALS = {
    "gemma3": [
        "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
        "a<bos>b<eos>",
        " <start_of_turn> spaced ",
        "<start_of_turn",
        "<end_of_turn><end_of_turn>",
        "<start_of_image><end_of_image>",
        "<unused0> and <unused99>",
        "[multimodal] <div>x</div> <h1>",
    ],
    "qwen": [
        "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
        "a<|endoftext|>b",
        " <|im_start|> spaced ",
        "<|im_start",
        "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
        "<tool_call>\n{}\n</tool_call>",
    ],
    "smollm": [
        "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
        "a<|endoftext|>b",
        " <|im_start|> spaced ",
        "<|im_start",
    ],
    "llama3": [
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>",
        "a<|end_of_text|>b",
        " <|eot_id|> spaced ",
        "<|eot_id",
        "<|reserved_special_token_0|><|reserved_special_token_250|>",
    ],
    "llama2": [
        "<s>[INST] Hello [/INST] Hi</s>",
        "a<s>b</s>",
        " </s> spaced ",
        "<s",
    ],
    "phi3": [
        "<|user|>\nHello<|end|>\n<|assistant|>\n",
        "a<|endoftext|>b",
        " <|end|> spaced ",
        "<|end",
        "<s>x</s>",
    ],
    "mistral": [
        "<s>[INST] Hello [/INST] Hi</s>",
        "[INST]x[/INST]",
        " [INST] spaced ",
        "[AVAILABLE_TOOLS][{}][/AVAILABLE_TOOLS][TOOL_CALLS]",
        "a</s>b",
    ],
    "tiny": [
        "<s>hello</s>",
        "a<|im_start|>b<|im_end|>",
        " <|im_end|> spaced ",
        "<|im_start",
    ],
}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Source:
    """One tokenizer: where its GGUF is (as recorded in the golden), and how to get it."""

    def __init__(self, name, recorded, specials, expect="ids_transformers", note="", make=None,
                 original=None, fetch=None, how=None):
        self.name, self.recorded, self.specials = name, recorded, specials
        self.expect, self.note, self.make, self.original = expect, note, make, original
        self.fetch = fetch
        self.how = how or (f"python3 tools/fetch_model.py {fetch}" if fetch else
                           "llama-cpp-python's source tree, as tools/bench_vs_llama.py unpacks it"
                           if recorded.startswith(LLAMA_CPP_MODELS) else
                           "tools/reference/make_tokenizer_golden.py")

    def path(self) -> Path | None:
        return resolve(self.recorded)


def resolve(recorded: str) -> Path | None:
    """`tests/...` in the repository; `cache:...` in the cache folder, where a `*` component
    is any folder (the last name, sorted, that has the file)."""
    if recorded.startswith("tests/"):
        return REPO_ROOT / recorded
    assert recorded.startswith("cache:"), recorded
    cands = sorted(cache_dir().glob(recorded[len("cache:"):]))
    return cands[-1] if cands else cache_dir() / recorded[len("cache:"):]


# ---------------------------------------------------------------------------------------
# Vocabulary-only GGUF files.


def write_vocab_gguf(out: Path, arch: str, model: str, tokens, types, scores=None, merges=None,
                     pre=None, bos=None, eos=None, unk=None, add_bos=None, add_space_prefix=None):
    import gguf

    out.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(out), arch)
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if scores is not None:
        w.add_token_scores(scores)
    if merges is not None:
        w.add_token_merges(merges)
    if bos is not None:
        w.add_bos_token_id(bos)
    if eos is not None:
        w.add_eos_token_id(eos)
    if unk is not None:
        w.add_unk_token_id(unk)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    if add_space_prefix is not None:
        w.add_add_space_prefix(add_space_prefix)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def spm_to_gguf(model_file: Path, out: Path, arch: str = "llama",
                user_defined: tuple[str, ...] = ()) -> None:
    """A SentencePiece model as llama.cpp's convert_hf_to_gguf.py writes its vocabulary."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    sp = spm.SentencePieceProcessor(model_file=str(model_file))
    proto = pb.ModelProto()
    proto.ParseFromString(model_file.read_bytes())
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        t = 1
        if sp.is_unknown(i):
            t = 2
        elif sp.is_control(i):
            t = 3
        elif sp.is_unused(i):
            t = 5
        elif sp.is_byte(i):
            t = 6
        elif proto.pieces[i].type == pb.ModelProto.SentencePiece.USER_DEFINED:
            t = 4
        types.append(t)
    write_vocab_gguf(out, arch, "llama", tokens, types, scores=scores,
                     bos=sp.bos_id(), eos=sp.eos_id(), unk=sp.unk_id(), add_bos=True,
                     add_space_prefix=proto.normalizer_spec.add_dummy_prefix)


def make_mistral(args) -> Path:
    src = args.mistral_common
    if src is None:
        raise FileNotFoundError("--mistral-common WHEEL_OR_DIR not given")
    src = Path(src)
    member = "mistral_common/data/mistral_instruct_tokenizer_240323.model.v3"
    tmp = Path(tempfile.mkdtemp())
    if src.is_file():
        with zipfile.ZipFile(src) as z:
            z.extract(member, tmp)
        model = tmp / member
    else:
        model = src / member
    spm_to_gguf(model, resolve(f"{GENERATED}/mistral-v3-vocab.gguf"))
    return model


TINY_CORPUS = None


def tiny_corpus() -> list[str]:
    """Training text for the tiny vocabularies: the cases themselves plus some prose and
    code, written for this file."""
    global TINY_CORPUS
    if TINY_CORPUS is None:
        prose = (
            "The tokenizer splits text into pieces. Pieces are merged by rank. "
            "Hello world, hello there; the quick brown fox jumps over the lazy dog. "
            "Numbers like 12, 345 and 6789 appear; so do 3.14 and 2.71. "
            "def main():\n    print('hello')\n    return 0\n"
            "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}\n"
            "Caf\u00e9 na\u00efve r\u00e9sum\u00e9. \u65e5\u672c\u8a9e \u4e2d\u6587 \u4f60\u597d.\n"
        )
        TINY_CORPUS = [prose] * 20 + COMMON_CASES * 3
    return TINY_CORPUS


TINY_SPECIALS = ["<|im_start|>", "<|im_end|>"]


def make_tiny_spm(out: Path, add_dummy_prefix: bool) -> Path:
    import sentencepiece as spm

    tmp = Path(tempfile.mkdtemp())
    corpus = tmp / "corpus.txt"
    corpus.write_text("\n".join(c.replace("\n", " ") for c in tiny_corpus()) + "\n")
    prefix = tmp / "tiny"
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(prefix), model_type="bpe", vocab_size=600,
        byte_fallback=True, character_coverage=0.98, add_dummy_prefix=add_dummy_prefix,
        remove_extra_whitespaces=False, normalization_rule_name="identity",
        split_digits=True, allow_whitespace_only_pieces=True,
        user_defined_symbols=TINY_SPECIALS, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        minloglevel=2,
    )
    model = prefix.with_suffix(".model")
    spm_to_gguf(model, out)
    return model


def make_tiny_llama3_bpe(out: Path) -> None:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers.integrations.gguf.gguf_tokenizer_mapping import _LLAMA3_SPLIT

    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=700, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[], show_progress=False)
    tok.train_from_iterator(tiny_corpus(), trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in vocab]
    types = [1] * len(tokens)
    for s in ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]:
        tokens.append(s)
        types.append(3)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    write_vocab_gguf(out, "llama", "gpt2", tokens, types, merges=merges, pre="llama-bpe",
                     bos=tokens.index("<|begin_of_text|>"), eos=tokens.index("<|eot_id|>"),
                     add_bos=True)


def smollm_original(path: Path):
    from make_golden import build_original_tokenizer

    tok, _ = build_original_tokenizer(path)

    class Original:
        def encode(self, text):
            return tok.encode(text, add_special_tokens=False).ids

        def decode(self, ids):
            return tok.decode(ids, skip_special_tokens=False)

    return Original()


# ---------------------------------------------------------------------------------------

SOURCES = [
    Source("gemma3", "cache:models/gemma-3-270m-q4_k_m.gguf", "gemma3", fetch="gemma3-270m"),
    Source("qwen2.5-coder", "cache:models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen",
           fetch="qwen2.5-coder-0.5b"),
    Source("smollm2", "cache:models/SmolLM2-135M-Instruct.Q4_1.gguf", "smollm",
           how="tessera pull (the default model)",
           expect="ids_original", original=smollm_original,
           note="transformers' GGUF conversion drops SmolLM2's individual-digit split "
                "(pre 'smollm'), so its ids differ on digits from SmolLM2's own tokenizer.json, "
                "which the model was trained with and llama.cpp follows. ids_original: that "
                "tokenizer.json rebuilt from the GGUF (make_golden.py build_original_tokenizer); "
                "Tessera follows it here (see tests/golden/smollm2-135m-q4_1.json)."),
    Source("llama3-bpe", f"{LLAMA_CPP_MODELS}/ggml-vocab-llama-bpe.gguf", "llama3"),
    Source("llama2-spm", f"{LLAMA_CPP_MODELS}/ggml-vocab-llama-spm.gguf", "llama2",
           expect="ids_llama_cpp",
           note="SentencePiece with a dummy prefix, as the model was trained (the sentencepiece "
                "library) and as its Hugging Face tokenizer.json (legacy) and llama.cpp "
                "tokenize: a '\u2581' starts the text and every piece after a special token, "
                "and a leading space becomes '\u2581\u2581'. transformers' GGUF loader builds "
                "a non-legacy tokenizer (one '\u2581' at the start only); Tessera follows the "
                "model's own tokenizer."),
    Source("phi3", f"{LLAMA_CPP_MODELS}/ggml-vocab-phi-3.gguf", "phi3",
           expect="ids_llama_cpp",
           note="Phi-3's chat markers (<|user|>, <|end|>, <|assistant|>, ...) swallow the "
                "whitespace after them in Phi-3's own tokenizer.json (rstrip) and in llama.cpp; "
                "transformers' GGUF loader keeps it. Tessera follows the model's tokenizer.json "
                "and llama.cpp."),
    Source("mistral-v3", f"{GENERATED}/mistral-v3-vocab.gguf", "mistral",
           how="tools/reference/make_tokenizer_golden.py --only mistral-v3 --mistral-common "
               "WHEEL (pip download --no-deps mistral-common)",
           make=make_mistral,
           expect="ids_llama_cpp",
           note="SentencePiece with a dummy prefix, as the model was trained (the sentencepiece "
                "library) and as its Hugging Face tokenizer.json (legacy) and llama.cpp "
                "tokenize: a '\u2581' starts the text and every piece after a special token, "
                "and a leading space becomes '\u2581\u2581'. transformers' GGUF loader builds "
                "a non-legacy tokenizer (one '\u2581' at the start only); Tessera follows the "
                "model's own tokenizer."),
    Source("tiny-spm", "tests/golden/tokenizers/tiny-spm.gguf", "tiny",
           make=lambda a: make_tiny_spm(REPO_ROOT / "tests/golden/tokenizers/tiny-spm.gguf", True),
           expect="ids_llama_cpp",
           note="SentencePiece with a dummy prefix, as the model was trained (the sentencepiece "
                "library) and as its Hugging Face tokenizer.json (legacy) and llama.cpp "
                "tokenize: a '\u2581' starts the text and every piece after a special token, "
                "and a leading space becomes '\u2581\u2581'. transformers' GGUF loader builds "
                "a non-legacy tokenizer (one '\u2581' at the start only); Tessera follows the "
                "model's own tokenizer."),
    Source("tiny-spm-noprefix", "tests/golden/tokenizers/tiny-spm-noprefix.gguf", "tiny",
           expect="ids_llama_cpp",
           note="add_space_prefix = false on a llama-architecture SentencePiece vocabulary: "
                "transformers' GGUF loader drops the flag (LlamaTokenizer is built without "
                "add_prefix_space, so it prepends '\u2581' anyway); sentencepiece itself "
                "(ids_sentencepiece, which does not parse control tokens) and llama.cpp honour "
                "it. Tessera follows the file, as llama.cpp does.",
           make=lambda a: make_tiny_spm(
               REPO_ROOT / "tests/golden/tokenizers/tiny-spm-noprefix.gguf", False)),
    Source("tiny-llama3-bpe", "tests/golden/tokenizers/tiny-llama3-bpe.gguf", "tiny",
           make=lambda a: make_tiny_llama3_bpe(
               REPO_ROOT / "tests/golden/tokenizers/tiny-llama3-bpe.gguf")),
]


def llama_cpp_decode(lt, ids: list[int]) -> str:
    """llama.cpp's detokenizer (special tokens rendered, none removed)."""
    arr = (lt.lc.llama_token * max(len(ids), 1))(*ids)
    n = 64 + 64 * len(ids)
    buf = ctypes.create_string_buffer(n)
    got = lt.lc.llama_detokenize(lt.vocab, arr, len(ids), buf, n, False, True)
    if got < 0:
        raise RuntimeError(f"llama_detokenize needs {-got} bytes")
    return buf.raw[:got].decode("utf-8", errors="replace")


def fuzz_texts(n: int, seed: str) -> list[str]:
    """`n` random strings of the kinds the cases hold: words, digits, runs of spaces, tabs
    and newlines, CJK, emoji, combining marks, `▁`, special tokens, any code point."""
    import random

    rng = random.Random(seed)
    pools = [
        lambda: rng.choice(["the", "Hello", "world", "def", "return", "x", "ALL", "café",
                            "naïve", "snake_case", "camelCase", "I'm", "don't", "http://a.b/c"]),
        lambda: "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 12))),
        lambda: rng.choice(".,;:!?()[]{}<>/\\|@#$%^&*-+=_~`'\"") * rng.randint(1, 3),
        lambda: " " * rng.randint(1, 40),
        lambda: rng.choice(["\n", "\n\n", "\r\n", "\t", "\t\t", " \n", "\n  "]) * rng.randint(1, 4),
        lambda: "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(rng.randint(1, 6))),
        lambda: rng.choice(["😀", "👍🏽", "👨\u200d👩\u200d👧", "🇫🇷", "❤️", "🧿"]),
        lambda: rng.choice(["e\u0301", "a\u0308", "\u0915\u094d\u0937", "\u05e9\u05dc", "\u0645\u0631"]),
        lambda: "\u2581" * rng.randint(1, 3),
        lambda: chr(rng.choice([rng.randint(0x20, 0x7E), rng.randint(0xA0, 0x2FFF),
                                rng.randint(0x3000, 0xD7FF), rng.randint(0xE000, 0xFFFD),
                                rng.randint(0x10000, 0x1FFFF)])),
    ]
    out = []
    for _ in range(n):
        parts = [rng.choice(pools)() for _ in range(rng.randint(1, 16))]
        out.append("".join(p if rng.random() < 0.5 else " " + p for p in parts))
    return out


def golden(src: Source, path: Path, llama_lib: Path | None, spm_model: Path | None,
           texts: list[str] | None = None) -> dict:
    from gguf import GGUFReader
    from transformers import AutoTokenizer

    from golden_qwen2 import LlamaCppTokenizer

    reader = GGUFReader(str(path))

    def field(k):
        f = reader.fields.get(k)
        return f.contents() if f is not None else None

    meta = {k: field(k) for k in ["general.architecture", "tokenizer.ggml.model",
                                  "tokenizer.ggml.pre", "tokenizer.ggml.add_bos_token",
                                  "tokenizer.ggml.bos_token_id",
                                  "tokenizer.ggml.add_space_prefix"]}
    del reader
    hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    lt = LlamaCppTokenizer(llama_lib, path) if llama_lib else None
    sp = None
    if spm_model is not None:
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=str(spm_model))
    original = src.original(path) if src.original else None
    cases = []
    if texts is None:
        texts = COMMON_CASES + SPECIALS[src.specials]
    else:  # fuzzing: some with special tokens around them too
        texts = texts + [s + t + s for t in texts[:len(texts) // 8]
                         for s in SPECIALS[src.specials][:1]]
    n_diff = 0
    for text in texts:
        ids = hf(text, add_special_tokens=False).input_ids
        case = {"text": text, "ids_transformers": ids,
                "ids_llama_cpp": lt.encode(text) if lt else None,
                "decoded_transformers": hf.decode(ids, skip_special_tokens=False)}
        if sp is not None:
            case["ids_sentencepiece"] = sp.encode(text)
        if original is not None:
            case["ids_original"] = original.encode(text)
        # The reference decoding of the expected ids.
        if src.expect == "ids_transformers":
            case["decoded"] = case["decoded_transformers"]
        elif src.expect == "ids_original":
            case["decoded"] = original.decode(case["ids_original"])
        else:
            case["decoded"] = llama_cpp_decode(lt, case["ids_llama_cpp"])
        if lt and case["ids_llama_cpp"] != ids:
            n_diff += 1
            print(f"  differ {text!r}:\n    transformers {ids}\n    llama.cpp    {case['ids_llama_cpp']}")
        if original is not None and case["ids_original"] != case["ids_llama_cpp"]:
            print(f"  original differs from llama.cpp on {text!r}")
        cases.append(case)
    print(f"{src.name}: {len(cases)} cases, transformers and llama.cpp differ on {n_diff}")
    versions = {p: importlib.metadata.version(p) for p in
                ["transformers", "tokenizers", "sentencepiece", "gguf"]}
    if lt:
        versions["llama.cpp"] = lt.source
    return {
        "name": src.name,
        "model_file": src.recorded,
        "fetch": src.fetch,
        "how": src.how,
        "sha256": sha256_file(path),
        "expect": src.expect,
        "note": src.note,
        "gguf": meta,
        "versions": versions,
        "n_differ_transformers_llama_cpp": n_diff,
        "cases": cases,
    }


def main() -> int:
    from golden_qwen2 import find_llama_cpp_lib

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="comma-separated names")
    ap.add_argument("--llama-cpp-lib", help="folder of libllama.so, or 'none'")
    ap.add_argument("--mistral-common", help="mistral-common wheel (or unpacked folder)")
    ap.add_argument("--fuzz", type=int, metavar="N",
                    help="N random strings instead of the cases, written to --out (not the "
                         "committed goldens; the Rust test reads them with "
                         "TESSERA_TOKENIZER_GOLDENS=DIR)")
    ap.add_argument("--out", type=Path, default=OUT_DIR, help="folder of the goldens")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else None
    llama_lib = None
    if args.llama_cpp_lib != "none":
        llama_lib = Path(args.llama_cpp_lib) if args.llama_cpp_lib else find_llama_cpp_lib()
    if llama_lib is None:
        print("llama.cpp not found: its ids are not recorded", file=sys.stderr)
    for src in SOURCES:
        if only and src.name not in only:
            continue
        path = src.path()
        spm_model = None
        if src.make:
            try:
                spm_model = src.make(args)
            except Exception as e:  # noqa: BLE001
                print(f"{src.name}: SKIPPED (cannot make it: {e})", file=sys.stderr)
                continue
        if path is None or not path.exists():
            print(f"{src.name}: SKIPPED ({src.recorded} not found)", file=sys.stderr)
            continue
        texts = fuzz_texts(args.fuzz, src.name) if args.fuzz else None
        doc = golden(src, path, llama_lib, spm_model, texts)
        args.out.mkdir(parents=True, exist_ok=True)
        out = args.out / f"{src.name}.json"
        out.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
        print(f"wrote {out} ({out.stat().st_size // 1024} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
