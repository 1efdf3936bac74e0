"""How much of one Redis a multi-node pool uses: Redis's own CPU time and commands per request,
per streamed token and per node, read from Redis's INFO before and after each phase.

A split pool of three runtime workers (``alpha`` serves the models, ``beta`` and ``gamma`` only
announce themselves) and one API process, over the local Redis.  Redis runs one command at a time
on one core, so the CPU time Redis spends per request bounds what one Redis carries:
``capacity_per_redis_core`` is one second divided by that time (the API and runtime processes,
Python on this machine's two cores, saturate long before Redis does; those figures say where
Redis itself would stop).  Nothing else may use the Redis while this runs.

Prints one JSON object.  Run: .venv/bin/python bench/redis_capacity.py [--requests 2000] [--streams 200]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import httpx
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import REDIS_URL, http_latencies, percentiles, running_nodes  # noqa: E402

STREAM_TOKENS = 32
SETTINGS = {
    "engine": {"fairness": {"per_key_queue_limit": 10000, "executor_queue_limit": 10000}},
    "models": {
        "cap": {"backend": "stub", "device": "cpu", "node": "alpha", "enabled": True},
        "tokens": {"backend": "stub", "device": "cpu", "node": "alpha", "enabled": True,
                   "stub_reply": " ".join(f"w{i}" for i in range(STREAM_TOKENS))},
    },
}
NODES = ("alpha", "beta", "gamma")


def _counters(client: redis.Redis) -> tuple[float, int, dict[str, int]]:
    cpu, stats = client.info("cpu"), client.info("stats")
    calls = {name.removeprefix("cmdstat_"): value["calls"] for name, value in client.info("commandstats").items()}
    return cpu["used_cpu_sys"] + cpu["used_cpu_user"], stats["total_commands_processed"], calls


def _measured(client: redis.Redis, action) -> dict:
    """Redis's CPU time and commands while ``action`` runs; ``by_command``: the calls of each
    command (those a Lua script makes count too)."""
    cpu_before, commands_before, calls_before = _counters(client)
    began = time.perf_counter()
    extra = action() or {}
    wall = time.perf_counter() - began
    cpu_after, commands_after, calls_after = _counters(client)
    by_command = {name: calls - calls_before.get(name, 0) for name, calls in calls_after.items()}
    by_command = dict(sorted(((n, c) for n, c in by_command.items() if c), key=lambda item: -item[1]))
    return {"seconds": round(wall, 2), "redis_cpu_s": round(cpu_after - cpu_before, 4),
            "redis_commands": commands_after - commands_before, "by_command": by_command, **extra}


async def _streams(url: str, count: int, clients: int) -> int:
    tokens = 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
        async def one() -> None:
            nonlocal tokens
            body = {"model": "tokens", "input": "x", "stream": True}
            async with http.stream("POST", "/v1/responses", json=body) as answer:
                answer.raise_for_status()
                async for line in answer.aiter_lines():
                    tokens += line.startswith("event: response.output_text.delta")

        async def client(share: int) -> None:
            for _ in range(share):
                await one()

        await asyncio.gather(*(client(count // clients) for _ in range(clients)))
    return tokens


def _idle(client: redis.Redis, seconds: float) -> dict:
    run = _measured(client, lambda: time.sleep(seconds))
    per_node_s = run["redis_cpu_s"] / len(NODES) / run["seconds"]
    return {**run, "redis_cpu_per_node_per_s_us": round(per_node_s * 1e6, 1),
            "commands_per_node_per_s": round(run["redis_commands"] / len(NODES) / run["seconds"], 1)}


def _non_streamed(client: redis.Redis, url: str, requests: int) -> dict:
    def plain() -> dict:
        latencies, elapsed = asyncio.run(http_latencies(url, {"model": "cap", "input": "a b"}, 16, requests // 16))
        return {"requests": len(latencies), "requests_per_s": round(len(latencies) / elapsed, 1),
                **percentiles(latencies)}

    run = _measured(client, plain)
    per_request = run["redis_cpu_s"] / run["requests"]
    return {**run, "redis_cpu_per_request_us": round(per_request * 1e6, 1),
            "commands_per_request": round(run["redis_commands"] / run["requests"], 1),
            "capacity_per_redis_core_requests_per_s": round(1 / per_request)}


def _streamed(client: redis.Redis, url: str, streams: int) -> dict:
    run = _measured(client, lambda: {"streams": streams, "tokens": asyncio.run(_streams(url, streams, 8))})
    per_token = run["redis_cpu_s"] / max(1, run["tokens"])
    return {**run, "redis_cpu_per_token_us": round(per_token * 1e6, 1),
            "commands_per_token": round(run["redis_commands"] / max(1, run["tokens"]), 2),
            "capacity_per_redis_core_tokens_per_s": round(1 / per_token)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=2000, help="non-streamed requests (16 clients)")
    parser.add_argument("--streams", type=int, default=200,
                        help=f"streamed requests of {STREAM_TOKENS} tokens (8 clients)")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of an idle pool (heartbeats only)")
    args = parser.parse_args()
    client = redis.Redis.from_url(REDIS_URL)
    result: dict = {"redis_version": client.info("server")["redis_version"], "nodes": len(NODES)}
    with running_nodes(SETTINGS, NODES) as url:
        time.sleep(2.0)  # every node has sent a few heartbeats
        result["idle_pool"] = _idle(client, args.idle)
        result["non_streamed"] = _non_streamed(client, url, args.requests)
        result["streamed"] = _streamed(client, url, args.streams)
    client.close()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
