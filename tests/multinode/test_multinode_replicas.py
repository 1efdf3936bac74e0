"""A model that several nodes serve (``node`` a list): a load spreads its replicas over them, all
or nothing; requests go to the least loaded node; a node that goes silent is avoided."""
from __future__ import annotations

import concurrent.futures
import json
import time

import httpx
import pytest

from models_app.transport.nodes import CACHE_SECONDS
from tests.conftest import wait_until
from tests.multinode.pool_processes import Pool, entries, running_pool

CPU = {"device": "cpu"}
SETTINGS = {
    "service": {"runtime_reply_timeout_seconds": 2},
    "memory": {"devices": {"cpu": {"budget_mib": 1000}}, "eviction": "none"},
    "models": {
        "shared": {"backend": "stub", **CPU, "node": ["alpha", "beta"], "stub_vram_mib": 100,
                   "stub_token_delay_ms": 200, "stub_reply": "a b c d e"},
        "picky": {"backend": "stub", **CPU, "node": ["alpha", "beta"], "stub_vram_mib": 500},
        "hog": {"backend": "stub", **CPU, "node": "beta", "stub_vram_mib": 700, "enabled": True},
        "alpha-hog": {"backend": "stub", **CPU, "node": "alpha", "stub_vram_mib": 700},
    },
}


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    def ready(listing):
        return listing[("hog", "beta")]["runtime_state"] == "loaded"

    with running_pool(tmp_path_factory.mktemp("multinode-replicas"), SETTINGS, ready=ready) as pool:
        yield pool


def _announced_loaded(pool: Pool, node: str, model: str) -> bool:
    record = json.loads(pool.redis.get(f"{pool.prefix}:node:{node}") or b"{}")
    return any(m["name"] == model and m["runtime_state"] == "loaded" for m in record.get("models", ()))


def test_a_load_spreads_the_replicas_over_the_nodes(pool):
    with pool.client() as http:
        loaded = http.post("/v1/admin/models/shared/load", json={"replicas": 2})
        assert loaded.status_code == 200, loaded.text
        answer = loaded.json()
        assert (answer["runtime_state"], answer["replicas"], answer["loaded_replicas"]) == ("loaded", 2, 2)
        assert [(n["node"], n["runtime_state"], n["replicas"]) for n in answer["nodes"]] == [
            ("alpha", "loaded", 1), ("beta", "loaded", 1)]
        listed = entries(http)
        assert (listed[("shared", "alpha")]["replicas"], listed[("shared", "beta")]["replicas"]) == (1, 1)


def test_requests_go_to_the_least_loaded_node(pool):
    assert wait_until(lambda: all(_announced_loaded(pool, n, "shared") for n in ("alpha", "beta")), timeout=5)
    time.sleep(CACHE_SECONDS + 0.1)  # the API's view of the registry is refreshed by now

    def one(_):
        return httpx.post(pool.url + "/v1/responses", json={"model": "shared", "input": "x"}, timeout=30).status_code

    with concurrent.futures.ThreadPoolExecutor(4) as workers:
        assert list(workers.map(one, range(4))) == [200] * 4
    with pool.client() as http:
        requests = [r for r in http.get("/v1/admin/activity").json()["requests"] if r["model"] == "shared"]
    assert sorted(r["node"] for r in requests) == ["alpha", "alpha", "beta", "beta"]


def test_a_load_that_one_node_cannot_take_leaves_no_node_loaded(pool):
    with pool.client() as http:
        refused = http.post("/v1/admin/models/picky/load", json={"replicas": 2})
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["code"] == "insufficient_memory" and error["message"].startswith("node beta:")
        listed = entries(http)
        assert listed[("picky", "alpha")]["runtime_state"] == "unloaded"  # alpha's share was taken back
        assert listed[("picky", "beta")]["runtime_state"] == "unloaded"
        one = http.post("/v1/admin/models/picky/load")  # one replica: the first node alone, which has room
        assert one.status_code == 200 and [n["node"] for n in one.json()["nodes"]] == ["alpha"]
        assert http.post("/v1/admin/models/picky/unload").json()["runtime_state"] == "unloaded"


def test_a_one_replica_load_goes_to_the_node_with_room(pool):
    with pool.client() as http:
        assert http.post("/v1/admin/models/alpha-hog/load").status_code == 200  # alpha: 300 MiB free, beta: 300
        assert http.post("/v1/admin/models/picky/load").status_code == 409  # 500 MiB fits neither
        assert http.post("/v1/admin/models/alpha-hog/unload").status_code == 200
        assert http.post("/v1/admin/models/hog/unload").status_code == 200
        assert http.post("/v1/admin/models/alpha-hog/load").status_code == 200  # now alpha is full, beta free
        placed = http.post("/v1/admin/models/picky/load")
        assert placed.status_code == 200, placed.text
        assert [n["node"] for n in placed.json()["nodes"]] == ["beta"]  # not alpha, the first by name
        for name in ("picky", "alpha-hog"):
            assert http.post(f"/v1/admin/models/{name}/unload").status_code == 200
        assert http.post("/v1/admin/models/hog/load").status_code == 200


def test_unload_reaches_every_node(pool):
    with pool.client() as http:
        unloaded = http.post("/v1/admin/models/shared/unload")
        assert unloaded.status_code == 200, unloaded.text
        assert [(n["node"], n["runtime_state"]) for n in unloaded.json()["nodes"]] == [
            ("alpha", "unloaded"), ("beta", "unloaded")]
        assert {e["runtime_state"] for (name, _), e in entries(http).items() if name == "shared"} == {"unloaded"}


def test_a_killed_node_is_avoided_for_a_model_another_node_serves(pool):
    with pool.client() as http:
        assert http.post("/v1/admin/models/shared/load", json={"replicas": 2}).status_code == 200
    assert wait_until(lambda: all(_announced_loaded(pool, n, "shared") for n in ("alpha", "beta")), timeout=5)
    time.sleep(CACHE_SECONDS + 0.1)
    pool.kill("beta")

    def one(_):
        return httpx.post(pool.url + "/v1/responses", json={"model": "shared", "input": "x"}, timeout=30).status_code

    rounds = []
    with concurrent.futures.ThreadPoolExecutor(2) as workers:
        for _ in range(3):  # two at once: the least loaded pick sends one of them to each node
            rounds.append(sorted(workers.map(one, range(2))))
    # The first round's request on the silent node is 503 after the reply timeout; from then on
    # this API process prefers alpha until the registry says beta is down.
    assert rounds == [[200, 503], [200, 200], [200, 200]], rounds
