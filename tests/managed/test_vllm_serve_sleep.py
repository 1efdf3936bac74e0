"""vllm_serve's warm tier against the fake ``vllm serve`` (runtime.model.residency, VllmServeEngine).

``vllm_enable_sleep_mode`` starts the server with ``--enable-sleep-mode`` and
``VLLM_SERVER_DEV_MODE=1`` (the fake, as vLLM, serves its sleep endpoints only with both); a
sleep is ``POST /sleep?level=1`` then ``GET /is_sleeping``, a wake ``POST /wake_up`` then the
same check, argument-exact in the fake's control log.  A request to the sleeping model wakes it
first (the fake answers a sleeping chat 503).  Without sleep mode: 400 not_sleepable.
"""
from __future__ import annotations

import asyncio
import json

import pytest

from runtime.backends import BACKENDS
from runtime.backends.vllm_serve.spec import vllm_serve_command
from runtime.errors import NotSleepable
from runtime.model.residency import ModelEvent
from runtime.service import RuntimeService
from runtime.model.state import TransitionEvent
from tests.conftest import write_settings
from tests.engines.runtime_driver import user_input
from tests.managed.helpers import TARGET, environ_of, pidfiles, records

SLEEP = {"method": "POST", "path": "/sleep", "query": {"level": ["1"]}}
WAKE = {"method": "POST", "path": "/wake_up", "query": {}}
CHECK = {"method": "GET", "path": "/is_sleeping", "query": {}}


def _model(fake_bin, tmp_path, **fields) -> dict:
    return {
        "backend": "vllm_serve",
        "vllm_serve_model": TARGET,
        "vllm_serve_binary": str(fake_bin / "vllm"),
        "vllm_serve_env": {"FAKE_RECORD": str(tmp_path / "record.jsonl"),
                           "FAKE_CONTROL_LOG": str(tmp_path / "control.jsonl"), **fields.pop("env", {})},
        "vllm_serve_startup_timeout_seconds": 20.0,
        **fields,
    }


@pytest.fixture
async def start(tmp_path, state_dir, fake_bin):
    services = []

    async def started(models: dict) -> RuntimeService:
        service = RuntimeService(str(write_settings(tmp_path, models)))
        services.append(service)
        service.events = []
        service.pool.listeners.append(service.events.append)
        await service.start(load_enabled=False)
        for name in models:
            await service.handle("load", {"name": name, "body": None}, None)
        service.events.clear()
        return service

    yield started
    for service in services:
        await service.shutdown()


def _control(tmp_path) -> list[dict]:
    path = tmp_path / "control.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _generate(service, name: str, text: str):
    payload = {"request_id": f"r-{text}", "model": name, "messages": user_input(text), "max_output_tokens": 8}
    return asyncio.create_task(service.handle("generate", payload, None))


def test_sleep_mode_is_a_flag_and_the_dev_mode_environment():
    spec = BACKENDS["vllm_serve"]
    off = spec.definition_model.model_validate({"backend": "vllm_serve", "vllm_serve_model": TARGET})
    on = spec.definition_model.model_validate({"backend": "vllm_serve", "vllm_serve_model": TARGET,
                                               "vllm_enable_sleep_mode": True})
    assert (spec.can_sleep(off), spec.can_sleep(on)) == (False, True)
    assert "--enable-sleep-mode" in vllm_serve_command(spec.effective_config(on, {}), "127.0.0.1", 8000, "/")
    assert "--enable-sleep-mode" not in vllm_serve_command(spec.effective_config(off, {}), "127.0.0.1", 8000, "/")


async def test_sleep_and_wake_call_vllms_endpoints_and_a_request_wakes_it(start, tmp_path, state_dir, fake_bin):
    service = await start({"vl": _model(fake_bin, tmp_path, vllm_enable_sleep_mode=True)})
    controller = service.pool.controller("vl")
    [record] = pidfiles(state_dir)
    assert "--enable-sleep-mode" in record["argv"]
    assert environ_of(record["pid"])["VLLM_SERVER_DEV_MODE"] == "1"

    answer = await service.handle("sleep", {"name": "vl"}, None)
    assert (answer["runtime_state"], answer["residency"], answer["slept"]["reason"]) == ("loaded", "sleeping", "admin")
    assert _control(tmp_path) == [SLEEP, CHECK]

    result = await asyncio.wait_for(_generate(service, "vl", "hello"), 30)  # wakes it, then is answered
    assert result["text"] == "echo: hello" and controller.residency == "active"
    assert _control(tmp_path) == [SLEEP, CHECK, WAKE, CHECK]

    await service.handle("sleep", {"name": "vl"}, None)
    answer = await service.handle("wake", {"name": "vl"}, None)
    assert (answer["residency"], answer["woke"]["reason"]) == ("active", "admin")
    assert _control(tmp_path) == [SLEEP, CHECK, WAKE, CHECK] * 2
    assert [(e.kind, e.details["reason"]) for e in service.events if isinstance(e, ModelEvent)] == [
        ("slept", "admin"), ("woke", "request"), ("slept", "admin"), ("woke", "admin")
    ]
    assert not [e for e in service.events if isinstance(e, TransitionEvent)]
    assert len(records(tmp_path / "record.jsonl")) == 1  # one server throughout


async def test_without_sleep_mode_it_is_not_sleepable(start, tmp_path, state_dir, fake_bin):
    service = await start({"vl": _model(fake_bin, tmp_path)})
    [record] = pidfiles(state_dir)
    assert "--enable-sleep-mode" not in record["argv"] and "VLLM_SERVER_DEV_MODE" not in environ_of(record["pid"])
    with pytest.raises(NotSleepable):
        await service.handle("sleep", {"name": "vl"}, None)
    assert _control(tmp_path) == [] and service.pool.controller("vl").residency == "active"

