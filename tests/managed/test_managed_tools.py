"""Tool calls on the typed path (/v1/responses) to the fake vLLM, SGLang and TensorRT-LLM servers
started for tools, and to openai_remote: the exact chat body each upstream gets, the upstream's
calls (whole or streamed in fragments) as ToolCall events with its ids, a two-turn exchange, and
the runtime's result (tool_calls, finish_reason "tool_calls", tool_call events on a stream)."""
from __future__ import annotations

import json
import os
import subprocess

import httpx
import pytest

from runtime.backends.base import Finished, TextDelta
from runtime.errors import ToolsUnsupported
from runtime.inputs.request import GenerationRequest
from runtime.inference.tool_calls import ToolCall
from tests.conftest import free_port
from tests.managed.helpers import TARGET, records, requests_logged, wait_until
from tests.managed.test_managed_engines import definition
from tests.runtime.helpers import start_pool

PARSERS = {
    "vllm_serve": {"vllm_tool_call_parser": "hermes"},
    "sglang_serve": {"sglang_tool_call_parser": "qwen25"},
    "trtllm_serve": {"trtllm_tool_parser": "qwen3"},
}
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}
TIME = {"type": "function", "function": {"name": "time", "parameters": {"type": "object", "properties": {}}}}


def user(text: str) -> dict:
    return {"role": "user", "content": [{"type": "input_text", "text": text}]}


def ask(messages: list[dict], **fields) -> GenerationRequest:
    return GenerationRequest(request_id="r", messages=messages, max_output_tokens=64, **fields).resolved()


async def events_of(engine, request) -> list:
    return [event async for event in engine.generate(request)]


@pytest.mark.parametrize("backend", list(PARSERS))
async def test_the_upstreams_calls_come_back_whole_and_streamed(backend, fake_bin, state_dir, tmp_path):
    pool, _ = await start_pool(tmp_path, {"m": definition(backend, fake_bin, tmp_path, **PARSERS[backend])})
    controller = pool.controller("m")
    await controller.load({}, None)
    assert controller.last_error is None
    engine = controller.engines[0]
    assert records(tmp_path / "record.jsonl")[0]["argv"][-2:] == {
        "vllm_serve": ["--tool-call-parser", "hermes"],
        "sglang_serve": ["--tool-call-parser", "qwen25"],
        "trtllm_serve": ["--tool_parser", "qwen3"],
    }[backend]
    arguments = json.dumps({"text": "weather in Oslo"})
    for stream in (False, True):
        events = await events_of(engine, ask([user("weather in Oslo")], tools=[WEATHER, TIME], stream=stream))
        assert events[:-1] == [ToolCall("weather", arguments, "call_fake_0")]
        assert isinstance(events[-1], Finished) and events[-1].finish_reason == "stop"
        assert events[-1].output_tokens == 5  # the fake's count: 4 argument fragments and the header
    first, streamed = requests_logged(tmp_path / "requests.jsonl")
    assert first == {
        "model": TARGET, "messages": [{"role": "user", "content": "weather in Oslo"}], "stream": False,
        "max_tokens": 64, "temperature": 0.7, "top_p": 1.0, "tools": [WEATHER, TIME], "tool_choice": "auto",
    }
    assert streamed == {**first, "stream": True, "stream_options": {"include_usage": True}}
    await pool.shutdown()


async def test_parallel_calls_named_choice_and_the_second_turn(fake_bin, state_dir, tmp_path):
    pool, _ = await start_pool(tmp_path, {"m": definition("vllm_serve", fake_bin, tmp_path, **PARSERS["vllm_serve"])})
    controller = pool.controller("m")
    await controller.load({}, None)
    engine = controller.engines[0]
    arguments = json.dumps({"text": "__parallel__ both"})
    for stream in (False, True):  # streamed, the two calls' fragments arrive interleaved
        events = await events_of(engine, ask([user("__parallel__ both")], tools=[WEATHER, TIME], stream=stream))
        assert events[:-1] == [ToolCall("weather", arguments, "call_fake_0"), ToolCall("time", arguments, "call_fake_1")]
    events = await events_of(engine, ask([user("__parallel__ both")], tools=[WEATHER, TIME], parallel_tool_calls=False))
    assert events[:-1] == [ToolCall("weather", arguments, "call_fake_0")]
    named = {"type": "function", "function": {"name": "time"}}
    events = await events_of(engine, ask([user("what time")], tools=[WEATHER, TIME], tool_choice=named))
    assert events[:-1] == [ToolCall("time", json.dumps({"text": "what time"}), "call_fake_0")]
    events = await events_of(engine, ask([user("what time")], tools=[WEATHER, TIME], tool_choice="none"))
    assert events[:-1] == [TextDelta("echo: what time")]
    # The second turn: the call and its result go back; the fake answers from the result.
    history = [
        user("what time"),
        {"role": "assistant", "content": [], "tool_calls": [{"id": "call_fake_0", "name": "time", "arguments": "{}"}]},
        {"role": "tool", "tool_call_id": "call_fake_0", "content": [{"type": "input_text", "text": "noon"}]},
    ]
    for stream in (False, True):
        events = await events_of(engine, ask(history, tools=[WEATHER, TIME], stream=stream))
        assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "result call_fake_0: noon"
        assert not [e for e in events if isinstance(e, ToolCall)]
    logged = requests_logged(tmp_path / "requests.jsonl")
    assert logged[2]["parallel_tool_calls"] is False
    assert (logged[3]["tools"], logged[3]["tool_choice"]) == ([WEATHER, TIME], named)
    assert logged[-1]["messages"] == [
        {"role": "user", "content": "what time"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_fake_0", "type": "function", "function": {"name": "time", "arguments": "{}"}}]},
        {"role": "tool", "content": "noon", "tool_call_id": "call_fake_0"},
    ]
    await pool.shutdown()


def tool_payload(request_id: str, model: str = "m", **fields) -> dict:
    return {"request_id": request_id, "model": model, "messages": [user("weather in Oslo")],
            "tools": [WEATHER], **fields}


async def test_the_runtime_result_carries_the_calls(fake_bin, state_dir, tmp_path, runtime_service):
    service, _ = await runtime_service({"m": definition("sglang_serve", fake_bin, tmp_path, **PARSERS["sglang_serve"])})
    await service.handle("load", {"name": "m", "body": None}, None)
    call = {"id": "call_fake_0", "name": "weather", "arguments": json.dumps({"text": "weather in Oslo"})}
    for stream in (False, True):
        emitted: list[dict] = []

        async def emit(event: dict) -> None:
            emitted.append(event)

        result = await service.handle("generate", tool_payload(f"r{stream}", stream=stream), emit)
        assert result["tool_calls"] == [call]
        assert (result["text"], result["finish_reason"]) == ("", "tool_calls")
        if stream:
            assert [e for e in emitted if e["event"] == "tool_call"] == [{"event": "tool_call", "index": 0, "call": call}]
            assert not [e for e in emitted if e["event"] == "delta"]


async def test_a_server_not_started_for_tools_refuses_them_before_the_upstream(
    fake_bin, state_dir, tmp_path, runtime_service
):
    service, _ = await runtime_service({"m": definition("vllm_serve", fake_bin, tmp_path)})
    await service.handle("load", {"name": "m", "body": None}, None)
    with pytest.raises(ToolsUnsupported):
        await service.handle("generate", tool_payload("r1"), None)
    result = await service.handle("generate", tool_payload("r2", tool_choice="none"), None)
    assert (result["text"], result["finish_reason"], "tool_calls" in result) == ("echo: weather in Oslo", "stop", False)
    assert len(requests_logged(tmp_path / "requests.jsonl")) == 1  # only the "none" request went up


@pytest.fixture
def tool_remote(fake_bin, tmp_path):
    """A fake vllm serve started for tools, as an openai_remote's upstream: its base URL and log."""
    port, log = free_port(), tmp_path / "remote.requests.jsonl"
    argv = [str(fake_bin / "vllm"), "serve", "remote-model", "--host", "127.0.0.1", "--port", str(port),
            "--enable-auto-tool-choice", "--tool-call-parser", "llama3_json"]
    process = subprocess.Popen(argv, env={**os.environ, "FAKE_REQUEST_LOG": str(log)},
                               stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _healthy(base), 10, message="remote up")
        yield base + "/v1", log
    finally:
        process.terminate()
        process.wait(timeout=10)


def _healthy(base: str) -> bool:
    try:
        return httpx.get(base + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


async def test_openai_remote_passes_tools_and_reads_the_remotes_calls(tool_remote, tmp_path, runtime_service):
    base_url, log = tool_remote
    models = {"r": {"backend": "openai_remote", "remote_base_url": base_url, "remote_model": "remote-model"}}
    service, _ = await runtime_service(models)
    service.pool.startup_service["allow_remote_execution"] = True
    await service.handle("load", {"name": "r", "body": None}, None)
    for stream in (False, True):
        result = await service.handle("generate", tool_payload(f"r{stream}", "r", tool_choice="required",
                                                               stream=stream), _ignore)
        assert result["tool_calls"] == [
            {"id": "call_fake_0", "name": "weather", "arguments": json.dumps({"text": "weather in Oslo"})}
        ]
        assert result["finish_reason"] == "tool_calls"
    sent = requests_logged(log)[0]
    assert (sent["model"], sent["tools"], sent["tool_choice"]) == ("remote-model", [WEATHER], "required")


async def _ignore(event: dict) -> None:
    pass
