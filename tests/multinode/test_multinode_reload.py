"""A settings reload fans out to every node, two-phase: one node's refusal leaves every node's
catalog unchanged; accepted everywhere, every node swaps."""
from __future__ import annotations

import copy

import pytest

from tests.conftest import wait_until
from tests.multinode.pool_processes import entries, running_pool

SETTINGS = {
    "service": {"runtime_reply_timeout_seconds": 2},
    "models": {
        "a1": {"backend": "stub", "enabled": True, "node": "alpha", "stub_reply": "one"},
        "b1": {"backend": "stub", "node": "beta", "stub_reply": "one"},
    },
}


@pytest.fixture
def pool(tmp_path):
    def ready(listing):
        return listing[("a1", "alpha")]["runtime_state"] == "loaded"

    with running_pool(tmp_path / "pool", SETTINGS, ready=ready) as pool:
        yield pool


def test_one_node_refusing_leaves_every_catalog_unchanged_then_both_swap(pool):
    with pool.client() as http:
        before = entries(http)
        changed = copy.deepcopy(SETTINGS)
        changed["models"]["a1"]["stub_reply"] = "two"  # a1 is loaded on alpha: alpha refuses (409)
        changed["models"]["b2"] = {"backend": "stub", "node": "beta"}  # beta alone would accept
        pool.write(changed)
        refused = http.post("/v1/admin/settings/reload")
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["code"] == "settings_reload_conflict" and error["message"].startswith("node alpha:")
        assert [r["node"] for r in error["details"]["refused_by"]] == ["alpha"]
        after = entries(http)
        assert set(after) == set(before)  # beta did not add b2
        assert after[("a1", "alpha")]["definition"]["stub_reply"] == "one"
        assert http.post("/v1/responses", json={"model": "b2", "input": "x"}).status_code == 404

        del changed["models"]["a1"]["stub_reply"]
        changed["models"]["a1"]["stub_reply"] = "one"
        changed["models"]["b1"]["stub_reply"] = "three"  # b1 is unloaded: beta may change it
        pool.write(changed)
        accepted = http.post("/v1/admin/settings/reload")
        assert accepted.status_code == 200, accepted.text
        diff = accepted.json()
        assert (diff["added_models"], diff["updated_models"]) == (["b2"], ["b1"])
        assert [n["node"] for n in diff["nodes"]] == ["alpha", "beta"]
        assert set(entries(http)) == {("a1", "alpha"), ("b1", "beta"), ("b2", "beta")}
        assert http.post("/v1/admin/models/b1/load").json()["runtime_state"] == "loaded"
        answer = http.post("/v1/responses", json={"model": "b1", "input": "x"})
        assert answer.json()["output"][0]["content"][0]["text"] == "three"


def test_a_bad_file_is_refused_by_every_node_with_its_code(pool):
    with pool.client() as http:
        bad = copy.deepcopy(SETTINGS)
        bad["models"]["b1"]["node"] = "not a node name"
        pool.write(bad)
        refused = http.post("/v1/admin/settings/reload")
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["code"] == "invalid_settings" and "$.models.b1.node" in error["message"]
        assert [(r["node"], r["code"]) for r in error["details"]["refused_by"]] == [
            ("alpha", "invalid_settings"), ("beta", "invalid_settings")]
        assert [(p["path"], p["code"]) for p in error["details"]["problems"]] == [("$.models.b1.node", "node_invalid")]
        assert wait_until(lambda: set(entries(http)) == {("a1", "alpha"), ("b1", "beta")})
