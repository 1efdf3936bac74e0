"""Shared fixtures: settings files and a live ``manage.py serve`` on a free port."""
from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import redis

from runtime.service import RuntimeService
# The shape a LiveService takes when a test does not name one; tests/api runs each module in both.
from tests.service_shape import DEFAULT_MODE

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_settings(folder: Path, models: dict, *, service: dict | None = None, engine: dict | None = None,
                   local: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "settings.json"
    data = {"service": service or {}, "engine": engine or {}, "models": models}
    path.write_text(json.dumps(data, indent=2))
    if local is not None:
        (folder / "local.json").write_text(json.dumps(local, indent=2))
    return path



@pytest.fixture
async def runtime_service(tmp_path):
    """Factory: ``await runtime_service(models)`` -> (a started RuntimeService, its transition events)."""
    started: list[RuntimeService] = []

    async def start(models: dict):
        service = RuntimeService(str(write_settings(tmp_path / f"settings{len(started)}", models)))
        events: list = []
        service.pool.listeners.append(events.append)
        await service.start(load_enabled=False)
        started.append(service)
        return service, events

    yield start
    for service in started:
        await service.shutdown()


REDIS_URL = os.environ.get("LLMPOOL_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_URL = os.environ.get("LLMPOOL_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres")


def forget_prefix(url: str, prefix: str) -> None:
    """Delete a stopped split service's Redis keys (a node's registry record and name stay behind
    on purpose, for a week and for good: docs/deployment.md, "The registry").  Only a test prefix,
    and quietly where the test's Redis is gone."""
    if not prefix.startswith("llmpooltest-"):
        return
    try:
        client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()
    except redis.RedisError:
        pass


# The HTTP server the tests' services run: uvicorn (the default), or daphne with
# LLMPOOL_TEST_SERVER=daphne, so the whole suite can run on either.
TEST_SERVER = os.environ.get("LLMPOOL_TEST_SERVER", "uvicorn")


def api_command(port: int, server: str | None = None) -> list[str]:
    """The command of a split API process on ``port`` (``server``: the suite's by default)."""
    return [sys.executable, str(ROOT / "manage.py"), "api", "--host", "127.0.0.1", "--port", str(port),
            "--server", server or TEST_SERVER]


class LiveService:
    """A real llm-pool on a free port; ``stop`` ends it and checks it exited.

    ``mode="embedded"``: one ``manage.py serve`` process (in-memory layer, SQLite).
    ``mode="split"``: ``manage.py runtime`` plus ``manage.py api`` (see ``api_command``) talking over
    Redis (a channel prefix of their own), with a PostgreSQL database of their own.
    """

    def __init__(self, settings_path: Path, db_path: Path, env: dict | None = None, mode: str | None = None,
                 server: str | None = None):
        self.mode = mode = mode or DEFAULT_MODE["mode"]
        self.server = server or TEST_SERVER  # the HTTP server: uvicorn or daphne
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.settings_path = settings_path
        self.log_path = settings_path.parent / "serve.log"
        self.env = {
            **os.environ,
            "LLMPOOL_SETTINGS": str(settings_path),
            "LLMPOOL_DB_PATH": str(db_path),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        self.process: subprocess.Popen | None = None  # serve, or the API process when split
        self.runtime_process: subprocess.Popen | None = None  # the runtime worker when split
        if mode == "split":
            self.channel_prefix = f"llmpooltest-{uuid.uuid4().hex[:10]}:"
            self.database = f"llmpool_test_{uuid.uuid4().hex[:10]}"
            self.env.update({
                "LLMPOOL_REDIS_URL": REDIS_URL,
                "LLMPOOL_CHANNEL_PREFIX": self.channel_prefix,
                "LLMPOOL_NODE_ID": f"test-{self.port}",
                "LLMPOOL_DATABASE_URL": f"{POSTGRES_URL.rsplit('/', 1)[0]}/{self.database}",
            })
            self.env.update(env or {})  # a test's own Redis or database URL wins over these

    def _spawn(self, *args: str) -> subprocess.Popen:
        log = open(self.log_path, "ab")
        return subprocess.Popen(list(args), cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def start(self, timeout: float = 30.0) -> LiveService:
        if self.mode == "split":
            _postgres_admin(f'CREATE DATABASE "{self.database}"')
            self.runtime_process = self.start_runtime()
            self.process = self._spawn(*api_command(self.port, self.server))
        else:
            self.process = self._spawn(sys.executable, str(ROOT / "manage.py"), "serve", "--port", str(self.port),
                                       "--server", self.server)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for process in (self.process, self.runtime_process):
                if process is not None and process.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"a service process exited with {process.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the service did not become healthy:\n{self.log()}")

    def start_runtime(self) -> subprocess.Popen:
        """(Split mode) start a runtime worker process."""
        return self._spawn(sys.executable, str(ROOT / "manage.py"), "runtime")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> int | None:
        """SIGTERM every process; returns the exit code of serve (or of the runtime when split)."""
        codes, hung = [], []
        for process in (self.runtime_process, self.process):
            try:
                codes.append(_terminate(process))
            except AssertionError as exc:
                codes.append(None)
                hung.append(str(exc))
        if self.mode == "split":
            _postgres_admin(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
            forget_prefix(self.env.get("LLMPOOL_REDIS_URL", REDIS_URL), self.env.get("LLMPOOL_CHANNEL_PREFIX", ""))
        if hung:  # with the stacks the hung process wrote to the log (models_app.diagnostics)
            tail = "\n".join(self.log().splitlines()[-200:])
            raise AssertionError("\n".join(hung) + f"\n--- the service log, last 200 lines ---\n{tail}")
        return codes[0] if self.mode == "split" else codes[1]

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=kwargs.pop("timeout", 30), **kwargs)


def catalog_mirror(service: LiveService) -> dict[str, tuple]:
    """The catalog mirror rows: name -> (backend, enabled, definition, sources).

    SQLite beside the settings file on the embedded default, the service's own PostgreSQL
    database on the split.
    """
    query = "SELECT name, backend, enabled, definition, sources FROM models_app_catalogmodel"
    if service.mode == "split":
        import psycopg

        with psycopg.connect(service.env["LLMPOOL_DATABASE_URL"]) as db:
            rows = db.execute(query).fetchall()
    else:
        with sqlite3.connect(service.settings_path.parent / "db.sqlite3") as db:
            rows = db.execute(query).fetchall()

    def parsed(value):
        return json.loads(value) if isinstance(value, str) else value

    return {name: (backend, bool(enabled), parsed(definition), parsed(sources))
            for name, backend, enabled, definition, sources in rows}


def _terminate(process: subprocess.Popen | None) -> int | None:
    if process is None or process.poll() is not None:
        return process.returncode if process else None
    process.send_signal(signal.SIGTERM)
    try:
        # Managed servers get 10 s between SIGTERM and SIGKILL: leave room for that and the rest.
        return process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGUSR1)  # models_app.diagnostics: its stacks into the log
        time.sleep(1)
        process.kill()
        process.wait(timeout=5)
        raise AssertionError(f"a service process did not stop on SIGTERM within 30 s: {process.args}") from None


def _postgres_admin(statement: str) -> None:
    import psycopg

    with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
        connection.execute(statement)


def model_entry(http: httpx.Client, name: str) -> dict:
    """One AdminModelEntry from GET /v1/admin/models."""
    return next(m for m in http.get("/v1/admin/models").json()["models"] if m["name"] == name)


def wait_until(predicate, timeout: float = 3.0):
    """Poll ``predicate`` until it returns something truthy or ``timeout`` passes; return its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


@pytest.fixture
def service_mode() -> str:
    """The shape of services started by ``live_service`` (see DEFAULT_MODE)."""
    return DEFAULT_MODE["mode"]


@pytest.fixture
def live_service(tmp_path, service_mode):
    """Factory: ``live_service(models, service=..., engine=..., local=...)`` starts a server."""
    started: list[LiveService] = []

    def start(models: dict, **kwargs) -> LiveService:
        folder = tmp_path / f"svc{len(started)}"
        env = kwargs.pop("env", None)
        mode = kwargs.pop("mode", service_mode)
        settings_path = write_settings(folder, models, **kwargs)
        service = LiveService(settings_path, folder / "db.sqlite3", env=env, mode=mode)
        started.append(service)
        return service.start()

    yield start
    for service in started:
        service.stop()


@contextmanager
def service_with_loaded_models(
    folder: Path, models: dict, *, unloaded: tuple[str, ...] = ("cold",), admin_token: str | None = None, **settings
) -> Iterator[LiveService]:
    """A live service over ``models`` (``settings`` as ``write_settings`` takes them) with every
    model loaded but those named ``unloaded``; stopped when the block ends."""
    live = LiveService(write_settings(folder, models, **settings), folder / "db.sqlite3").start()
    headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else None
    try:
        with live.client(headers=headers, timeout=60) as admin:
            for name in models:
                if name not in unloaded:
                    answer = admin.post(f"/v1/admin/models/{name}/load")
                    assert answer.json()["runtime_state"] == "loaded", answer.text
        yield live
    finally:
        live.stop()


@contextmanager
def openai_client(live: LiveService, api_key: str = "unused"):
    """The official openai client on ``live`` (no retries, so each answer is the first)."""
    import openai

    with openai.OpenAI(base_url=live.url + "/v1", api_key=api_key, max_retries=0) as client:
        yield client


@contextmanager
def serving_http(handler):
    """A threaded stdlib HTTP server of ``handler`` on a free port (an upstream a test fakes)."""
    from http.server import ThreadingHTTPServer

    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextmanager
def forwarding_service(folder: Path, upstream_port: int) -> Iterator[LiveService]:
    """A live service with one loaded openai_remote model ``remote`` (``upstream-model`` at the
    upstream on ``upstream_port``): a model whose engine forwards requests."""
    remote = {"backend": "openai_remote", "remote_base_url": f"http://127.0.0.1:{upstream_port}/v1",
              "remote_model": "upstream-model"}
    live = LiveService(write_settings(folder, {"remote": remote}, service={"allow_remote_execution": True}),
                       folder / "db.sqlite3").start()
    try:
        with live.client() as http:
            assert http.post("/v1/admin/models/remote/load").json()["runtime_state"] == "loaded"
        yield live
    finally:
        live.stop()
