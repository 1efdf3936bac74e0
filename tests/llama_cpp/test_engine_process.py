"""llama_cpp for real in engine processes (its default isolation), against isolation "none"."""
from __future__ import annotations

import asyncio
import os
import signal

import psutil
import pytest
from llama_helpers import SMOLLM2_MODEL

from runtime.engine_process.engine import ProcessEngine
from runtime.errors import BackendError, ContextLengthExceeded
from runtime.model.state import RuntimeState
from tests.engine_process.conftest import (  # noqa: F401 - fixtures
    engine_processes,
    no_engine_process_left,
    state_dir,
)
from tests.engines.runtime_driver import generate, load, unload, wait_for_state
from tests.runtime.helpers import LOAD_CYCLE, UNLOAD_CYCLE, moves

COUNTING = "Count from 1 to 100, separated by commas."
CYCLES = 20


def gemma3(path) -> dict:
    """Gemma 3 270M's GGUF carries no chat template: the generic format."""
    return {"backend": "llama_cpp", "model_path": str(path), "prompt_format": "generic", "gguf_n_ctx": 1024,
            "gguf_n_gpu_layers": 0, "gguf_n_threads": 1}


@pytest.fixture(params=["smollm2", "gemma3"])
def definition(request, smollm2_gguf, gemma3_gguf) -> dict:
    return SMOLLM2_MODEL if request.param == "smollm2" else gemma3(gemma3_gguf)


async def test_isolation_defaults_to_an_engine_process(runtime_service):
    service, events = await runtime_service({"smol": SMOLLM2_MODEL})
    await load(service, "smol")
    [engine] = service.pool.controller("smol").engines
    assert isinstance(engine, ProcessEngine) and engine.process.pid in [p.pid for p in engine_processes()]
    assert (await engine.stats())["rss_bytes"] > 60 * 2**20  # the weights live over there
    await unload(service, "smol")
    assert moves(events, "smol") == LOAD_CYCLE + UNLOAD_CYCLE


async def test_usage_counts_the_reused_prompt_tokens_through_the_engine_process(runtime_service):
    service, _ = await runtime_service({"proc": SMOLLM2_MODEL})
    await load(service, "proc")
    fields = {"temperature": 0.0, "max_output_tokens": 6}
    first, _ = await generate(service, "proc", COUNTING, **fields)
    again, _ = await generate(service, "proc", COUNTING, **fields)
    assert first["usage"]["cached_tokens"] == 0  # a fresh context
    assert again["usage"]["cached_tokens"] == again["usage"]["input_tokens"] - 1
    assert again["text"] == first["text"]
    await unload(service, "proc")


async def test_a_conversation_cache_outlives_an_unload_through_the_engine_process(runtime_service, state_dir):
    service, _ = await runtime_service({"proc": SMOLLM2_MODEL})
    # Longer than engine.kv_store.min_tokens (256 by default), so the conversation is saved.
    fields = {"temperature": 0.0, "max_output_tokens": 6,
              "instructions": " ".join(f"Gauge {i} is read every {i + 2} hours." for i in range(1, 41))}
    await load(service, "proc")
    first, _ = await generate(service, "proc", "How often is gauge 3 read?", **fields)
    await unload(service, "proc")
    assert len(list((state_dir / "kv").glob("*/*.kv"))) == 1  # written by the engine process as the model left
    await load(service, "proc")
    again, _ = await generate(service, "proc", "How often is gauge 3 read?", **fields)
    assert again["usage"]["cached_tokens"] == again["usage"]["input_tokens"] - 1 > 256
    assert again["text"] == first["text"]
    await unload(service, "proc")


async def test_generation_and_streaming_match_isolation_none_at_temperature_zero(runtime_service, definition):
    service, _ = await runtime_service({"proc": definition, "here": {**definition, "isolation": "none"}})
    await load(service, "proc")
    await load(service, "here")
    fields = {"temperature": 0.0, "max_output_tokens": 24}
    for stream in (False, True):
        (proc, proc_deltas), (here, here_deltas) = [
            await generate(service, name, COUNTING, stream=stream, **fields) for name in ("proc", "here")
        ]
        assert proc == here and proc["text"] != ""
        assert "".join(proc_deltas) == "".join(here_deltas) == (proc["text"] if stream else "")
    await unload(service, "proc")
    await unload(service, "here")


async def test_load_overrides_reach_the_engine_process(runtime_service):
    """A prompt the definition's context (2048) takes is too long for the override's."""
    service, _ = await runtime_service({"smol": SMOLLM2_MODEL})
    long_prompt = " ".join(["word"] * 400)
    await load(service, "smol")
    assert (await generate(service, "smol", long_prompt, max_output_tokens=1))[0]["usage"]["input_tokens"] > 400
    await unload(service, "smol")
    entry = await load(service, "smol", {"gguf_n_ctx": 64})
    assert (entry["runtime_state"], entry["load_override"]) == ("loaded", {"gguf_n_ctx": 64})
    with pytest.raises(ContextLengthExceeded) as refused:
        await generate(service, "smol", long_prompt, max_output_tokens=1)
    assert "tokens (gguf_n_ctx)" in refused.value.message and refused.value.param == "input"
    await unload(service, "smol")


async def test_unload_waits_for_an_active_stream_which_finishes(runtime_service):
    service, events = await runtime_service({"smol": SMOLLM2_MODEL})
    await load(service, "smol")
    [pid] = [p.pid for p in engine_processes()]
    stream = asyncio.create_task(
        generate(service, "smol", COUNTING, stream=True, max_output_tokens=48, temperature=0.0)
    )  # at temperature 0 SmolLM2 counts on past 48 tokens: the stream ends by its length, never early
    controller = service.pool.controller("smol")
    while controller.scheduler.inflight == 0:
        await asyncio.sleep(0.01)
    unloading = asyncio.create_task(unload(service, "smol"))
    await wait_for_state(service, "smol", "unloading")
    result, deltas = await stream
    assert result["finish_reason"] == "length" and "".join(deltas) == result["text"] != ""
    assert (await unloading)["runtime_state"] == "unloaded"
    assert moves(events, "smol") == LOAD_CYCLE + UNLOAD_CYCLE
    assert pid not in [p.pid for p in engine_processes()]


async def test_a_sigkill_mid_stream_fails_the_model_and_an_admin_load_brings_it_back(runtime_service):
    service, events = await runtime_service({"smol": SMOLLM2_MODEL})
    await load(service, "smol")
    [engine] = service.pool.controller("smol").engines
    first_delta = asyncio.Event()
    deltas: list[str] = []

    async def emit(event: dict) -> None:
        if event["event"] == "delta":
            deltas.append(event["text"])
            first_delta.set()

    payload = {"request_id": "doomed", "model": "smol", "stream": True, "max_output_tokens": 200,
               "messages": [{"role": "user", "content": [{"type": "input_text", "text": COUNTING}]}]}
    stream = asyncio.create_task(service.handle("generate", payload, emit))
    await asyncio.wait_for(first_delta.wait(), 30)
    os.kill(engine.process.pid, signal.SIGKILL)
    with pytest.raises(BackendError) as failed:
        await asyncio.wait_for(stream, 10)
    assert failed.value.code == "backend_error" and "died of SIGKILL" in failed.value.message
    assert deltas  # the client saw the stream begin, then its error
    entry = await wait_for_state(service, "smol", "failed")
    assert entry["last_error"].startswith("engine process for model smol, replica 1 died of SIGKILL while loaded")
    assert engine_processes() == []
    assert (await load(service, "smol"))["runtime_state"] == "loaded"
    assert (await generate(service, "smol", "Hi", max_output_tokens=4))[0]["text"] != ""
    assert moves(events, "smol") == LOAD_CYCLE + [("loaded", "failed"), ("failed", "loading"), ("loading", "loaded")]
    await unload(service, "smol")


async def test_runtime_rss_returns_after_twenty_cycles_and_no_engine_process_remains(runtime_service):
    """The engine's memory goes with its process; the runtime only keeps its own bookkeeping."""
    service, _ = await runtime_service({"smol": {**SMOLLM2_MODEL, "gguf_n_ctx": 512}})
    controller = service.pool.controller("smol")
    runtime = psutil.Process()
    unloaded_rss, engine_rss = [], []
    for cycle in range(CYCLES):
        await controller.load({}, None)
        assert controller.state is RuntimeState.LOADED, controller.last_error
        assert (await generate(service, "smol", "Hi", max_output_tokens=3))[0]["usage"]["output_tokens"] > 0
        engine_rss.append((await controller.engines[0].stats())["rss_bytes"])
        await controller.unload()
        assert controller.state is RuntimeState.UNLOADED
        assert engine_processes() == [], f"an engine process outlived unload {cycle + 1}"
        unloaded_rss.append(runtime.memory_info().rss)
    mib = [round(rss / 2**20, 1) for rss in unloaded_rss]
    assert max(unloaded_rss[1:]) <= unloaded_rss[0] * 1.05, f"runtime RSS after each unload (MiB): {mib}"
    assert min(engine_rss) > 60 * 2**20  # the model was resident, in the engine process


async def test_a_replica_batches_concurrent_generations_through_its_engine_process(runtime_service):
    """target_inflight 3: three generations at once in the one engine process, each answering as it
    does alone (flash attention off: see tests/llama_cpp/test_batching.py)."""
    service, _ = await runtime_service({"smol": {**SMOLLM2_MODEL, "gguf_flash_attn": "off"}})
    entry = await load(service, "smol", {"target_inflight": 3})
    assert entry["effective_target_inflight"] == 3
    [pid] = [p.pid for p in engine_processes()]
    questions = ["Name a colour of the sea.", "What is a compass for?", "Count from 1 to 5."]
    fields = {"temperature": 0.0, "max_output_tokens": 8}
    alone = [(await generate(service, "smol", question, **fields))[0]["text"] for question in questions]
    controller = service.pool.controller("smol")
    most = 0

    async def watch() -> None:
        nonlocal most
        while True:
            most = max(most, controller.scheduler.inflight)
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    results = await asyncio.gather(*(generate(service, "smol", q, stream=True, **fields) for q in questions))
    watcher.cancel()
    assert [result["text"] for result, _ in results] == alone
    assert most == 3  # all three ran at once in the one replica
    await unload(service, "smol")
    assert pid not in [p.pid for p in engine_processes()]


async def test_unload_waits_for_active_batched_streams_which_finish_and_the_process_goes(runtime_service):
    service, events = await runtime_service({"smol": SMOLLM2_MODEL})
    await load(service, "smol", {"target_inflight": 3})
    [pid] = [p.pid for p in engine_processes()]
    streams = [asyncio.create_task(generate(service, "smol", f"Count from {start} to 100, separated by commas.",
                                            stream=True, max_output_tokens=24, temperature=0.0))
               for start in (1, 10, 20)]
    controller = service.pool.controller("smol")
    while controller.scheduler.inflight < 3:
        await asyncio.sleep(0.01)
    unloading = asyncio.create_task(unload(service, "smol"))
    await wait_for_state(service, "smol", "unloading")
    for result, deltas in await asyncio.gather(*streams):  # each ends as it would have, not cut short
        assert result["finish_reason"] in ("length", "stop") and "".join(deltas) == result["text"] != ""
    assert (await unloading)["runtime_state"] == "unloaded"
    assert moves(events, "smol") == LOAD_CYCLE + UNLOAD_CYCLE
    assert pid not in [p.pid for p in engine_processes()]
