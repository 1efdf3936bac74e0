"""Scheduler benchmark: decision cost, token fairness, and end-to-end requests/s.

Prints one JSON object.  Run: .venv/bin/python bench/scheduler.py [--e2e-seconds 10]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime.config import FairnessSettings  # noqa: E402
from runtime.scheduler import Scheduler, Ticket  # noqa: E402


class Recorder:
    def __init__(self):
        self.started: list[Ticket] = []

    def start(self, ticket, replica):
        self.started.append(ticket)

    def reject(self, ticket, error):
        raise AssertionError("nothing is rejected in this benchmark")


def decision_cost(queued: int = 10_000, keys: int = 100, rounds: int = 20_000) -> dict:
    """Mean cost of one request's decisions (admit + dispatch + completion) with ``queued`` pending."""
    effects = Recorder()
    scheduler = Scheduler(FairnessSettings(per_key_queue_limit=queued, executor_queue_limit=queued * 2), effects)
    scheduler.open(1, 1)
    rng = random.Random(1)
    for index in range(queued + 1):
        scheduler.on_request(Ticket(f"r{index}", f"k{index % keys}", cost_estimate=rng.randint(10, 500)))
    begin = time.perf_counter()
    for index in range(rounds):
        running = effects.started[-1]
        scheduler.on_request(Ticket(f"n{index}", f"k{rng.randrange(keys)}", cost_estimate=rng.randint(10, 500)))
        scheduler.on_done(running, running.cost_estimate + rng.randint(1, 500))
    elapsed = time.perf_counter() - begin
    return {"queued": queued, "keys": keys, "rounds": rounds, "us_per_request": round(elapsed / rounds * 1e6, 2),
            "target_us": 20}


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
        if any(not scheduler.keys[key].queue for key in requests_per_key):
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def hammer(url: str, clients: int, seconds: float) -> dict:
    import httpx

    done = 0
    errors = 0
    stop_at = time.monotonic() + seconds
    latencies: list[float] = []

    async def client(http):
        nonlocal done, errors
        while time.monotonic() < stop_at:
            begin = time.perf_counter()
            response = await http.post("/v1/responses", json={"model": "bench", "input": "one two three four"})
            latencies.append(time.perf_counter() - begin)
            if response.status_code == 200:
                done += 1
            else:
                errors += 1

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
        begin = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        elapsed = time.perf_counter() - begin
    latencies.sort()
    return {
        "clients": clients,
        "seconds": round(elapsed, 2),
        "requests": done,
        "errors": errors,
        "requests_per_s": round(done / elapsed, 1),
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 1) if latencies else None,
        "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 1) if latencies else None,
    }


def end_to_end(clients: int, seconds: float) -> dict:
    import httpx

    with tempfile.TemporaryDirectory() as folder:
        settings = Path(folder) / "settings.json"
        settings.write_text(json.dumps({
            "engine": {"fairness": {"per_key_queue_limit": 1000, "executor_queue_limit": 1000}},
            "models": {"bench": {"backend": "stub", "enabled": True}},
        }))
        port = free_port()
        env = {**os.environ, "LLMPOOL_SETTINGS": str(settings), "LLMPOOL_DB_PATH": str(Path(folder) / "db.sqlite3"),
               "LLMPOOL_LOG_LEVEL": "WARNING"}
        server = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "serve", "--port", str(port)],
                                  cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    models = httpx.get(url + "/v1/admin/models", timeout=1).json()["models"]
                    if models[0]["runtime_state"] == "loaded":
                        break
                except (httpx.HTTPError, KeyError, IndexError):
                    pass
                time.sleep(0.1)
            return asyncio.run(hammer(url, clients, seconds))
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=15)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--e2e-seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--skip-e2e", action="store_true")
    args = parser.parse_args()
    result = {"decision_cost": decision_cost(), "fairness": fairness()}
    if not args.skip_e2e:
        result["end_to_end_stub_zero_delay"] = end_to_end(args.clients, args.e2e_seconds)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
