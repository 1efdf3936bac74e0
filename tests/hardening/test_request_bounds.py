"""Bodies that one character, one oversized list or one empty message used to turn against the
service (docs/api.md, "Limits"): a lone UTF-16 surrogate, the per-request bounds (messages,
content parts, tools, stop sequences), and the empty-message rule.  Each is refused with the
envelope before anything is loaded or queued, and a bystander's request on another model is
served meanwhile.  The module runs on the embedded default and on the split."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from models_app.api.limits import MAX_MESSAGES, MAX_STOP_LENGTH, MAX_STOP_SEQUENCES, MAX_TOOLS
from tests.conftest import LiveService, model_entry, write_settings

TOKEN = "bounds-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
MODELS = {
    "m": {"backend": "stub", "enabled": True, "embeddings": True},
    "heavy": {"backend": "stub", "enabled": True, "stub_reply": "done"},
    "lazy": {"backend": "stub", "load_on_request": True, "embeddings": True},
    "cold": {"backend": "stub"},
}
USER = {"role": "user", "content": "hi"}
BODIES = {
    "/v1/responses": {"model": "lazy", "input": "hi"},
    "/v1/chat/completions": {"model": "lazy", "messages": [USER]},
    "/v1/completions": {"model": "lazy", "prompt": "hi"},
    "/v1/embeddings": {"model": "lazy", "input": "hi"},
}
# Where each endpoint's text goes: the surrogate is put there.
TEXT_FIELD = {
    "/v1/responses": ("input", "input"),
    "/v1/chat/completions": ("messages", "messages[0].content"),
    "/v1/completions": ("prompt", "prompt"),
    "/v1/embeddings": ("input", "input"),
}
SURROGATE = "x \\ud800 y"  # as the JSON body spells it: a lone high surrogate


@pytest.fixture(scope="module", params=["embedded", "split"])
def service(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"bounds-{request.param}")
    live = LiveService(write_settings(folder, MODELS, service={"admin_token": TOKEN}), folder / "db.sqlite3",
                       mode=request.param).start()
    yield live
    assert live.stop() == 0


@pytest.fixture
def http(service):
    with service.client(headers=ADMIN, timeout=60) as client:
        yield client


def assert_error(answer, status: int, code: str, param: str | None) -> dict:
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == (code, param), error
    return error


def assert_nothing_loaded(http) -> None:
    assert model_entry(http, "lazy")["runtime_state"] == "unloaded"
    assert model_entry(http, "cold")["runtime_state"] == "unloaded"


def with_surrogate(path: str) -> bytes:
    field, _ = TEXT_FIELD[path]
    body = json.dumps({**BODIES[path], field: "PLACE"})
    if path == "/v1/chat/completions":
        body = json.dumps({**BODIES[path], "messages": [{"role": "user", "content": "PLACE"}]})
    return body.replace('"PLACE"', f'"{SURROGATE}"').encode()


# -- a lone surrogate -------------------------------------------------------------------------
@pytest.mark.parametrize("path", sorted(BODIES))
def test_a_lone_surrogate_is_400_naming_its_field_on_every_inference_endpoint(http, path):
    error = assert_error(http.post(path, content=with_surrogate(path)), 400, "invalid_request", TEXT_FIELD[path][1])
    assert "lone UTF-16 surrogate" in error["message"]
    # A whole pair is one character, and runs.
    pair = with_surrogate(path).replace(b"\\ud800", b"\\ud83d\\ude00").replace(b'"lazy"', b'"m"')
    assert http.post(path, content=pair).status_code == 200
    assert_nothing_loaded(http)


@pytest.mark.parametrize("path", ["/v1/admin/models/cold/load", "/v1/admin/models/cold/load?dry_run=true",
                                  "/v1/admin/models/m/reconfigure"])
def test_a_lone_surrogate_in_a_load_body_is_422_naming_its_field(http, path):
    body = b'{"replicas": 1, "llama_server_env": {"HF_TOKEN": "' + SURROGATE.encode() + b'"}}'
    answer = http.post(path, content=body, headers={"content-type": "application/json"})
    error = assert_error(answer, 422, "invalid_load_body", "llama_server_env.HF_TOKEN")
    assert "lone UTF-16 surrogate" in error["message"]
    assert_nothing_loaded(http)
    assert model_entry(http, "m")["runtime_state"] == "loaded"


# -- per-request bounds -----------------------------------------------------------------------
def chat(model: str, **fields) -> dict:
    return {"model": model, "messages": [USER], **fields}


def tools(count: int) -> list[dict]:
    return [{"type": "function", "function": {"name": f"f{index}"}} for index in range(count)]


OVER_THE_BOUNDS = [
    ("/v1/chat/completions", chat("lazy", stop=["s"] * (MAX_STOP_SEQUENCES + 1)), "stop"),
    ("/v1/completions", {"model": "lazy", "prompt": "hi", "stop": ["s"] * (MAX_STOP_SEQUENCES + 1)}, "stop"),
    ("/v1/chat/completions", chat("lazy", stop=["s", "x" * (MAX_STOP_LENGTH + 1)]), "stop[1]"),
    ("/v1/completions", {"model": "lazy", "prompt": "hi", "stop": "x" * (MAX_STOP_LENGTH + 1)}, "stop"),
    ("/v1/chat/completions", {"model": "lazy", "messages": [USER] * (MAX_MESSAGES + 1)}, "messages"),
    ("/v1/responses", {"model": "lazy", "input": [USER] * (MAX_MESSAGES + 1)}, "input"),
    ("/v1/chat/completions", {"model": "lazy", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}] * (MAX_MESSAGES + 1)}]}, "messages"),
    ("/v1/chat/completions", chat("lazy", tools=tools(MAX_TOOLS + 1)), "tools"),
    ("/v1/responses", {"model": "lazy", "input": "hi", "tools": [
        {"type": "function", "name": f"f{index}"} for index in range(MAX_TOOLS + 1)]}, "tools"),
]


@pytest.mark.parametrize("path, body, param", OVER_THE_BOUNDS)
def test_a_body_past_a_bound_is_400_naming_the_bound_before_any_load(http, path, body, param):
    error = assert_error(http.post(path, json=body), 400, "invalid_request", param)
    assert "at most" in error["message"]
    assert_nothing_loaded(http)


def test_a_body_at_the_bounds_runs(http):
    body = chat("m", stop=["x" * MAX_STOP_LENGTH] * (MAX_STOP_SEQUENCES - 1) + [" there"], tools=tools(MAX_TOOLS),
                tool_choice="none",
                messages=[{"role": "user", "content": "hi there you"}] * MAX_MESSAGES)
    answer = http.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "hi"  # cut before the stop sequence


def bystanders(service: LiveService, count: int = 16):
    """``count`` requests on model m at once, each a stream of a few tokens: the statuses they got."""
    def one(_):
        with service.client(timeout=60) as client:
            answer = client.post("/v1/chat/completions", json=chat("m", stream=True))
            return answer.status_code, answer.text.count('"error"')
    pool = ThreadPoolExecutor(max_workers=count)
    return pool, [pool.submit(one, index) for index in range(count)]


def send_beside_bystanders(service: LiveService, body: bytes):
    """Send ``body`` to /v1/chat/completions while bystanders run on model m: its answer, and
    theirs (every one must be a whole, error-free 200)."""
    pool, futures = bystanders(service)
    try:
        with service.client(timeout=120) as client:
            answer = client.post("/v1/chat/completions", content=body)
        results = [future.result(timeout=120) for future in futures]
    finally:
        pool.shutdown(wait=True)
    assert results == [(200, 0)] * len(results), results
    return answer


def test_oversized_requests_are_refused_while_bystanders_are_served(service, http):
    """The issue's two: 2,000 stop sequences of 10 KB (19 MB), and a million short messages (40 MB)."""
    stops = json.dumps(chat("heavy", stop=["x" * 10_000] * 2_000)).encode()
    assert_error(send_beside_bystanders(service, stops), 400, "invalid_request", "stop")
    message = json.dumps(USER).encode()
    million = b'{"model": "heavy", "messages": [' + b", ".join([message] * 1_000_000) + b"]}"
    assert_error(send_beside_bystanders(service, million), 400, "invalid_request", "messages")


def test_a_heavy_request_within_the_bounds_does_not_fail_bystanders(service):
    """10,000 messages of 100 characters (1.3 MB, parsed off the event loop) on another model."""
    messages = [{"role": "user", "content": "word " * 20}] * MAX_MESSAGES
    body = json.dumps({"model": "heavy", "messages": messages, "stop": ["y" * MAX_STOP_LENGTH] * MAX_STOP_SEQUENCES})
    answer = send_beside_bystanders(service, body.encode())
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "done"


# -- the empty-message rule -------------------------------------------------------------------
EMPTY = [
    ("/v1/chat/completions", {"model": "lazy", "messages": [{"role": "user", "content": ""}]}, "messages[0].content"),
    ("/v1/chat/completions", {"model": "lazy", "messages": [{"role": "user", "content": []}]}, "messages[0].content"),
    ("/v1/chat/completions", {"model": "lazy", "messages": []}, "messages"),
    ("/v1/chat/completions", {"model": "lazy", "messages": [
        {"role": "system", "content": []}, USER]}, "messages[0].content"),
    ("/v1/responses", {"model": "lazy", "input": [{"role": "user", "content": []}]}, "input[0].content"),
    ("/v1/responses", {"model": "lazy", "input": [{"role": "user", "content": ""}]}, "input[0].content"),
    ("/v1/responses", {"model": "lazy", "input": []}, "input"),
    ("/v1/responses", {"model": "lazy", "input": ""}, "input"),
    ("/v1/completions", {"model": "lazy", "prompt": ""}, "prompt"),
    ("/v1/completions", {"model": "lazy", "prompt": ["hi", ""]}, "prompt"),
]


@pytest.mark.parametrize("path, body, param", EMPTY)
def test_an_empty_message_is_400_before_any_load(http, path, body, param):
    assert_error(http.post(path, json=body), 400, "invalid_request", param)
    assert_nothing_loaded(http)


def test_an_empty_assistant_text_is_not_an_empty_message(http):
    """An assistant turn of "" (how clients send a turn that only called tools) is no user message."""
    messages = [USER, {"role": "assistant", "content": ""}, {"role": "user", "content": "again"}]
    assert http.post("/v1/chat/completions", json={"model": "m", "messages": messages}).status_code == 200
    items = [USER, {"role": "assistant", "content": ""}, {"role": "user", "content": "again"}]
    assert http.post("/v1/responses", json={"model": "m", "input": items}).status_code == 200


def test_the_openapi_document_states_the_rules(http):
    paths = http.get("/v1/openapi.json").json()["paths"]

    def body(path: str) -> dict:
        return paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]

    chat_body, responses_body = body("/v1/chat/completions"), body("/v1/responses")
    assert (chat_body["messages"]["minItems"], chat_body["messages"]["maxItems"]) == (1, MAX_MESSAGES)
    assert chat_body["messages"]["items"]["properties"]["content"]["minItems"] == 1
    assert chat_body["tools"]["maxItems"] == MAX_TOOLS
    stop_shapes = chat_body["stop"]["anyOf"]
    assert {"type": "string", "maxLength": MAX_STOP_LENGTH} in stop_shapes
    assert any(shape.get("maxItems") == MAX_STOP_SEQUENCES for shape in stop_shapes)
    assert (responses_body["input"]["minItems"], responses_body["input"]["maxItems"]) == (1, MAX_MESSAGES)
    assert body("/v1/completions")["prompt"]["anyOf"][0] == {"type": "string", "minLength": 1}
