"""A node that goes away (kill -9): its models answer 503 runtime_unavailable within the bounded
time and its streams end with an error event, while the other node keeps serving and its streams
finish; restarted, it loads its enabled models again."""
from __future__ import annotations

import concurrent.futures
import time

import pytest

from tests.conftest import wait_until
from tests.multinode.pool_processes import Pool, all_loaded, entries, running_pool, stream_events

SLOW = {"backend": "stub", "enabled": True, "stub_token_delay_ms": 150, "stub_reply": "a b c d e f g h i j"}
SETTINGS = {
    "service": {"runtime_reply_timeout_seconds": 2},
    "models": {
        "a-slow": {**SLOW, "node": "alpha"},
        "b-slow": {**SLOW, "node": "beta"},
        "b1": {"backend": "stub", "enabled": True, "node": "beta", "stub_reply": "from beta"},
    },
}


@pytest.fixture
def pool(tmp_path):
    with running_pool(tmp_path / "pool", SETTINGS, ready=all_loaded) as pool:
        yield pool


def _restart_once_the_lock_expires(pool: Pool, name: str) -> None:
    """The dead owner's node lock lives up to its TTL: earlier workers exit with 3 (already running)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            pool.start_node(name)
            return
        except RuntimeError as exc:
            assert "exited with 3" in str(exc), exc
            assert time.monotonic() < deadline, pool.log()


def test_kill_of_one_node_mid_stream_then_its_restart(pool):
    with concurrent.futures.ThreadPoolExecutor(2) as workers:
        on_beta = workers.submit(stream_events, pool.url, {"model": "b-slow", "input": "x"})
        on_alpha = workers.submit(stream_events, pool.url, {"model": "a-slow", "input": "x"})
        time.sleep(0.5)  # both streams are under way (each takes 1.5 s)
        pool.kill("beta")
        killed_at = time.monotonic()
        beta_events, alpha_events = on_beta.result(timeout=20), on_alpha.result(timeout=20)
    assert beta_events[-1] == ("error", "runtime_unavailable"), beta_events
    assert "response.completed" not in beta_events
    assert time.monotonic() - killed_at < 5
    assert alpha_events[-1] == "response.completed" and alpha_events.count("response.output_text.delta") == 10

    with pool.client() as http:
        began = time.monotonic()
        down = http.post("/v1/responses", json={"model": "b1", "input": "x"})
        assert down.status_code == 503 and down.json()["error"]["code"] == "runtime_unavailable", down.text
        assert down.headers["Retry-After"]
        assert time.monotonic() - began < 3  # the reply timeout (2 s) at most
        served = http.post("/v1/responses", json={"model": "a-slow", "input": "x"})
        assert served.status_code == 200
        # Once its heartbeat expired, the node is down in the merged listing and its models answer at once.
        assert wait_until(lambda: not pool.alive("beta"), timeout=10)
        listing = http.get("/v1/admin/models").json()
        assert {(m["name"], m["node"]) for m in listing["models"]} == {("a-slow", "alpha")}
        beta = next(n for n in listing["nodes"] if n["node"] == "beta")
        assert beta["alive"] is False
        began = time.monotonic()
        down = http.post("/v1/responses", json={"model": "b1", "input": "x"})
        assert down.status_code == 503 and "beta" in down.json()["error"]["message"]
        assert time.monotonic() - began < 1
        assert http.post("/v1/admin/models/b1/unload").json()["error"]["code"] == "runtime_unavailable"

        _restart_once_the_lock_expires(pool, "beta")
        assert wait_until(lambda: entries(http).get(("b1", "beta"), {}).get("runtime_state") == "loaded",
                          timeout=30), pool.log()
        back = http.post("/v1/responses", json={"model": "b1", "input": "x"})
        assert back.status_code == 200 and back.json()["output"][0]["content"][0]["text"] == "from beta"
