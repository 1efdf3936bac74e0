"""Unload frees the engine's memory inside the runtime process (isolation "none"): 20 load/unload cycles."""
from __future__ import annotations

import psutil
from llama_helpers import SMOLLM2_MODEL, write_settings

from runtime.backends.base import Finished, GenerationRequest
from runtime.pool import ModelPool
from runtime.state import RuntimeState

CYCLES = 20


async def test_rss_returns_after_twenty_load_unload_cycles(tmp_path):
    settings = write_settings(tmp_path, {"smol": {**SMOLLM2_MODEL, "gguf_n_ctx": 512, "isolation": "none"}})
    pool = ModelPool(str(settings))
    await pool.start(load_enabled=False)
    controller = pool.controller("smol")
    process = psutil.Process()
    loaded_rss, unloaded_rss = [], []
    try:
        for cycle in range(CYCLES):
            await controller.load({}, None)
            assert controller.state is RuntimeState.LOADED, controller.last_error
            request = GenerationRequest(
                f"cycle-{cycle}", [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
                max_output_tokens=3,
            ).resolved()
            events = [event async for event in controller.engines[0].generate(request)]
            assert isinstance(events[-1], Finished) and events[-1].output_tokens > 0
            loaded_rss.append(process.memory_info().rss)
            await controller.unload()
            assert controller.state is RuntimeState.UNLOADED
            unloaded_rss.append(process.memory_info().rss)
    finally:
        await pool.shutdown()
    mib = [round(rss / 2**20, 1) for rss in unloaded_rss]
    assert max(unloaded_rss[1:]) <= unloaded_rss[0] * 1.05, f"RSS after each unload (MiB): {mib}"
    # The model really was resident while loaded (weights + KV cache), so the check means something.
    assert min(loaded_rss) - unloaded_rss[0] > 60 * 2**20
