"""Redis restarted under load in the split: requests fail fast with 503 ``runtime_unavailable``
while it is away, the service recovers by itself once it is back (no llm-pool process restarted),
and no reply meant for one request reaches another.

The test runs a Redis of its own on a free port (the machine's shared one on 6379 serves other
tests) and kills and restarts that one.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
import redis

from tests.conftest import ROOT, free_port, wait_until, write_settings

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")

FAST_FAIL_SECONDS = 5.0  # well under a client's patience; the reply timeout is 2 s
RECOVERY_SECONDS = 30.0


class PrivateRedis:
    def __init__(self, folder):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.folder = folder
        self.process: subprocess.Popen | None = None

    def start(self) -> PrivateRedis:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.folder)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url)
        assert wait_until(lambda: self._pings(client), 10), "the private redis-server did not start"
        client.close()
        return self

    @staticmethod
    def _pings(client) -> bool:
        try:
            return client.ping()
        except redis.RedisError:
            return False

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


@pytest.fixture
def private_redis(tmp_path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path).start()
    try:
        yield server
    finally:
        server.kill()


def ask(url: str, text: str, stream: bool) -> tuple[int, str, float]:
    """(status, the reply text or the error code, seconds taken) of one request echoing ``text``."""
    began = time.monotonic()
    body = {"model": "m", "input": text, "stream": stream}
    try:
        if not stream:
            answer = httpx.post(url + "/v1/responses", json=body, timeout=30)
            data = answer.json()
            if answer.status_code == 200:
                return 200, data["output"][0]["content"][0]["text"], time.monotonic() - began
            return answer.status_code, data["error"]["code"], time.monotonic() - began
        with httpx.stream("POST", url + "/v1/responses", json=body, timeout=30) as answer:
            if answer.status_code != 200:
                answer.read()
                return answer.status_code, answer.json()["error"]["code"], time.monotonic() - began
            text_out, last = "", None
            for line in answer.iter_lines():
                if line.startswith("data: "):
                    last = json.loads(line.removeprefix("data: "))
                    if last.get("type") == "response.output_text.delta":
                        text_out += last["delta"]
            if last and last.get("type") == "response.completed":
                return 200, text_out, time.monotonic() - began
            code = (last or {}).get("code") or (last or {}).get("response", {}).get("error", {}).get("code")
            return 599, str(code), time.monotonic() - began  # a stream that ended with an error event
    except httpx.HTTPError as exc:
        return 0, type(exc).__name__, time.monotonic() - began


def test_redis_restarted_under_load_fails_fast_then_recovers_without_a_restart(live_service, private_redis):
    models = {"m": {"backend": "stub", "enabled": True, "stub_token_delay_ms": 20, "target_inflight": 8}}
    service = live_service(models, mode="split", env={"LLMPOOL_REDIS_URL": private_redis.url})
    api_pid, runtime_pid = service.process.pid, service.runtime_process.pid
    assert wait_until(lambda: ask(service.url, "warm up", False)[:2] == (200, "warm up"), 20)

    results: list[tuple[str, tuple[int, str, float]]] = []
    stop = threading.Event()

    def load(worker: int) -> None:
        index = 0
        while not stop.is_set():
            text = f"w{worker} r{index} {uuid.uuid4().hex[:8]}"
            results.append((text, ask(service.url, text, stream=index % 2 == 1)))
            index += 1

    workers = [threading.Thread(target=load, args=(n,)) for n in range(6)]
    for thread in workers:
        thread.start()
    try:
        assert wait_until(lambda: sum(r[0] == 200 for _, r in results) >= 20, 30), results[-5:]
        private_redis.kill()
        down_at = len(results)
        # While Redis is away every new request is refused at once, with the envelope.
        outage = [ask(service.url, f"during {n}", stream=n % 2 == 1) for n in range(6)]
        for status, code, seconds in outage:
            assert (status, code) in ((503, "runtime_unavailable"), (599, "runtime_unavailable")), outage
            assert seconds < FAST_FAIL_SECONDS, outage
        private_redis.start()  # the same port, empty
        back_at = time.monotonic()
        recovered = wait_until(lambda: ask(service.url, "after", False)[:2] == (200, "after"), RECOVERY_SECONDS)
        assert recovered, (service.log()[-4000:], ask(service.url, "after", False))
        recovery_seconds = time.monotonic() - back_at
        after = len(results)
        wait_until(lambda: sum(r[0] == 200 for _, r in results[after:]) >= 20, 30)
    finally:
        stop.set()
        for thread in workers:
            thread.join(timeout=60)
    print(f"recovered {recovery_seconds:.2f} s after Redis was back")

    # Every request either got its own reply or a clean error: no reply meant for another.
    for text, (status, body, _) in results:
        if status == 200:
            assert body == text, (text, body)
        else:
            assert body == "runtime_unavailable", (text, status, body)
    during = results[down_at:after]
    assert any(status != 200 for _, (status, _, _) in during), "the outage was not seen by the load"
    assert sum(r[0] == 200 for _, r in results[after:]) >= 20
    # The same processes served before and after: nothing was restarted.
    assert service.process.poll() is None and service.runtime_process.poll() is None, service.log()[-4000:]
    assert (service.process.pid, service.runtime_process.pid) == (api_pid, runtime_pid)
    # The runtime took its owner lock again in the empty Redis (models_app/host/lock.py), so a
    # second worker for the node would still be refused.
    fresh = redis.Redis.from_url(private_redis.url)
    try:
        owner = wait_until(lambda: list(fresh.scan_iter(match="*runtime-owner*")), 10)
        assert owner, "the runtime did not take its owner lock again"
        assert f":{runtime_pid}:".encode() in fresh.get(owner[0])
    finally:
        fresh.close()
    with service.client() as http:
        assert http.get("/healthz").status_code == 200
        entry = http.get("/v1/admin/models").json()["models"][0]
        assert entry["runtime_state"] == "loaded"
        # The generations whose replies Redis lost freed their slots: nothing is left running.
        idle = wait_until(lambda: http.get("/v1/admin/models").json()["models"][0]["inflight_requests"] == 0, 10)
        assert idle, http.get("/v1/admin/models").json()["models"][0]
    assert service.stop() == 0


def test_a_runtime_worker_that_cannot_reach_redis_at_start_exits_2_saying_so(tmp_path):
    settings = write_settings(tmp_path / "conf", {"m": {"backend": "stub", "enabled": True}})
    port = free_port()  # nothing listens there
    env = {**os.environ, "LLMPOOL_SETTINGS": str(settings), "LLMPOOL_DB_PATH": str(tmp_path / "db.sqlite3"),
           "LLMPOOL_STATE_DIR": str(tmp_path / "state"), "LLMPOOL_REDIS_URL": f"redis://:secret@127.0.0.1:{port}/0"}
    env.pop("LLMPOOL_DATABASE_URL", None)
    result = subprocess.run([sys.executable, str(ROOT / "manage.py"), "runtime"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert f"runtime_unavailable: cannot reach Redis at 127.0.0.1:{port} (LLMPOOL_REDIS_URL)" in result.stderr
    assert "Traceback" not in output and "secret" not in output


@pytest.mark.parametrize(("command", "alone"), [("api", "an API process alone reaches the runtime"),
                                                ("runtime", "the runtime worker runs alone")])
def test_a_command_of_the_split_without_a_redis_url_exits_2_saying_so(tmp_path, command, alone):
    settings = write_settings(tmp_path / "conf", {"m": {"backend": "stub", "enabled": True}})
    env = {**os.environ, "LLMPOOL_SETTINGS": str(settings), "LLMPOOL_DB_PATH": str(tmp_path / "db.sqlite3"),
           "LLMPOOL_STATE_DIR": str(tmp_path / "state")}
    for name in ("LLMPOOL_REDIS_URL", "LLMPOOL_DATABASE_URL"):
        env.pop(name, None)
    result = subprocess.run([sys.executable, str(ROOT / "manage.py"), command], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"runtime_unavailable: {alone} only over Redis; set LLMPOOL_REDIS_URL" in result.stderr
