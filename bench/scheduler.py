"""Scheduler benchmark: decision cost, token fairness, priority classes, and end-to-end requests/s.

``--nodes`` adds the fairness figures measured for real across two nodes (a split pool over the
local Redis, one model with a replica on each node, stub requests of equal size).

Prints one JSON object.  Run: .venv/bin/python bench/scheduler.py [--requests 1280] [--clients 64] [--nodes]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import http_latencies, percentiles, running_nodes, running_service  # noqa: E402
from runtime.config import FairnessSettings  # noqa: E402
from runtime.model.scheduler import Scheduler  # noqa: E402
from runtime.model.tickets import Ticket  # noqa: E402
from runtime.queue_terms import DEFAULT_PRIORITY, PRIORITY_CLASSES  # noqa: E402


class Recorder:
    def __init__(self):
        self.started: list[Ticket] = []

    def start(self, ticket, replica):
        self.started.append(ticket)

    def reject(self, ticket, error):
        raise AssertionError("nothing is rejected in this benchmark")


def decision_cost(queued: int = 10_000, keys: int = 100, rounds: int = 20_000,
                  classes: tuple[str, ...] = (DEFAULT_PRIORITY,)) -> dict:
    """Mean cost of one request's decisions (admit + dispatch + completion) with ``queued`` pending,
    each request of a class drawn from ``classes``."""
    effects = Recorder()
    scheduler = Scheduler(FairnessSettings(per_key_queue_limit=queued, executor_queue_limit=queued * 2), effects)
    scheduler.open(1, 1)
    rng = random.Random(1)
    for index in range(queued + 1):
        scheduler.on_request(Ticket(f"r{index}", f"k{index % keys}", cost_estimate=rng.randint(10, 500),
                                    priority=rng.choice(classes)))
    begin = time.perf_counter()
    for index in range(rounds):
        running = effects.started[-1]
        scheduler.on_request(Ticket(f"n{index}", f"k{rng.randrange(keys)}", cost_estimate=rng.randint(10, 500),
                                    priority=rng.choice(classes)))
        scheduler.on_done(running, running.cost_estimate + rng.randint(1, 500))
    elapsed = time.perf_counter() - begin
    return {"queued": queued, "keys": keys, "rounds": rounds, "classes": list(classes),
            "us_per_request": round(elapsed / rounds * 1e6, 2), "target_us": 20}


def priority_classes(limit: int = 8) -> dict:
    """One slot, counted in starts: how many starts an interactive request waits behind a flood of
    batch requests, and the batch class's share of the starts, and its longest wait, while
    interactive requests keep the slot busy (the bound: limit + 1 starts passed over)."""
    effects = Recorder()
    fairness = FairnessSettings(per_key_queue_limit=10_000, executor_queue_limit=20_000,
                                priority_starvation_limit=limit)
    scheduler = Scheduler(fairness, effects)
    scheduler.open(1, 1)
    rng = random.Random(3)
    for index in range(3000):
        scheduler.on_request(Ticket(f"b{index}", f"job{index % 10}", cost_estimate=rng.randint(10, 500),
                                    priority="batch"))
    waits = []
    for index in range(200):
        for _ in range(rng.randint(0, 3)):
            scheduler.on_done(effects.started[-1], rng.randint(10, 900))
        scheduler.on_request(Ticket(f"i{index}", f"user{index % 5}", cost_estimate=20, priority="interactive"))
        before = len(effects.started)
        while effects.started[-1].request_id != f"i{index}":
            scheduler.on_done(effects.started[-1], rng.randint(10, 900))
        waits.append(len(effects.started) - before - 1)  # other starts before it
    for index in range(2000):
        scheduler.on_request(Ticket(f"s{index}", f"user{index % 5}", cost_estimate=20, priority="interactive"))
    begin = len(effects.started)
    for _ in range(900):
        scheduler.on_done(effects.started[-1], rng.randint(10, 900))
    classes = [ticket.request_id[0] for ticket in effects.started[begin:]]
    longest = max(len(run) for run in "".join(classes).split("b"))
    return {
        "priority_starvation_limit": limit,
        "interactive_behind_batch_flood": {"requests": len(waits), "max_other_starts_before_it": max(waits),
                                           "target": 0},
        "interactive_saturation": {"starts": len(classes), "batch_share": round(classes.count("b") / len(classes), 4),
                                   "target_share": round(1 / (limit + 1), 4),
                                   "longest_batch_wait_starts": longest, "bound": limit + 1},
    }


def served_shares(requests_per_key: dict[str, int], weights: dict[str, float], slots: int = 4) -> dict:
    """Token shares while every key is still backlogged (simulated time, service ∝ tokens)."""
    effects = Recorder()
    total = sum(requests_per_key.values())
    scheduler = Scheduler(
        FairnessSettings(per_key_queue_limit=total, executor_queue_limit=total, weights=weights), effects
    )
    scheduler.open(1, slots)
    rng = random.Random(2)
    sizes, pending = {}, []
    for key, count in requests_per_key.items():
        for index in range(count):
            prompt, output = rng.randint(20, 200), rng.randint(20, 400)
            pending.append(Ticket(f"{key}-{index}", key, cost_estimate=prompt))
            sizes[pending[-1].request_id] = prompt + output
    rng.shuffle(pending)  # interleave arrivals so no key is first by accident
    served = {key: 0 for key in requests_per_key}
    running: list[tuple[float, Ticket]] = []
    clock = 0.0
    for ticket in pending:
        scheduler.on_request(ticket)
    seen = 0
    while True:
        for ticket in effects.started[seen:]:
            running.append((clock + sizes[ticket.request_id], ticket))
        seen = len(effects.started)
        if not running:
            break
        running.sort(key=lambda item: item[0])
        clock, ticket = running.pop(0)
        if any(not scheduler.keys[key].pending for key in requests_per_key):
            break  # one key ran dry: the backlogged window is over
        served[ticket.fairness_key] += sizes[ticket.request_id]
        scheduler.on_done(ticket, sizes[ticket.request_id])
    total_served = sum(served.values())
    return {key: round(value / total_served, 4) for key, value in served.items()}


def jain(values: list[float]) -> float:
    return round(sum(values) ** 2 / (len(values) * sum(v * v for v in values)), 4)


def fairness() -> dict:
    equal = served_shares({"heavy": 2000, "light": 200}, {})
    weighted = served_shares({"w1": 2000, "w3": 2000}, {"w3": 3.0})
    ten = served_shares({f"k{i}": 300 * (i + 1) for i in range(10)}, {})
    return {
        "equal_weights_10x_requests": {"shares": equal, "target": "0.5 ± 0.05 each"},
        "weights_1_to_3": {"shares": weighted, "target": "0.25 / 0.75 ± 0.05"},
        "ten_keys_jain_index": jain(list(ten.values())),
    }


def across_nodes() -> dict:
    """The fairness figures with the model's two replicas on two nodes (real processes).

    A blocker request holds each node's replica (3 s) while every request of the burst is sent,
    in shuffled order, so all of them are queued before any is served (``queued_before_service``
    says how many were); the API spreads them over the nodes and each node's scheduler orders its
    queue.  A key's share is its completed requests (all of one size) while every key still had
    requests left: the window ends when the first key's last one ends.
    """
    weights = {"w3": 3.0}
    settings = {
        "engine": {"fairness": {"per_key_queue_limit": 1000, "executor_queue_limit": 2000, "weights": weights}},
        "service": {"runtime_reply_timeout_seconds": 120},
        # No stub_reply: the answer echoes the input, one word a token, 30 ms each.
        "models": {"fair": {"backend": "stub", "device": "cpu", "node": ["alpha", "beta"], "stub_token_delay_ms": 30}},
    }
    with running_nodes(settings, ("alpha", "beta")) as url:
        answer = httpx.post(url + "/v1/admin/models/fair/load", json={"replicas": 2}, timeout=60)
        answer.raise_for_status()
        time.sleep(1.5)  # the API has read both nodes' heartbeats with the model loaded
        equal = asyncio.run(_node_shares(url, {"heavy": 300, "light": 30}))
        weighted = asyncio.run(_node_shares(url, {"w1": 150, "w3": 150}))
    return {
        "equal_weights_10x_requests": {**equal, "target": "0.5 ± 0.05 each"},
        "weights_1_to_3": {**weighted, "target": "0.25 / 0.75 ± 0.05"},
    }


async def _node_shares(url: str, requests_per_key: dict[str, int]) -> dict:
    order = [key for key, count in requests_per_key.items() for _ in range(count)]
    random.Random(1).shuffle(order)
    done: list[tuple[float, str]] = []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        async def one(key: str, text: str = "a b c") -> None:
            answer = await http.post("/v1/responses", json={"model": "fair", "input": text, "user": key})
            if answer.status_code != 200:
                raise RuntimeError(f"{answer.status_code}: {answer.text}")
            done.append((time.perf_counter(), key))

        blockers = [asyncio.create_task(one("blocker", " ".join(["w"] * 100))) for _ in range(2)]
        await asyncio.sleep(0.3)  # both blockers run, one on each node
        burst = asyncio.gather(*(one(key) for key in order))
        await asyncio.sleep(2.4)
        listed = (await http.get("/v1/admin/models")).json()["models"]
        queued = sum(m["queue_depth"] for m in listed if m["name"] == "fair")
        await asyncio.gather(burst, *blockers)
    done = sorted(item for item in done if item[1] != "blocker")
    last = {key: max(t for t, k in done if k == key) for key in requests_per_key}
    window_end = min(last.values())
    served = {key: sum(1 for t, k in done if k == key and t <= window_end) for key in requests_per_key}
    total = sum(served.values())
    return {"shares": {key: round(count / total, 4) for key, count in served.items()}, "window_requests": total,
            "queued_before_service": f"{queued} of {len(order)}"}


def end_to_end(clients: int, requests: int) -> dict:
    """Requests/s through POST /v1/responses with ``clients`` concurrent clients, embedded default."""
    settings = {
        "engine": {"fairness": {"per_key_queue_limit": 1000, "executor_queue_limit": 1000}},
        "models": {"bench": {"backend": "stub", "enabled": True}},
    }
    body = {"model": "bench", "input": "one two three four"}
    with running_service(settings) as url:
        latencies, elapsed = asyncio.run(http_latencies(url, body, clients, max(1, requests // clients)))
    return {"clients": clients, "seconds": round(elapsed, 2), "requests_per_s": round(len(latencies) / elapsed, 1),
            **percentiles(latencies)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=1280, help="end-to-end requests in all")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--skip-e2e", action="store_true")
    parser.add_argument("--nodes", action="store_true", help="also measure fairness across two nodes (needs Redis)")
    args = parser.parse_args()
    result = {"decision_cost": decision_cost(), "decision_cost_three_classes": decision_cost(classes=PRIORITY_CLASSES),
              "fairness": fairness(), "priority_classes": priority_classes()}
    if args.nodes:
        result["fairness_across_two_nodes"] = across_nodes()
    if not args.skip_e2e:
        result["end_to_end_stub_zero_delay"] = end_to_end(args.clients, args.requests)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
