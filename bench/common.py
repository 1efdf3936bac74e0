"""Start llm-pool for a benchmark (embedded or split over Redis) and measure request latency."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
REDIS_URL = os.environ.get("LLMPOOL_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def running_service(settings: dict, mode: str = "embedded"):
    """Yield the base URL of a service running ``settings`` once its models are loaded."""
    with tempfile.TemporaryDirectory() as folder:
        settings_path = Path(folder) / "settings.json"
        settings_path.write_text(json.dumps(settings))
        port = free_port()
        env = {**os.environ, "LLMPOOL_SETTINGS": str(settings_path), "LLMPOOL_DB_PATH": str(Path(folder) / "db.sqlite3"),
               "LLMPOOL_LOG_LEVEL": "WARNING"}
        if mode == "split":
            env.update({"LLMPOOL_REDIS_URL": REDIS_URL, "LLMPOOL_CHANNEL_PREFIX": f"llmpoolbench-{uuid.uuid4().hex[:8]}:",
                        "LLMPOOL_NODE_ID": f"bench-{port}"})
            commands = [[sys.executable, str(ROOT / "manage.py"), "runtime"],
                        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "llmpool.asgi:application"]]
        else:
            commands = [[sys.executable, str(ROOT / "manage.py"), "serve", "--port", str(port)]]
        processes = [subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                     for command in commands]
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_loaded(url, [name for name, d in settings["models"].items() if d.get("enabled")])
            yield url
        finally:
            for process in processes:
                process.send_signal(signal.SIGTERM)
            for process in processes:
                process.wait(timeout=30)


def serving_process():
    """The ``manage.py serve`` process that ``running_service`` started from this process."""
    import psutil

    return next(p for p in psutil.Process().children(recursive=True) if "serve" in " ".join(p.cmdline()))


def wait_until_loaded(url: str, names: list[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
            models = httpx.get(url + "/v1/admin/models", timeout=2).json()["models"]
            states = {m["name"]: m["runtime_state"] for m in models}
            if all(states.get(name) == "loaded" for name in names):
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url}: models {names} did not load")


def percentiles(samples: list[float]) -> dict:
    ordered = sorted(samples)
    pick = lambda q: round(ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000, 3)  # noqa: E731
    return {"p50_ms": pick(0.5), "p99_ms": pick(0.99), "n": len(ordered)}


async def http_latencies(url: str, body: dict, clients: int, requests_per_client: int) -> tuple[list[float], float]:
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
        async def client():
            for _ in range(requests_per_client):
                began = time.perf_counter()
                response = await http.post("/v1/responses", json=body)
                latencies.append(time.perf_counter() - began)
                response.raise_for_status()

        await http.post("/v1/responses", json=body)  # warm up
        began = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.perf_counter() - began
    return latencies, elapsed
