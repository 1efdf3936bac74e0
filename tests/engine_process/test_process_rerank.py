"""The runtime's rerank op on a replica in an engine process: the ``rerank`` frame and its
``reranked`` answer (the stub's scores, in the documents' order), and a cancelled rerank cancelled
in the child, its slot free at once."""
from __future__ import annotations

import asyncio

import pytest

from runtime.backends.stub.spec import stub_relevance
from runtime.engine_process.engine import ProcessEngine
from tests.engine_process.test_process_embed import until
from tests.engines.runtime_driver import load, unload

STUB = {"backend": "stub", "isolation": "process", "rerank": True}
DOCUMENTS = ["a cat", "the cat sat", "dogs"]


async def rerank(service, model: str, query: str, documents: list[str], request_id: str = "r-1") -> dict:
    payload = {"request_id": request_id, "model": model, "query": query, "documents": documents}
    return await service.handle("rerank", payload, None)


async def test_scores_come_back_from_the_engine_process(runtime_service):
    service, _ = await runtime_service({"m": STUB})
    await load(service, "m")
    [engine] = service.pool.controller("m").engines
    assert isinstance(engine, ProcessEngine)
    result = await rerank(service, "m", "the cat", DOCUMENTS)
    assert result == {
        "scores": [stub_relevance("the cat", document) for document in DOCUMENTS],
        "usage": {"prompt_tokens": 3 * 2 + 2 + 3 + 1},
    }
    assert result["scores"] == [0.5, 1.0, 0.0]
    await unload(service, "m")


async def test_a_cancelled_rerank_is_cancelled_in_the_child_and_frees_its_slot(runtime_service):
    service, _ = await runtime_service({"m": {**STUB, "stub_token_delay_ms": 60000}})
    await load(service, "m")
    controller = service.pool.controller("m")
    [engine] = controller.engines
    task = asyncio.create_task(rerank(service, "m", "q", ["slow"]))
    assert await until(lambda: controller.scheduler.inflight == 1 and engine._streams)
    [stream] = engine._streams.values()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stream.cancelled.is_set()
    assert await until(lambda: controller.scheduler.inflight == 0)
    await unload(service, "m")
