"""The DRF view of POST /v1/responses (``api.views.ResponseCreateApi``): it serves the endpoint where the
ASGI router of llmpool.asgi is not in front, as here through Django's own test client, and answers
what the plain-ASGI front answers, because both call ``api.responses.endpoint.create_response``."""
from __future__ import annotations

import hashlib
import json

import pytest
from django.test import AsyncClient

from models_app.conf import service_settings
from tests.models_app.drf_runtime import serving_runtime

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
async def runtime(tmp_path, settings):
    async with serving_runtime(tmp_path, settings, {"echo": {"backend": "stub", "stub_reply": "one two three"}}):
        yield


async def test_a_non_streamed_answer(runtime):
    answer = await AsyncClient().post("/v1/responses", {"model": "echo", "input": "hi"}, content_type="application/json")
    assert answer.status_code == 200
    body = answer.json()
    assert (body["object"], body["status"]) == ("response", "completed")
    assert body["output"][0]["content"][0]["text"] == "one two three"


async def test_a_streamed_answer(runtime):
    answer = await AsyncClient().post(
        "/v1/responses", {"model": "echo", "input": "hi", "stream": True}, content_type="application/json"
    )
    assert answer.status_code == 200
    assert answer["Content-Type"] == "text/event-stream"
    text = b"".join([chunk async for chunk in answer.streaming_content]).decode()
    events = [line.removeprefix("event: ") for line in text.splitlines() if line.startswith("event: ")]
    assert events[0] == "response.created" and events[-1] == "response.completed"
    assert events.count("response.output_text.delta") == 3


async def test_errors_have_the_same_envelope(runtime):
    answer = await AsyncClient().post("/v1/responses", {"model": "nope", "input": "hi"}, content_type="application/json")
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "unknown_model"


@pytest.fixture
def keyed(tmp_path, settings):
    """Settings with one inference key (for echo only); the views refuse before they reach the runtime."""
    path = tmp_path / "settings.json"
    key = {"name": "alice", "key_sha256": hashlib.sha256(b"alice-key").hexdigest(), "models": ["echo"]}
    path.write_text(json.dumps({"service": {"api_keys": [key]}, "models": {"echo": {"backend": "stub"}}}))
    settings.LLMPOOL_SETTINGS = str(path)
    service_settings.cache_clear()
    yield
    service_settings.cache_clear()


async def test_the_keys_apply_here_too(keyed):
    body = {"model": "other", "input": "hi"}
    missing = await AsyncClient().post("/v1/responses", body, content_type="application/json")
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == "invalid_api_key"
    assert missing["WWW-Authenticate"] == 'Bearer realm="llm-pool"'
    refused = await AsyncClient().post(
        "/v1/chat/completions", {"model": "other", "messages": [{"role": "user", "content": "x"}]},
        content_type="application/json", headers={"Authorization": "Bearer alice-key"},
    )
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "model_not_allowed"
    assert (await AsyncClient().get("/v1/models")).status_code == 401
