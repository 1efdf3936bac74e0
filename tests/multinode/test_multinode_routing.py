"""Two runtime workers (nodes alpha and beta) behind one API over one Redis: each node serves the
models whose ``node`` names it, the API routes to it and merges the listings."""
from __future__ import annotations

import pytest

from tests.multinode.pool_processes import all_loaded, entries, running_pool

MODELS = {
    "a1": {"backend": "stub", "enabled": True, "node": "alpha", "stub_reply": "from alpha", "aliases": ["a-alias"]},
    "b1": {"backend": "stub", "enabled": True, "node": ["beta"], "stub_reply": "from beta"},
    "b-cold": {"backend": "stub", "node": "beta", "stub_reply": "cold beta"},
}
SETTINGS = {"service": {"runtime_reply_timeout_seconds": 2}, "models": MODELS}


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    def ready(listing):  # b-cold is not enabled
        return all_loaded({key: entry for key, entry in listing.items() if key[0] != "b-cold"})

    with running_pool(tmp_path_factory.mktemp("multinode-routing"), SETTINGS, ready=ready) as pool:
        yield pool


@pytest.fixture
def http(pool):
    with pool.client() as client:
        yield client


def test_each_node_lists_only_its_own_models_and_the_api_merges_them(http):
    assert set(entries(http)) == {("a1", "alpha"), ("b1", "beta"), ("b-cold", "beta")}
    answer = http.get("/v1/admin/models").json()
    assert [(n["node"], n["alive"]) for n in answer["nodes"]] == [("alpha", True), ("beta", True)]


def test_inference_goes_to_the_node_that_serves_the_model(http):
    for model, reply in (("a1", "from alpha"), ("a-alias", "from alpha"), ("b1", "from beta")):
        answer = http.post("/v1/responses", json={"model": model, "input": "x"})
        assert answer.status_code == 200, answer.text
        assert answer.json()["output"][0]["content"][0]["text"] == reply
    chat = http.post("/v1/chat/completions", json={"model": "b1", "messages": [{"role": "user", "content": "x"}]})
    assert chat.json()["choices"][0]["message"]["content"] == "from beta"


def test_admin_calls_go_to_the_node_that_serves_the_model(http):
    loaded = http.post("/v1/admin/models/b-cold/load")
    assert loaded.status_code == 200, loaded.text
    assert (loaded.json()["runtime_state"], loaded.json()["node"]) == ("loaded", "beta")
    assert entries(http)[("b-cold", "beta")]["runtime_state"] == "loaded"
    answer = http.post("/v1/responses", json={"model": "b-cold", "input": "x"})
    assert answer.json()["output"][0]["content"][0]["text"] == "cold beta"
    unloaded = http.post("/v1/admin/models/b-cold/unload")
    assert (unloaded.json()["runtime_state"], unloaded.json()["node"]) == ("unloaded", "beta")
    refused = http.post("/v1/responses", json={"model": "b-cold", "input": "x"})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "model_not_loaded"


def test_openai_model_list_merges_every_node_with_its_node(http):
    data = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
    assert {i: m["node"] for i, m in data.items()} == {"a1": "alpha", "a-alias": "alpha", "b1": "beta",
                                                        "b-cold": "beta"}


def test_gpu_memory_lists_the_devices_of_each_node(http):
    answer = http.get("/v1/admin/gpu-memory")
    assert answer.status_code == 200, answer.text
    memory = answer.json()
    assert [n["node"] for n in memory["nodes"]] == ["alpha", "beta"]
    assert all(n["devices"] and n["alive"] for n in memory["nodes"])
    assert {d["node"] for d in memory["devices"]} == {"alpha", "beta"}
    assert {(m["name"], m["node"]) for m in memory["models"]} == {("a1", "alpha"), ("b1", "beta"), ("b-cold", "beta")}


def test_a_model_no_node_serves_is_404(http):
    answer = http.post("/v1/responses", json={"model": "nowhere", "input": "x"})
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "unknown_model"
    assert http.post("/v1/admin/models/nowhere/load").status_code == 404


def test_activity_and_metrics_merge_every_node(http):
    http.post("/v1/responses", json={"model": "a1", "input": "x"})
    http.post("/v1/responses", json={"model": "b1", "input": "x"})
    requests = http.get("/v1/admin/activity").json()["requests"]
    assert {"alpha", "beta"} <= {r["node"] for r in requests}
    text = http.get("/metrics").text
    assert 'node="alpha"' in text and 'node="beta"' in text


def test_the_catalog_mirror_keeps_every_nodes_models(pool):
    import psycopg

    from tests.conftest import POSTGRES_URL

    url = f"{POSTGRES_URL.rsplit('/', 1)[0]}/{pool.database}"
    with psycopg.connect(url) as connection:
        rows = {name for (name,) in connection.execute("SELECT name FROM models_app_catalogmodel")}
    assert rows == set(MODELS)
