"""The runtime's embed op on a replica in an engine process: the ``embed`` frame and its
``embedded`` answer, a cancelled embed cancelled in the child (its slot free at once), and an
engine process that dies while embedding.  (An engine's error keeping its code and param through
the process: tests/llama_cpp/test_llama_embeddings.py.)"""
from __future__ import annotations

import asyncio
import os
import signal

import pytest

from runtime.backends.stub.spec import stub_embedding
from runtime.engine_process.engine import ProcessEngine
from runtime.errors import BackendError
from tests.engine_process.conftest import engine_processes
from tests.engines.runtime_driver import load, unload, wait_for_state

STUB = {"backend": "stub", "isolation": "process", "embeddings": True, "stub_embedding_dimensions": 16}


async def embed(service, model: str, inputs, request_id: str = "e-1", **fields) -> dict:
    payload = {"request_id": request_id, "model": model, "inputs": inputs, **fields}
    return await service.handle("embed", payload, None)


async def test_vectors_come_back_from_the_engine_process(runtime_service):
    service, _ = await runtime_service({"m": STUB})
    await load(service, "m")
    [engine] = service.pool.controller("m").engines
    assert isinstance(engine, ProcessEngine) and engine.process.pid in [p.pid for p in engine_processes()]
    result = await embed(service, "m", ["one", "two words", [3, 4]])
    assert result == {
        "vectors": [stub_embedding("one", 16), stub_embedding("two words", 16), stub_embedding([3, 4], 16)],
        "usage": {"prompt_tokens": 1 + 2 + 2},
    }
    await unload(service, "m")


async def until(condition, timeout: float = 5.0):
    for _ in range(int(timeout / 0.01)):
        if condition():
            return True
        await asyncio.sleep(0.01)
    return condition()


async def test_a_cancelled_embed_is_cancelled_in_the_child_and_frees_its_slot(runtime_service):
    service, _ = await runtime_service({"m": {**STUB, "stub_token_delay_ms": 60000}})
    await load(service, "m")
    controller = service.pool.controller("m")
    [engine] = controller.engines
    task = asyncio.create_task(embed(service, "m", ["slow"]))
    assert await until(lambda: controller.scheduler.inflight == 1 and engine._streams)
    [stream] = engine._streams.values()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stream.cancelled.is_set()  # the runtime sent the cancel and the child answered it
    assert await until(lambda: controller.scheduler.inflight == 0)
    assert engine._streams == {}
    await unload(service, "m")


async def test_an_engine_process_that_dies_while_embedding(runtime_service):
    service, _ = await runtime_service({"m": {**STUB, "stub_token_delay_ms": 60000}})
    await load(service, "m")
    [engine] = service.pool.controller("m").engines
    task = asyncio.create_task(embed(service, "m", ["x"]))
    assert await until(lambda: engine._streams)
    os.kill(engine.process.pid, signal.SIGKILL)
    with pytest.raises(BackendError) as died:
        await task
    assert "died of SIGKILL" in died.value.message
    assert (await wait_for_state(service, "m", "failed"))["runtime_state"] == "failed"
