"""llama_server restart-mode reconfigure for real (runtime.model.residency, LlamaServerEngine): the cached
llama-server build serving SmolLM2, driven through the runtime's operations as the API calls them.

A reconfigure while a request streams restarts the server with the new arguments once the
stream has finished (the model ``loaded`` throughout, requests that came meanwhile queue and run
on the new server, none refused); arguments llama-server refuses to start with (a quantized V
cache without flash attention) start the old server again and answer 400 with the model serving.
"""
from __future__ import annotations

import asyncio

import httpx
import pytest

from runtime.backends import BACKENDS
from runtime.backends.llama_server.spec import llama_server_command
from runtime.errors import InvalidLoadRequest, NotReconfigurable
from runtime.model.residency import ModelEvent
from runtime.service import RuntimeService
from runtime.model.state import TransitionEvent
from tests.conftest import write_settings
from tests.engines.runtime_driver import user_input
from tests.managed.helpers import alive, pidfiles

# About 700 tokens: more than a 512 context holds, well within 2,048.
LONG_PROMPT = "count: " + " ".join(str(n) for n in range(180))
RESTART = {"reconfigurable": True, "reconfigure_mode": "restart"}


@pytest.fixture
async def service(tmp_path, state_dir, llama_server_binary, smollm2_gguf):
    model = {
        "backend": "llama_server",
        "model_path": smollm2_gguf,
        "llama_server_binary": llama_server_binary,
        "llama_server_n_ctx": 512,
        "llama_server_startup_timeout_seconds": 60.0,
        "llama_server_extra_args": ["--threads", "1"],
    }
    service = RuntimeService(str(write_settings(tmp_path, {"smol": model})))
    service.events = []
    service.pool.listeners.append(service.events.append)
    await service.start(load_enabled=False)
    await service.handle("load", {"name": "smol", "body": None}, None)
    service.events.clear()
    try:
        yield service
    finally:
        await service.shutdown()


def _generate(service, request_id: str, text: str, max_tokens: int, deltas: list | None = None):
    async def emit(event: dict) -> None:
        if deltas is not None and event.get("event") == "delta":
            deltas.append(event)

    payload = {"request_id": request_id, "model": "smol", "messages": user_input(text), "max_output_tokens": max_tokens,
               "temperature": 0, "stream": deltas is not None}
    return asyncio.create_task(service.handle("generate", payload, emit))


async def _until(condition, timeout: float = 60) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


def _reconfigure(service, body: dict):
    return service.handle("reconfigure", {"name": "smol", "body": body}, None)


def _server(state_dir) -> dict:
    [record] = pidfiles(state_dir)
    return record


def _flag(record: dict, flag: str) -> str | None:
    argv = record["argv"]
    return argv[argv.index(flag) + 1] if flag in argv else None


def _props(record: dict) -> dict:
    return httpx.get(f"http://127.0.0.1:{_flag(record, '--port')}/props", timeout=10).json()


def test_the_server_flags_are_reconfigurable_by_restart():
    spec = BACKENDS["llama_server"]
    definition = spec.definition_model.model_validate({"backend": "llama_server", "model_path": "/m.gguf"})
    constraints = spec.load_constraints(definition)
    marked = {key: {k: entry[k] for k in RESTART if k in entry} for key, entry in constraints.items()}
    assert {key for key, keys in marked.items() if keys} == {
        "llama_server_n_ctx", "llama_server_type_k", "llama_server_type_v", "llama_server_flash_attn"
    }
    assert all(keys == RESTART for keys in marked.values() if keys)
    config = spec.effective_config(definition, {"llama_server_type_k": "q8_0", "llama_server_type_v": "q4_0"})
    argv = llama_server_command(config, "127.0.0.1", 9000, "/")
    assert argv[argv.index("--cache-type-k") + 1] == "q8_0" and argv[argv.index("--cache-type-v") + 1] == "q4_0"
    assert "--cache-type-k" not in llama_server_command(spec.effective_config(definition, {}), "h", 1, "/")


async def test_reconfigure_restarts_the_server_after_the_stream_and_queued_requests_run_on_it(service, state_dir):
    controller = service.pool.controller("smol")
    before = _server(state_dir)
    deltas: list = []
    streaming = _generate(service, "stream", "Write a long story about a cat.", 32, deltas)
    await _until(lambda: deltas)
    changing = asyncio.create_task(_reconfigure(service, {"llama_server_n_ctx": 2048, "llama_server_type_k": "q8_0"}))
    await _until(lambda: controller.scheduler.paused)
    # Requests that come meanwhile queue (a long one the old server's 512 tokens could not hold).
    queued = [_generate(service, "long", LONG_PROMPT, 2), _generate(service, "short", "Hi", 4)]
    await _until(lambda: controller.scheduler.queue_depth == 2)
    assert controller.state.value == "loaded" and alive(before["pid"])

    finished = await asyncio.wait_for(streaming, 60)
    assert finished["usage"]["output_tokens"] > 0 and "".join(d["text"] for d in deltas) == finished["text"]
    answer = await asyncio.wait_for(changing, 120)
    assert answer["reconfigured"]["changed"] == {"llama_server_n_ctx": {"from": 512, "to": 2048},
                                                 "llama_server_type_k": {"from": None, "to": "q8_0"}}
    assert answer["load_override"] == {"llama_server_n_ctx": 2048, "llama_server_type_k": "q8_0"}
    assert (answer["runtime_state"], answer["residency"]) == ("loaded", "active")
    long_answer, short_answer = await asyncio.wait_for(asyncio.gather(*queued), 120)
    assert long_answer["usage"]["input_tokens"] > 512  # ran on the new server
    assert short_answer["usage"]["output_tokens"] > 0

    after = _server(state_dir)
    assert after["pid"] != before["pid"] and not alive(before["pid"])
    assert (_flag(after, "-c"), _flag(after, "--cache-type-k")) == ("2048", "q8_0")
    assert _props(after)["default_generation_settings"]["n_ctx"] == 2048  # llama-server really has it
    assert not [e for e in service.events if isinstance(e, TransitionEvent)]
    assert [(e.kind, e.details["reason"]) for e in service.events if isinstance(e, ModelEvent)] == [
        ("reconfigured", "admin")
    ]


async def test_arguments_the_server_refuses_start_the_old_ones_again(service, state_dir):
    controller = service.pool.controller("smol")
    before = _server(state_dir)
    with pytest.raises(InvalidLoadRequest, match="started again with the old ones") as refused:
        await _reconfigure(service, {"llama_server_type_v": "q8_0", "llama_server_flash_attn": "off"})
    assert "exited" in refused.value.message  # the new server's own words
    assert (controller.state.value, controller.load_override, controller.residency) == ("loaded", {}, "active")
    after = _server(state_dir)
    assert after["pid"] != before["pid"] and _same_but_port(before, after)
    assert _flag(after, "--cache-type-v") is None and _flag(after, "--flash-attn") == "auto"
    assert (await asyncio.wait_for(_generate(service, "after", "Hi", 4), 60))["usage"]["output_tokens"] > 0
    assert not [e for e in service.events if isinstance(e, (TransitionEvent, ModelEvent))]

    with pytest.raises(NotReconfigurable) as not_live:
        await _reconfigure(service, {"llama_server_image_max_tokens": 64})
    assert not_live.value.param == "llama_server_image_max_tokens" and _server(state_dir)["pid"] == after["pid"]


def _same_but_port(before: dict, after: dict) -> bool:
    """The same argv but for the free port each start picks."""
    strip = lambda argv: [a for i, a in enumerate(argv) if i == 0 or argv[i - 1] != "--port"]  # noqa: E731
    return strip(before["argv"]) == strip(after["argv"])
