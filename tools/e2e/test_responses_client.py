"""The Responses API (`/v1/responses`) through the official `openai` client: create, stream,
the store, and a function tool round trip on Qwen2.5-Coder-0.5B (its template takes tools);
then the `openai-agents` package running a two-tool agent loop to its final answer against
the server (the loop's mechanics, not the model's wisdom).
"""

import asyncio
import json

import openai
import pytest

from conftest import run_server
from test_tools import qwen_path


@pytest.fixture(scope="module")
def smol():
    with run_server(["--served-model-name", "smol", "--max-num-seqs", "4",
                     "--max-model-len", "1024", "--kv-blocks", "512"]) as base:
        yield base


@pytest.fixture(scope="module")
def qwen():
    with run_server(["--model", qwen_path(), "--served-model-name", "qwen", "--max-num-seqs", "4",
                     "--max-model-len", "2048", "--kv-blocks", "512"]) as base:
        yield base


def client_of(base):
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)


WEATHER = {"type": "function", "name": "get_weather", "description": "The current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"], "additionalProperties": False}, "strict": True}


def test_create_store_get_delete(smol):
    c = client_of(smol)
    r = c.responses.create(model="smol", input="Say hello.", instructions="Be terse.",
                           max_output_tokens=12, temperature=0, metadata={"k": "v"})
    assert r.id.startswith("resp_") and r.object == "response"
    assert r.status in ("completed", "incomplete")
    assert r.output_text == r.output[0].content[0].text
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    assert c.responses.retrieve(r.id).output_text == r.output_text
    r2 = c.responses.create(model="smol", input="Again.", previous_response_id=r.id,
                            max_output_tokens=8, temperature=0)
    assert r2.usage.input_tokens > r.usage.input_tokens + r.usage.output_tokens - 1
    c.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError) as e:
        c.responses.retrieve(r.id)
    assert r.id in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model="smol", input="x", tools=[{"type": "web_search"}])
    assert "web_search" in str(e.value)


def test_stream_text_deltas(smol):
    c = client_of(smol)
    deltas, final = [], None
    with c.responses.stream(model="smol", input="Say hello.", max_output_tokens=12,
                            temperature=0) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
            # Cut at max_output_tokens the stream ends with response.incomplete, as OpenAI's
            # does (get_final_response() wants response.completed).
            if event.type in ("response.completed", "response.incomplete"):
                final = event.response
    assert deltas and "".join(deltas) == final.output_text
    # The raw event stream's sequence numbers increase from 0.
    events = list(c.responses.create(model="smol", input="Hi.", max_output_tokens=6, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type in (
        "response.completed", "response.incomplete")


def test_function_tool_round_trip(qwen):
    c = client_of(qwen)
    r = c.responses.create(model="qwen", input="What is the weather in Paris?", tools=[WEATHER],
                           tool_choice="required", parallel_tool_calls=False,
                           max_output_tokens=80, temperature=0)
    calls = [i for i in r.output if i.type == "function_call"]
    assert calls and calls[0].name == "get_weather", r.output
    assert "city" in json.loads(calls[0].arguments)
    r2 = c.responses.create(model="qwen", previous_response_id=r.id, tools=[WEATHER],
                            input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                    "output": json.dumps({"temp_c": 21, "sky": "clear"})}],
                            max_output_tokens=60, temperature=0)
    assert r2.status == "completed" and r2.output_text.strip(), r2.output
    # Streamed: the call's arguments arrive as deltas.
    args = []
    with c.responses.stream(model="qwen", input="Weather in Rome?", tools=[WEATHER],
                            tool_choice="required", parallel_tool_calls=False, max_output_tokens=80,
                            temperature=0) as stream:
        for event in stream:
            if event.type == "response.function_call_arguments.delta":
                args.append(event.delta)
        final = stream.get_final_response()
    call = [i for i in final.output if i.type == "function_call"][0]
    assert "".join(args) == call.arguments


def test_agents_sdk_two_tool_loop(qwen):
    agents = pytest.importorskip("agents")
    from agents import (Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool,
                        set_tracing_disabled)
    from agents.agent import StopAtTools

    set_tracing_disabled(True)
    ran = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        ran.append("get_weather")
        return f"Sunny, 21 C in {city}."

    @function_tool
    def add(a: int, b: int) -> int:
        """Adds two integers."""
        ran.append("add")
        return a + b

    async def main():
        client = openai.AsyncOpenAI(base_url=qwen + "/v1", api_key="unused", max_retries=0)
        agent = Agent(
            name="assistant",
            instructions="First call get_weather for Paris. Then call add with a=2 and b=3.",
            tools=[get_weather, add],
            model=OpenAIResponsesModel(model="qwen", openai_client=client),
            # Every turn calls a tool until `add` ends the run with its result.
            model_settings=ModelSettings(tool_choice="required", temperature=0,
                                         max_tokens=100, parallel_tool_calls=False),
            reset_tool_choice=False,
            tool_use_behavior=StopAtTools(stop_at_tool_names=["add"]),
        )
        return await Runner.run(agent, "What is the weather in Paris, and what is 2 + 3?",
                                max_turns=6)

    result = asyncio.run(main())
    # Both tools ran, each result went back to the model, and `add` ended the run with its
    # output as the final answer.
    assert ran == ["get_weather", "add"], ran
    assert str(result.final_output) == "5", result.final_output
    print("agent loop:", ran, "->", result.final_output)
