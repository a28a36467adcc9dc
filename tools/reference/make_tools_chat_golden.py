#!/usr/bin/env python3
"""Golden chat prompts with tools: transformers renders a GGUF's own chat template with
`tools`, an assistant turn's `tool_calls` and a `tool` turn, and tokenizes the text; the
engine's test (crates/engine/tests/real_models.rs) renders and encodes the same
conversation and must match both.

  tools/reference/.venv/bin/python tools/reference/make_tools_chat_golden.py \
      ~/.cache/tessera/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
      tests/golden/chat_tools/qwen2.5-coder-0.5b.json
"""
import hashlib
import json
import sys
from pathlib import Path

from transformers import AutoTokenizer

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city (°C & wind <km/h>)",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "e.g. \"Zürich\""},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {"name": "now", "description": "The time",
                                      "parameters": {"type": "object", "properties": {}}}},
]

CASES = [
    ("tools_first_turn", [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Weather in Paris?"}]),
    ("tool_call_and_result", [
        {"role": "user", "content": "Weather in Paris and the time?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}},
            {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": {}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
        {"role": "tool", "tool_call_id": "call_2", "content": "12:00"}]),
]


def main():
    model, out = Path(sys.argv[1]), Path(sys.argv[2])
    tok = AutoTokenizer.from_pretrained(str(model.parent), gguf_file=model.name)
    cases = []
    for name, msgs in CASES:
        text = tok.apply_chat_template(msgs, tools=TOOLS, add_generation_prompt=True,
                                       tokenize=False)
        ids = tok(text, add_special_tokens=False).input_ids
        cases.append({"name": name, "messages": msgs, "text": text, "ids": ids})
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model_file": model.name, "model_sha256": sha, "tools": TOOLS,
                               "cases": cases}, indent=1, ensure_ascii=False) + "\n")
    print(f"{out}: {len(cases)} cases")


if __name__ == "__main__":
    main()
