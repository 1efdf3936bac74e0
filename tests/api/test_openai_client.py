"""The official ``openai`` client against a live ``serve``: plain and streamed responses, errors as its exceptions."""
from __future__ import annotations

import threading
import time
from contextlib import ExitStack

import httpx
import openai
import pytest
from openai.types.responses import ResponseCompletedEvent, ResponseTextDeltaEvent

from tests.conftest import LiveService, write_settings

REPLY = "the quick brown fox"
SLOW_REPLY = " ".join(f"w{i}" for i in range(60))
MODELS = {
    "fixed": {"backend": "stub", "stub_reply": REPLY},
    "echo": {"backend": "stub", "thinking_modes": ["default", "enabled", "disabled"]},
    "flaky": {"backend": "stub", "stub_reply": "one two three four", "stub_fail_after_tokens": 2},
    "slow": {"backend": "stub", "stub_reply": SLOW_REPLY, "stub_token_delay_ms": 100},
    "draining": {"backend": "stub", "stub_reply": SLOW_REPLY, "stub_token_delay_ms": 100},
    "remote": {"backend": "stub", "stub_remote": True},
    "cold": {"backend": "stub"},
    "broken": {"backend": "stub", "stub_fail_load": "weights missing"},
}
STREAM_TYPES = (
    ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    + ["response.output_text.delta"] * len(REPLY.split())
    + ["response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"]
)


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape):
    """Remote execution off and at most one waiting request per model, to reach 403 and 429."""
    folder = tmp_path_factory.mktemp("openai_client")
    settings = write_settings(
        folder,
        MODELS,
        service={"allow_remote_execution": False},
        engine={"fairness": {"executor_queue_limit": 1}},
    )
    live = LiveService(settings, folder / "db.sqlite3").start()
    try:
        with live.client() as http:
            for name in MODELS:
                if name != "cold":
                    assert http.post(f"/v1/admin/models/{name}/load").status_code == 200
        yield live
    finally:
        live.stop()


@pytest.fixture
def client(service):
    # No retries: the client would otherwise retry 409, 429 and 5xx answers.
    with openai.OpenAI(base_url=service.url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


def model_state(http, name: str) -> str:
    return next(m for m in http.get("/v1/admin/models").json()["models"] if m["name"] == name)["runtime_state"]


def test_create(client):
    response = client.responses.create(model="fixed", input="hello there")
    assert response.id.startswith("resp_")
    assert response.model == "fixed"
    assert response.status == "completed"
    assert response.output_text == REPLY
    assert response.usage.input_tokens == 2
    assert response.usage.output_tokens == 4
    assert response.usage.total_tokens == 6


def test_create_with_messages_instructions_and_limits(client):
    response = client.responses.create(
        model="echo",
        instructions="repeat after me",
        input=[
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [{"type": "input_text", "text": "one two three"}]},
        ],
        max_output_tokens=2,
        metadata={"run": "7"},
        user="alice",
        extra_body={"thinking": "enabled"},
    )
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == "one two"
    assert response.usage.output_tokens == 2
    assert response.usage.input_tokens == 3 + 1 + 1 + 3
    assert response.metadata == {"run": "7"}
    assert response.user == "alice"
    assert response.instructions == "repeat after me"


def test_stream(client):
    events = list(client.responses.create(model="fixed", input="x", stream=True))
    assert [e.type for e in events] == STREAM_TYPES
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if isinstance(e, ResponseTextDeltaEvent)]
    assert len(deltas) == len(REPLY.split())
    assert "".join(deltas) == REPLY
    final = events[-1]
    assert isinstance(final, ResponseCompletedEvent)
    assert final.response.output_text == REPLY
    assert final.response.usage.output_tokens == len(deltas)


def test_stream_helper_accumulates_the_final_response(client):
    with client.responses.stream(model="fixed", input="x") as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert text == REPLY
    assert final.output_text == REPLY
    assert final.status == "completed"


def test_error_mid_stream_raises_api_error(client):
    seen = []
    with pytest.raises(openai.APIError) as caught:
        for event in client.responses.create(model="flaky", input="x", stream=True):
            seen.append(event.type)
    # A plain APIError (no HTTP status: the stream had already answered 200) carrying the error envelope.
    assert type(caught.value) is openai.APIError
    assert caught.value.code == "backend_error"
    assert caught.value.body["code"] == "backend_error"
    assert seen[-2:] == ["response.output_text.delta"] * 2
    assert "response.completed" not in seen


@pytest.mark.parametrize(
    ("kwargs", "error_class", "status", "code"),
    [
        pytest.param({"model": "no-such-model"}, openai.NotFoundError, 404, "unknown_model", id="unknown_model"),
        pytest.param({"model": "cold"}, openai.ConflictError, 409, "model_not_loaded", id="model_not_loaded"),
        pytest.param({"model": "broken"}, openai.ConflictError, 409, "model_failed", id="model_failed"),
        pytest.param(
            {"model": "fixed", "extra_body": {"thinking": "sideways"}},
            openai.BadRequestError, 400, "invalid_request", id="invalid_request",
        ),
        pytest.param(
            {"model": "fixed", "extra_body": {"thinking": "enabled"}},
            openai.BadRequestError, 400, "thinking_unsupported", id="thinking_unsupported",
        ),
        pytest.param(
            {"model": "remote"}, openai.PermissionDeniedError, 403, "remote_execution_disallowed", id="remote",
        ),
    ],
)
def test_errors_map_to_client_exceptions(client, kwargs, error_class, status, code):
    with pytest.raises(error_class) as caught:
        client.responses.create(input="x", **kwargs)
    error = caught.value
    assert error.status_code == status
    assert error.code == code
    assert error.body["code"] == code
    assert set(error.body) == {"code", "message", "param"}


def test_full_queue_raises_rate_limit_error(service, client):
    with service.client() as http, ExitStack() as streams:
        for _ in range(2):  # one runs, one waits: the queue (limit 1) is full
            body = {"model": "slow", "input": "x", "stream": True}
            assert streams.enter_context(http.stream("POST", "/v1/responses", json=body)).status_code == 200
        with pytest.raises(openai.RateLimitError) as caught:
            client.responses.create(model="slow", input="x")
    assert caught.value.status_code == 429
    assert caught.value.code == "executor_queue_full"
    assert int(caught.value.response.headers["retry-after"]) > 0


def test_unloading_model_raises_internal_server_error_with_retry_after(service, client):
    """503 answers are the client's InternalServerError; Retry-After says when to come back."""
    with service.client() as http:
        body = {"model": "draining", "input": "x", "stream": True}
        with http.stream("POST", "/v1/responses", json=body) as active:
            assert active.status_code == 200
            unload_url = service.url + "/v1/admin/models/draining/unload"
            unloader = threading.Thread(target=httpx.post, args=(unload_url,), kwargs={"timeout": 30}, daemon=True)
            unloader.start()
            deadline = time.monotonic() + 3
            while model_state(http, "draining") != "unloading" and time.monotonic() < deadline:
                time.sleep(0.02)
            with pytest.raises(openai.InternalServerError) as caught:
                client.responses.create(model="draining", input="x")
        unloader.join(timeout=10)
        assert model_state(http, "draining") == "unloaded"
    assert caught.value.status_code == 503
    assert caught.value.code == "model_unloading"
    assert int(caught.value.response.headers["retry-after"]) > 0


async def test_async_client(service):
    async with openai.AsyncOpenAI(base_url=service.url + "/v1", api_key="unused", max_retries=0) as client:
        response = await client.responses.create(model="fixed", input="x")
        assert response.output_text == REPLY
        stream = await client.responses.create(model="fixed", input="x", stream=True)
        events = [event async for event in stream]
        assert [e.type for e in events] == STREAM_TYPES
        assert events[-1].response.output_text == "".join(e.delta for e in events if e.type.endswith(".delta"))
        with pytest.raises(openai.NotFoundError) as caught:
            await client.responses.create(model="no-such-model", input="x")
        assert caught.value.code == "unknown_model"
