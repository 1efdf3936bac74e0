"""One pool over several nodes on this machine: N ``manage.py runtime`` workers with node names of
their own, one API process, one real Redis (a channel prefix of the test's own) and one PostgreSQL
database, all reading one settings file."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import redis

from tests import conftest
from tests.conftest import (
    POSTGRES_URL, REDIS_URL, ROOT, _postgres_admin, _terminate, forget_prefix, free_port, wait_until,
)


def api_command(port: int) -> list[str]:
    """The API process's command: the one every split LiveService runs (``conftest.api_command``)."""
    return conftest.api_command(port)


class Pool:
    def __init__(self, folder: Path, settings: dict, redis_url: str = REDIS_URL):
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.settings_path = folder / "settings.json"
        self.write(settings)
        self.prefix = f"llmpooltest-{uuid.uuid4().hex[:10]}:"
        self.database = f"llmpool_test_{uuid.uuid4().hex[:10]}"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = folder / "pool.log"
        self.env = {
            **os.environ,
            "LLMPOOL_SETTINGS": str(self.settings_path),
            "LLMPOOL_DB_PATH": str(folder / "unused.sqlite3"),
            "LLMPOOL_REDIS_URL": redis_url,
            "LLMPOOL_CHANNEL_PREFIX": self.prefix,
            "LLMPOOL_DATABASE_URL": f"{POSTGRES_URL.rsplit('/', 1)[0]}/{self.database}",
            "PYTHONUNBUFFERED": "1",
        }
        self.nodes: dict[str, subprocess.Popen] = {}
        self.api: subprocess.Popen | None = None
        self.more_apis: list[subprocess.Popen] = []  # started by start_another_api
        self.redis = redis.Redis.from_url(redis_url)
        _postgres_admin(f'CREATE DATABASE "{self.database}"')

    def write(self, settings: dict) -> None:
        self.settings_path.write_text(json.dumps(settings, indent=2))

    def _spawn(self, args: list[str], **env: str) -> subprocess.Popen:
        log = open(self.log_path, "ab")
        return subprocess.Popen(args, cwd=ROOT, env={**self.env, **env}, stdout=log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start_node(self, name: str, timeout: float = 60) -> subprocess.Popen:
        """Start the runtime worker of node ``name``; returns once the registry says it is alive."""
        process = self._spawn([sys.executable, str(ROOT / "manage.py"), "runtime"], LLMPOOL_NODE_ID=name)
        self.nodes[name] = process
        deadline = time.monotonic() + timeout
        while not self.alive(name):
            if process.poll() is not None:
                raise RuntimeError(f"node {name} exited with {process.returncode}:\n{self.log()}")
            assert time.monotonic() < deadline, f"node {name} never announced itself:\n{self.log()}"
            time.sleep(0.1)
        return process

    def alive(self, name: str) -> bool:
        return bool(self.redis.exists(f"{self.prefix}:node-alive:{name}"))

    def start_api(self, timeout: float = 30) -> None:
        self.api = self._start_api(self.port, timeout)

    def start_another_api(self, timeout: float = 30) -> str:
        """A second (third ...) API process of the pool; answers its URL."""
        port = free_port()
        self.more_apis.append(self._start_api(port, timeout))
        return f"http://127.0.0.1:{port}"

    def _start_api(self, port: int, timeout: float) -> subprocess.Popen:
        # Its own node name, which no runtime has: every request is routed by the registry.
        api = self._spawn(api_command(port), LLMPOOL_NODE_ID="api-only")
        deadline = time.monotonic() + timeout
        while True:
            if api.poll() is not None:
                raise RuntimeError(f"the API exited with {api.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    return api
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"the API never became healthy:\n{self.log()}"
            time.sleep(0.1)

    def kill(self, name: str) -> None:
        process = self.nodes.pop(name)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=kwargs.pop("timeout", 30), **kwargs)

    def stop(self) -> None:
        problems = []
        for process in [*self.nodes.values(), self.api, *self.more_apis]:
            try:
                _terminate(process)
            except AssertionError as exc:
                problems.append(str(exc))
        self.nodes.clear()
        _postgres_admin(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
        self.redis.close()
        forget_prefix(self.env["LLMPOOL_REDIS_URL"], self.prefix)
        assert not problems, "\n".join(problems) + "\n" + self.log()[-5000:]


@contextlib.contextmanager
def running_pool(folder: Path, settings: dict, nodes=("alpha", "beta"), ready=None):
    """A pool with a runtime worker for each of ``nodes`` and one API process, stopped (and checked)
    on exit; ``ready``: a condition on the merged listing (``entries``) that must hold within 30 s."""
    pool = Pool(folder, settings)
    try:
        for name in nodes:
            pool.start_node(name)
        pool.start_api()
        if ready is not None:
            with pool.client() as http:
                assert wait_until(lambda: ready(entries(http)), timeout=30), pool.log()
        yield pool
    finally:
        pool.stop()


def all_loaded(listing: dict) -> bool:
    """Every entry of a merged listing is loaded (a ``ready`` for ``running_pool``)."""
    return all(entry["runtime_state"] == "loaded" for entry in listing.values())


def entries(http: httpx.Client) -> dict[tuple[str, str], dict]:
    """GET /v1/admin/models by (model, node)."""
    answer = http.get("/v1/admin/models")
    assert answer.status_code == 200, answer.text
    return {(m["name"], m["node"]): m for m in answer.json()["models"]}


def stream_events(url: str, body: dict, limit: float = 30) -> list:
    """A streamed POST /v1/responses: its event names, an error event as (error, code)."""
    events: list = []
    with httpx.stream("POST", url + "/v1/responses", json={**body, "stream": True}, timeout=limit) as response:
        for line in response.iter_lines():
            if line.startswith("event: "):
                events.append(line.removeprefix("event: "))
            elif line.startswith("data: ") and events and events[-1] == "error":
                events[-1] = ("error", json.loads(line.removeprefix("data: "))["code"])
    return events
