"""Reconfigure and the warm tier on SmolLM2 for real, in an engine process (runtime.model.residency).

Through the runtime's operations (as the API's channel calls them): a reconfigure while a
request streams (the stream completes on the old context, requests that came meanwhile queue and
run on the new one, none refused), KV types, the rollback of a context llama.cpp rejects, the
refusals (a field not reconfigurable, a shrink below a queued request, a context over the cpu
budget), and sleep / wake with the engine process's RSS going down and back, a request waking it.
"""
from __future__ import annotations

import asyncio

import pytest
from llama_helpers import SMOLLM2_MODEL

from runtime.errors import InsufficientMemory, InvalidLoadRequest, NotReconfigurable
from runtime.pool.devices import MemorySettings
from runtime.model.residency import ModelEvent
from runtime.service import RuntimeService
from runtime.model.state import TransitionEvent
from tests.conftest import write_settings
from tests.engines.runtime_driver import user_input

SMOL = {**SMOLLM2_MODEL, "gguf_n_ctx": 512, "isolation": "process"}
# About 700 tokens: more than a 512 context holds, well within 1,024.
LONG_PROMPT = "count: " + " ".join(str(n) for n in range(180))


@pytest.fixture
async def service(tmp_path):
    service = RuntimeService(str(write_settings(tmp_path, {"smol": SMOL, "stub": {"backend": "stub"}})))
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


def _model_events(service) -> list[tuple]:
    return [(e.kind, e.details.get("reason")) for e in service.events if isinstance(e, ModelEvent)]


async def test_reconfigure_while_a_request_streams(service):
    controller = service.pool.controller("smol")
    deltas: list = []
    streaming = _generate(service, "stream", "Write a long story about a cat.", 48, deltas)
    await _until(lambda: deltas)
    changing = asyncio.create_task(_reconfigure(service, {"gguf_n_ctx": 1024}))
    await _until(lambda: controller.scheduler.paused)
    # Requests that come meanwhile queue (a long one that the old context could not hold).
    queued = [_generate(service, "long", LONG_PROMPT, 4), _generate(service, "short", "Hi", 4)]
    await _until(lambda: controller.scheduler.queue_depth == 2)
    assert controller.state.value == "loaded" and controller.scheduler.inflight == 1

    finished = await asyncio.wait_for(streaming, 60)
    assert finished["usage"]["output_tokens"] > 0 and "".join(d["text"] for d in deltas) == finished["text"]
    answer = await asyncio.wait_for(changing, 60)
    assert answer["reconfigured"]["changed"] == {"gguf_n_ctx": {"from": 512, "to": 1024}}
    assert answer["load_override"] == {"gguf_n_ctx": 1024} and answer["runtime_state"] == "loaded"
    long_answer, short_answer = await asyncio.wait_for(asyncio.gather(*queued), 60)
    assert long_answer["usage"]["input_tokens"] > 512  # ran on the new context
    assert short_answer["usage"]["output_tokens"] > 0
    assert not [e for e in service.events if isinstance(e, TransitionEvent) and e.new.value != "loaded"]
    reconfigured = [e for e in service.events if isinstance(e, ModelEvent)]
    assert [e.kind for e in reconfigured] == ["reconfigured"] and reconfigured[0].details["duration_ms"] > 0

    # KV types (quantized V needs flash attention): the same weights, a new context.
    answer = await _reconfigure(service, {"gguf_type_k": "q8_0", "gguf_type_v": "q8_0", "gguf_flash_attn": "on"})
    assert answer["load_override"] == {"gguf_n_ctx": 1024, "gguf_type_k": "q8_0", "gguf_type_v": "q8_0",
                                       "gguf_flash_attn": "on"}
    assert (await asyncio.wait_for(_generate(service, "q8", "Hi", 4), 60))["usage"]["output_tokens"] > 0
    # null: back to the definition's value (the key leaves the load override).
    answer = await _reconfigure(service, {"gguf_type_k": None, "gguf_type_v": None, "gguf_flash_attn": None})
    assert answer["load_override"] == {"gguf_n_ctx": 1024}


async def test_rollback_and_refusals_leave_the_model_serving(service):
    controller = service.pool.controller("smol")
    with pytest.raises(InvalidLoadRequest, match="quantized V cache requires flash_attn"):
        await _reconfigure(service, {"gguf_type_v": "q8_0", "gguf_flash_attn": "off"})
    assert controller.load_override == {} and controller.residency == "active"
    assert (await asyncio.wait_for(_generate(service, "after", "Hi", 4), 60))["usage"]["output_tokens"] > 0

    with pytest.raises(NotReconfigurable) as refused:
        await _reconfigure(service, {"replicas": 2})
    assert refused.value.param == "replicas"
    with pytest.raises(NotReconfigurable):
        await service.handle("reconfigure", {"name": "stub", "body": {"gguf_n_ctx": 2}}, None)

    # A shrink below a queued request's size is refused; the queued request still runs.
    holder = _generate(service, "holder", "Write a long story about a dog.", 24, [])
    await _until(lambda: controller.scheduler.inflight == 1)
    waiting = _generate(service, "waiting", "x" * 1200, 2)  # about 300 tokens estimated, fewer in fact
    await _until(lambda: controller.scheduler.queue_depth == 1)
    with pytest.raises(InvalidLoadRequest, match="about 301 prompt tokens") as small:
        await _reconfigure(service, {"gguf_n_ctx": 256})
    assert small.value.param == "gguf_n_ctx" and not controller.scheduler.paused
    await asyncio.wait_for(asyncio.gather(holder, waiting), 60)

    # Over the cpu budget: 409 with the plan, nothing changed.
    charge = service.pool.memory.charges["smol"].mib["cpu"]
    service.pool.memory.configure(MemorySettings.model_validate({"devices": {"cpu": {"budget_mib": charge + 50}}}))
    with pytest.raises(InsufficientMemory) as full:
        await _reconfigure(service, {"gguf_n_ctx": 32768})
    assert full.value.details["device"] == "cpu" and full.value.details["needed_mib"] > charge + 50
    assert controller.load_override == {} and _model_events(service) == []


async def test_sleep_frees_the_context_and_a_request_wakes_it(service):
    controller = service.pool.controller("smol")
    await _reconfigure(service, {"gguf_n_ctx": 4096})  # a KV cache worth measuring (about 90 MiB)
    engine = controller.engines[0]
    awake = (await engine.stats())["rss_bytes"]
    answer = await service.handle("sleep", {"name": "smol"}, None)
    assert answer["residency"] == "sleeping" and answer["runtime_state"] == "loaded"
    asleep = (await engine.stats())["rss_bytes"]
    assert awake - asleep > 60 * 2**20, (awake, asleep)
    assert service.pool.memory.charges["smol"].mib["cpu"] < awake / 2**20 - 50  # the charge follows

    result = await asyncio.wait_for(_generate(service, "wakes", "Hi", 4), 60)  # wakes it and waits
    assert result["usage"]["output_tokens"] > 0 and controller.residency == "active"
    assert abs((await engine.stats())["rss_bytes"] - awake) < 30 * 2**20
    assert _model_events(service) == [("reconfigured", "admin"), ("slept", "admin"), ("woke", "request")]

    await service.handle("sleep", {"name": "smol"}, None)
    answer = await service.handle("wake", {"name": "smol"}, None)
    assert answer["residency"] == "active" and answer["woke"]["reason"] == "admin"
    assert not [e for e in service.events if isinstance(e, TransitionEvent) and e.new.value != "loaded"]
