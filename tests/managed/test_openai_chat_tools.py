"""Tool calls on the typed path to an OpenAI-compatible server (``runtime.backends.shared.openai_chat``):
the exact upstream body (tools, tool_choice, parallel_tool_calls, earlier calls and results as
chat messages) and the upstream's calls read back, whole or as streamed fragments (httpx
MockTransport)."""
from __future__ import annotations

import json

import httpx
import pytest

from runtime.backends.base import Finished, TextDelta
from runtime.backends.shared.openai_chat import chat_completion, chat_request, required_for_named
from runtime.errors import BackendError
from runtime.inputs.request import GenerationRequest
from runtime.inference.tool_calls import ToolCall

WEATHER = {"type": "function", "function": {"name": "weather", "description": "the weather",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
TIME = {"type": "function", "function": {"name": "time", "parameters": {"type": "object", "properties": {}}}}
CONVERSATION = [
    {"role": "user", "content": [{"type": "input_text", "text": "weather in Oslo?"}]},
    {"role": "assistant", "content": [], "tool_calls": [{"id": "call_1", "name": "weather",
                                                          "arguments": '{"city": "Oslo"}'}]},
    {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "input_text", "text": "12 C"}]},
    {"role": "assistant", "content": [{"type": "output_text", "text": "Let me check the time too."}],
     "tool_calls": [{"id": "call_2", "name": "time", "arguments": "{}"}]},
    {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "input_text", "text": "noon"}]},
]
CHAT_MESSAGES = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "weather in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]},
    {"role": "tool", "content": "12 C", "tool_call_id": "call_1"},
    {"role": "assistant", "content": "Let me check the time too.", "tool_calls": [
        {"id": "call_2", "type": "function", "function": {"name": "time", "arguments": "{}"}}]},
    {"role": "tool", "content": "noon", "tool_call_id": "call_2"},
]


def request(**fields) -> GenerationRequest:
    return GenerationRequest(request_id="r", messages=CONVERSATION, instructions="be brief", **fields).resolved()


def test_tools_choice_and_the_conversation_reach_the_upstream_in_the_chat_shape():
    body = chat_request(request(tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False), "m")
    assert body == {
        "model": "m", "messages": CHAT_MESSAGES, "stream": False, "max_tokens": 512, "temperature": 0.7,
        "top_p": 1.0, "tools": [WEATHER, TIME], "tool_choice": "required", "parallel_tool_calls": False,
    }


def test_no_tool_choice_is_sent_as_auto_and_no_tools_send_no_tool_fields():
    body = chat_request(request(tools=[WEATHER]), "m")
    assert (body["tools"], body["tool_choice"]) == ([WEATHER], "auto")
    assert "parallel_tool_calls" not in body
    body = chat_request(request(), "m")
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & set(body)
    assert body["messages"] == CHAT_MESSAGES  # the history's calls still go as chat messages


def test_a_named_function_goes_as_it_is_or_as_that_tool_alone_with_required():
    named = {"type": "function", "function": {"name": "time"}}
    body = chat_request(request(tools=[WEATHER, TIME], tool_choice=named), "m")
    assert (body["tools"], body["tool_choice"]) == ([WEATHER, TIME], named)
    body = chat_request(request(tools=[WEATHER, TIME], tool_choice=named), "m", named_tool_choice=False)
    assert (body["tools"], body["tool_choice"]) == ([TIME], "required")
    # A client's chat body, as llama-server's pass-through sends it; other choices stay as they are.
    client_body = {"model": "x", "messages": [], "tools": [WEATHER, TIME], "tool_choice": named, "top_k": 3}
    assert required_for_named(client_body) == {**client_body, "tools": [TIME], "tool_choice": "required"}
    for choice in ("auto", "none", "required"):
        assert required_for_named({**client_body, "tool_choice": choice}) == {**client_body, "tool_choice": choice}


async def post(answer, body: dict) -> list:
    def handler(sent: httpx.Request) -> httpx.Response:
        return answer

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://upstream") as client:
        return [event async for event in chat_completion(client, "/v1/chat/completions", body, "up", BackendError)]


def completion(message: dict, finish: str = "tool_calls") -> httpx.Response:
    usage = {"prompt_tokens": 9, "completion_tokens": 6}
    return httpx.Response(200, json={"choices": [{"index": 0, "message": message, "finish_reason": finish}],
                                     "usage": usage})


async def test_a_message_with_tool_calls_yields_them_with_the_upstream_ids():
    message = {"role": "assistant", "content": "Checking.", "tool_calls": [
        {"id": "chatcmpl-tool-a", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}},
        # Some servers write the arguments as an object: they become JSON text.
        {"id": "chatcmpl-tool-b", "type": "function", "function": {"name": "time", "arguments": {"tz": "CET"}}},
    ]}
    events = await post(completion(message), {"stream": False})
    assert events == [
        TextDelta("Checking."),
        ToolCall("weather", '{"city": "Oslo"}', "chatcmpl-tool-a"),
        ToolCall("time", '{"tz": "CET"}', "chatcmpl-tool-b"),
        Finished(input_tokens=9, output_tokens=6, finish_reason="stop"),
    ]


async def test_a_call_without_an_id_gets_one_and_a_call_without_a_name_is_the_upstreams_fault():
    events = await post(completion({"content": None, "tool_calls": [{"function": {"name": "time"}}]}), {})
    assert [(e.name, e.arguments, e.id.startswith("call_")) for e in events[:1]] == [("time", "{}", True)]
    with pytest.raises(BackendError, match="up answered tool call 0 without a function name"):
        await post(completion({"content": None, "tool_calls": [{"id": "x", "function": {"arguments": "{}"}}]}), {})


def sse(*chunks) -> httpx.Response:
    lines = [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks] + ["data: [DONE]\n\n"]
    return httpx.Response(200, content="".join(lines).encode(), headers={"Content-Type": "text/event-stream"})


def delta(fields: dict, finish=None) -> dict:
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": finish}]}


async def test_streamed_fragments_are_joined_by_index_and_yielded_when_the_stream_ends():
    answer = sse(
        delta({"role": "assistant", "content": ""}),
        delta({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                               "function": {"name": "weather", "arguments": ""}}]}),
        delta({"tool_calls": [{"index": 1, "id": "call_b", "type": "function", "function": {"name": "time"}}]}),
        delta({"tool_calls": [{"index": 0, "function": {"arguments": '{"city"'}}]}),
        delta({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}),
        delta({"tool_calls": [{"index": 0, "function": {"arguments": ': "Oslo"}'}}]}),
        delta({}, "tool_calls"),
        {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 7}},
    )
    events = await post(answer, {"stream": True})
    assert events == [
        ToolCall("weather", '{"city": "Oslo"}', "call_a"),
        ToolCall("time", "{}", "call_b"),
        Finished(input_tokens=11, output_tokens=7, finish_reason="stop"),
    ]


async def test_streamed_text_before_a_call_comes_first_and_fragments_count_without_usage():
    answer = sse(
        delta({"content": "Sure."}),
        delta({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "time", "arguments": "{"}}]}),
        delta({"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}, "tool_calls"),
    )
    events = await post(answer, {"stream": True})
    assert events == [TextDelta("Sure."), ToolCall("time", "{}", "c"),
                      Finished(input_tokens=0, output_tokens=3, finish_reason="stop")]


def test_a_typed_requests_logprobs_are_asked_of_the_upstream():
    body = chat_request(request(logprobs=2), "m")
    assert body["logprobs"] is True and body["top_logprobs"] == 2
    assert "logprobs" not in chat_request(request(), "m")
