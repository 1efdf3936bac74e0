"""LoRA adapters as models of their own, against a live service and the fake ``vllm serve``: the
model lists, a request for an adapter running on the loaded base under the adapter's name (no
load), keys, and the refusals."""
from __future__ import annotations

import hashlib

import pytest

from tests.managed.helpers import TARGET, requests_logged

KEY, BASE_ONLY_KEY = "sk-adapter", "sk-base-only"
ADAPTERS = {"sql": {"path": "/peft/sql", "aliases": ["sql-coder"]}, "poet": {"path": "/peft/poet"}}
MESSAGES = [{"role": "user", "content": "hi there"}]


def key(name: str, secret: str, models) -> dict:
    return {"name": name, "key_sha256": hashlib.sha256(secret.encode()).hexdigest(), "models": models}


@pytest.fixture(params=["embedded", "split"])
def service(request, live_service, fake_bin, tmp_path):
    """The model loaded, in both deployment shapes (split: the adapters travel in the node's record)."""
    model = {
        "backend": "vllm_serve", "vllm_serve_model": TARGET, "vllm_serve_binary": str(fake_bin / "vllm"),
        "vllm_serve_env": {"FAKE_REQUEST_LOG": str(tmp_path / "requests.jsonl")},
        "vllm_serve_startup_timeout_seconds": 30.0, "adapters": ADAPTERS,
    }
    keys = [key("all", KEY, "*"), key("base", BASE_ONLY_KEY, ["m", "m:poet"])]
    live = live_service({"m": model}, service={"api_keys": keys}, mode=request.param,
                        env={"LLMPOOL_STATE_DIR": str(tmp_path / "state")})
    with live.client(headers={"Authorization": f"Bearer {KEY}"}) as http:
        loaded = http.post("/v1/admin/models/m/load").json()
        assert (loaded["runtime_state"], loaded["last_error"]) == ("loaded", None)
    yield live, tmp_path / "requests.jsonl"
    assert live.stop() == 0


def test_each_adapter_is_listed_as_a_model_with_its_base_as_parent(service):
    live, _ = service
    with live.client(headers={"Authorization": f"Bearer {KEY}"}) as http:
        listed = {item["id"]: item for item in http.get("/v1/models").json()["data"]}
        tags = {item["name"]: item["details"]["parent_model"] for item in http.get("/api/tags").json()["models"]}
        one = http.get("/v1/models/sql-coder").json()
    assert list(listed) == ["m", "m:sql", "sql-coder", "m:poet"]
    assert {name: (item.get("parent"), item.get("alias_of")) for name, item in listed.items()} == {
        "m": (None, None), "m:sql": ("m", None), "sql-coder": ("m", "m:sql"), "m:poet": ("m", None),
    }
    assert tags == {"m": "", "m:sql": "m", "sql-coder": "m", "m:poet": "m"}
    assert (one["id"], one["parent"], one["alias_of"], one["runtime_state"]) == ("sql-coder", "m", "m:sql", "loaded")


def test_a_request_for_an_adapter_runs_on_the_loaded_base_under_the_adapters_name(service):
    live, log = service
    with live.client(headers={"Authorization": f"Bearer {KEY}"}) as http:
        for model in ("m", "m:sql", "sql-coder", "m:poet"):
            answer = http.post("/v1/chat/completions", json={"model": model, "messages": MESSAGES})
            assert answer.status_code == 200, answer.text
            assert answer.json()["model"] == model
        typed = http.post("/v1/responses", json={"model": "m:poet", "input": "hi there"})
        assert typed.status_code == 200, typed.text
        base = http.get("/v1/models/m").json()
    assert [request["model"] for request in requests_logged(log)] == [TARGET, "sql", "sql", "poet", "poet"]
    assert base["runtime_state"] == "loaded"


def test_a_key_uses_an_adapter_only_where_it_lists_the_adapter(service):
    live, _ = service
    with live.client(headers={"Authorization": f"Bearer {BASE_ONLY_KEY}"}) as http:
        refused = http.post("/v1/chat/completions", json={"model": "sql-coder", "messages": MESSAGES})
        allowed = http.post("/v1/chat/completions", json={"model": "m:poet", "messages": MESSAGES})
        listed = [item["id"] for item in http.get("/v1/models").json()["data"]]
    assert (refused.status_code, refused.json()["error"]["code"]) == (403, "model_not_allowed")
    assert allowed.status_code == 200
    assert listed == ["m", "m:poet"]


def test_an_unknown_adapter_is_an_unknown_model_and_embeddings_refuse_an_adapter(service):
    live, _ = service
    with live.client(headers={"Authorization": f"Bearer {KEY}"}) as http:
        unknown = http.post("/v1/chat/completions", json={"model": "m:nope", "messages": MESSAGES})
        embedded = http.post("/v1/embeddings", json={"model": "m:sql", "input": "hi"})
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "unknown_model")
    assert (embedded.status_code, embedded.json()["error"]["code"]) == (400, "adapter_unsupported")
