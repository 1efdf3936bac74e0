"""GET /v1/admin/events: lifecycle transitions as Server-Sent Events, over real HTTP.

Runs on the embedded default and on the production split (the runtime worker
publishes over Redis to the API process that holds the stream).
"""
from __future__ import annotations

import json

import httpx
import pytest

from tests.admin_ui.helpers import AUTH, EventStream

EVENT_FIELDS = {"model", "from", "to", "at", "reason", "last_error"}


@pytest.fixture(scope="module", params=["embedded", "split"])
def service(request):
    return request.getfixturevalue(f"{request.param}_workbench")


@pytest.fixture
def http(service):
    with service.client(timeout=15, headers=AUTH) as client:
        yield client


# ---- the admin token --------------------------------------------------------------------------------


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}], ids=["missing", "wrong"])
def test_the_stream_needs_the_admin_token(service, headers):
    answer = httpx.get(service.url + "/v1/admin/events", headers=headers, timeout=10)
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "unauthorized"
    as_sse = httpx.get(service.url + "/v1/admin/events", headers={**headers, "Accept": "text/event-stream"},
                       timeout=10)
    assert as_sse.status_code == 401
    assert as_sse.headers["content-type"].startswith("text/event-stream")
    event, data = as_sse.text.split("\n")[:2]
    assert event == "event: error"
    assert json.loads(data.removeprefix("data: "))["error"]["code"] == "unauthorized"


# ---- transitions ---------------------------------------------------------------------------------------


def test_a_load_and_an_unload_are_one_event_per_transition(service, http):
    with EventStream(service) as stream:
        assert http.post("/v1/admin/models/sse-quick/load").json()["runtime_state"] == "loaded"
        loading, loaded = stream.transitions(2)
        assert http.post("/v1/admin/models/sse-quick/unload").json()["runtime_state"] == "unloaded"
        unloading, unloaded = stream.transitions(2)
    sequence = [loading, loaded, unloading, unloaded]
    assert all(set(event) == EVENT_FIELDS for event in sequence)
    assert [(e["model"], e["from"], e["to"]) for e in sequence] == [
        ("sse-quick", "unloaded", "loading"),
        ("sse-quick", "loading", "loaded"),
        ("sse-quick", "loaded", "unloading"),
        ("sse-quick", "unloading", "unloaded"),
    ]
    assert all(e["last_error"] is None for e in sequence)
    assert [e["reason"] for e in sequence] == ["admin"] * 4
    times = [e["at"] for e in sequence]
    assert times == sorted(times) and all(t.endswith("Z") and "T" in t for t in times)


def test_a_failed_load_carries_last_error(service, http):
    with EventStream(service) as stream:
        answer = http.post("/v1/admin/models/sse-broken/load").json()
        loading, failed = stream.transitions(2)
    assert answer["runtime_state"] == "failed"
    assert (loading["to"], failed["from"], failed["to"]) == ("loading", "loading", "failed")
    assert "weights are corrupt" in failed["last_error"]
    assert failed["last_error"] == answer["last_error"]


def test_every_stream_gets_every_transition_and_a_closed_one_is_dropped(service, http):
    first, second = EventStream(service), EventStream(service)
    with first, second:
        http.post("/v1/admin/models/sse-other/load")
        assert [e["to"] for e in first.transitions(2)] == ["loading", "loaded"]
        assert [e["to"] for e in second.transitions(2)] == ["loading", "loaded"]
    with EventStream(service) as third:
        http.post("/v1/admin/models/sse-other/unload")
        assert [e["to"] for e in third.transitions(2)] == ["unloading", "unloaded"]
    assert http.get("/healthz").status_code == 200


def test_rejected_loads_and_reads_send_nothing(service, http):
    with EventStream(service) as stream:
        assert http.post("/v1/admin/models/sse-quick/load", json={"replicas": 0}).status_code == 422
        answer = http.post("/v1/admin/models/sse-quick/load", json={"gguf_n_ctx": 4})
        assert answer.status_code == 400, (answer.text, service.log()[-3000:])
        http.get("/v1/admin/models")
        http.post("/v1/admin/models/sse-quick/load")
        first, _ = stream.transitions(2)
        http.post("/v1/admin/models/sse-quick/unload")
        stream.transitions(2)
    assert (first["from"], first["to"]) == ("unloaded", "loading")


# ---- the OpenAPI description -------------------------------------------------------------------------------


def test_the_stream_is_in_the_openapi_description(service):
    schema = httpx.get(service.url + "/v1/openapi.json", timeout=15).json()
    operation = schema["paths"]["/v1/admin/events"]["get"]
    assert "text/event-stream" in operation["responses"]["200"]["content"]
    assert "401" in operation["responses"]
    for field in ("`model`", "`from`", "`to`", "`at`", "`last_error`"):
        assert field in operation["description"]
