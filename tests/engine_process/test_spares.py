"""Warm spare engine processes: one per engine kind, taken by a load, replaced, stopped at shutdown."""
from __future__ import annotations

import asyncio
import json
import os
import signal

import psutil

from runtime.engine_process.spares import SPARES
from tests.conftest import write_settings
from tests.engine_process.conftest import engine_processes
from tests.engines.runtime_driver import generate, load, unload

PROCESS_STUB = {"backend": "stub", "isolation": "process", "stub_reply": "warm and ready"}


async def spares_ready(count: int) -> list[int]:
    """The pids of the idle spares, once ``count`` of them have started."""
    for _ in range(500):
        pids = SPARES.idle_pids()
        if len(pids) == count:
            return pids
        await asyncio.sleep(0.02)
    raise AssertionError(f"expected {count} spares, found {SPARES.idle_pids()}")


def dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def spare_log(spare) -> str:
    return spare.process.command.log_path.read_text(errors="replace")


def pidfile_label(state_dir, pid: int) -> str:
    return json.loads((state_dir / "managed" / f"{pid}.json").read_text())["label"]


async def test_the_runtime_keeps_one_spare_per_engine_kind_that_runs_in_engine_processes(runtime_service, state_dir):
    service, _ = await runtime_service({
        "a": PROCESS_STUB, "b": PROCESS_STUB, "here": {"backend": "stub"},
        "gguf": {"backend": "llama_cpp", "model_path": "/nonexistent/m.gguf"},
    })
    spares = await spares_ready(2)  # stub and llama_cpp; none for the in-process model
    commands = sorted(" ".join(psutil.Process(pid).cmdline()[-2:]) for pid in spares)
    assert commands == ["--warm llama_cpp", "--warm stub"]
    assert {pidfile_label(state_dir, pid) for pid in spares} == {
        "spare engine process for stub", "spare engine process for llama_cpp",
    }
    await service.shutdown()
    assert engine_processes(spares=True) == []  # no spare outlives the runtime
    assert list((state_dir / "managed").glob("*.json")) == []


async def test_a_spare_stopped_while_it_warms_up_goes_at_once(runtime_service):
    """A spare reads its socket only after its warm-up (importing its engine library, under
    SCHED_IDLE): stopped by closing the socket and waiting, it went only once the import was over,
    about a second here, and on a busy CI machine not within the grace (spares outliving tests).
    It holds nothing worth a clean exit: SIGTERM at once."""
    service, _ = await runtime_service({"gguf": {"backend": "llama_cpp", "isolation": "process",
                                                 "model_path": "/nonexistent/m.gguf"}})
    await spares_ready(1)
    [spare] = SPARES.idle()
    assert "warmed up" not in spare_log(spare)
    await service.shutdown()  # stops the spare and waits until it is gone
    assert spare.process.has_exited()
    assert "warmed up" not in spare_log(spare)  # it was not left to finish importing llama_cpp
    assert engine_processes(spares=True) == []


async def test_a_load_takes_the_spare_and_a_new_one_starts_behind_it(runtime_service, state_dir):
    service, _ = await runtime_service({"a": PROCESS_STUB, "b": PROCESS_STUB})
    [first] = await spares_ready(1)
    await load(service, "a")
    [engine] = service.pool.controller("a").engines
    assert engine.process.pid == first
    assert pidfile_label(state_dir, first) == "engine process for model a, replica 1"
    threads = [int(thread) for thread in os.listdir(f"/proc/{first}/task")]
    assert {os.sched_getscheduler(thread) for thread in threads} == {os.SCHED_OTHER}  # it warmed up idle
    [second] = await spares_ready(1)
    assert second != first
    await load(service, "b")
    assert service.pool.controller("b").engines[0].process.pid == second
    assert (await generate(service, "a"))[0]["text"] == (await generate(service, "b"))[0]["text"] == "warm and ready"
    await spares_ready(1)
    assert (state_dir / "logs" / "a.r0.log").exists() and (state_dir / "logs" / "b.r0.log").exists()
    await unload(service, "a")
    await unload(service, "b")
    assert len(engine_processes(spares=True)) == 1  # the spare waits for the next load


async def test_a_spare_that_died_while_idle_is_replaced_by_a_fresh_process(runtime_service, state_dir):
    service, events = await runtime_service({"a": PROCESS_STUB})
    [spare] = await spares_ready(1)
    os.kill(spare, signal.SIGKILL)
    while not dead(spare):  # reaped or not, before the load takes it
        await asyncio.sleep(0.001)
    entry = await load(service, "a")
    assert (entry["runtime_state"], entry["last_error"]) == ("loaded", None)
    assert service.pool.controller("a").engines[0].process.pid != spare
    assert (await generate(service, "a"))[0]["text"] == "warm and ready"
    await spares_ready(1)
    assert not (state_dir / "managed" / f"{spare}.json").exists()
    await unload(service, "a")


async def test_a_reload_stops_the_spares_of_kinds_no_model_runs_in_engine_processes(runtime_service, tmp_path):
    service, _ = await runtime_service({"a": PROCESS_STUB})
    [spare] = await spares_ready(1)
    write_settings(tmp_path / "settings0", {"a": {**PROCESS_STUB, "isolation": "none"}})
    await service.handle("reload_settings", {}, None)
    for _ in range(250):
        if not engine_processes(spares=True):
            break
        await asyncio.sleep(0.02)
    assert engine_processes(spares=True) == [] and SPARES.idle_pids() == []
    assert (await load(service, "a"))["runtime_state"] == "loaded"  # in the runtime process now


def test_a_spares_log_is_named_by_its_runtime(tmp_path):
    """Two runtimes sharing a state folder (two services of one user, the test suite's services)
    must not rename each other's spare log when they take a spare (seen: FileNotFoundError)."""
    from runtime.engine_process.spares import spare_log_path

    path = spare_log_path(tmp_path, "llama_cpp")
    assert path == tmp_path / "logs" / f"spare-llama_cpp-{os.getpid()}.log"
