"""An engine process that dies: each signal, while loading or while generating (streamed or
not), with another model in an engine process serving throughout."""
from __future__ import annotations

import asyncio
import os
import signal

import pytest

from runtime.errors import BackendError, ModelFailed
from runtime.model.tickets import Ticket
from tests.conftest import write_settings
from tests.engine_process.conftest import engine_processes
from tests.engines.runtime_driver import generate, load, unload, wait_for_state
from tests.runtime.helpers import LOAD_CYCLE, UNLOAD_CYCLE, moves

SIGNALS = ["SIGSEGV", "SIGABRT", "SIGKILL"]
OTHER_REPLY = " ".join(f"w{i}" for i in range(20))


def models(crash: str, signal_name: str) -> dict:
    return {
        "other": {"backend": "stub", "isolation": "process", "stub_reply": OTHER_REPLY, "stub_token_delay_ms": 20},
        "crashy": {"backend": "stub", "isolation": "process", "stub_reply": "fine now",
                   "stub_crash": crash, "stub_crash_signal": signal_name},
    }


def assert_names_the_death(last_error: str, signal_name: str, when: str, prefix: str = "") -> None:
    assert last_error.startswith(f"{prefix}engine process for model crashy, replica 1 died of {signal_name} {when}")
    assert "last output:" in last_error
    if signal_name != "SIGKILL":  # faulthandler writes the stack of a fault to the output tail
        assert "Fatal Python error" in last_error and "_crash_if" in last_error


async def serving_other(service) -> asyncio.Task:
    """A stream of the other model that is under way while the crash happens."""
    task = asyncio.create_task(generate(service, "other", stream=True))
    controller = service.pool.controller("other")
    while controller.scheduler.inflight == 0:
        await asyncio.sleep(0.01)
    return task


async def assert_other_still_serves(service, events, stream: asyncio.Task) -> None:
    result, deltas = await stream
    assert result["text"] == "".join(deltas) == OTHER_REPLY
    assert (await generate(service, "other", max_output_tokens=2))[0]["text"] == "w0 w1"
    assert moves(events, "other") == LOAD_CYCLE


@pytest.mark.parametrize("signal_name", SIGNALS)
async def test_a_death_while_loading_is_a_failed_load(runtime_service, tmp_path, signal_name):
    service, events = await runtime_service(models("on_load", signal_name))
    await load(service, "other")
    stream = await serving_other(service)
    entry = await load(service, "crashy")
    assert entry["runtime_state"] == "failed"
    assert_names_the_death(entry["last_error"], signal_name, "while loading", "replica 1 of 1 failed to load: ")
    assert moves(events, "crashy") == [("unloaded", "loading"), ("loading", "failed")]
    assert len(engine_processes()) == 1  # only the other model's
    with pytest.raises(ModelFailed):
        await generate(service, "crashy")
    await assert_other_still_serves(service, events, stream)
    # The operator fixes the definition and loads it again.
    write_settings(tmp_path / "settings0", {**models("on_load", signal_name),
                                            "crashy": {"backend": "stub", "isolation": "process",
                                                       "stub_reply": "fine now"}})
    await service.handle("reload_settings", {}, None)
    assert (await load(service, "crashy"))["runtime_state"] == "loaded"
    assert (await generate(service, "crashy"))[0]["text"] == "fine now"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("signal_name", SIGNALS)
async def test_a_death_while_generating_fails_the_model_and_answers_every_client(
    runtime_service, signal_name, stream
):
    service, events = await runtime_service(models("on_generate", signal_name))
    await load(service, "other")
    await load(service, "crashy")
    [crashy_pid] = [p.pid for p in engine_processes() if p.pid not in _pids(service, "other")]
    other_stream = await serving_other(service)
    controller = service.pool.controller("crashy")
    # Hold the only slot so that both client requests are in place before the crash:
    # the first runs (and crashes the process), the second waits in the queue.
    holder = Ticket("holder", None)
    await (await controller.admit(holder))
    active = asyncio.create_task(generate(service, "crashy", stream=stream))
    queued = asyncio.create_task(generate(service, "crashy", stream=stream))
    while controller.scheduler.queue_depth < 2:
        await asyncio.sleep(0.01)
    controller.finish(holder, 1)
    messages = []
    for request in (active, queued):
        with pytest.raises(BackendError) as failed:
            await asyncio.wait_for(request, 10)
        assert failed.value.code == "backend_error"
        messages.append(failed.value.message)
    # Each client is told that the model died, never what its engine wrote: last_error keeps that.
    assert messages[0] == f"engine process for model crashy, replica 1 died of {signal_name} while loaded"
    assert messages[1].startswith("model crashy failed while loaded; an operator can see why in its last_error")
    entry = await wait_for_state(service, "crashy", "failed")
    assert entry["runtime_state"] == "failed"
    assert_names_the_death(entry["last_error"], signal_name, "while loaded")
    assert moves(events, "crashy") == LOAD_CYCLE + [("loaded", "failed")]
    assert crashy_pid not in [p.pid for p in engine_processes()]
    await assert_other_still_serves(service, events, other_stream)
    # An admin load brings it back (its next generation would crash it again).
    assert (await load(service, "crashy"))["runtime_state"] == "loaded"
    assert moves(events, "crashy") == LOAD_CYCLE + [("loaded", "failed"), ("failed", "loading"), ("loading", "loaded")]
    assert entry["last_error"] and (await wait_for_state(service, "crashy", "loaded"))["last_error"] is None


def _pids(service, model: str) -> list[int]:
    return [engine.process.pid for engine in service.pool.controller(model).engines]


async def test_a_kill_of_an_idle_engine_process_fails_its_model(runtime_service):
    """Nothing running: the exit alone moves the model to failed, naming the signal."""
    service, events = await runtime_service(models("on_generate", "SIGSEGV"))
    await load(service, "crashy")
    [pid] = _pids(service, "crashy")
    os.kill(pid, signal.SIGKILL)
    entry = await wait_for_state(service, "crashy", "failed")
    assert entry["last_error"].startswith("engine process for model crashy, replica 1 died of SIGKILL while loaded")
    assert moves(events, "crashy") == LOAD_CYCLE + [("loaded", "failed")]


async def test_a_kill_of_one_of_two_replicas_fails_that_replica_and_the_other_serves_on(runtime_service):
    """With another replica serving, the dead one is taken out of dispatch (the model stays loaded);
    an unload releases both, and the next load has both replicas again."""
    service, events = await runtime_service({"pair": {**models("on_load", "SIGKILL")["other"], "replicas": 2}})
    await load(service, "pair")
    first, second = _pids(service, "pair")
    os.kill(first, signal.SIGKILL)
    controller = service.pool.controller("pair")
    async with asyncio.timeout(5):
        while not controller.failed_replicas:
            await asyncio.sleep(0.01)
    entry = await service.handle("get_model", {"name": "pair"}, None)
    assert (entry["runtime_state"], entry["loaded_replicas"]) == ("loaded", 1)
    assert entry["last_error"].startswith("engine process for model pair, replica 1 died of SIGKILL while loaded")
    results = await asyncio.gather(*(generate(service, "pair", max_output_tokens=2) for _ in range(3)))
    assert [result["text"] for result, _ in results] == ["w0 w1"] * 3
    assert [p.pid for p in engine_processes()] == [second]
    await unload(service, "pair")
    assert (await load(service, "pair"))["loaded_replicas"] == 2
    assert moves(events, "pair") == LOAD_CYCLE + UNLOAD_CYCLE + LOAD_CYCLE
