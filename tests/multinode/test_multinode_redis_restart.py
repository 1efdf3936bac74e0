"""Redis away under a pool of two nodes: every model answers 503 runtime_unavailable at once, no
process exits, and once Redis is back (empty) both nodes announce themselves again and serve
their models, still loaded, with no llm-pool process restarted (docs/deployment.md, "When Redis
goes away").  A Redis of the test's own (tests/faults/test_redis_restart.py's), killed and
restarted on its port."""
from __future__ import annotations

import shutil
import time

import httpx
import pytest

from tests.conftest import wait_until
from tests.faults.test_redis_restart import FAST_FAIL_SECONDS, RECOVERY_SECONDS, PrivateRedis
from tests.multinode.pool_processes import Pool, entries

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")

SETTINGS = {
    "service": {"runtime_reply_timeout_seconds": 2},
    "models": {
        "on-alpha": {"backend": "stub", "device": "cpu", "node": "alpha", "enabled": True},
        "on-beta": {"backend": "stub", "device": "cpu", "node": "beta", "enabled": True},
    },
}


def _ask(url: str, model: str) -> tuple[int, str, float]:
    began = time.monotonic()
    try:
        answer = httpx.post(url + "/v1/responses", json={"model": model, "input": "ping"}, timeout=30)
    except httpx.HTTPError as exc:
        return 0, type(exc).__name__, time.monotonic() - began
    body = answer.json()
    code = body["output"][0]["content"][0]["text"] if answer.status_code == 200 else body["error"]["code"]
    return answer.status_code, code, time.monotonic() - began


def test_redis_away_fails_every_node_fast_then_both_come_back_by_themselves(tmp_path):
    redis_server = PrivateRedis(tmp_path).start()
    pool = Pool(tmp_path / "pool", SETTINGS, redis_url=redis_server.url)
    try:
        pool.start_node("alpha")
        pool.start_node("beta")
        pool.start_api()
        pids = {name: process.pid for name, process in pool.nodes.items()} | {"api": pool.api.pid}
        for model in ("on-alpha", "on-beta"):
            assert wait_until(lambda m=model: _ask(pool.url, m)[:2] == (200, "ping"), 30), _ask(pool.url, model)

        redis_server.kill()
        outage = [_ask(pool.url, model) for model in ("on-alpha", "on-beta", "on-alpha", "on-beta")]
        for status, code, seconds in outage:
            assert (status, code) == (503, "runtime_unavailable") and seconds < FAST_FAIL_SECONDS, outage
        assert all(process.poll() is None for process in [*pool.nodes.values(), pool.api]), pool.log()[-3000:]

        redis_server.start()  # the same port, empty: no registry, no channels
        for name in ("alpha", "beta"):
            assert wait_until(lambda n=name: pool.alive(n), RECOVERY_SECONDS), f"{name} did not announce itself again"
        for model in ("on-alpha", "on-beta"):
            assert wait_until(lambda m=model: _ask(pool.url, m)[:2] == (200, "ping"), RECOVERY_SECONDS), (
                _ask(pool.url, model), pool.log()[-3000:])
        wanted = {("on-alpha", "alpha"), ("on-beta", "beta")}
        with pool.client() as http:  # the listing merges the nodes the API's view (0.5 s old at most) has alive
            assert wait_until(lambda: wanted <= set(entries(http)), 10), entries(http)
            listed = entries(http)
        assert {listed[key]["runtime_state"] for key in wanted} == {"loaded"}
        # Nothing was restarted: the same processes serve, their models never reloaded.
        assert {name: process.pid for name, process in pool.nodes.items()} | {"api": pool.api.pid} == pids
        assert listed[("on-alpha", "alpha")]["last_reason"] == "startup"
    finally:
        if redis_server.process is None or redis_server.process.poll() is not None:
            redis_server.start()  # the pool's own clean-up talks to it
        try:
            pool.stop()
        finally:
            redis_server.kill()
