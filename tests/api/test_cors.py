"""CORS (service.cors_allowed_origins) against a live service: preflights allowed and refused on
every /v1 inference path, the headers of actual answers (streamed, errors and 404s too), the admin
API left out, nothing added by default; a reload keeps the origins the process started with and
refuses a bad one as invalid_settings (tests/runtime/test_cors_origins.py checks the schema)."""
from __future__ import annotations

import json

import pytest

from tests.conftest import LiveService, write_settings

APP = "http://app.example.com"
DEV = "http://localhost:5173"
OTHER = "http://evil.example.net"
MODELS = {"fixed": {"backend": "stub", "stub_reply": "alpha beta"}}
CHAT = {"model": "fixed", "messages": [{"role": "user", "content": "hi"}]}
INFERENCE_PATHS = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/responses"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/embeddings"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/fixed"),
]
# What the openai JavaScript SDK asks for in a browser, besides the fairness header.
REQUESTED_HEADERS = "authorization, content-type, x-stainless-os, x-llmpool-fairness-key"


def start(folder, service: dict) -> LiveService:
    live = LiveService(write_settings(folder, MODELS, service=service), folder / "db.sqlite3").start()
    with live.client() as http:
        assert http.post("/v1/admin/models/fixed/load").json()["runtime_state"] == "loaded"
    return live


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape):
    live = start(tmp_path_factory.mktemp("cors_on"), {"cors_allowed_origins": [APP, DEV]})
    yield live
    live.stop()


@pytest.fixture(scope="module")
def plain_service(tmp_path_factory, api_shape):
    live = start(tmp_path_factory.mktemp("cors_off"), {})
    yield live
    live.stop()


def preflight(http, path: str, origin: str, method: str = "POST", **headers):
    return http.options(path, headers={
        "Origin": origin, "Access-Control-Request-Method": method,
        "Access-Control-Request-Headers": REQUESTED_HEADERS, **headers,
    })


def vary(answer) -> set[str]:
    return {part.strip().lower() for value in answer.headers.get_list("vary") for part in value.split(",")}


@pytest.mark.parametrize(("method", "path"), INFERENCE_PATHS)
def test_a_preflight_from_a_listed_origin_is_allowed(http, method, path):
    for origin in (APP, DEV):
        answer = preflight(http, path, origin, method)
        assert answer.status_code == 200, answer.text
        assert answer.headers["access-control-allow-origin"] == origin
        assert answer.headers["access-control-allow-methods"] == "GET, POST"
        assert answer.headers["access-control-max-age"] == "600"
        assert answer.headers["access-control-allow-headers"] == REQUESTED_HEADERS
        assert "access-control-allow-credentials" not in answer.headers
        assert "origin" in vary(answer)


@pytest.mark.parametrize(("method", "path"), INFERENCE_PATHS)
def test_a_preflight_from_another_origin_is_refused(http, method, path):
    answer = preflight(http, path, OTHER, method)
    assert answer.status_code == 400
    assert answer.text == "Disallowed CORS origin"
    assert "access-control-allow-origin" not in answer.headers


def test_a_preflight_for_another_method_is_refused(http):
    answer = preflight(http, "/v1/models/fixed", APP, "DELETE")
    assert answer.status_code == 400
    assert answer.text == "Disallowed CORS method"


def test_a_private_network_preflight_from_a_listed_origin_is_allowed(http):
    answer = preflight(http, "/v1/chat/completions", APP, **{"Access-Control-Request-Private-Network": "true"})
    assert answer.status_code == 200
    assert answer.headers["access-control-allow-private-network"] == "true"


def assert_cors(answer, origin: str) -> None:
    assert answer.headers["access-control-allow-origin"] == origin
    assert answer.headers["access-control-expose-headers"] == "Retry-After, WWW-Authenticate"
    assert "origin" in vary(answer)


def test_actual_answers_to_a_listed_origin_carry_the_cors_headers(http):
    headers = {"Origin": APP}
    chat = http.post("/v1/chat/completions", json=CHAT, headers=headers)
    assert chat.status_code == 200
    assert chat.json()["choices"][0]["message"]["content"] == "alpha beta"
    assert_cors(chat, APP)
    with http.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}, headers=headers) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert_cors(stream, APP)
        body = stream.read().decode()
    assert body.rstrip().endswith("data: [DONE]")
    responses = http.post("/v1/responses", json={"model": "fixed", "input": "x"}, headers=headers)
    assert responses.json()["output"][0]["content"][0]["text"] == "alpha beta"
    assert_cors(responses, APP)
    models = http.get("/v1/models", headers=headers)
    assert [m["id"] for m in models.json()["data"]] == ["fixed"]
    assert_cors(models, APP)
    for answer, code in ((http.get("/v1/nowhere", headers=headers), "not_found"),
                         (http.post("/v1/chat/completions", json={**CHAT, "model": "nope"}, headers=headers),
                          "unknown_model")):
        assert answer.json()["error"]["code"] == code
        assert_cors(answer, APP)


def test_answers_to_another_origin_carry_no_allow_origin(http):
    answer = http.post("/v1/chat/completions", json=CHAT, headers={"Origin": OTHER})
    assert answer.status_code == 200  # the browser, not the server, keeps the page from reading it
    assert "access-control-allow-origin" not in answer.headers
    assert "origin" in vary(answer)


def test_the_admin_api_gets_no_cors(http):
    answer = preflight(http, "/v1/admin/models", APP, "GET")
    assert "access-control-allow-origin" not in answer.headers
    listed = http.get("/v1/admin/models", headers={"Origin": APP})
    assert listed.status_code == 200
    assert "access-control-allow-origin" not in listed.headers
    load = preflight(http, "/v1/admin/models/fixed/unload", APP)
    assert "access-control-allow-origin" not in load.headers


def test_cors_is_off_by_default(plain_service):
    with plain_service.client() as http:
        answer = preflight(http, "/v1/chat/completions", APP)
        assert answer.status_code == 405  # the endpoint's own answer to OPTIONS: no preflight handling
        assert answer.json()["error"]["code"] == "method_not_allowed"
        chat = http.post("/v1/chat/completions", json=CHAT, headers={"Origin": APP})
        assert chat.status_code == 200
        assert not [name for name in chat.headers if name.startswith("access-control-")]
        assert "origin" not in vary(chat)


def test_a_reload_keeps_the_origins_the_process_started_with(service, http):
    local = service.settings_path.parent / "local.json"
    try:
        local.write_text(json.dumps({"service": {"cors_allowed_origins": [OTHER]}}))
        answer = http.post("/v1/admin/settings/reload")
        assert answer.status_code == 200
        assert answer.json()["service_restart_required"] is True
        assert preflight(http, "/v1/chat/completions", APP).headers["access-control-allow-origin"] == APP
        assert preflight(http, "/v1/chat/completions", OTHER).status_code == 400
        local.write_text(json.dumps({"service": {"cors_allowed_origins": ["http://app.example.com/"]}}))
        refused = http.post("/v1/admin/settings/reload")
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == "invalid_settings"
        assert "$.service.cors_allowed_origins[0]" in refused.json()["error"]["message"]
    finally:
        local.unlink(missing_ok=True)
        assert http.post("/v1/admin/settings/reload").status_code == 200
    assert preflight(http, "/v1/chat/completions", APP).status_code == 200
