"""Overhead of the process model: p50/p99 latency of a non-streamed POST /v1/responses on the stub
backend at zero delay, 1 and 32 concurrent clients, embedded vs split vs the runtime's Python entry
point called directly.  Prints one JSON object.  Needs Redis on 127.0.0.1:6379 for the split run.

Run: .venv/bin/python bench/overhead.py [--requests 400]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import http_latencies, percentiles, running_service  # noqa: E402
from runtime.service import RuntimeService  # noqa: E402

SETTINGS = {
    "engine": {"fairness": {"per_key_queue_limit": 10000, "executor_queue_limit": 10000}},
    "models": {"bench": {"backend": "stub", "enabled": True}},
}
BODY = {"model": "bench", "input": "one two three four"}


async def direct(clients: int, per_client: int) -> tuple[list[float], float]:
    """The runtime's entry point (RuntimeService.handle 'generate'), no HTTP, no channel layer."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "settings.json"
        path.write_text(json.dumps(SETTINGS))
        service = RuntimeService(str(path))
        # Load explicitly: a load call made while the start-up load runs would return at once.
        await service.start(load_enabled=False)
        await service.pool.controller("bench").load({}, None)
        payload = {"model": "bench", "messages": [{"role": "user", "content": [{"type": "input_text", "text": BODY["input"]}]}]}

        async def nothing(_chunk):
            return None

        latencies: list[float] = []

        async def client():
            for _ in range(per_client):
                began = time.perf_counter()
                await service.handle("generate", {**payload, "request_id": uuid.uuid4().hex}, nothing)
                latencies.append(time.perf_counter() - began)

        began = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.perf_counter() - began
        await service.shutdown()
        return latencies, elapsed


def figures(latencies: list[float], elapsed: float) -> dict:
    return {**percentiles(latencies), "requests_per_s": round(len(latencies) / elapsed, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=400, help="requests per client count and mode")
    args = parser.parse_args()
    result: dict = {"direct": {}, "embedded": {}, "split": {}}
    for clients in (1, 32):
        per_client = max(1, args.requests // clients)
        result["direct"][f"{clients}_clients"] = figures(*asyncio.run(direct(clients, per_client)))
    for mode in ("embedded", "split"):
        with running_service(SETTINGS, mode) as url:
            for clients in (1, 32):
                per_client = max(1, args.requests // clients)
                result[mode][f"{clients}_clients"] = figures(*asyncio.run(http_latencies(url, BODY, clients, per_client)))
    one = "1_clients"
    result["split_minus_embedded_p50_ms"] = round(result["split"][one]["p50_ms"] - result["embedded"][one]["p50_ms"], 3)
    result["embedded_minus_direct_p50_ms"] = round(result["embedded"][one]["p50_ms"] - result["direct"][one]["p50_ms"], 3)
    result["targets"] = {"split_minus_embedded_p50_ms": 2.0, "embedded_minus_direct_p50_ms": 1.0}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
