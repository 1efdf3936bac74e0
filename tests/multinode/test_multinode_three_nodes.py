"""Three runtime workers behind two API processes: both APIs route alike and list the same
merged pool; a reload through one is seen through the other."""
from __future__ import annotations

import copy

import httpx
import pytest

from tests.conftest import wait_until
from tests.multinode.pool_processes import Pool, entries

NODES = ("alpha", "beta", "gamma")
SETTINGS = {
    "service": {"runtime_reply_timeout_seconds": 2},
    "models": {f"on-{n}": {"backend": "stub", "enabled": True, "node": n, "stub_reply": f"from {n}"} for n in NODES},
}


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    pool = Pool(tmp_path_factory.mktemp("multinode-three"), SETTINGS)
    try:
        for name in NODES:
            pool.start_node(name)
        pool.start_api()
        pool.second_url = pool.start_another_api()
        yield pool
    finally:
        pool.stop()


def test_two_api_processes_route_and_list_alike(pool):
    with pool.client() as first, httpx.Client(base_url=pool.second_url, timeout=30) as second:
        expected = {(f"on-{n}", n) for n in NODES}
        assert wait_until(lambda: all(e["runtime_state"] == "loaded" for e in entries(first).values()), timeout=30)
        assert set(entries(first)) == set(entries(second)) == expected
        for http in (first, second):
            for node in NODES:
                answer = http.post("/v1/responses", json={"model": f"on-{node}", "input": "x"})
                assert answer.json()["output"][0]["content"][0]["text"] == f"from {node}"


def test_a_reload_through_one_api_is_seen_through_the_other(pool):
    changed = copy.deepcopy(SETTINGS)
    changed["models"]["late"] = {"backend": "stub", "node": "gamma", "stub_reply": "late gamma"}
    pool.write(changed)
    with pool.client() as first, httpx.Client(base_url=pool.second_url, timeout=30) as second:
        diff = first.post("/v1/admin/settings/reload")
        assert diff.status_code == 200, diff.text
        assert diff.json()["added_models"] == ["late"]
        assert [n["node"] for n in diff.json()["nodes"]] == list(NODES)
        assert second.post("/v1/admin/models/late/load").json()["node"] == "gamma"
        answer = second.post("/v1/responses", json={"model": "late", "input": "x"})
        assert answer.json()["output"][0]["content"][0]["text"] == "late gamma"
