"""Memory-aware placement over HTTP on both deployment shapes: 409 insufficient_memory with the
plan in error.details, ?dry_run=true answering the plan without acting, eviction's reason and
the entry's placement (stub models on a cpu budget)."""
from __future__ import annotations

import json

import pytest

from tests.conftest import LiveService, model_entry

MODELS = {
    "big": {"backend": "stub", "device": "cpu", "stub_vram_mib": 300},
    "other": {"backend": "stub", "device": "cpu", "stub_vram_mib": 300},
    "pinned": {"backend": "stub", "device": "cpu", "stub_vram_mib": 100, "pinned": True},
}
MEMORY = {"devices": {"cpu": {"budget_mib": 500}}, "eviction": "none"}


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape):
    folder = tmp_path_factory.mktemp("memory_api")
    path = folder / "settings.json"
    path.write_text(json.dumps({"models": MODELS, "memory": MEMORY}))
    live = LiveService(path, folder / "db.sqlite3").start()
    try:
        yield live
    finally:
        live.stop()


def test_refusal_dry_run_and_placement(http):
    assert http.post("/v1/admin/models/big/load").status_code == 200
    entry = model_entry(http, "big")
    assert entry["placement"] == ["cpu"]
    assert (entry["memory"]["charge_mib"], entry["memory"]["charge"]) == ({"cpu": 300}, "measured")

    dry = http.post("/v1/admin/models/other/load?dry_run=true")
    assert dry.status_code == 200
    assert dry.json() == {
        "model": "other", "runtime_state": "unloaded", "fits": False, "action": "refuse", "placement": ["cpu"],
        "device": "cpu", "needed_mib": 300, "free_mib": 200, "evictable": [{"name": "big", "charge_mib": 300}],
        "blocking": [], "evict": [], "relieve": [], "estimate_source": "estimate", "slot_mib": 0,
    }
    fits = http.post("/v1/admin/models/pinned/load?dry_run=true").json()
    assert (fits["fits"], fits["action"], fits["free_mib"]) == (True, "load", 200)
    assert model_entry(http, "pinned")["runtime_state"] == "unloaded"  # the dry run did nothing

    refused = http.post("/v1/admin/models/other/load")
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert error["code"] == "insufficient_memory"
    assert error["details"] == {
        "device": "cpu", "needed_mib": 300, "free_mib": 200,
        "evictable": [{"name": "big", "charge_mib": 300}], "blocking": [],
    }
    after = model_entry(http, "other")
    assert (after["runtime_state"], after["last_error"], after["placement"]) == ("unloaded", None, None)

    bad = http.post("/v1/admin/models/other/load?dry_run=maybe")
    assert (bad.status_code, bad.json()["error"]["param"]) == (400, "dry_run")
    assert http.post("/v1/admin/models/big/unload").status_code == 200


def test_the_dry_run_checks_the_body_as_a_load_does(http):
    answer = http.post("/v1/admin/models/other/load?dry_run=true", json={"replicas": 5})
    assert (answer.status_code, answer.json()["error"]["code"]) == (400, "invalid_load_request")
    assert http.post("/v1/admin/models/nope/load?dry_run=true").status_code == 404
