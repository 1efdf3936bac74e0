"""Scheduling seen through the API: replica spreading, live counters, unload with a queue."""
import concurrent.futures
import time

import httpx
import pytest

SLOW = {"backend": "stub", "stub_token_delay_ms": 150, "stub_reply": "one two three four"}  # about 0.6 s


@pytest.fixture
def slow_service(live_service):
    # "single"'s active request must outlast queueing three more, which takes longer in the split
    # (each goes through Redis) on a loaded machine: about 2 s.
    service = live_service({"spread": {**SLOW, "replicas": 2}, "single": {**SLOW, "stub_token_delay_ms": 500}})
    with service.client() as http:
        for name in ("spread", "single"):
            assert http.post(f"/v1/admin/models/{name}/load").json()["runtime_state"] == "loaded"
    return service


def entry(service, name):
    return next(m for m in httpx.get(service.url + "/v1/admin/models").json()["models"] if m["name"] == name)


def ask(service, model, key=None):
    headers = {"X-LLMPool-Fairness-Key": key} if key else {}
    return httpx.post(service.url + "/v1/responses", json={"model": model, "input": "x"}, headers=headers, timeout=30)


def wait_for(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("condition not reached")


def test_requests_spread_over_replicas_and_queue_beyond_the_target(slow_service):
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(ask, slow_service, "spread", key) for key in ("a", "b", "c")]
        live = wait_for(lambda: (e := entry(slow_service, "spread"))["inflight_requests"] == 3 and e)
        assert live["runtime_inflight"] == 2  # one per replica, effective_target_inflight 1
        assert live["queue_depth"] == 1
        keys = {row["key"]: row for row in live["fairness"]["keys"]}
        assert sorted(keys) == ["a", "b", "c"]
        assert sum(row["active"] for row in keys.values()) == 2
        assert sum(row["pending"] for row in keys.values()) == 1
        assert all(f.result().status_code == 200 for f in futures)
    done = entry(slow_service, "spread")
    assert (done["inflight_requests"], done["queue_depth"], done["runtime_inflight"]) == (0, 0, 0)


def test_unload_cancels_the_queue_and_lets_the_active_request_finish(slow_service):
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        active = pool.submit(ask, slow_service, "single", "first")
        wait_for(lambda: entry(slow_service, "single")["runtime_inflight"] == 1)
        queued = [pool.submit(ask, slow_service, "single", f"q{i}") for i in range(3)]
        wait_for(lambda: entry(slow_service, "single")["queue_depth"] == 3)
        unload = pool.submit(httpx.post, slow_service.url + "/v1/admin/models/single/unload", timeout=30)
        for future in queued:
            response = future.result(timeout=30)
            assert response.status_code == 503
            assert response.json()["error"]["code"] == "model_unloading"
            assert response.headers["Retry-After"]
        finished = active.result(timeout=30)
        assert finished.status_code == 200
        assert finished.json()["output"][0]["content"][0]["text"] == "one two three four"
        unloaded = unload.result(timeout=30)
    assert unloaded.json()["runtime_state"] == "unloaded"
    assert unloaded.json()["fairness"] == {"rejected_per_key_limit": 0, "rejected_executor_limit": 0, "keys": []}


def test_target_inflight_is_clamped_for_the_stub(live_service):
    service = live_service({"m": {"backend": "stub", "target_inflight": 4}})
    with service.client() as http:
        row = http.get("/v1/admin/models").json()["models"][0]
        assert (row["configured_target_inflight"], row["effective_target_inflight"]) == (4, 1)
        rejected = http.post("/v1/admin/models/m/load", json={"target_inflight": 2})
        assert rejected.status_code == 400
        assert rejected.json()["error"]["code"] == "invalid_load_request"
