"""Helpers of the admin workbench tests."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from models_app.transport.messages import EVENT_TRANSITION
from tests.conftest import ROOT, LiveService

CHROMIUM = os.environ.get("LLMPOOL_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# The admin token of the shared services (GET /v1/admin/* needs it; the admin pages use the staff login).
TOKEN = "workbench-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# The models of the shared services; every test module works on its own ones.
WORKBENCH_MODELS = {
    # the browser tests
    "stub-slow": {"backend": "stub", "stub_load_seconds": 2, "stub_unload_seconds": 1.5, "replica_max": 2,
                  "stub_vram_mib": 512},
    "stub-broken": {"backend": "stub", "stub_load_seconds": 0.3, "stub_fail_load": "weights are corrupt"},
    "stub-list": {"backend": "stub", "stub_load_seconds": 0.5},
    "stub-reload": {"backend": "stub", "stub_reply": "before"},
    "gguf-missing": {"backend": "llama_cpp", "model_path": "/nonexistent/model.gguf", "gguf_n_ctx": 4096},
    # the SSE tests
    "sse-quick": {"backend": "stub", "stub_load_seconds": 0.2, "stub_unload_seconds": 0.1},
    "sse-broken": {"backend": "stub", "stub_load_seconds": 0.1, "stub_fail_load": "weights are corrupt"},
    "sse-other": {"backend": "stub"},
    # the redaction tests: secrets no page may show
    "remote-keyed": {"backend": "openai_remote", "remote_base_url": "http://127.0.0.1:9/v1", "remote_model": "gpt",
                     "remote_api_key": "sk-workbench-secret", "remote_headers": {"X-Api-Key": "header-wb-secret"}},
    "server-env": {"backend": "llama_server", "model_path": "/nonexistent/m.gguf",
                   "llama_server_env": {"HF_TOKEN": "hf_workbench_secret"}},
}
WORKBENCH_SECRETS = ("sk-workbench-secret", "header-wb-secret", "hf_workbench_secret")
STAFF = {"username": "operator", "password": "op-secret-pw", "email": "operator@example.com"}


def create_superuser(service: LiveService, **credentials) -> dict:
    """``manage.py createsuperuser --noinput`` against the live service's database, as an operator would."""
    credentials = {**STAFF, **credentials}
    env = {
        **service.env,
        "DJANGO_SUPERUSER_USERNAME": credentials["username"],
        "DJANGO_SUPERUSER_PASSWORD": credentials["password"],
        "DJANGO_SUPERUSER_EMAIL": credentials["email"],
    }
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "createsuperuser", "--noinput"],
        cwd=ROOT, env=env, check=True, capture_output=True, timeout=60,
    )
    return credentials


class EventStream:
    """One SSE subscription; it is in place once the opening comment has been read."""

    def __init__(self, service: LiveService, headers: dict | None = None):
        self.client = httpx.Client(base_url=service.url, timeout=httpx.Timeout(15, read=10))
        headers = {"Accept": "text/event-stream", **AUTH, **(headers or {})}
        self._context = self.client.stream("GET", "/v1/admin/events", headers=headers)
        self.response = self._context.__enter__()
        assert self.response.status_code == 200
        assert self.response.headers["content-type"].startswith("text/event-stream")
        self.lines = self.response.iter_lines()
        assert next(self.lines).startswith(":")
        assert next(self.lines) == ""

    def next_event(self) -> tuple[str, dict]:
        name, data = None, []
        for line in self.lines:
            if line.startswith(":"):
                continue
            if line == "":
                if name is not None:
                    return name, json.loads("\n".join(data))
                continue
            field, _, value = line.partition(": ")
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)
        raise AssertionError("the stream ended")

    def transitions(self, count: int) -> list[dict]:
        found = []
        for _ in range(count):
            name, data = self.next_event()
            assert name == EVENT_TRANSITION
            found.append(data)
        return found

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._context.__exit__(None, None, None)
        self.client.close()


@contextmanager
def logged_in_page(browser, service: LiveService, path: str, height: int = 1100) -> Iterator:
    """A page of a new browser context, logged in through the admin login form on its way to
    ``path``; closed afterwards, and failing the test if a script error happened on it."""
    context = browser.new_context(viewport={"width": 1300, "height": height})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(service.url + path)
    page.fill("#id_username", service.staff["username"])
    page.fill("#id_password", service.staff["password"])
    page.click("input[type=submit]")
    yield page
    context.close()
    assert not errors, errors
