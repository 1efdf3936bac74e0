"""Shared fixtures: settings files and a live ``manage.py serve`` on a free port."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

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


class LiveService:
    """A real ``manage.py serve`` process; ``stop`` ends it and checks it exited."""

    def __init__(self, settings_path: Path, db_path: Path, env: dict | None = None):
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
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> LiveService:
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "serve", "--port", str(self.port)],
            cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"serve exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"serve did not become healthy:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)
            raise AssertionError("serve did not stop on SIGTERM within 15 s") from None

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=kwargs.pop("timeout", 30), **kwargs)


@pytest.fixture
def live_service(tmp_path):
    """Factory: ``live_service(models, service=..., engine=..., local=...)`` starts a server."""
    started: list[LiveService] = []

    def start(models: dict, **kwargs) -> LiveService:
        folder = tmp_path / f"svc{len(started)}"
        env = kwargs.pop("env", None)
        settings_path = write_settings(folder, models, **kwargs)
        service = LiveService(settings_path, folder / "db.sqlite3", env=env)
        started.append(service)
        return service.start()

    yield start
    for service in started:
        service.stop()
