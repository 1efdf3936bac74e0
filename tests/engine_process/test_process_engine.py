"""A stub model in an engine process behaves as it does in the runtime's own process."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import psutil
import pytest

from runtime.errors import BackendError, RequestTimeout
from runtime.supervisor import sweep_stale_processes
from tests.conftest import ROOT, write_settings
from tests.engine_process.conftest import engine_processes
from tests.engines.runtime_driver import generate, load, unload
from tests.runtime.helpers import LOAD_CYCLE, UNLOAD_CYCLE, moves

REPLY = "The quick brown fox jumps over the lazy dog"


def stub(**fields) -> dict:
    return {"backend": "stub", "stub_reply": REPLY, "stub_token_delay_ms": 2, **fields}


async def test_generation_through_an_engine_process_matches_the_in_process_engine(runtime_service, state_dir):
    service, events = await runtime_service({"inproc": stub(), "proc": stub(isolation="process", replicas=2)})
    await load(service, "inproc")
    entry = await load(service, "proc")
    assert entry["runtime_state"] == "loaded"
    pids = sorted(p.pid for p in engine_processes())
    assert len(pids) == 2
    assert sorted(replica_pidfiles(state_dir)) == pids  # the start-up sweep knows them
    for fields in ({}, {"stream": True}, {"max_output_tokens": 3}, {"stream": True, "max_output_tokens": 3}):
        expected, expected_deltas = await generate(service, "inproc", "Hi there", **fields)
        result, deltas = await generate(service, "proc", "Hi there", **fields)
        assert result == expected
        assert "".join(deltas) == "".join(expected_deltas)
        assert bool(deltas) is bool(fields.get("stream"))
    concurrent = await asyncio.gather(*(generate(service, "proc", stream=True) for _ in range(6)))
    assert {result["text"] for result, _ in concurrent} == {REPLY}
    await unload(service, "proc")
    assert moves(events, "proc") == LOAD_CYCLE + UNLOAD_CYCLE
    assert engine_processes() == []
    assert replica_pidfiles(state_dir) == {}
    assert (state_dir / "logs" / "proc.r1.log").exists()


def replica_pidfiles(state_dir) -> dict[int, str]:
    """pid -> label of the pidfiles of replicas' engine processes (spares left out)."""
    records = [json.loads(path.read_text()) for path in (state_dir / "managed").glob("*.json")]
    return {record["pid"]: record["label"] for record in records if not record["label"].startswith("spare ")}


async def test_a_failed_load_in_an_engine_process_reads_as_it_does_in_process(runtime_service):
    failing = {"stub_fail_load": "weights are corrupt"}
    service, events = await runtime_service({"inproc": stub(**failing), "proc": stub(isolation="process", **failing)})
    expected = await load(service, "inproc")
    entry = await load(service, "proc")
    assert (entry["runtime_state"], entry["last_error"]) == ("failed", expected["last_error"])
    assert entry["last_error"] == "replica 1 of 1 failed to load: weights are corrupt"
    assert moves(events, "proc") == [("unloaded", "loading"), ("loading", "failed")]
    assert engine_processes() == []


async def test_an_engine_error_reaches_the_client_with_its_code_and_the_model_keeps_serving(runtime_service):
    service, events = await runtime_service({"proc": stub(isolation="process", stub_fail_after_tokens=2)})
    await load(service, "proc")
    for stream in (False, True):
        with pytest.raises(BackendError, match="stub engine failed after 2 tokens") as failed:
            await generate(service, "proc", stream=stream)
        assert failed.value.code == "backend_error"
    result, _ = await generate(service, "proc", max_output_tokens=2)
    assert result["text"] == "The quick"
    assert moves(events, "proc") == LOAD_CYCLE


async def test_a_request_timeout_cancels_the_generation_in_the_engine_process(runtime_service):
    slow = stub(isolation="process", stub_token_delay_ms=50, request_timeout_seconds=0.2)
    service, _ = await runtime_service({"proc": slow})
    await load(service, "proc")
    with pytest.raises(RequestTimeout):
        await generate(service, "proc", stream=True)
    controller = service.pool.controller("proc")
    engine = controller.engines[0]
    assert engine._streams == {}  # the child acknowledged the cancel
    result, _ = await generate(service, "proc", max_output_tokens=2)
    assert result["text"] == "The quick"


async def test_stats_report_the_engine_process_rss_and_gpu_memory(runtime_service):
    service, _ = await runtime_service({"proc": stub(isolation="process")})
    await load(service, "proc")
    stats = await service.pool.controller("proc").engines[0].stats()
    assert 10 * 2**20 < stats["rss_bytes"] < 2 * 2**30
    # The child reads its own device memory from NVML: none here (a stub holds no GPU memory).
    assert set(stats) == {"rss_bytes", "gpu_memory_bytes"}
    assert stats["gpu_memory_bytes"] in (None, 0)


async def test_unloading_twice_and_after_a_failed_load_is_safe(runtime_service):
    service, _ = await runtime_service({"proc": stub(isolation="process")})
    await load(service, "proc")
    engine = service.pool.controller("proc").engines[0]
    await unload(service, "proc")
    await engine.unload()
    assert engine_processes() == []


RUNTIME_SCRIPT = """
import asyncio, sys
from runtime.service import RuntimeService

async def main():
    service = RuntimeService(sys.argv[1])
    await service.start(load_enabled=False)
    for name in ("a", "b", "c"):
        await service.handle("load", {"name": name, "body": None}, None)
    pids = [service.pool.controller(n).engines[0].process.pid for n in ("a", "b", "c")]
    print(" ".join(map(str, pids)), flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def test_a_kill_9_of_the_runtime_takes_its_engine_processes_with_it(tmp_path, state_dir):
    settings = write_settings(tmp_path, {name: stub(isolation="process") for name in ("a", "b", "c")})
    runtime = subprocess.Popen([sys.executable, "-c", RUNTIME_SCRIPT, str(settings)], cwd=ROOT,
                               stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(pid) for pid in runtime.stdout.readline().split()]
        assert len(pids) == 3 and all(psutil.pid_exists(pid) for pid in pids)
    finally:
        runtime.kill()
        runtime.wait()
        runtime.stdout.close()
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in pids if _alive(pid)]
    sweep_stale_processes(state_dir)  # what the next runtime does first: the pidfiles go
    assert list((state_dir / "managed").glob("*.json")) == []


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_a_service_shutdown_during_a_load_ends_the_engine_process(runtime_service):
    service, events = await runtime_service({"proc": stub(isolation="process", stub_load_seconds=30)})
    service.pool.controller("proc").begin_load()
    while not engine_processes():
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # the child is inside the engine's load
    await service.shutdown()
    assert engine_processes() == []
    assert moves(events, "proc") == [("unloaded", "loading")]
