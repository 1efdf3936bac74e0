"""POST /v1/responses over raw HTTP against a live ``serve``: shapes, streaming, disconnects, fairness keys."""
from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.conftest import LiveService, model_entry, wait_until, write_settings

FIXED_REPLY = "alpha beta gamma delta epsilon"
SLOW_REPLY = " ".join(f"w{i}" for i in range(60))  # 60 tokens x 100 ms: far longer than any wait below
MODELS = {
    "echo": {"backend": "stub"},
    "fixed": {"backend": "stub", "stub_reply": FIXED_REPLY},
    "flaky": {"backend": "stub", "stub_reply": "one two three four", "stub_fail_after_tokens": 2},
    "slow": {"backend": "stub", "stub_reply": SLOW_REPLY, "stub_token_delay_ms": 100},
}
OPENING = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
]
CLOSING = [
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]
FAIRNESS_HEADER = "X-LLMPool-Fairness-Key"


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape):
    folder = tmp_path_factory.mktemp("responses")
    live = LiveService(write_settings(folder, MODELS), folder / "db.sqlite3").start()
    try:
        with live.client() as http:
            for name in MODELS:
                assert http.post(f"/v1/admin/models/{name}/load").json()["runtime_state"] == "loaded"
        yield live
    finally:
        live.stop()


def sse_events(response) -> list[dict]:
    """Every SSE event of a streamed response, checking each ``event:`` line matches its data type."""
    events, event_type = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            event_type = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data = json.loads(line.removeprefix("data: "))
            assert data["type"] == event_type
            events.append(data)
    return events


def fairness_key(http, model: str, key: str) -> dict | None:
    return next((k for k in model_entry(http, model)["fairness"]["keys"] if k["key"] == key), None)


def output_text(body: dict) -> str:
    return body["output"][0]["content"][0]["text"]


# ---- input shapes --------------------------------------------------------------------


def test_input_as_a_string(http):
    answer = http.post("/v1/responses", json={"model": "echo", "input": "ping pong"})
    assert answer.status_code == 200
    assert output_text(answer.json()) == "ping pong"


def test_input_as_messages_with_string_content(http):
    messages = [
        {"role": "system", "content": "be terse"},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "first answer"},
        {"type": "message", "role": "user", "content": "second question here"},
    ]
    answer = http.post("/v1/responses", json={"model": "echo", "input": messages})
    assert answer.status_code == 200
    body = answer.json()
    assert output_text(body) == "second question here"
    # The stub counts every text of every message as prompt tokens.
    assert body["usage"]["input_tokens"] == 2 + 2 + 2 + 3


def test_input_with_input_text_parts(http):
    content = [{"type": "input_text", "text": "part one"}, {"type": "input_text", "text": " part two"}]
    answer = http.post("/v1/responses", json={"model": "echo", "input": [{"role": "user", "content": content}]})
    assert answer.status_code == 200
    assert output_text(answer.json()) == "part one part two"


def test_instructions_are_echoed_and_count_as_input(http):
    plain = http.post("/v1/responses", json={"model": "echo", "input": "one two three"}).json()
    instructed = http.post(
        "/v1/responses", json={"model": "echo", "input": "one two three", "instructions": "answer in french"}
    ).json()
    assert plain["instructions"] is None
    assert instructed["instructions"] == "answer in french"
    assert instructed["usage"]["input_tokens"] == plain["usage"]["input_tokens"] + 3
    assert output_text(instructed) == "one two three"


# ---- the response object -------------------------------------------------------------


def test_response_object_shape(http):
    before = int(time.time())
    answer = http.post("/v1/responses", json={"model": "fixed", "input": "hello"})
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    body = answer.json()
    assert body["id"].startswith("resp_")
    assert body["object"] == "response"
    assert isinstance(body["created_at"], int) and before - 1 <= body["created_at"] <= time.time() + 1
    assert body["model"] == "fixed"
    assert body["status"] == "completed"
    assert body["error"] is None
    assert body["incomplete_details"] is None
    assert len(body["output"]) == 1
    message = body["output"][0]
    assert message["type"] == "message"
    assert message["role"] == "assistant"
    assert message["status"] == "completed"
    assert message["id"].startswith("msg_")
    assert message["content"] == [{"type": "output_text", "text": FIXED_REPLY, "annotations": []}]


def test_usage_numbers_are_consistent(http):
    body = http.post("/v1/responses", json={"model": "fixed", "input": "one two three", "instructions": "be nice"})
    usage = body.json()["usage"]
    assert usage["input_tokens"] == 5
    assert usage["output_tokens"] == len(FIXED_REPLY.split())
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_max_output_tokens_truncates_as_incomplete(http):
    answer = http.post("/v1/responses", json={"model": "fixed", "input": "x", "max_output_tokens": 2})
    assert answer.status_code == 200
    body = answer.json()
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["max_output_tokens"] == 2
    assert body["output"][0]["status"] == "incomplete"
    assert output_text(body) == "alpha beta"
    assert body["usage"]["output_tokens"] == 2


def test_max_output_tokens_at_the_reply_length_is_complete(http):
    body = http.post("/v1/responses", json={"model": "fixed", "input": "x", "max_output_tokens": 5}).json()
    assert body["status"] == "completed"
    assert body["incomplete_details"] is None
    assert output_text(body) == FIXED_REPLY


def test_metadata_is_echoed(http):
    metadata = {"trace_id": "abc-123", "team": "search"}
    body = http.post("/v1/responses", json={"model": "echo", "input": "x", "metadata": metadata}).json()
    assert body["metadata"] == metadata
    assert http.post("/v1/responses", json={"model": "echo", "input": "x"}).json()["metadata"] == {}


def test_engine_decoding_defaults_apply_when_fields_are_omitted(live_service):
    service = live_service(
        {"fixed": {"backend": "stub", "stub_reply": FIXED_REPLY}},
        engine={"decoding": {"max_output_tokens": 2}},
    )
    with service.client() as http:
        http.post("/v1/admin/models/fixed/load")
        default = http.post("/v1/responses", json={"model": "fixed", "input": "x"}).json()
        assert default["status"] == "incomplete"
        assert default["usage"]["output_tokens"] == 2
        assert output_text(default) == "alpha beta"
        explicit = http.post("/v1/responses", json={"model": "fixed", "input": "x", "max_output_tokens": 4}).json()
        assert explicit["usage"]["output_tokens"] == 4


# ---- streaming -----------------------------------------------------------------------


def test_stream_event_sequence(http):
    with http.stream("POST", "/v1/responses", json={"model": "fixed", "input": "x", "stream": True}) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        events = sse_events(stream)
    tokens = len(FIXED_REPLY.split())
    assert [e["type"] for e in events] == (
        OPENING + ["response.output_text.delta"] * tokens + CLOSING + ["response.completed"]
    )
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert "".join(deltas) == done["text"] == FIXED_REPLY
    created, completed = events[0]["response"], events[-1]["response"]
    assert created["status"] == "in_progress" and created["output"] == []
    assert completed["id"] == created["id"]
    assert completed["status"] == "completed"
    assert output_text(completed) == FIXED_REPLY
    assert completed["usage"]["output_tokens"] == tokens
    message_id = events[2]["item"]["id"]
    assert {e["item_id"] for e in events if "item_id" in e} == {message_id}
    assert completed["output"][0]["id"] == message_id


def test_stream_truncated_by_max_output_tokens_ends_incomplete(http):
    body = {"model": "fixed", "input": "x", "stream": True, "max_output_tokens": 2}
    with http.stream("POST", "/v1/responses", json=body) as stream:
        events = sse_events(stream)
    assert [e["type"] for e in events] == (
        OPENING + ["response.output_text.delta"] * 2 + CLOSING + ["response.incomplete"]
    )
    final = events[-1]["response"]
    assert final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert output_text(final) == "alpha beta"


def test_mid_stream_failure_ends_with_an_error_event(http):
    with http.stream("POST", "/v1/responses", json={"model": "flaky", "input": "x", "stream": True}) as stream:
        assert stream.status_code == 200
        events = sse_events(stream)
    types = [e["type"] for e in events]
    assert types == OPENING + ["response.output_text.delta"] * 2 + ["error"]
    assert "response.completed" not in types
    error = events[-1]
    assert error["code"] == "backend_error"
    assert error["error"]["code"] == "backend_error"
    assert set(error["error"]) == {"code", "message", "param"}
    assert error["sequence_number"] == len(events) - 1
    assert wait_until(lambda: model_entry(http, "flaky")["runtime_inflight"] == 0)


def test_client_disconnect_mid_stream_frees_the_slot(http):
    with http.stream("POST", "/v1/responses", json={"model": "slow", "input": "x", "stream": True}) as stream:
        lines = stream.iter_lines()  # kept alive: dropping it would close the connection early
        deltas = 0
        while deltas < 2:
            deltas += next(lines) == "event: response.output_text.delta"
        assert model_entry(http, "slow")["runtime_inflight"] == 1
    # The full reply would take ~6 s more; the slot must come back long before that.
    freed = wait_until(
        lambda: (entry := model_entry(http, "slow"))["runtime_inflight"] == 0 and entry["inflight_requests"] == 0,
        timeout=2.0,
    )
    assert freed
    started = time.monotonic()
    answer = http.post("/v1/responses", json={"model": "slow", "input": "x", "max_output_tokens": 2})
    assert answer.status_code == 200
    assert output_text(answer.json()) == "w0 w1"
    assert time.monotonic() - started < 2.0


# ---- fairness keys -------------------------------------------------------------------


def test_fairness_key_from_the_user_field(http):
    body = {"model": "slow", "input": "x", "stream": True, "user": "carol"}
    with http.stream("POST", "/v1/responses", json=body) as stream:
        assert stream.status_code == 200
        key = wait_until(lambda: (k := fairness_key(http, "slow", "carol")) and k["active"] == 1 and k)
        assert key and (key["active"], key["pending"]) == (1, 0)
    answer = http.post("/v1/responses", json={"model": "echo", "input": "x", "user": "carol"})
    assert answer.status_code == 200, answer.text  # a split CI run once got another answer here
    assert answer.json()["user"] == "carol"


def test_fairness_header_wins_over_the_user_field(http):
    body = {"model": "slow", "input": "x", "stream": True, "user": "dave"}
    with http.stream("POST", "/v1/responses", json=body, headers={FAIRNESS_HEADER: "erin"}) as stream:
        assert stream.status_code == 200
        key = wait_until(lambda: (k := fairness_key(http, "slow", "erin")) and k["active"] == 1 and k)
        assert key and key["active"] == 1
        assert fairness_key(http, "slow", "dave") is None
    answer = http.post(
        "/v1/responses", json={"model": "echo", "input": "x", "user": "dave"}, headers={FAIRNESS_HEADER: "erin"}
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["user"] == "erin"
    header_only = http.post("/v1/responses", json={"model": "echo", "input": "x"}, headers={FAIRNESS_HEADER: "frank"})
    assert header_only.json()["user"] == "frank"


def test_no_fairness_key_is_the_anonymous_bucket(http):
    assert http.post("/v1/responses", json={"model": "echo", "input": "x"}).json()["user"] is None
    keys = model_entry(http, "echo")["fairness"]["keys"]
    assert None in [k["key"] for k in keys]


def test_a_client_that_accepts_only_event_streams_still_gets_answers(service):
    headers = {"Accept": "text/event-stream"}
    with httpx.stream("POST", service.url + "/v1/responses", headers=headers, timeout=30,
                      json={"model": "echo", "input": "hello there", "stream": True}) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert any(line == "event: response.completed" for line in stream.iter_lines())
    missing = httpx.post(service.url + "/v1/responses", headers=headers, json={"model": "nope", "input": "x"})
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "unknown_model"


def test_client_disconnect_while_waiting_for_a_non_streamed_answer_frees_the_slot(http, service):
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(service.url + "/v1/responses", json={"model": "slow", "input": "x"}, timeout=0.5)
    freed = wait_until(
        lambda: (entry := model_entry(http, "slow"))["runtime_inflight"] == 0 and entry["inflight_requests"] == 0,
        timeout=2.0,
    )
    assert freed


# ---- the HTTP edge ---------------------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
def test_other_methods_are_405_method_not_allowed(http, method):
    answer = http.request(method, "/v1/responses")
    assert answer.status_code == 405
    assert answer.headers["Allow"] == "POST"
    assert answer.json()["error"] == {"code": "method_not_allowed", "message": f'Method "{method}" not allowed.',
                                      "param": None}


def test_a_body_over_64_mib_is_413_request_too_large(http):
    before = model_entry(http, "echo")["fairness"]
    answer = http.post("/v1/responses", content=b" " * (64 * 1024 * 1024 + 1), headers={"Content-Type": "application/json"})
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "request_too_large"
    assert model_entry(http, "echo")["fairness"] == before


def test_an_empty_body_is_400_naming_the_missing_model(http):
    answer = http.post("/v1/responses", content=b"")
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid_request"
    assert answer.json()["error"]["param"] == "model"


def test_fields_clients_add_by_default_are_accepted_and_ignored(http):
    """include, stream_options, prompt_cache_key, safety_identifier and reasoning change nothing."""
    body = {
        "model": "fixed", "input": "x", "include": ["reasoning.encrypted_content"],
        "stream_options": {"include_obfuscation": False},
        "prompt_cache_key": "k", "safety_identifier": "s", "reasoning": {"effort": "low", "summary": "auto"},
    }
    answer = http.post("/v1/responses", json=body)
    assert answer.status_code == 200, answer.text
    assert output_text(answer.json()) == FIXED_REPLY
    assert answer.json()["usage"]["input_tokens_details"] == {"cached_tokens": 0, "cache_write_tokens": 0}
