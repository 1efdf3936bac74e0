"""A stuck engine (``stub_spin_on``: its engine process's event loop blocked for good, so no
cancel is answered): a request past request_timeout_seconds gets 504, its engine process is
killed once the cancel's grace is over, and the kill reads as a crash: with another replica the
model serves on without the stuck one, with one replica it goes to ``failed``."""
from __future__ import annotations

import asyncio

import psutil
import pytest

from runtime.engine_process import engine as process_engine
from runtime.errors import BackendError, RequestTimeout
from runtime.model.state import TransitionEvent
from tests.engine_process.conftest import engine_processes
from tests.engines.runtime_driver import generate, load, unload, wait_for_state
from tests.runtime.helpers import LOAD_CYCLE, UNLOAD_CYCLE, moves

GRACE = 0.5
TIMEOUT = 0.5


@pytest.fixture(autouse=True)
def short_grace(monkeypatch):
    monkeypatch.setattr(process_engine, "CANCEL_WAIT_SECONDS", GRACE)


def stuck(**fields) -> dict:
    return {"backend": "stub", "isolation": "process", "stub_reply": "fine", "stub_spin_on": "loop forever",
            "request_timeout_seconds": TIMEOUT, **fields}


def pids(service, model: str) -> list[int]:
    return [engine.process.pid for engine in service.pool.controller(model).engines]


async def gone(pid: int, seconds: float = 5.0) -> bool:
    """Whether process ``pid`` is gone (reaped, or at least a zombie) within ``seconds``."""
    deadline = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        await asyncio.sleep(0.02)
    return False


KILLED = (f"died of SIGKILL while loaded (killed: it did not stop within {GRACE:g} s of a cancel; "
          f"a request ran past request_timeout_seconds={TIMEOUT:g}); last output:")


async def test_a_stuck_replica_is_killed_and_the_other_serves_on(runtime_service):
    service, events = await runtime_service({"m": stuck(replicas=2)})
    await load(service, "m")
    first, second = pids(service, "m")
    with pytest.raises(RequestTimeout):
        await generate(service, "m", "loop forever")  # on replica 1: the least loaded, first
    assert await gone(first)
    controller = service.pool.controller("m")
    async with asyncio.timeout(5):
        while not controller.failed_replicas:  # the death report reaches the model's writer
            await asyncio.sleep(0.01)
    assert list(controller.failed_replicas) == [0]
    entry = await service.handle("get_model", {"name": "m"}, None)
    assert (entry["runtime_state"], entry["loaded_replicas"]) == ("loaded", 1)
    assert entry["last_error"].startswith(f"engine process for model m, replica 1 {KILLED}")
    replica_failed = [e for e in events if not isinstance(e, TransitionEvent)]
    assert [(e.kind, e.details["replica"], e.details["reason"]) for e in replica_failed] == [
        ("replica_failed", 1, "engine_failure")
    ]
    answers = await asyncio.gather(*(generate(service, "m", stream=True) for _ in range(3)))
    assert [result["text"] for result, _ in answers] == ["fine"] * 3  # all on replica 2
    assert [p.pid for p in engine_processes()] == [second]
    await unload(service, "m")
    assert moves(events, "m") == LOAD_CYCLE + UNLOAD_CYCLE
    assert engine_processes() == []


async def test_a_stuck_only_replica_fails_the_model_and_its_queued_request(runtime_service):
    service, events = await runtime_service({"m": stuck(), "other": stuck()})
    await load(service, "m")
    await load(service, "other")
    [pid] = pids(service, "m")
    controller = service.pool.controller("m")
    hung = asyncio.create_task(generate(service, "m", "loop forever"))
    while controller.scheduler.inflight == 0:
        await asyncio.sleep(0.01)
    queued = asyncio.create_task(generate(service, "m", "hello"))
    while controller.scheduler.queue_depth == 0:
        await asyncio.sleep(0.01)
    with pytest.raises(RequestTimeout):
        await hung
    with pytest.raises(BackendError) as failed:
        await asyncio.wait_for(queued, 5)  # never given to the stuck replica
    # the caller is told the model failed; how (the kill and the engine's output) is last_error's
    assert failed.value.message == "model m failed while loaded; an operator can see why in its last_error (GET /v1/admin/models)"
    assert await gone(pid)
    entry = await wait_for_state(service, "m", "failed")
    assert entry["last_error"].startswith(f"engine process for model m, replica 1 {KILLED}")
    assert moves(events, "m") == LOAD_CYCLE + [("loaded", "failed")]
    assert (await generate(service, "other", "hi"))[0]["text"] == "fine"  # another model is untouched
    assert (await load(service, "m"))["runtime_state"] == "loaded"  # an admin load brings it back
    assert (await generate(service, "m", "hi"))[0]["text"] == "fine"


async def test_a_stuck_embedding_request_kills_its_engine_too(runtime_service):
    service, events = await runtime_service({"e": stuck(embeddings=True)})
    await load(service, "e")
    [pid] = pids(service, "e")
    with pytest.raises(RequestTimeout):
        await service.handle("embed", {"request_id": "e-1", "model": "e", "inputs": ["loop forever"]}, None)
    assert await gone(pid)
    entry = await wait_for_state(service, "e", "failed")
    assert entry["last_error"].startswith(f"engine process for model e, replica 1 {KILLED}")
    assert moves(events, "e") == LOAD_CYCLE + [("loaded", "failed")]


async def test_an_unload_waiting_for_a_stuck_request_ends_once_it_times_out(runtime_service):
    service, events = await runtime_service({"m": stuck(request_timeout_seconds=1.0)})
    await load(service, "m")
    [pid] = pids(service, "m")
    controller = service.pool.controller("m")
    hung = asyncio.create_task(generate(service, "m", "loop forever"))
    while controller.scheduler.inflight == 0:
        await asyncio.sleep(0.01)
    unloading = asyncio.create_task(unload(service, "m"))
    with pytest.raises(RequestTimeout):
        await hung
    # The engine cannot answer ``unload`` (30 s before the SIGKILL): it is killed instead.
    assert (await asyncio.wait_for(unloading, 5))["runtime_state"] == "unloaded"
    assert await gone(pid)
    assert moves(events, "m") == LOAD_CYCLE + UNLOAD_CYCLE


async def test_a_client_gone_from_a_stuck_engine_kills_nothing_and_an_unload_stops_it_at_once(runtime_service):
    """Only a request past its timeout kills; a stalled engine is not asked to unload (30 s)."""
    service, events = await runtime_service({"m": stuck(request_timeout_seconds=None)})
    await load(service, "m")
    [pid] = pids(service, "m")
    controller = service.pool.controller("m")
    hung = asyncio.create_task(generate(service, "m", "loop forever"))
    while controller.scheduler.inflight == 0:
        await asyncio.sleep(0.01)
    hung.cancel()  # the client went away
    await asyncio.gather(hung, return_exceptions=True)
    assert controller.engines[0].stalled and psutil.Process(pid).is_running()
    assert (await service.handle("get_model", {"name": "m"}, None))["runtime_state"] == "loaded"
    assert (await asyncio.wait_for(unload(service, "m"), 3))["runtime_state"] == "unloaded"
    assert await gone(pid)
    assert moves(events, "m") == LOAD_CYCLE + UNLOAD_CYCLE


async def test_a_request_timeout_of_an_engine_that_stops_kills_nothing(runtime_service):
    reply = " ".join(f"w{i}" for i in range(20))
    service, events = await runtime_service({"m": stuck(stub_reply=reply, stub_token_delay_ms=100, replicas=2)})
    await load(service, "m")
    before = pids(service, "m")
    with pytest.raises(RequestTimeout):
        await generate(service, "m", "a slow answer")
    result, _ = await generate(service, "m", max_output_tokens=1)
    assert result["text"] == "w0"
    assert pids(service, "m") == before and all(p.is_running() for p in map(psutil.Process, before))
    assert service.pool.controller("m").failed_replicas == {}
    assert moves(events, "m") == LOAD_CYCLE


def test_engine_processes_get_a_finite_request_timeout_by_default():
    from runtime.backends.base import ENGINE_PROCESS_REQUEST_TIMEOUT_SECONDS
    from runtime.config import validate_settings

    models = validate_settings({"models": {
        "isolated": {"backend": "stub", "isolation": "process"},
        "unbounded": {"backend": "stub", "isolation": "process", "request_timeout_seconds": None},
        "inproc": {"backend": "stub"},
    }}).models
    assert ENGINE_PROCESS_REQUEST_TIMEOUT_SECONDS == 600
    assert {name: m.request_timeout_seconds for name, m in models.items()} == {
        "isolated": 600, "unbounded": None, "inproc": None,
    }
