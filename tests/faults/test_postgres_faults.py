"""PostgreSQL unavailable in the split: at start (the runtime exits 2 with ``database_unavailable``,
no traceback; the API's /healthz says the runtime is unavailable) and during a settings reload
(the reload succeeds without the database, nothing loaded or configured is lost, and the catalog
mirror catches up once the database is back).

"During" runs the database URL through a TCP forwarder to the real PostgreSQL that the test stops
and restarts, so no private PostgreSQL is needed.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import httpx
import psycopg
import pytest

from tests.conftest import POSTGRES_URL, ROOT, LiveService, free_port, wait_until, write_settings

PG_HOST, PG_PORT = "127.0.0.1", 5432


class Forwarder:
    """127.0.0.1:<port> -> PostgreSQL, until ``stop`` closes the listener and every connection."""

    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.listener: socket.socket | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> Forwarder:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.listener = listener
        self.thread = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        self.thread.start()
        return self

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # stopped
            try:
                upstream = socket.create_connection((PG_HOST, PG_PORT))
            except OSError:
                client.close()
                continue
            with self.lock:
                self.sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for each in (source, sink):
            try:
                each.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stop(self) -> None:
        if self.listener is not None:
            self.listener.close()  # accept() in the thread raises and it ends
            self.thread.join(timeout=5)
            self.listener = None
        with self.lock:
            sockets, self.sockets = self.sockets, []
        for each in sockets:
            try:
                each.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            each.close()


@pytest.fixture
def forwarder():
    started = Forwarder().start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def split_services():
    started: list[LiveService] = []
    yield started
    for service in started:
        service.stop()


def mirror_names(database: str) -> set[str]:
    with psycopg.connect(f"{POSTGRES_URL.rsplit('/', 1)[0]}/{database}") as connection:
        return {row[0] for row in connection.execute("SELECT name FROM models_app_catalogmodel")}


def closed_port_url() -> str:
    return f"postgres://postgres@127.0.0.1:{free_port()}/llmpool"  # nothing listens there


def run_command(tmp_path, command: str, database_url: str) -> subprocess.CompletedProcess:
    settings = write_settings(tmp_path / "conf", {"m": {"backend": "stub", "enabled": True}})
    env = {**os.environ, "LLMPOOL_SETTINGS": str(settings), "LLMPOOL_DATABASE_URL": database_url,
           "LLMPOOL_STATE_DIR": str(tmp_path / "state"), "LLMPOOL_CHANNEL_PREFIX": f"pgfault-{free_port()}:",
           "LLMPOOL_NODE_ID": f"pgfault-{free_port()}"}
    args = [sys.executable, str(ROOT / "manage.py"), command]
    if command == "serve":
        env.pop("LLMPOOL_REDIS_URL", None)
        args += ["--port", str(free_port())]
    else:
        env["LLMPOOL_REDIS_URL"] = os.environ.get("LLMPOOL_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("command", ["runtime", "serve"])
def test_a_database_that_cannot_be_reached_at_start_exits_2_with_database_unavailable(tmp_path, command):
    url = closed_port_url()
    began = time.monotonic()
    result = run_command(tmp_path, command, url)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    port = url.rsplit(":", 1)[1].split("/")[0]
    assert f"database_unavailable: cannot reach the database 127.0.0.1:{port}/llmpool (LLMPOOL_DATABASE_URL)" \
        in result.stderr, output
    assert "Traceback" not in output
    assert time.monotonic() - began < 30


def test_the_api_of_a_split_whose_runtime_cannot_start_reports_it_on_healthz(tmp_path, split_services):
    """The API process itself needs no database for /v1: it starts, and /healthz answers 503
    runtime_unavailable while the runtime is down for want of its database."""
    settings = write_settings(tmp_path / "conf", {"m": {"backend": "stub"}})
    service = LiveService(settings, tmp_path / "db.sqlite3", mode="split")
    service.env["LLMPOOL_DATABASE_URL"] = closed_port_url()
    split_services.append(service)
    with pytest.raises(RuntimeError, match="exited with 2"):
        service.start(timeout=30)
    assert "database_unavailable: cannot reach the database" in service.log()
    # the API alone, as a deployment would still have it running
    service.process = service._spawn(*service.process.args)
    answer = wait_until(lambda: _healthz(service.url), 20)
    assert answer is not None and answer.status_code == 503, service.log()
    assert answer.json()["error"]["code"] == "runtime_unavailable"


def _healthz(url: str) -> httpx.Response | None:
    try:
        return httpx.get(url + "/healthz", timeout=5)
    except httpx.HTTPError:
        return None


def test_a_reload_while_the_database_is_away_succeeds_and_the_mirror_catches_up(tmp_path, forwarder,
                                                                                 split_services):
    models = {"m": {"backend": "stub", "enabled": True}}
    settings = write_settings(tmp_path / "conf", models)
    service = LiveService(settings, tmp_path / "db.sqlite3", mode="split")
    service.env["LLMPOOL_DATABASE_URL"] = f"postgres://postgres@127.0.0.1:{forwarder.port}/{service.database}"
    split_services.append(service)
    service.start()
    with service.client() as http:
        assert wait_until(lambda: http.get("/v1/admin/models").json()["models"][0]["runtime_state"] == "loaded", 20)
        assert mirror_names(service.database) == {"m"}
        before = http.get("/v1/admin/models").json()["models"]

        forwarder.stop()  # the database goes away, and every open connection to it
        data = json.loads(settings.read_text())
        data["models"]["n"] = {"backend": "stub"}
        settings.write_text(json.dumps(data))
        answer = http.post("/v1/admin/settings/reload")
        assert answer.status_code == 200, answer.text
        assert answer.json()["added_models"] == ["n"]

        # nothing loaded or configured is lost; the service goes on serving
        after = {entry["name"]: entry for entry in http.get("/v1/admin/models").json()["models"]}
        assert after["m"]["runtime_state"] == "loaded" and after["m"]["definition"] == before[0]["definition"]
        assert after["n"]["runtime_state"] == "unloaded"
        still = http.post("/v1/responses", json={"model": "m", "input": "still here"})
        assert still.status_code == 200, still.text
        assert http.get("/healthz").status_code == 200
        assert mirror_names(service.database) == {"m"}  # the mirror could not be written yet

        forwarder.start()  # the database is back, on the same address
        assert wait_until(lambda: mirror_names(service.database) == {"m", "n"}, 30), service.log()[-3000:]
        data["models"].pop("n")
        settings.write_text(json.dumps(data))
        again = http.post("/v1/admin/settings/reload")
        assert again.status_code == 200 and again.json()["removed_models"] == ["n"], again.text
        assert mirror_names(service.database) == {"m"}
    assert service.stop() == 0
