"""Tiny tokenizers for the family goldens (make_family_golden.py): a fixed training corpus,
byte-level BPE tokenizers trained with `tokenizers` (Llama 3 and Qwen2 pre-tokenizer
regexes) and SentencePiece BPE models trained with `sentencepiece` (Gemma style: no dummy
prefix; Llama 2 style: dummy prefix), plus the chat templates. Everything is deterministic
(fixed corpus, one thread); not meant to be run on its own."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

# ---------------------------------------------------------------------------------------
# Training corpus: original text written for these goldens (English, code, numbers,
# unicode). Changing it changes every tiny tokenizer, hence every golden.
# ---------------------------------------------------------------------------------------

_PROSE = """\
The harbour town woke slowly on winter mornings. Fishermen checked their nets by lamplight,
the baker pulled the first trays of bread from the oven, and the ferry captain stood on the
pier with a mug of tea, watching the fog lift off the water. Nobody hurried; the tide would
turn when it turned, and the boats would leave when the sea allowed it.

In the library at the top of the hill, an old map of the coast hung behind glass. It showed
rocks that had long since crumbled, a lighthouse that was rebuilt twice, and a road that no
longer existed. Children liked to trace the road with their fingers and argue about where it
had gone. Their teacher said that maps are promises about the past, and promises are often
broken by the weather.
Every spring the river flooded the lower fields. The farmers knew it would happen, so they
planted late and built their barns on stilts. When the water went down, it left a layer of
dark silt that made the soil rich for years. What looked like a disaster from the road was,
from the farmhouse window, the reason anything grew at all.

She wrote the numbers down carefully: the temperature, the pressure, the speed of the wind.
Later she would compare them with the readings from the station on the island, and if the
two disagreed by more than a little, she would walk out to the instruments and check them by
hand. Machines are patient, she liked to say, but they are not always right.
Questions worth asking: What is the capital of France? Why is the sky blue? How do plants
turn sunlight into sugar? Which is heavier, a kilogram of iron or a kilogram of feathers?
Could you explain recursion to a child? Please write a short poem about the sea.
Sure! Here is a short answer. The capital of France is Paris. The sky looks blue because air
scatters short wavelengths of light more than long ones. Plants use chlorophyll to capture
light and combine water with carbon dioxide.
"""

_CODE = '''\
def fibonacci(n: int) -> list[int]:
    """Return the first n Fibonacci numbers."""
    if n <= 0:
        return []
    seq = [0, 1]
    while len(seq) < n:
        seq.append(seq[-1] + seq[-2])
    return seq[:n]


class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from empty stack")
        return self.items.pop()


for i in range(10):
    print(f"{i:3d} {i * i:5d} {2 ** i}")

fn main() {
    let values: Vec<u32> = (1..=10).map(|x| x * x).collect();
    let total: u32 = values.iter().sum();
    println!("sum of squares = {}", total);
    if let Some(max) = values.iter().max() {
        println!("max = {max}");
    }
}

pub struct Point { pub x: f64, pub y: f64 }

impl Point {
    pub fn norm(&self) -> f64 { (self.x * self.x + self.y * self.y).sqrt() }
}

#include <stdio.h>
int main(void) {
    for (int i = 0; i < 4; ++i) { printf("%d\\n", i); }
    return 0;
}

{"name": "tessera", "version": "0.1.0", "layers": [1, 2, 3], "enabled": true, "ratio": 0.75}
$ git commit -m "fix: handle empty input" && cargo test --release -- --nocapture
SELECT id, name FROM users WHERE age > 30 ORDER BY name LIMIT 10;
x = [a + b for a, b in zip(xs, ys) if a != b]  # pairwise sums
'''

_NUMBERS = """\
1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 25 30 42 64 99 100 128 256 512 1000 1024
2024-03-15 12:30:45 3.14159 2.71828 -42 +7 0.001 1e-9 6.022e23 1,000,000 10% 3/4 $19.99
0x1F 0xFF 0b1010 127.0.0.1:8080 +1 (555) 123-4567 v1.2.3 #42 @home 50°C 7×8=56 √2≈1.414
"""

_UNICODE = """\
Le café coûte 3,50 € ; naïve façade, déjà vu, crème brûlée, garçon, élève, où est la gare ?
Über die Brücke gehen wir zur Straße; Größe, Mädchen, schön, Zürich, Österreich.
¿Dónde está la biblioteca? Mañana será otro día, señor. Ελληνικά: καλημέρα κόσμε.
Привет, мир! Как дела? Москва, Санкт-Петербург. 你好，世界！我们一起去公园散步吧。
今日は良い天気ですね。東京と大阪。한국어 문장입니다. Emoji: 🙂 🚀 🌸 ✅ 👍 🎉 ❤️ 🐍 🦀
"""

CORPUS_LINES: list[str] = []
for _block in (_PROSE, _CODE, _NUMBERS, _UNICODE):
    CORPUS_LINES.extend(_block.split("\n"))
# A few deterministic arithmetic lines so numbers and operators are frequent.
for _i in range(1, 41):
    CORPUS_LINES.append(f"{_i} + {_i * 3} = {_i * 4}; {_i} * {_i} = {_i * _i}; item_{_i} = {_i / 8:.3f}")
# The corpus is repeated so that rare-ish pairs still pass min_frequency.
CORPUS_TEXT = "\n".join(CORPUS_LINES)

# ---------------------------------------------------------------------------------------
# Pre-tokenizer regexes (as in the real tokenizer.json files; llama.cpp's "llama-bpe" and
# "qwen2" pre-tokenizers implement these).
# ---------------------------------------------------------------------------------------
LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# ---------------------------------------------------------------------------------------
# Chat templates
# ---------------------------------------------------------------------------------------
# Meta-Llama-3-8B-Instruct's template (the 3.1/3.2 one injects "Today Date" from the clock,
# which would make the rendered prompt depend on the day the script runs).
LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)

# Plain ChatML (Qwen2.5 without the default system turn; Qwen3's thinking blocks left out).
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# google/gemma-3-*-it (text part).
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n'}}\n"
    "{%- endif -%}\n"
)

# google/gemma-2-*-it.
GEMMA2_CHAT_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)

# microsoft/Phi-3.5-mini-instruct.
PHI3_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}"
    "{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}"
    "{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)

# mistralai/Mistral-7B-Instruct-v0.1.
MISTRAL_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}"
    "{% endif %}{% endfor %}"
)


# ---------------------------------------------------------------------------------------
# Byte-level BPE (Llama 3, Qwen2/3)
# ---------------------------------------------------------------------------------------
def train_bytelevel_bpe(regex: str, n_merged_vocab: int, specials: list[str], *,
                        ignore_merges: bool, nfc: bool, bos: str | None):
    """Train a byte-level BPE with `regex` as the Split pre-tokenizer followed by
    ByteLevel(use_regex=False), as Llama 3 / Qwen2 tokenizer.json files are built. The
    specials are appended after the trained vocabulary. Returns a tokenizers.Tokenizer."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC() if nfc else None
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    trainer = trainers.BpeTrainer(
        vocab_size=n_merged_vocab,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator([CORPUS_TEXT], trainer=trainer)
    # Re-load through JSON to set ignore_merges (Llama 3 has it; llama.cpp's llama-bpe too).
    js = json.loads(tok.to_str())
    js["model"]["ignore_merges"] = ignore_merges
    tok = Tokenizer.from_str(json.dumps(js))
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    if bos is not None:
        bos_id = tok.token_to_id(bos)
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{bos}:0 $A:0",
                pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                special_tokens=[(bos, bos_id)],
            ),
        ])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


# ---------------------------------------------------------------------------------------
# SentencePiece BPE (Gemma, Llama 2 / Mistral / Phi-3)
# ---------------------------------------------------------------------------------------
def train_spm(vocab_size: int, *, style: str, user_defined: list[str]) -> bytes:
    """Train a SentencePiece BPE model with byte fallback; returns the serialized model.

    style "gemma": <pad>=0 <eos>=1 <bos>=2 <unk>=3, then `user_defined`; no dummy prefix,
    whitespace kept as is (no extra-whitespace removal), identity normalization.
    style "llama2": <unk>=0 <s>=1 </s>=2 (no pad), dummy prefix, identity normalization,
    extra whitespace kept (as Llama 2 / Mistral / Phi-3's tokenizer.model)."""
    import sentencepiece as spm

    with tempfile.TemporaryDirectory() as td:
        corpus = Path(td) / "corpus.txt"
        corpus.write_text(CORPUS_TEXT + "\n", encoding="utf-8")
        common = dict(
            input=str(corpus),
            model_prefix=str(Path(td) / "m"),
            model_type="bpe",
            vocab_size=vocab_size,
            character_coverage=0.995,
            byte_fallback=True,
            split_digits=True,
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            allow_whitespace_only_pieces=True,
            max_sentencepiece_length=16,
            num_threads=1,
            shuffle_input_sentence=False,
            input_sentence_size=0,
            minloglevel=2,
            hard_vocab_limit=True,
        )
        if style == "gemma":
            spm.SentencePieceTrainer.train(
                **common,
                pad_id=0, eos_id=1, bos_id=2, unk_id=3,
                pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>",
                add_dummy_prefix=False,
                user_defined_symbols=user_defined,
            )
        elif style == "llama2":
            spm.SentencePieceTrainer.train(
                **common,
                unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>",
                add_dummy_prefix=True,
                user_defined_symbols=user_defined,
            )
        else:
            raise ValueError(style)
        raw = (Path(td) / "m.model").read_bytes()
    # The trainer spec records the (temporary) input path and model prefix: blank them so
    # that the file is byte-for-byte reproducible.
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()
    proto.ParseFromString(raw)
    del proto.trainer_spec.input[:]
    proto.trainer_spec.model_prefix = ""
    return proto.SerializeToString(deterministic=True)
