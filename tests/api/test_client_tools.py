"""Agent libraries' tool calling, unchanged, against a live ``serve``: langchain-openai
``bind_tools`` + ``invoke`` (and ``stream``), pydantic-ai with an ``@agent.tool_plain`` and with
``output_type=SomeModel`` (its default output mode is a tool call, sent with tool_choice), and
litellm with tools, each a two-turn exchange: the model calls the tool, the client sends its
result, the model answers.  The stub scripts it (``stub_tool_calls``): a conversation that ends
with the user's message gets the scripted call, one that ends with a tool result gets that
result's text back as the answer (stub_reply unset), so the second turn proves the result
reached the model.
"""
from __future__ import annotations

import asyncio
import json
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # noqa: E402
import pytest  # noqa: E402
from langchain_core.messages import HumanMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from pydantic import BaseModel  # noqa: E402
from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.messages import ToolCallPart, ToolReturnPart  # noqa: E402
from pydantic_ai.models.openai import OpenAIChatModel  # noqa: E402
from pydantic_ai.providers.openai import OpenAIProvider  # noqa: E402

from tests.conftest import LiveService  # noqa: E402
from tests.llama_cpp.llama_helpers import load, start_service  # noqa: E402

CITY = {"city": "Paris"}
FORECAST = {"city": "Paris", "temperature": 21}
MODELS = {
    "agent": {"backend": "stub", "stub_tool_calls": [{"name": "get_weather", "arguments": CITY}]},
    "structured": {"backend": "stub", "stub_tool_calls": [{"name": "final_result", "arguments": FORECAST}]},
}
WEATHER_REPORT = "Sunny and 21 degrees in Paris"


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape):
    live = start_service(tmp_path_factory.mktemp("client_tools"), MODELS)
    try:
        with live.client(timeout=60) as http:
            for name in MODELS:
                assert load(http, name)["runtime_state"] == "loaded"
        yield live
    finally:
        live.stop()


def base_url(live: LiveService) -> str:
    return live.url + "/v1"


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return WEATHER_REPORT


# ---- langchain-openai ------------------------------------------------------------------


def test_langchain_bind_tools_two_turns(service):
    llm = ChatOpenAI(base_url=base_url(service), api_key="unused", model="agent", max_retries=0, timeout=60)
    bound = llm.bind_tools([get_weather])
    history = [HumanMessage("What is the weather in Paris?")]
    called = bound.invoke(history)
    assert called.response_metadata["finish_reason"] == "tool_calls" and called.content == ""
    (call,) = called.tool_calls
    assert (call["name"], call["args"]) == ("get_weather", CITY) and call["id"].startswith("call_")
    history += [called, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
    answer = bound.invoke(history)
    assert (answer.content, answer.tool_calls) == (WEATHER_REPORT, [])
    assert answer.response_metadata["finish_reason"] == "stop"
    chunks = list(bound.stream(history[:1]))
    merged = sum(chunks[1:], chunks[0])
    assert [(c["name"], c["args"]) for c in merged.tool_calls] == [("get_weather", CITY)] and merged.content == ""


# ---- pydantic-ai -----------------------------------------------------------------------


def agent(live: LiveService, model: str, **options) -> Agent:
    return Agent(OpenAIChatModel(model, provider=OpenAIProvider(base_url=base_url(live), api_key="unused")), **options)


def test_pydantic_ai_tool_plain_two_turns(service):
    runner = agent(service, "agent")
    seen = []

    @runner.tool_plain
    def get_weather(city: str) -> str:  # noqa: F811 - pydantic-ai's own tool of the same name
        """The weather in a city."""
        seen.append(city)
        return WEATHER_REPORT

    result = runner.run_sync("What is the weather in Paris?")
    assert seen == ["Paris"]
    assert result.output == WEATHER_REPORT
    assert result.usage.requests == 2
    parts = [part for message in result.all_messages() for part in message.parts]
    calls = [part for part in parts if isinstance(part, ToolCallPart)]
    returns = [part for part in parts if isinstance(part, ToolReturnPart)]
    assert [(c.tool_name, c.args_as_dict()) for c in calls] == [("get_weather", CITY)]
    assert [(r.tool_call_id, r.content) for r in returns] == [(calls[0].tool_call_id, WEATHER_REPORT)]

    async def streamed():
        async with runner.run_stream("What is the weather in Paris?") as stream:
            return await stream.get_output()

    assert asyncio.run(streamed()) == WEATHER_REPORT and seen == ["Paris", "Paris"]


class Forecast(BaseModel):
    city: str
    temperature: int


def test_pydantic_ai_output_type_is_a_tool_call(service):
    result = agent(service, "structured", output_type=Forecast).run_sync("Forecast for Paris?")
    assert result.output == Forecast(**FORECAST)
    (call,) = [part for message in result.all_messages() for part in message.parts if isinstance(part, ToolCallPart)]
    assert call.tool_name == "final_result"


# ---- litellm ---------------------------------------------------------------------------


LITELLM_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}}]


def test_litellm_tools_two_turns(service):
    def completion(messages, **options):
        return litellm.completion(model="openai/agent", api_base=base_url(service), api_key="unused",
                                  messages=messages, tools=LITELLM_TOOLS, timeout=60, **options)

    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = completion(messages)
    assert first.choices[0].finish_reason == "tool_calls"
    (call,) = first.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", CITY)
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": WEATHER_REPORT}]
    second = completion(messages)
    assert (second.choices[0].message.content, second.choices[0].finish_reason) == (WEATHER_REPORT, "stop")
    chunks = list(completion(messages[:1], stream=True))
    pieces = [p for c in chunks if c.choices for p in c.choices[0].delta.tool_calls or ()]
    assert pieces[0].function.name == "get_weather" and pieces[0].id.startswith("call_")
    assert json.loads("".join(p.function.arguments or "" for p in pieces)) == CITY
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
