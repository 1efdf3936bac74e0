"""Fairness across nodes: a model whose replicas are on two nodes keeps each key's share.

Where the scheduling happens (docs/scheduling.md, "A model on several nodes"): each node's
scheduler orders its own replicas' queue token-fairly (VTC), and the API process sends each
request to the node with the fewest of its own requests of that fairness key in flight per
replica, then the fewest in all.  A flood from one key is therefore spread evenly over both nodes'
queues, and a second key's requests, spread the same way, are served next on each node (a newly
backlogged key starts at the lowest counter) instead of after the flood.
"""
from __future__ import annotations

import concurrent.futures
import time

import httpx
import pytest

from models_app.transport.nodes import CACHE_SECONDS
from tests.conftest import wait_until
from tests.multinode.pool_processes import entries, running_pool

TOKEN_DELAY_MS = 100
SETTINGS = {
    "service": {"runtime_reply_timeout_seconds": 5},
    "models": {
        "shared": {"backend": "stub", "device": "cpu", "node": ["alpha", "beta"], "stub_reply": "a b c",
                   "stub_token_delay_ms": TOKEN_DELAY_MS},
    },
}
HEAVY, LIGHT = 12, 4


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    with running_pool(tmp_path_factory.mktemp("multinode-fairness"), SETTINGS) as pool:
        yield pool


def _queued_on_both(http: httpx.Client) -> bool:
    listed = entries(http)
    return all(listed[("shared", node)]["queue_depth"] >= 2 for node in ("alpha", "beta"))


def test_a_flood_from_one_key_does_not_hold_back_another_across_nodes(pool):
    with pool.client() as http:
        loaded = http.post("/v1/admin/models/shared/load", json={"replicas": 2})
        assert loaded.status_code == 200, loaded.text
        assert [n["node"] for n in loaded.json()["nodes"]] == ["alpha", "beta"]
    time.sleep(CACHE_SECONDS + 0.6)  # both nodes have announced the model loaded, and the API has read it
    start = time.monotonic()

    def one(user: str) -> tuple[str, int, float]:
        answer = httpx.post(pool.url + "/v1/responses", json={"model": "shared", "input": "x", "user": user},
                            timeout=60)
        return user, answer.status_code, time.monotonic() - start

    with concurrent.futures.ThreadPoolExecutor(HEAVY + LIGHT) as workers, pool.client() as http:
        heavy = [workers.submit(one, "heavy") for _ in range(HEAVY)]
        # The flood is queued on both nodes before the other key sends anything.
        assert wait_until(lambda: _queued_on_both(http), timeout=10), entries(http)
        light = [workers.submit(one, "light") for _ in range(LIGHT)]
        results = [f.result() for f in [*heavy, *light]]
    assert {status for _, status, _ in results} == {200}, results
    heavy_done = sorted(t for user, _, t in results if user == "heavy")
    light_done = sorted(t for user, _, t in results if user == "light")
    # First in, first out, the light key would finish after the whole flood.  Token-fair on each
    # node, its 2 requests per node are served among the first 5 of the 8 each node runs.
    assert light_done[-1] < heavy_done[-3], (heavy_done, light_done)
    assert light_done[-1] <= 0.8 * heavy_done[-1], (heavy_done, light_done)
    with pool.client() as http:
        ran = [r for r in http.get("/v1/admin/activity", params={"limit": 100}).json()["requests"]
               if r["model"] == "shared"]
    by_key = {key: sorted(r["node"] for r in ran if r["fairness_key"] == key) for key in ("heavy", "light")}
    # Each key is spread evenly over the nodes (the API counts its requests in flight per key).
    assert by_key == {"heavy": ["alpha"] * 6 + ["beta"] * 6, "light": ["alpha", "alpha", "beta", "beta"]}, by_key
