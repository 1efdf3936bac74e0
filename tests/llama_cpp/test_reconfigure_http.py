"""POST /v1/admin/models/{name}/reconfigure, /sleep and /wake over HTTP with the admin token
(SmolLM2 in an engine process, and a stub that can do neither): the answers, the error codes,
residency in the entry, and the reconfigured / slept / woke events on GET /v1/admin/events."""
from __future__ import annotations

import pytest
from llama_helpers import SMOLLM2_MODEL

from tests.admin_ui.helpers import EventStream
from tests.conftest import service_with_loaded_models

TOKEN = "reconfigure-admin-token"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
MODELS = {"smol": {**SMOLLM2_MODEL, "gguf_n_ctx": 512, "isolation": "process"}, "echo": {"backend": "stub"},
          "cold": {**SMOLLM2_MODEL, "gguf_n_ctx": 512}}


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    with service_with_loaded_models(tmp_path_factory.mktemp("reconfigure_http"), MODELS, admin_token=TOKEN,
                                    service={"admin_token": TOKEN}) as live:
        yield live


def test_reconfigure_sleep_and_wake_over_http(live):
    with live.client(headers=HEADERS, timeout=60) as http, EventStream(live, HEADERS) as events:
        answer = http.post("/v1/admin/models/smol/reconfigure", json={"gguf_n_ctx": 1024, "gguf_type_k": "q8_0"})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["runtime_state"] == "loaded" and body["residency"] == "active"
        assert body["load_override"] == {"gguf_n_ctx": 1024, "gguf_type_k": "q8_0"}
        assert body["reconfigured"]["changed"] == {"gguf_n_ctx": {"from": 512, "to": 1024},
                                                   "gguf_type_k": {"from": None, "to": "q8_0"}}
        name, data = events.next_event()
        assert name == "reconfigured" and data["model"] == "smol" and data["changed"] == body["reconfigured"]["changed"]
        assert data["duration_ms"] > 0 and data["reason"] == "admin"

        assert http.post("/v1/admin/models/smol/sleep").json()["residency"] == "sleeping"
        assert events.next_event()[0] == "slept"
        listed = {m["name"]: m["residency"] for m in http.get("/v1/admin/models").json()["models"]}
        assert listed == {"smol": "sleeping", "echo": "active", "cold": "active"}
        assert http.post("/v1/admin/models/smol/wake").json()["residency"] == "active"
        name, data = events.next_event()
        assert (name, data["reason"]) == ("woke", "admin")


@pytest.mark.parametrize("path, body, status, code", [
    ("smol/reconfigure", {"gguf_n_batch": 8}, 422, "invalid_load_body"),
    ("smol/reconfigure", {"replicas": 2}, 400, "not_reconfigurable"),
    ("smol/reconfigure", {"gguf_n_ctx": 0}, 422, "invalid_load_body"),
    ("smol/reconfigure", {"gguf_type_k": "q9_9"}, 400, "invalid_load_request"),
    ("smol/reconfigure", None, 400, "invalid_load_request"),
    ("echo/reconfigure", {"gguf_n_ctx": 64}, 400, "not_reconfigurable"),
    ("echo/sleep", None, 400, "not_sleepable"),
    ("cold/reconfigure", {"gguf_n_ctx": 64}, 409, "model_not_loaded"),
    ("cold/sleep", None, 409, "model_not_loaded"),
    ("nothing/wake", None, 404, "unknown_model"),
])
def test_refusals_change_nothing(live, path, body, status, code):
    with live.client(headers=HEADERS) as http:
        before = {m["name"]: (m["load_override"], m["residency"]) for m in http.get("/v1/admin/models").json()["models"]}
        answer = http.post(f"/v1/admin/models/{path}", json=body) if body is not None else http.post(
            f"/v1/admin/models/{path}")
        assert (answer.status_code, answer.json()["error"]["code"]) == (status, code), answer.text
        after = {m["name"]: (m["load_override"], m["residency"]) for m in http.get("/v1/admin/models").json()["models"]}
        assert after == before


def test_the_endpoints_need_the_admin_token(live):
    with live.client() as http:
        for op in ("reconfigure", "sleep", "wake"):
            assert http.post(f"/v1/admin/models/smol/{op}").status_code == 401
