"""Overhead of the process model: p50/p99 latency of a non-streamed POST /v1/responses on the stub
backend at zero delay, 1 and 32 concurrent clients, embedded vs split vs the runtime's Python entry
point called directly, each shape on uvicorn (``embedded``, ``split``: the default server) and on
daphne (``embedded_daphne``, ``split_daphne``) in the same run; and a split pool of two runtime
workers (two nodes, one API process) where one model is on the API process's own node and one on
the other, taking turns (``split_two_nodes``: the second node's added p50, target <= 0.5 ms);
and what a key's limits add (``key_limits_embedded``, ``key_limits_split``): one client taking
turns between a key with requests per minute, tokens per minute and a monthly budget and a key
without limits, on uvicorn (target: added p50 <= 0.2 ms embedded, <= 0.5 ms split).
Prints one JSON object.  Needs
Redis on 127.0.0.1:6379 for the split runs.

Run: .venv/bin/python bench/overhead.py [--requests 400] [--servers uvicorn,daphne] [--only key_limits]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    REDIS_URL,
    forget_prefix,
    http_latencies,
    percentiles,
    running_nodes,
    running_service,
)
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


NODES = ("bench-a", "bench-b")
TWO_NODES = {
    **SETTINGS,
    "models": {"near": {"backend": "stub", "enabled": True, "node": NODES[0]},
               "far": {"backend": "stub", "enabled": True, "node": NODES[1]}},
}


async def second_node(url: str, requests: int) -> dict:
    """One client, the two models taking turns every request: ``near`` on the node of the API
    process's own LLMPOOL_NODE_ID, ``far`` on the other node; p50/p99 of each and the difference."""
    import httpx

    samples: dict[str, list[float]] = {"near": [], "far": []}
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        for model in samples:
            for _ in range(20):  # warm up
                (await http.post("/v1/responses", json={**BODY, "model": model})).raise_for_status()
        for _ in range(requests):
            for model, values in samples.items():
                began = time.perf_counter()
                answer = await http.post("/v1/responses", json={**BODY, "model": model})
                values.append(time.perf_counter() - began)
                answer.raise_for_status()
    stats = {f"{model}_node": percentiles(values) for model, values in samples.items()}
    return {**stats, "second_node_minus_same_node_p50_ms": round(stats["far_node"]["p50_ms"] - stats["near_node"]["p50_ms"], 3),
            "target_second_node_minus_same_node_p50_ms": 0.5}


ADMIN_TOKEN = "bench-admin-token"
LIMITS_ON = {"requests_per_minute": 1_000_000, "tokens_per_minute": 10**10, "token_budget": 10**15,
             "budget_period": "month"}
KEY_LIMIT_TARGETS = {"embedded": 0.2, "split": 0.5}


async def key_limits(url: str, requests: int, mode: str) -> dict:
    """One client, a key with limits and one without taking turns every request (so drift hits both
    alike): p50/p99 of each and the difference, against the shape's target."""
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        headers = {}
        for name, limits in (("limits_off", {}), ("limits_on", LIMITS_ON)):
            made = await http.post("/v1/admin/keys", json={"name": f"bench-{name.replace('_', '-')}", **limits},
                                   headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
            made.raise_for_status()
            headers[name] = {"Authorization": f"Bearer {made.json()['key']}"}
        samples: dict[str, list[float]] = {name: [] for name in headers}
        for name in samples:
            for _ in range(50):  # warm up (and every API process has read the keys)
                (await http.post("/v1/responses", json=BODY, headers=headers[name])).raise_for_status()
        for _ in range(requests):
            for name, values in samples.items():
                began = time.perf_counter()
                answer = await http.post("/v1/responses", json=BODY, headers=headers[name])
                values.append(time.perf_counter() - began)
                answer.raise_for_status()
    stats = {name: percentiles(values) for name, values in samples.items()}
    return {**stats, "added_p50_ms": round(stats["limits_on"]["p50_ms"] - stats["limits_off"]["p50_ms"], 3),
            "target_added_p50_ms": KEY_LIMIT_TARGETS[mode]}


async def admission_calls(calls: int) -> dict:
    """The admission and the end of one request of a limited key (requests and tokens per minute and
    a budget), called in this process on each store: what the HTTP figures add, without the noise
    of the rest of a request.  The Redis store's calls are a round trip each."""
    from models_app.quotas.admission import EMBEDDED
    from models_app.quotas.policy import BudgetPeriod, KeyLimits
    from models_app.quotas.redis_store import RedisStore

    limits = KeyLimits(**LIMITS_ON)
    result = {}
    for name, store in (("embedded", EMBEDDED), ("split", RedisStore())):
        if name == "embedded":
            EMBEDDED.memory.seed_budget("1", BudgetPeriod.at("month", time.time()), 0)  # no database here
        admits, finishes = [], []
        for index in range(calls):
            period = BudgetPeriod.at("month", time.time())
            began = time.perf_counter()
            await store.admit(1, limits, f"bench-{index}", period)
            admits.append(time.perf_counter() - began)
            began = time.perf_counter()
            await store.finish(1, limits, 10, f"bench-{index}", period, False)
            finishes.append(time.perf_counter() - began)
        result[f"{name}_admit"], result[f"{name}_finish"] = percentiles(admits), percentiles(finishes)
    return result


def key_limit_runs(requests: int) -> dict:
    settings = {**SETTINGS, "service": {"admin_token": ADMIN_TOKEN}}
    result = {}
    for mode in ("embedded", "split"):
        with running_service(settings, mode) as url:
            result[f"key_limits_{mode}"] = asyncio.run(key_limits(url, requests, mode))
    prefix = f"llmpoolbench-{uuid.uuid4().hex[:8]}"
    os.environ.update({"DJANGO_SETTINGS_MODULE": "llmpool.settings", "LLMPOOL_REDIS_URL": REDIS_URL,
                       "LLMPOOL_CHANNEL_PREFIX": prefix})
    import django

    django.setup()
    result["key_limits_calls"] = asyncio.run(admission_calls(requests))
    forget_prefix(prefix)
    return result


def figures(latencies: list[float], elapsed: float) -> dict:
    return {**percentiles(latencies), "requests_per_s": round(len(latencies) / elapsed, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=400, help="requests per client count and mode")
    parser.add_argument("--servers", default="uvicorn,daphne", help="HTTP servers to run each shape on, in turn")
    parser.add_argument("--only", choices=["key_limits"], help="run only this part")
    args = parser.parse_args()
    if args.only == "key_limits":
        print(json.dumps(key_limit_runs(args.requests), indent=2))
        return
    result: dict = {"direct": {}}
    for clients in (1, 32):
        per_client = max(1, args.requests // clients)
        result["direct"][f"{clients}_clients"] = figures(*asyncio.run(direct(clients, per_client)))
    for server in args.servers.split(","):
        for mode in ("embedded", "split"):
            key = mode if server == "uvicorn" else f"{mode}_{server}"
            result[key] = {}
            with running_service(SETTINGS, mode, server=server) as url:
                for clients in (1, 32):
                    per_client = max(1, args.requests // clients)
                    result[key][f"{clients}_clients"] = figures(*asyncio.run(http_latencies(url, BODY, clients, per_client)))
    with running_nodes(TWO_NODES, NODES) as url:
        result["split_two_nodes"] = asyncio.run(second_node(url, args.requests))
    one = "1_clients"
    for server in args.servers.split(","):
        if server != "uvicorn" and "embedded" in result:
            for mode in ("embedded", "split"):
                result[f"{mode}_{server}_minus_uvicorn_p50_ms"] = round(
                    result[f"{mode}_{server}"][one]["p50_ms"] - result[mode][one]["p50_ms"], 3)
    result.update(key_limit_runs(args.requests))
    result["split_minus_embedded_p50_ms"] = round(result["split"][one]["p50_ms"] - result["embedded"][one]["p50_ms"], 3)
    result["embedded_minus_direct_p50_ms"] = round(result["embedded"][one]["p50_ms"] - result["direct"][one]["p50_ms"], 3)
    result["targets"] = {"split_minus_embedded_p50_ms": 2.0, "embedded_minus_direct_p50_ms": 1.0}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
