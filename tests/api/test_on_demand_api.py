"""Models that load on request, over HTTP on both deployment shapes: streams that wait with
``: loading`` comments, the errors of a wait, aliases on every inference endpoint and in
/v1/models, the admin entry's new fields and the reason of each transition.
"""
from __future__ import annotations

import json

import openai
import pytest

from tests.admin_ui.helpers import EventStream
from tests.conftest import LiveService, model_entry, write_settings

REPLY = "the quick brown fox"
MODELS = {
    # a load longer than the notice interval (3 s): the stream says so twice
    "cold": {"backend": "stub", "stub_reply": REPLY, "load_on_request": True, "stub_load_seconds": 3.5},
    "warmish": {"backend": "stub", "stub_reply": REPLY, "load_on_request": True, "stub_load_seconds": 0.5},
    "aliased": {"backend": "stub", "stub_reply": REPLY, "load_on_request": True, "ttl_seconds": 600,
                "aliases": ["gpt-4o-mini", "local-small"]},
    "broken": {"backend": "stub", "load_on_request": True, "stub_fail_load": "weights missing",
               "stub_load_seconds": 0.3},
    "broken-stream": {"backend": "stub", "load_on_request": True, "stub_fail_load": "weights missing",
                      "stub_load_seconds": 0.3},
    "slow-load": {"backend": "stub", "load_on_request": True, "stub_load_seconds": 5, "load_wait_timeout_seconds": 0.5},
    "plain": {"backend": "stub"},
}


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape):
    folder = tmp_path_factory.mktemp("on_demand_api")
    live = LiveService(write_settings(folder, MODELS), folder / "db.sqlite3").start()
    try:
        yield live
    finally:
        live.stop()


@pytest.fixture
def client(service):
    with openai.OpenAI(base_url=service.url + "/v1", api_key="unused", max_retries=0, timeout=30) as client:
        yield client


def raw_stream(http, body: dict) -> tuple[int, list[str]]:
    with http.stream("POST", "/v1/responses", json=body) as answer:
        return answer.status_code, list(answer.iter_lines())


def sse_events(lines: list[str]) -> list[dict]:
    return [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]


def test_a_stream_waits_for_the_load_with_loading_comments_then_streams(http):
    status, lines = raw_stream(http, {"model": "cold", "input": "x", "stream": True})
    assert status == 200
    comments = [line for line in lines if line.startswith(":")]
    assert comments[:2] == [": loading cold", ": loading cold"]  # at once, then 3 s later
    assert lines[0] == ": loading cold"
    events = sse_events(lines)
    assert [e["type"] for e in events][0] == "response.created"
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == REPLY
    entry = model_entry(http, "cold")
    assert (entry["runtime_state"], entry["last_reason"]) == ("loaded", "request")


def test_the_openai_client_streams_through_a_load_on_request(client, http):
    events = list(client.responses.create(model="warmish", input="x", stream=True))
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == REPLY
    assert model_entry(http, "warmish")["runtime_state"] == "loaded"


def test_aliases_work_on_every_inference_endpoint_and_load_the_model_once(client, http, service):
    with EventStream(service) as stream:
        chat = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
        assert chat.choices[0].message.content == REPLY
        loading, loaded = stream.transitions(2)
    assert [(e["model"], e["to"], e["reason"]) for e in (loading, loaded)] == [
        ("aliased", "loading", "request"), ("aliased", "loaded", "request")
    ]
    assert client.responses.create(model="local-small", input="x").output_text == REPLY
    streamed = client.chat.completions.create(
        model="local-small", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    assert "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices) == REPLY
    entry = model_entry(http, "aliased")
    assert entry["definition"]["aliases"] == ["gpt-4o-mini", "local-small"]
    assert entry["last_request_at"] is not None and entry["idle_expires_at"] is not None
    assert entry["group"] is None and entry["definition"]["load_on_request"] is True


def test_aliases_are_listed_in_v1_models(http):
    listed = {item["id"]: item for item in http.get("/v1/models").json()["data"]}
    assert listed["gpt-4o-mini"]["alias_of"] == "aliased"
    assert listed["local-small"]["alias_of"] == "aliased"
    assert listed["aliased"]["aliases"] == ["gpt-4o-mini", "local-small"]
    one = http.get("/v1/models/gpt-4o-mini")
    assert one.status_code == 200 and one.json()["alias_of"] == "aliased"
    assert http.get("/v1/models/no-such-alias").status_code == 404


def test_a_failed_load_answers_409_model_failed_and_is_not_retried(http):
    answer = http.post("/v1/responses", json={"model": "broken", "input": "x"})
    assert answer.status_code == 409
    error = answer.json()["error"]
    assert error["code"] == "model_failed" and "weights missing" not in error["message"]
    assert "weights missing" in model_entry(http, "broken")["last_error"]
    # failed now: the refusal comes before any wait, so a stream keeps the status too
    status, lines = raw_stream(http, {"model": "broken", "input": "x", "stream": True})
    assert status == 409 and json.loads(lines[0])["error"]["code"] == "model_failed"
    assert model_entry(http, "broken")["runtime_state"] == "failed"


def test_a_load_that_fails_while_a_stream_waits_ends_the_stream_with_its_error(http):
    status, lines = raw_stream(http, {"model": "broken-stream", "input": "x", "stream": True})
    assert status == 200 and lines[0] == ": loading broken-stream"
    errors = [e for e in sse_events(lines) if e.get("type") == "error" or "error" in e]
    assert errors and "model_failed" in json.dumps(errors[-1])


def test_a_wait_past_load_wait_timeout_seconds_is_503_model_loading_with_retry_after(http):
    answer = http.post("/v1/responses", json={"model": "slow-load", "input": "x"})
    assert answer.status_code == 503
    assert answer.json()["error"]["code"] == "model_loading"
    assert answer.headers["Retry-After"] == "5"


def test_errors_before_the_wait_keep_their_status(http):
    status, lines = raw_stream(http, {"model": "nope", "input": "x", "stream": True})
    assert status == 404 and json.loads(lines[0])["error"]["code"] == "unknown_model"
    status, lines = raw_stream(http, {"model": "plain", "input": "x", "stream": True})
    assert status == 409 and json.loads(lines[0])["error"]["code"] == "model_not_loaded"
