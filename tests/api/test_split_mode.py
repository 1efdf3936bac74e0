"""The production split: a runtime worker and API processes over Redis, PostgreSQL as database."""
import concurrent.futures
import json
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
import redis

from tests.conftest import REDIS_URL, ROOT

@pytest.fixture(scope="module", autouse=True)
def api_shape():
    """These tests name their shape themselves: run them once, not once per shape."""
    return "split"


SLOW = {"backend": "stub", "stub_token_delay_ms": 100, "stub_reply": "a b c d e f g h i j"}


def keys(prefix: str) -> list[bytes]:
    return list(redis.Redis.from_url(REDIS_URL).scan_iter(match=f"{prefix}*"))


def stream_events(url: str, body: dict, limit: float = 20):
    events = []
    with httpx.stream("POST", url + "/v1/responses", json={**body, "stream": True}, timeout=limit) as response:
        for line in response.iter_lines():
            if line.startswith("event: "):
                events.append(line.removeprefix("event: "))
            elif line.startswith("data: ") and events[-1] == "error":
                events[-1] = ("error", json.loads(line.removeprefix("data: "))["code"])
    return events


def test_split_serves_loads_and_streams(live_service):
    service = live_service({"m": dict(SLOW, stub_token_delay_ms=1)}, mode="split")
    with service.client() as http:
        assert http.post("/v1/admin/models/m/load").json()["runtime_state"] == "loaded"
        answer = http.post("/v1/responses", json={"model": "m", "input": "x"})
        assert answer.json()["output"][0]["content"][0]["text"] == "a b c d e f g h i j"
    events = stream_events(service.url, {"model": "m", "input": "x"})
    assert events.count("response.output_text.delta") == 10 and events[-1] == "response.completed"


def test_a_second_runtime_worker_for_the_node_is_refused(live_service):
    service = live_service({"m": {"backend": "stub"}}, mode="split")
    second = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "runtime"], cwd=ROOT, env=service.env,
        capture_output=True, text=True, timeout=30,
    )
    assert second.returncode == 3
    assert "runtime_already_running" in second.stderr
    assert httpx.get(service.url + "/healthz").status_code == 200


def test_killing_the_worker_mid_stream_ends_the_stream_with_an_error_then_a_restart_recovers(live_service):
    service = live_service({"m": dict(SLOW, enabled=True)}, mode="split")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        stream = pool.submit(stream_events, service.url, {"model": "m", "input": "x"})
        time.sleep(0.4)
        service.runtime_process.send_signal(signal.SIGKILL)
        began = time.monotonic()
        events = stream.result(timeout=15)
    assert time.monotonic() - began < 5
    assert events[-1] == ("error", "runtime_unavailable")
    assert "response.completed" not in events
    down = httpx.get(service.url + "/v1/admin/models", timeout=10)
    assert down.status_code == 503 and down.json()["error"]["code"] == "runtime_unavailable"
    assert down.headers["Retry-After"]
    # The dead owner's lock expires (10 s at most); a new worker then takes over and loads enabled models.
    service.runtime_process = _start_worker_once_the_lock_expires(service)
    deadline = time.monotonic() + 60
    while True:
        response = httpx.get(service.url + "/v1/admin/models", timeout=10)
        if response.status_code == 200 and response.json()["models"][0]["runtime_state"] == "loaded":
            break
        assert time.monotonic() < deadline, service.log()
        time.sleep(0.2)
    answer = httpx.post(service.url + "/v1/responses", json={"model": "m", "input": "x"}, timeout=20)
    assert answer.status_code == 200, answer.text


def _start_worker_once_the_lock_expires(service) -> subprocess.Popen:
    """Start workers until one takes the node's lock (earlier ones exit with 3 while the dead
    owner's lock lives).  A worker has the lock once it says it started: one still running after a
    few seconds may only be slow to get that far (on a loaded machine it then exited 3)."""
    deadline = time.monotonic() + 60
    while True:
        started = service.log().count(WORKER_STARTED)
        worker = service.start_runtime()
        while worker.poll() is None and service.log().count(WORKER_STARTED) == started:
            assert time.monotonic() < deadline, service.log()
            time.sleep(0.1)
        if worker.poll() is None:
            return worker
        assert worker.returncode == 3, service.log()
        assert time.monotonic() < deadline, service.log()


WORKER_STARTED = "llm-pool runtime worker for node"


def test_nothing_is_left_in_redis_after_many_requests(live_service):
    service = live_service({"m": {"backend": "stub", "enabled": True}}, mode="split")
    with service.client() as http:
        http.post("/v1/admin/models/m/load")
        baseline = sorted(keys(service.channel_prefix))

        local = threading.local()  # one kept-alive client per thread: the requests, not connection set-up, are measured

        def one(index: int) -> int:
            if not hasattr(local, "http"):
                local.http = service.client(timeout=30)
                clients.append(local.http)
            body = {"model": "m", "input": f"request {index}", "stream": index % 2 == 0}
            return local.http.post("/v1/responses", json=body).status_code

        clients: list[httpx.Client] = []
        try:
            with concurrent.futures.ThreadPoolExecutor(16) as pool:
                codes = list(pool.map(one, range(1000)))
        finally:
            for client in clients:
                client.close()
    assert codes.count(200) == 1000
    time.sleep(0.5)
    # The usage pruner's election lease (one per pool, with a life of its own) may be taken at
    # any time by an API process; nothing else may stay behind the requests.
    lease = f"{service.channel_prefix}:usage-pruner".encode()
    left = sorted(keys(service.channel_prefix))
    if lease in left:
        assert redis.Redis.from_url(REDIS_URL).ttl(lease) > 0
    assert [key for key in left if key != lease] == [key for key in baseline if key != lease]


def test_a_stopped_test_service_leaves_no_key_in_redis(live_service):
    """The node's registry record and name outlive a worker on purpose (docs/deployment.md, "The
    registry"); the suite's services use a prefix each, so their stop deletes that prefix's keys."""
    service = live_service({"m": {"backend": "stub", "enabled": True}}, mode="split")
    with service.client() as http:
        assert http.post("/v1/responses", json={"model": "m", "input": "hi"}).status_code == 200
    assert any(key.endswith(b":node-names") for key in keys(service.channel_prefix))
    service.stop()
    assert keys(service.channel_prefix) == []
