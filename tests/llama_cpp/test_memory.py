"""Unload frees the engine's memory inside the runtime process (isolation "none"): 20 load/unload cycles.

The cycles run in a fresh interpreter of their own: the RSS of a test worker that has run other
tests already (522 MiB in one CI run) moves by more than the 5% checked here as its heap settles,
whatever this test does (one such run grew 6% over the 20 cycles).
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

CYCLES = 20
ROOT = Path(__file__).resolve().parents[2]


async def cycles(settings: str) -> dict:
    """Load, generate and unload SmolLM2 ``CYCLES`` times in this process: the RSS after each."""
    import psutil

    from runtime.backends.base import Finished, GenerationRequest
    from runtime.pool.model_pool import ModelPool
    from runtime.model.state import RuntimeState

    pool = ModelPool(settings)
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
    return {"loaded": loaded_rss, "unloaded": unloaded_rss}


def test_rss_returns_after_twenty_load_unload_cycles(tmp_path):
    from llama_helpers import SMOLLM2_MODEL, write_settings

    settings = write_settings(tmp_path, {"smol": {**SMOLLM2_MODEL, "gguf_n_ctx": 512, "isolation": "none"}})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    ran = subprocess.run([sys.executable, __file__, str(settings)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    measured = json.loads(ran.stdout.splitlines()[-1])
    loaded_rss, unloaded_rss = measured["loaded"], measured["unloaded"]
    mib = [round(rss / 2**20, 1) for rss in unloaded_rss]
    assert max(unloaded_rss[1:]) <= unloaded_rss[0] * 1.05, f"RSS after each unload (MiB): {mib}"
    # The model really was resident while loaded (weights + KV cache), so the check means something.
    assert min(loaded_rss) - unloaded_rss[0] > 60 * 2**20


if __name__ == "__main__":
    print(json.dumps(asyncio.run(cycles(sys.argv[1]))))
