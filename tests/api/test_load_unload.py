"""POST /v1/admin/models/{name}/load and /unload: the lifecycle over real HTTP.

One live service (module scope); every test works on its own stub model, so
the tests do not see each other's state.
"""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from tests.conftest import LiveService, model_entry, write_settings

STATES = {"unloaded", "loading", "loaded", "unloading", "failed"}
STREAM_REPLY = "one two three four five six seven eight nine ten"

MODELS = {
    "cycle": {"backend": "stub", "stub_load_seconds": 0.8, "stub_unload_seconds": 0.8},
    "failing": {"backend": "stub", "stub_load_seconds": 1.0, "stub_fail_load": "weights are corrupt"},
    "replica-fail": {
        "backend": "stub",
        "replicas": 3,
        "replica_max": 3,
        "stub_fail_load": "replica broke",
        "stub_fail_replica": 1,
    },
    "scalable": {"backend": "stub", "replicas": 1, "replica_max": 3, "stub_vram_mib": 10},
    "idempotent": {"backend": "stub", "stub_load_seconds": 1.0, "replica_max": 2},
    "slow-unload": {"backend": "stub", "stub_unload_seconds": 1.5},
    "slow-load": {"backend": "stub", "stub_load_seconds": 1.5},
    "racer": {"backend": "stub", "stub_load_seconds": 0.05, "stub_unload_seconds": 0.05},
    "herd": {"backend": "stub", "stub_load_seconds": 1.5},
    "streamer": {"backend": "stub", "stub_token_delay_ms": 100, "stub_reply": STREAM_REPLY},
    "states": {"backend": "stub", "stub_load_seconds": 1.0},
    "broken": {"backend": "stub", "stub_fail_load": "cannot start"},
    "gguf": {"model_path": "/nonexistent/model.gguf", "backend": "llama_cpp"},
    "lls": {
        "model_path": "/nonexistent/model.gguf",
        "backend": "llama_server",
        "target_inflight": 2,
        "llama_server_binary": "/nonexistent/llama-server",
    },
    "trt": {
        "backend": "trtllm_serve",
        "trtllm_serve_model": "/nonexistent/engine",
        "trtllm_serve_binary": "/nonexistent/trtllm-serve",
    },
}


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape):
    folder = tmp_path_factory.mktemp("load_unload")
    live = LiveService(write_settings(folder, MODELS), folder / "db.sqlite3").start()
    yield live
    assert live.stop() == 0


def wait_for_state(http: httpx.Client, name: str, state: str, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        current = model_entry(http, name)
        if current["runtime_state"] == state:
            return current
        time.sleep(0.01)
    raise AssertionError(f"{name} did not reach {state}; it is {current['runtime_state']}")


def observe_states(service: LiveService, name: str, action) -> tuple[list[str], httpx.Response]:
    """Run ``action(client)`` in a thread and record every distinct state seen meanwhile."""
    with service.client() as watcher, service.client(timeout=15) as actor, ThreadPoolExecutor(1) as pool:
        seen = [model_entry(watcher, name)["runtime_state"]]
        running = pool.submit(action, actor)
        while not running.done():
            state = model_entry(watcher, name)["runtime_state"]
            if state != seen[-1]:
                seen.append(state)
            time.sleep(0.01)
        state = model_entry(watcher, name)["runtime_state"]
        if state != seen[-1]:
            seen.append(state)
        return seen, running.result()


def post_load(http: httpx.Client, name: str, body=None) -> httpx.Response:
    return http.post(f"/v1/admin/models/{name}/load", json=body) if body is not None else http.post(
        f"/v1/admin/models/{name}/load"
    )


def ask(http: httpx.Client, name: str, text: str = "hello there") -> httpx.Response:
    return http.post("/v1/responses", json={"model": name, "input": text})


def assert_error(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code
    assert set(response.json()) == {"error"} and set(error) == {"code", "message", "param"}
    assert error["message"]
    return error


# ---- transitions -------------------------------------------------------------------------


def test_load_then_unload_walks_the_exact_transition_sequence(service):
    seen, loaded = observe_states(service, "cycle", lambda c: post_load(c, "cycle"))
    assert seen == ["unloaded", "loading", "loaded"]
    assert loaded.status_code == 200
    body = loaded.json()
    assert (body["runtime_state"], body["is_loaded"], body["loaded_replicas"]) == ("loaded", True, 1)
    assert body["last_error"] is None

    seen, unloaded = observe_states(service, "cycle", lambda c: c.post("/v1/admin/models/cycle/unload"))
    assert seen == ["loaded", "unloading", "unloaded"]
    assert unloaded.status_code == 200
    body = unloaded.json()
    assert (body["runtime_state"], body["is_loaded"], body["loaded_replicas"]) == ("unloaded", False, 0)


def test_failed_load_answers_200_and_keeps_last_error_until_the_next_load(service, http):
    seen, failed = observe_states(service, "failing", lambda c: post_load(c, "failing"))
    assert seen == ["unloaded", "loading", "failed"]
    assert failed.status_code == 200
    body = failed.json()
    assert (body["runtime_state"], body["is_loaded"], body["loaded_replicas"]) == ("failed", False, 0)
    assert "weights are corrupt" in body["last_error"]
    assert model_entry(http, "failing")["last_error"] == body["last_error"]

    # Unloading a failed model is a 200 no-op that keeps the error for inspection.
    unloaded = http.post("/v1/admin/models/failing/unload")
    assert unloaded.status_code == 200
    assert (unloaded.json()["runtime_state"], unloaded.json()["last_error"]) == ("failed", body["last_error"])

    # The next load clears it while loading (then the stub fails again and sets it anew).
    with ThreadPoolExecutor(1) as pool, service.client(timeout=15) as actor:
        again = pool.submit(post_load, actor, "failing")
        loading = wait_for_state(http, "failing", "loading")
        assert loading["last_error"] is None
        assert again.result().json()["runtime_state"] == "failed"
    assert "weights are corrupt" in model_entry(http, "failing")["last_error"]


def test_replicas_are_all_or_nothing(http):
    failed = post_load(http, "replica-fail")
    assert failed.status_code == 200
    body = failed.json()
    assert (body["runtime_state"], body["loaded_replicas"], body["is_loaded"]) == ("failed", 0, False)
    assert "replica 2 of 3" in body["last_error"] and "replica broke" in body["last_error"]
    # Only replica index 1 fails: a one-replica load of the same model succeeds.
    single = post_load(http, "replica-fail", {"replicas": 1})
    assert single.status_code == 200
    assert (single.json()["runtime_state"], single.json()["loaded_replicas"]) == ("loaded", 1)
    assert single.json()["last_error"] is None
    assert http.post("/v1/admin/models/replica-fail/unload").json()["runtime_state"] == "unloaded"


def test_replicas_in_the_body_change_the_entry_not_the_definition(http):
    loaded = post_load(http, "scalable", {"replicas": 2})
    assert loaded.status_code == 200
    body = loaded.json()
    assert (body["runtime_state"], body["replicas"], body["loaded_replicas"]) == ("loaded", 2, 2)
    assert body["definition"]["replicas"] == 1
    assert (body["vram_estimate_mib"], body["vram_estimate_replica_count"]) == (20, 2)
    assert body["load_override"] == {}
    unloaded = http.post("/v1/admin/models/scalable/unload").json()
    assert (unloaded["replicas"], unloaded["loaded_replicas"], unloaded["vram_estimate_mib"]) == (1, 0, 10)


def test_replicas_above_replica_max_are_rejected(http):
    before = model_entry(http, "scalable")
    error = assert_error(post_load(http, "scalable", {"replicas": 4}), 400, "invalid_load_request")
    assert error["param"] == "replicas"
    assert model_entry(http, "scalable") == before


def test_target_inflight_is_rejected_for_a_stub(http):
    before = model_entry(http, "scalable")
    error = assert_error(post_load(http, "scalable", {"target_inflight": 2}), 400, "invalid_load_request")
    assert error["param"] == "target_inflight"
    assert model_entry(http, "scalable") == before


# ---- idempotent loads, state conflicts ----------------------------------------------------


def test_load_while_loading_answers_the_current_state_without_a_second_load(service, http):
    with ThreadPoolExecutor(1) as pool, service.client(timeout=15) as actor:
        first = pool.submit(post_load, actor, "idempotent")
        wait_for_state(http, "idempotent", "loading")
        joined = post_load(http, "idempotent")
        assert joined.status_code == 200
        assert joined.json()["runtime_state"] == "loading"
        assert joined.elapsed.total_seconds() < 0.8
        assert_error(post_load(http, "idempotent", {"replicas": 2}), 400, "invalid_load_request")
        assert first.result().json()["runtime_state"] == "loaded"


def test_load_while_loaded_answers_at_once_and_rejects_new_overrides(http):
    assert post_load(http, "idempotent").json()["runtime_state"] == "loaded"
    for body in (None, {}, {"replicas": 1}):
        again = post_load(http, "idempotent", body)
        assert again.status_code == 200
        assert again.json()["runtime_state"] == "loaded"
        # stub_load_seconds is 1.0: a new load could not answer this fast.
        assert again.elapsed.total_seconds() < 0.8
    before = model_entry(http, "idempotent")
    error = assert_error(post_load(http, "idempotent", {"replicas": 2}), 400, "invalid_load_request")
    assert "unload" in error["message"]
    assert model_entry(http, "idempotent") == before
    assert http.post("/v1/admin/models/idempotent/unload").json()["runtime_state"] == "unloaded"


def test_load_while_unloading_conflicts_and_unload_while_unloading_is_200(service, http):
    assert post_load(http, "slow-unload").json()["runtime_state"] == "loaded"
    with ThreadPoolExecutor(1) as pool, service.client(timeout=15) as actor:
        unloading = pool.submit(lambda: actor.post("/v1/admin/models/slow-unload/unload"))
        wait_for_state(http, "slow-unload", "unloading")
        assert_error(post_load(http, "slow-unload"), 409, "model_state_conflict")
        again = http.post("/v1/admin/models/slow-unload/unload")
        assert again.status_code == 200
        assert again.json()["runtime_state"] == "unloading"
        assert unloading.result().json()["runtime_state"] == "unloaded"


def test_unload_while_loading_conflicts(service, http):
    with ThreadPoolExecutor(1) as pool, service.client(timeout=15) as actor:
        loading = pool.submit(post_load, actor, "slow-load")
        wait_for_state(http, "slow-load", "loading")
        assert_error(http.post("/v1/admin/models/slow-load/unload"), 409, "model_state_conflict")
        assert loading.result().json()["runtime_state"] == "loaded"
    assert http.post("/v1/admin/models/slow-load/unload").json()["runtime_state"] == "unloaded"


def test_unload_when_unloaded_is_200(http):
    answer = http.post("/v1/admin/models/broken/unload")
    assert answer.status_code == 200
    assert answer.json()["runtime_state"] == "unloaded"


@pytest.mark.parametrize("action", ["load", "unload"])
def test_unknown_model_is_404(http, action):
    assert_error(http.post(f"/v1/admin/models/no-such-model/{action}"), 404, "unknown_model")


# ---- engines that cannot load here ---------------------------------------------------------
# A backend whose engine is not in this build, or whose model file / server binary does not
# exist (the definitions point nowhere), must end in failed with a last_error, never a crash.


@pytest.mark.parametrize(
    "name, body",
    [
        ("gguf", {"gguf_n_ctx": 8192, "gguf_type_k": None}),
        ("lls", {"replicas": 1, "target_inflight": 4}),
        ("trt", {"target_inflight": 2, "trtllm_kv_cache_dtype": "fp8"}),
    ],
)
def test_a_load_that_cannot_succeed_fails_cleanly_and_the_runtime_keeps_serving(http, name, body):
    failed = post_load(http, name, body)
    assert failed.status_code == 200
    result = failed.json()
    assert (result["runtime_state"], result["loaded_replicas"], result["is_loaded"]) == ("failed", 0, False)
    assert isinstance(result["last_error"], str) and result["last_error"].strip()
    assert result["load_override"] == {}
    assert result["replicas"] == result["definition"]["replicas"]
    # The runtime goes on: another model loads and answers.
    assert post_load(http, "scalable").json()["runtime_state"] == "loaded"
    answer = ask(http, "scalable", "still alive")
    assert answer.status_code == 200
    assert answer.json()["output"][0]["content"][0]["text"] == "still alive"
    assert http.post("/v1/admin/models/scalable/unload").json()["runtime_state"] == "unloaded"


# ---- races -------------------------------------------------------------------------------


def test_concurrent_loads_start_exactly_one_load(service, http):
    barrier = threading.Barrier(20)

    def call(_index):
        with service.client(timeout=15) as client:
            barrier.wait()
            return post_load(client, "herd")

    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(call, range(20)))
    assert all(a.status_code == 200 for a in answers)
    assert {a.json()["runtime_state"] for a in answers} <= {"loading", "loaded"}
    # stub_load_seconds is 1.5: exactly one caller waited for a load, the others joined it.
    waited = [a for a in answers if a.elapsed.total_seconds() >= 1.2]
    assert len(waited) == 1
    assert waited[0].json()["runtime_state"] == "loaded"
    final = model_entry(http, "herd")
    assert (final["runtime_state"], final["loaded_replicas"]) == ("loaded", 1)
    assert http.post("/v1/admin/models/herd/unload").json()["runtime_state"] == "unloaded"


@pytest.mark.parametrize("round_", range(3))
def test_concurrent_load_and_unload_calls_end_in_a_legal_state(service, http, round_):
    barrier = threading.Barrier(20)

    def call(index):
        action = "load" if index % 2 == 0 else "unload"
        with service.client(timeout=15) as client:
            barrier.wait()
            return action, client.post(f"/v1/admin/models/racer/{action}")

    started = time.monotonic()
    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(call, range(20)))
    assert time.monotonic() - started < 10, "the calls hung"
    for action, answer in answers:
        assert answer.status_code in (200, 409), (action, answer.text)
        if answer.status_code == 409:
            assert answer.json()["error"]["code"] == "model_state_conflict"
        else:
            assert answer.json()["runtime_state"] in STATES - {"failed"}
            assert answer.json()["last_error"] is None
    # Once the last pending transition settles the model rests in a consistent state.
    deadline = time.monotonic() + 5
    while (final := model_entry(http, "racer"))["runtime_state"] in ("loading", "unloading"):
        assert time.monotonic() < deadline, "the model never settled"
        time.sleep(0.02)
    assert final["runtime_state"] in ("loaded", "unloaded")
    assert final["loaded_replicas"] == (1 if final["runtime_state"] == "loaded" else 0)
    assert final["is_loaded"] is (final["runtime_state"] == "loaded")
    # No deadlock: the model still loads, answers and unloads.
    assert post_load(http, "racer").json()["runtime_state"] == "loaded"
    assert ask(http, "racer").status_code == 200
    assert http.post("/v1/admin/models/racer/unload").json()["runtime_state"] == "unloaded"


# ---- requests by runtime state, graceful unload ------------------------------------------


def read_stream(service: LiveService, first_delta: threading.Event) -> list[dict]:
    """Stream one request from "streamer"; returns its SSE events."""
    events = []
    body = {"model": "streamer", "input": "ignored", "stream": True}
    with service.client(timeout=15) as client, client.stream("POST", "/v1/responses", json=body) as answer:
        assert answer.status_code == 200
        for line in answer.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: "):]))
                if events[-1]["type"] == "response.output_text.delta":
                    first_delta.set()
    return events


def test_unload_waits_for_the_stream_in_flight_and_rejects_new_requests(service, http):
    assert post_load(http, "streamer").json()["runtime_state"] == "loaded"
    first_delta = threading.Event()
    with ThreadPoolExecutor(2) as pool, service.client(timeout=15) as actor:
        streaming = pool.submit(read_stream, service, first_delta)
        assert first_delta.wait(5)
        busy = model_entry(http, "streamer")
        assert (busy["inflight_requests"], busy["runtime_inflight"]) == (1, 1)

        unloading = pool.submit(actor.post, "/v1/admin/models/streamer/unload")
        wait_for_state(http, "streamer", "unloading")
        rejected = ask(http, "streamer")
        assert_error(rejected, 503, "model_unloading")
        assert int(rejected.headers["Retry-After"]) > 0

        events = streaming.result()
        unloaded = unloading.result()
    deltas = "".join(event["delta"] for event in events if event["type"] == "response.output_text.delta")
    assert deltas == STREAM_REPLY
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == STREAM_REPLY
    assert unloaded.status_code == 200
    assert unloaded.json()["runtime_state"] == "unloaded"
    # At least 8 of the 10 tokens (100 ms each) were still to come when the unload was sent.
    assert unloaded.elapsed.total_seconds() >= 0.5, "unload did not wait for the stream in flight"


def test_requests_are_rejected_in_every_state_but_loaded(service, http):
    assert_error(ask(http, "states"), 409, "model_not_loaded")
    with ThreadPoolExecutor(1) as pool, service.client(timeout=15) as actor:
        loading = pool.submit(post_load, actor, "states")
        wait_for_state(http, "states", "loading")
        rejected = ask(http, "states")
        assert_error(rejected, 503, "model_loading")
        assert int(rejected.headers["Retry-After"]) > 0
        assert loading.result().json()["runtime_state"] == "loaded"
    assert ask(http, "states").status_code == 200
    assert http.post("/v1/admin/models/states/unload").json()["runtime_state"] == "unloaded"
    assert_error(ask(http, "states"), 409, "model_not_loaded")

    assert post_load(http, "broken").json()["runtime_state"] == "failed"
    error = assert_error(ask(http, "broken"), 409, "model_failed")
    assert "last_error" in error["message"] and "cannot start" not in error["message"]
    assert "cannot start" in model_entry(http, "broken")["last_error"]


def test_a_request_for_an_unknown_model_is_404(http):
    assert_error(ask(http, "no-such-model"), 404, "unknown_model")
