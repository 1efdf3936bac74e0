"""Driving a ``RuntimeService`` in-process, as the Channels consumer would."""
from __future__ import annotations

import asyncio
import itertools

import pytest

from runtime.backends.base import GenerationRequest
from runtime.service import RuntimeService
from tests.runtime.helpers import moves

_request_ids = itertools.count()


def user_input(text: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "input_text", "text": text}]}]


def generation_request(text: str = "Hi there", **fields) -> GenerationRequest:
    """What an engine's ``generate`` receives, for driving an engine directly."""
    fields = {"max_output_tokens": 256, **fields}
    return GenerationRequest(request_id=f"req-{next(_request_ids)}", messages=user_input(text), **fields).resolved()


def without_timings(result: dict) -> dict:
    """A generate result less its ``timings`` (the request's phases in ns, which differ run to run),
    once they are checked to be there: what the tests compare exactly."""
    timings = result.pop("timings")
    assert set(timings) == {"load_ns", "prompt_ns", "generation_ns"}
    assert all(isinstance(value, int) and value >= 0 for value in timings.values())
    return result


async def generate(service: RuntimeService, model: str, text: str = "Hi there", **fields) -> tuple[dict, list[str]]:
    """(result less its timings, streamed deltas) of one generate operation."""
    deltas: list[str] = []

    async def emit(event: dict) -> None:
        if event["event"] == "delta":
            deltas.append(event["text"])

    payload = {"request_id": f"req-{next(_request_ids)}", "model": model, "messages": user_input(text), **fields}
    result = await service.handle("generate", payload, emit)
    return without_timings(result), deltas


async def load(service: RuntimeService, model: str, body: dict | None = None) -> dict:
    return await service.handle("load", {"name": model, "body": body}, None)


async def unload(service: RuntimeService, model: str) -> dict:
    return await service.handle("unload", {"name": model}, None)


async def wait_for_state(service: RuntimeService, model: str, state: str, timeout: float = 5.0) -> dict:
    """The model's entry once it reached ``state`` (commands settle in the model's own task)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        entry = await service.handle("get_model", {"name": model}, None)
        if entry["runtime_state"] == state or asyncio.get_running_loop().time() > deadline:
            return entry
        await asyncio.sleep(0.01)


async def assert_refused_unchanged(service: RuntimeService, events: list, body: dict, error, param, fake) -> None:
    """A bad load body raises ``error`` (naming ``param``) and changes nothing: no state, no engine call."""
    with pytest.raises(error) as refused:
        await load(service, "m", body)
    if param is not None:
        assert refused.value.param == param
    entry = await service.handle("get_model", {"name": "m"}, None)
    assert (entry["runtime_state"], entry["load_override"], moves(events, "m")) == ("unloaded", {}, [])
    assert fake.calls == []
