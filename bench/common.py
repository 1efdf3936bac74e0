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
import redis

ROOT = Path(__file__).resolve().parent.parent
REDIS_URL = os.environ.get("LLMPOOL_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def manage(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "manage.py"), *args]


@contextlib.contextmanager
def running_service(settings: dict, mode: str = "embedded", server: str = "uvicorn"):
    """Yield the base URL of a service running ``settings`` once its models are loaded, on ``server``
    (``manage.py serve`` / ``api --server``: uvicorn or daphne)."""
    with _processes(settings, mode == "split") as (port, env, start):
        if mode == "split":
            start(manage("runtime"), {"LLMPOOL_NODE_ID": f"bench-{port}"})
            start(manage("api", "--port", str(port), "--server", server), {"LLMPOOL_NODE_ID": f"bench-{port}"})
        else:
            start(manage("serve", "--port", str(port), "--server", server), {})
        yield _loaded(port, settings)


@contextlib.contextmanager
def running_nodes(settings: dict, nodes: tuple[str, ...], server: str = "uvicorn"):
    """Yield the base URL of a split pool over Redis with one runtime worker per name in ``nodes``
    (``LLMPOOL_NODE_ID``) and one API process (on the first node's id), once every enabled model
    is loaded."""
    with _processes(settings, True) as (port, env, start):
        for node in nodes:
            start(manage("runtime"), {"LLMPOOL_NODE_ID": node})  # their migrations take turns (models_app.conf)
        start(manage("api", "--port", str(port), "--server", server), {"LLMPOOL_NODE_ID": nodes[0]})
        _announced(env["LLMPOOL_CHANNEL_PREFIX"], nodes)
        yield _loaded(port, settings)


def _announced(prefix: str, nodes: tuple[str, ...], timeout: float = 60) -> None:
    """Wait until every node's alive key is in the registry (models_app.transport.nodes)."""
    client = redis.Redis.from_url(REDIS_URL)
    deadline = time.monotonic() + timeout
    try:
        while not all(client.exists(f"{prefix}:node-alive:{node}") for node in nodes):
            if time.monotonic() > deadline:
                raise RuntimeError(f"nodes {nodes} did not all announce themselves")
            time.sleep(0.1)
    finally:
        client.close()


@contextlib.contextmanager
def _processes(settings: dict, split: bool):
    """A folder with ``settings``, a free port, the environment, and ``start(command, env)``;
    every process started is stopped (SIGTERM) when the block ends."""
    with tempfile.TemporaryDirectory() as folder:
        settings_path = Path(folder) / "settings.json"
        settings_path.write_text(json.dumps(settings))
        env = {**os.environ, "LLMPOOL_SETTINGS": str(settings_path), "LLMPOOL_DB_PATH": str(Path(folder) / "db.sqlite3"),
               "LLMPOOL_LOG_LEVEL": "WARNING"}
        if split:
            env.update({"LLMPOOL_REDIS_URL": REDIS_URL, "LLMPOOL_CHANNEL_PREFIX": f"llmpoolbench-{uuid.uuid4().hex[:8]}:"})
        processes: list[subprocess.Popen] = []

        logs = os.environ.get("LLMPOOL_BENCH_LOGS")  # a folder: each process's output is kept there

        def start(command: list[str], extra: dict) -> None:
            if not logs:
                output = subprocess.DEVNULL
                processes.append(subprocess.Popen(command, cwd=ROOT, env={**env, **extra}, stdout=output,
                                                  stderr=subprocess.STDOUT))
                return
            name = Path(logs) / f"{command[2] if len(command) > 2 else 'process'}-{len(processes)}-{os.getpid()}.log"
            with open(name, "ab") as output:  # the child keeps its own copy of the descriptor
                processes.append(subprocess.Popen(command, cwd=ROOT, env={**env, **extra}, stdout=output,
                                                  stderr=subprocess.STDOUT))

        try:
            yield free_port(), env, start
        finally:
            for process in processes:
                process.send_signal(signal.SIGTERM)
            for process in processes:
                process.wait(timeout=30)
            if split:  # the node's registry record and name outlive it on purpose: not a bench's
                forget_prefix(env["LLMPOOL_CHANNEL_PREFIX"])


def forget_prefix(prefix: str) -> None:
    """Delete every Redis key of a bench's channel prefix."""
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def _loaded(port: int, settings: dict) -> str:
    url = f"http://127.0.0.1:{port}"
    token = settings.get("service", {}).get("admin_token")
    wait_until_loaded(url, [name for name, d in settings["models"].items() if d.get("enabled")],
                      headers={"Authorization": f"Bearer {token}"} if token else None)
    return url


def serving_process():
    """The ``manage.py serve`` process that ``running_service`` started from this process."""
    import psutil

    return next(p for p in psutil.Process().children(recursive=True) if " serve " in " ".join(p.cmdline()) + " ")


def wait_until_loaded(url: str, names: list[str], timeout: float = 120, headers: dict | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
            models = httpx.get(url + "/v1/admin/models", timeout=2, headers=headers).json()["models"]
            states = {m["name"]: m["runtime_state"] for m in models}
            if all(states.get(name) == "loaded" for name in names):
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url}: models {names} did not load")


@contextlib.contextmanager
def llama_cpp_server(argv: list[str], log_folder: str, log_name: str, timeout: float):
    """llama.cpp's server (``argv`` without --host/--port; its router too) on a free port, its
    output in ``<LLMPOOL_BENCH_LOGS or log_folder>/<log_name>``: its URL once /health answers 200;
    its process group stopped at the end."""
    port = free_port()
    log = open(Path(os.environ.get("LLMPOOL_BENCH_LOGS", log_folder)) / log_name, "ab")  # noqa: SIM115
    process = subprocess.Popen([*argv, "--host", "127.0.0.1", "--port", str(port)], stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{argv[0]} did not start:\n" + Path(log.name).read_text(errors="replace")[-3000:])
            time.sleep(0.1)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


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


def print_run(doc: str, run, **defaults: int) -> None:
    """Parse ``--<name> N`` for each of ``defaults`` (``max_tokens`` is ``--max-tokens``), await
    ``run(**values)`` and print its JSON: the command line of the benchmarks that take only counts."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    for name, default in defaults.items():
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=default)
    print(json.dumps(asyncio.run(run(**vars(parser.parse_args()))), indent=2))
