"""The Anthropic Messages dialect (`/v1/messages`) through the official `anthropic` client:
messages.create, messages.stream, count_tokens and the error shape on the default model, and
a forced tool (tool_choice {"type": "tool"}) and its result's next turn on
Qwen2.5-Coder-0.5B-Instruct, whose template takes tools (skipped without it, as test_tools.py).
"""

import anthropic
import pytest

from conftest import run_server
from test_tools import qwen_path

WEATHER = {"name": "get_weather", "description": "The current weather in a city",
           "input_schema": {"type": "object", "properties": {
               "city": {"type": "string"},
               "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
               "required": ["city", "unit"], "additionalProperties": False}}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]
# Recent `anthropic` releases dropped the sampling arguments of create(); the server takes
# `temperature` as Anthropic's API does, sent here through extra_body.
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def smol():
    with run_server(["--served-model-name", "smol", "--max-num-seqs", "4",
                     "--max-model-len", "1024", "--kv-blocks", "256", "--api-key", "k3y"]) as base:
        yield anthropic.Anthropic(base_url=base, api_key="k3y", max_retries=0, timeout=120)


def test_create_stream_and_count(smol):
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    r = smol.messages.create(model="smol", max_tokens=12, extra_body=GREEDY, system="Be brief.",
                             messages=msgs, metadata={"user_id": "u1"})
    assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_")
    assert r.stop_reason in ("end_turn", "max_tokens")
    (block,) = r.content
    assert block.type == "text" and block.text
    assert r.usage.output_tokens <= 12 and r.usage.input_tokens > 0

    with smol.messages.stream(model="smol", max_tokens=12, extra_body=GREEDY, system="Be brief.",
                              messages=msgs) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == block.text
    assert final.content[0].text == block.text and final.stop_reason == r.stop_reason
    assert final.usage.output_tokens == r.usage.output_tokens

    n = smol.messages.count_tokens(model="smol", system="Be brief.", messages=msgs)
    assert n.input_tokens == r.usage.input_tokens


def test_errors_in_anthropic_shape(smol):
    with pytest.raises(anthropic.BadRequestError) as e:
        smol.messages.create(model="smol", max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}]}])
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert "image" in e.value.body["error"]["message"]
    bad = anthropic.Anthropic(base_url=str(smol.base_url), api_key="nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model="smol", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(anthropic.NotFoundError):
        smol.messages.create(model="nope", max_tokens=8, messages=[{"role": "user", "content": "hi"}])


@pytest.fixture(scope="module")
def qwen():
    with run_server(["--model", qwen_path(), "--served-model-name", "qwen", "--max-num-seqs", "4",
                     "--max-model-len", "2048", "--kv-blocks", "512"]) as base:
        yield anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0, timeout=300)


def check_weather(inp):
    assert set(inp) == {"city", "unit"} and inp["unit"] in ("celsius", "fahrenheit"), inp
    assert isinstance(inp["city"], str)


def test_forced_tool_whole_streamed_and_answered(qwen):
    forced = {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}
    r = qwen.messages.create(model="qwen", max_tokens=100, extra_body=GREEDY, messages=ASK,
                             tools=[WEATHER], tool_choice=forced)
    assert r.stop_reason == "tool_use", r
    (use,) = [b for b in r.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.id.startswith("toolu_")
    check_weather(use.input)

    kinds = []
    with qwen.messages.stream(model="qwen", max_tokens=100, extra_body=GREEDY, messages=ASK,
                              tools=[WEATHER], tool_choice=forced) as stream:
        for ev in stream:
            if ev.type == "content_block_start":
                kinds.append(ev.content_block.type)
            elif ev.type == "content_block_delta" and ev.delta.type == "input_json_delta":
                kinds.append("json")
        final = stream.get_final_message()
    # The tool_use block opens with its id and name, then its input in JSON fragments.
    assert "tool_use" in kinds and kinds[kinds.index("tool_use") + 1] == "json", kinds
    (suse,) = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and suse.input == use.input

    # The tool's result in the next turn; the answer reads it.
    turn = ASK + [{"role": "assistant", "content": [b.model_dump() for b in r.content]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                "content": '{"temperature": 21, "sky": "sunny"}'}]}]
    r2 = qwen.messages.create(model="qwen", max_tokens=60, extra_body=GREEDY, messages=turn,
                              tools=[WEATHER])
    assert r2.usage.input_tokens > r.usage.input_tokens + 20
    text = "".join(b.text for b in r2.content if b.type == "text")
    assert "21" in text or "sunny" in text.lower(), r2
