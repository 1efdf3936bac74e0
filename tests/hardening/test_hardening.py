"""Hostile input at the HTTP edge (issue 23): every bad input answered with the envelope and its
documented status, no 500, no state change.  One live embedded service for the module."""
from __future__ import annotations

import json
import socket

import pytest

from models_app.api.limits import MAX_FAIRNESS_KEY_LENGTH, MAX_JSON_DEPTH
from tests.conftest import TEST_SERVER, LiveService, model_entry, write_settings

TOKEN = "hardening-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
MODELS = {
    "m": {"backend": "stub", "enabled": True, "embeddings": True},
    "cold": {"backend": "stub"},
}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
BODIES = {
    "/v1/responses": {"model": "m", "input": "hi"},
    "/v1/chat/completions": CHAT,
    "/v1/completions": {"model": "m", "prompt": "hi"},
    "/v1/embeddings": {"model": "m", "input": "hi"},
}


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hardening")
    live = LiveService(write_settings(folder, MODELS, service={"admin_token": TOKEN}), folder / "db.sqlite3",
                       mode="embedded").start()
    yield live
    assert live.stop() == 0


@pytest.fixture
def http(service):
    with service.client() as client:
        yield client


def assert_error(answer, status: int, code: str, param: str | None = None) -> dict:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"].startswith("application/json")
    error = answer.json()["error"]
    assert error["code"] == code, error
    if param is not None:
        assert error["param"] == param
    return error


# -- 1. fairness keys ------------------------------------------------------------------------
@pytest.mark.parametrize("path", sorted(BODIES))
def test_a_fairness_key_over_the_limit_is_400_on_every_inference_endpoint(http, path):
    too_long = "u" * (MAX_FAIRNESS_KEY_LENGTH + 1)
    error = assert_error(http.post(path, json={**BODIES[path], "user": too_long}), 400, "fairness_key_too_long", "user")
    assert str(MAX_FAIRNESS_KEY_LENGTH) in error["message"]
    header = {"X-LLMPool-Fairness-Key": too_long}
    assert_error(http.post(path, json=BODIES[path], headers=header), 400, "fairness_key_too_long",
                 "x-llmpool-fairness-key")
    assert http.post(path, json={**BODIES[path], "user": "u" * MAX_FAIRNESS_KEY_LENGTH}).status_code == 200


# -- 2. OPTIONS ------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/v1/admin/models", "/v1/admin/gpu-memory", "/healthz", "/v1/models"])
def test_options_answers_200_where_allow_advertises_it(http, path):
    answer = http.options(path, headers=ADMIN)
    assert answer.status_code == 200, answer.text
    assert "OPTIONS" in answer.headers["allow"]


# -- 3. admin body size, and no internal detail in a 500 -------------------------------------
def test_an_admin_body_over_the_limit_is_413_request_too_large(http):
    body = b'{"replicas": 1' + b" " * (3 * 1024 * 1024) + b"}"
    answer = http.post("/v1/admin/models/cold/load", headers={**ADMIN, "content-type": "application/json"},
                       content=body)
    error = assert_error(answer, 413, "request_too_large")
    assert "DATA_UPLOAD" not in error["message"]
    assert model_entry(http_admin(http), "cold")["runtime_state"] == "unloaded"


def http_admin(http):
    http.headers.update(ADMIN)
    return http


# -- 4. deep nesting -------------------------------------------------------------------------
def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize("path", sorted(BODIES))
def test_deeply_nested_json_is_400_invalid_request(http, path):
    body = '{"model":"m","input":' + deep(5000) + "}"
    assert_error(http.post(path, content=body), 400, "invalid_request")
    # Just past the limit too, where the JSON parser itself would not have refused it.
    body = json.dumps({**BODIES[path], "metadata": json.loads(deep(MAX_JSON_DEPTH))})
    assert_error(http.post(path, content=body), 400, "invalid_request")


def test_deeply_nested_load_body_is_422_and_loads_nothing(http):
    for levels in (5000, MAX_JSON_DEPTH):
        answer = http.post("/v1/admin/models/cold/load", headers={**ADMIN, "content-type": "application/json"},
                           content='{"replicas":' + deep(levels) + "}")
        assert_error(answer, 422, "invalid_load_body")
    assert model_entry(http_admin(http), "cold")["runtime_state"] == "unloaded"


# -- 5. integer bounds -----------------------------------------------------------------------
@pytest.mark.parametrize("path,field", [
    ("/v1/responses", "max_output_tokens"), ("/v1/chat/completions", "max_tokens"),
    ("/v1/chat/completions", "seed"), ("/v1/completions", "max_tokens"), ("/v1/embeddings", "dimensions"),
])
def test_integers_past_the_bounds_are_400(http, path, field):
    for value in (2**64, 2**63, -(2**64)):
        assert_error(http.post(path, json={**BODIES[path], field: value}), 400, "invalid_request")
    if field != "seed":  # the declared fields' own bound (2^31 - 1), with the param named
        assert_error(http.post(path, json={**BODIES[path], field: 2**31}), 400, "invalid_request", field)


def test_an_integer_past_64_bits_anywhere_in_a_body_is_400(http):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "maxLength": 2**70}}}]
    assert_error(http.post("/v1/chat/completions", json={**CHAT, "tools": tools}), 400, "invalid_request")


def test_load_integers_past_the_bounds_are_422(http):
    for value in (2**64, 2**63):
        assert_error(http.post("/v1/admin/models/cold/load", headers=ADMIN, json={"replicas": value}),
                     422, "invalid_load_body")
    assert model_entry(http_admin(http), "cold")["runtime_state"] == "unloaded"


# -- 7. a null load body ---------------------------------------------------------------------
def test_a_null_load_body_is_422_and_loads_nothing(http):
    answer = http.post("/v1/admin/models/cold/load", headers={**ADMIN, "content-type": "application/json"},
                       content=b"null")
    assert_error(answer, 422, "invalid_load_body")
    assert model_entry(http_admin(http), "cold")["runtime_state"] == "unloaded"


# -- 10. strict types ------------------------------------------------------------------------
@pytest.mark.parametrize("path,field,value", [
    ("/v1/responses", "max_output_tokens", True), ("/v1/responses", "max_output_tokens", "10"),
    ("/v1/responses", "stream", "yes"), ("/v1/responses", "temperature", "0.5"),
    ("/v1/chat/completions", "max_tokens", True), ("/v1/chat/completions", "stream", 1),
    ("/v1/completions", "max_tokens", "10"), ("/v1/embeddings", "dimensions", 1.0),
])
def test_inference_fields_are_strictly_typed(http, path, field, value):
    assert_error(http.post(path, json={**BODIES[path], field: value}), 400, "invalid_request", field)


def test_empty_input_is_one_rule(http):
    for empty in ("", []):
        assert_error(http.post("/v1/responses", json={"model": "m", "input": empty}), 400, "invalid_request", "input")


# -- 11. envelopes ---------------------------------------------------------------------------
def test_json_constants_and_bad_utf8_are_400_envelopes(http):
    assert_error(http.post("/v1/responses", content=b'{"model":"m","input":"hi","temperature":NaN}'),
                 400, "invalid_request")
    assert_error(http.post("/v1/responses", content=b'{"model":"m","input":"\xff\xfe"}'), 400, "invalid_request")
    answer = http.post("/v1/admin/models/cold/load", headers={**ADMIN, "content-type": "application/json"},
                       content=b'{"replicas": 1, "x": "\xff"}')
    assert_error(answer, 422, "invalid_load_body")


def raw_exchange(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        try:
            sock.sendall(request)
        except OSError:
            pass  # the server may refuse before all of it is sent
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except OSError:
            pass
    return b"".join(chunks)


def test_what_the_http_server_itself_refuses_gets_a_bare_400(service):
    """The documented server-level refusals (docs/api.md, "Limits"): the HTTP server's parser
    answers 400 itself, before llm-pool sees the request (uvicorn's httptools with llm-pool's
    16 KiB bound on a request's head, models_app.http.connections; or daphne's Twisted)."""
    refused = [
        b"GET /v1/ad\x00min HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /v1/\xe9 HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: %s\r\n" % (i, b"a" * 2000) for i in range(10))
        + b"\r\n",
    ]
    multipart = (b"POST /v1/admin/models/cold/load HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data\r\n"
                 b"Content-Length: 1\r\n\r\nx")
    long_line = b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n"
    unending = b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 100_000  # no end of the line in sight
    if TEST_SERVER == "daphne":
        refused.append(multipart)  # Twisted parses form bodies itself, before the auth check
        # One header line longer than Twisted's line limit: it closes the connection unanswered.
        assert raw_exchange(service.port, long_line) == b""
    else:
        refused += [long_line, unending]
        # uvicorn leaves bodies to the application: llm-pool's own envelope (the admin token first).
        answer = raw_exchange(service.port, multipart)
        assert answer.startswith(b"HTTP/1.1 401") and b'"code":"unauthorized"' in answer, answer[:200]
    for request in refused:
        assert raw_exchange(service.port, request).startswith(b"HTTP/1.1 400"), request[:60]


def test_accept_event_stream_alone_is_answered_as_any_other(http):
    answer = http.post("/v1/responses", headers={"Accept": "text/event-stream"}, json=BODIES["/v1/responses"])
    assert answer.status_code == 200 and answer.json()["status"] == "completed"
