"""Tool calls through the official `openai` client, on Qwen2.5-Coder-0.5B-Instruct (its chat
template takes tools and writes Hermes-style `<tool_call>` blocks). The model is fetched by
`tools/fetch_model.py`; without it these tests skip, unless TESSERA_REQUIRE_REAL_MODELS=1.
"""

import json
import os
import subprocess
import sys

import openai
import pytest

from conftest import ROOT, run_server

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Adds two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


def qwen_path():
    cache = os.environ.get("TESSERA_CACHE", os.path.expanduser("~/.cache/tessera"))
    path = os.path.join(cache, "models", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    if os.path.exists(path):
        return path
    if os.environ.get("TESSERA_REQUIRE_REAL_MODELS") == "1":
        return subprocess.run([sys.executable, os.path.join(ROOT, "tools", "fetch_model.py"),
                               "qwen2.5-coder-0.5b"], check=True, capture_output=True,
                              text=True).stdout.strip().splitlines()[-1]
    pytest.skip("Qwen2.5-Coder-0.5B is not in the cache (tools/fetch_model.py qwen2.5-coder-0.5b)")


@pytest.fixture(scope="module")
def client():
    with run_server(["--model", qwen_path(), "--served-model-name", "qwen", "--max-num-seqs", "4",
                     "--max-model-len", "2048", "--kv-blocks", "512"]) as base:
        yield openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)


def check_weather_args(args):
    v = json.loads(args)
    assert set(v) == {"city", "unit"} and v["unit"] in ("celsius", "fahrenheit"), args
    return v


def test_required_tool_call_streams_id_and_name_then_arguments(client):
    stream = client.chat.completions.create(
        model="qwen", messages=ASK, tools=[WEATHER, ADD], tool_choice="required",
        parallel_tool_calls=False, stream=True, temperature=0, max_tokens=100)
    calls, finish = {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        finish = ch.finish_reason or finish
        for d in ch.delta.tool_calls or []:
            if d.index not in calls:
                # OpenAI's order: the first delta of a call carries its id, type and name.
                assert d.id and d.type == "function" and d.function.name, d
                calls[d.index] = {"id": d.id, "name": d.function.name, "args": ""}
            else:
                assert d.id is None and not d.function.name, d
            calls[d.index]["args"] += d.function.arguments or ""
    assert finish == "tool_calls"
    assert len(calls) == 1 and calls[0]["name"] == "get_weather"
    check_weather_args(calls[0]["args"])
    # The same request whole gives the same call.
    r = client.chat.completions.create(
        model="qwen", messages=ASK, tools=[WEATHER, ADD], tool_choice="required",
        parallel_tool_calls=False, temperature=0, max_tokens=100)
    (call,) = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == json.loads(calls[0]["args"])


def test_named_tool_choice_always_parses(client):
    for seed in range(3):
        r = client.chat.completions.create(
            model="qwen", messages=[{"role": "user", "content": "What is 17 plus 25?"}],
            tools=[WEATHER, ADD], tool_choice={"type": "function", "function": {"name": "add"}},
            temperature=1.0, seed=seed, max_tokens=60, n=2)
        for choice in r.choices:
            (call,) = choice.message.tool_calls
            assert call.function.name == "add" and call.id.startswith("call_")
            v = json.loads(call.function.arguments)
            assert isinstance(v["a"], int) and isinstance(v["b"], int), v


def test_tool_results_are_taken_in_the_next_turn(client):
    r = client.chat.completions.create(
        model="qwen", messages=ASK, tools=[WEATHER], tool_choice="required",
        parallel_tool_calls=False, temperature=0, max_tokens=80)
    msg = r.choices[0].message
    (call,) = msg.tool_calls
    turn = ASK + [msg.model_dump(exclude_none=True),
                  {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "sunny"}'}]
    r2 = client.chat.completions.create(model="qwen", messages=turn, tools=[WEATHER],
                                        temperature=0, max_tokens=60)
    assert r2.usage.prompt_tokens > r.usage.prompt_tokens + 20
    assert r2.choices[0].message.content, r2
    # The answer reads the tool's result.
    assert "21" in r2.choices[0].message.content or "sunny" in r2.choices[0].message.content.lower()


def test_auto_streamed_equals_whole(client):
    # Whatever the model chooses under "auto", streaming changes nothing.
    msgs = [{"role": "system", "content": "You call tools when they help."}] + ASK
    whole = client.chat.completions.create(model="qwen", messages=msgs, tools=[WEATHER],
                                           temperature=0, max_tokens=80)
    content, calls = "", {}
    for chunk in client.chat.completions.create(model="qwen", messages=msgs, tools=[WEATHER],
                                                temperature=0, max_tokens=80, stream=True):
        if chunk.choices:
            d = chunk.choices[0].delta
            content += d.content or ""
            for t in d.tool_calls or []:
                calls.setdefault(t.index, ["", ""])
                calls[t.index][0] += t.function.name or ""
                calls[t.index][1] += t.function.arguments or ""
    m = whole.choices[0].message
    assert content.strip() == (m.content or "").strip()
    assert [c[0] for c in calls.values()] == [c.function.name for c in m.tool_calls or []]
    for (_, a), c in zip(calls.values(), m.tool_calls or []):
        assert json.loads(a) == json.loads(c.function.arguments)


def test_bad_tool_requests_get_400(client):
    for extra in [{"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
                  {"tools": [{"type": "function", "function": {"name": "bad name"}}]},
                  {"tool_choice": "required"},
                  {"tools": [WEATHER], "tool_choice": "required",
                   "response_format": {"type": "json_object"}}]:
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="qwen", messages=ASK, max_tokens=4, **extra)
