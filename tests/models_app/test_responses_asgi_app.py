"""POST /v1/responses through the ASGI application's route table (``api.routes``), in process:
the answer, the stream, the error envelope, the keys; and no Django route serves the path."""
from __future__ import annotations

import hashlib
import json

import pytest
from django.test import AsyncClient

from models_app.conf import service_settings
from tests.models_app.in_process import asgi_client, serving_runtime

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
async def runtime(tmp_path, settings):
    async with serving_runtime(tmp_path, settings, {"echo": {"backend": "stub", "stub_reply": "one two three"}}):
        yield


async def test_a_non_streamed_answer(runtime):
    async with asgi_client() as client:
        answer = await client.post("/v1/responses", json={"model": "echo", "input": "hi"})
    assert answer.status_code == 200
    body = answer.json()
    assert (body["object"], body["status"]) == ("response", "completed")
    assert body["output"][0]["content"][0]["text"] == "one two three"


async def test_a_streamed_answer(runtime):
    async with asgi_client() as client:
        answer = await client.post("/v1/responses", json={"model": "echo", "input": "hi", "stream": True})
    assert answer.status_code == 200
    assert answer.headers["Content-Type"] == "text/event-stream"
    events = [line.removeprefix("event: ") for line in answer.text.splitlines() if line.startswith("event: ")]
    assert events[0] == "response.created" and events[-1] == "response.completed"
    assert events.count("response.output_text.delta") == 3


async def test_errors_have_the_envelope(runtime):
    async with asgi_client() as client:
        answer = await client.post("/v1/responses", json={"model": "nope", "input": "hi"})
        wrong_method = await client.get("/v1/responses")
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "unknown_model"
    assert (wrong_method.status_code, wrong_method.headers["Allow"]) == (405, "POST")
    assert wrong_method.json()["error"]["code"] == "method_not_allowed"


async def test_django_has_no_route_of_its_own_for_the_inference_paths():
    """Only the ASGI route table serves them: behind Django alone each is the /v1 404."""
    for path in ("/v1/responses", "/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
        answer = await AsyncClient().post(path, {"model": "echo"}, content_type="application/json")
        assert (answer.status_code, answer.json()["error"]["code"]) == (404, "not_found")


@pytest.fixture
def keyed(tmp_path, settings):
    """Settings with one inference key (for echo only); the apps refuse before they reach the runtime."""
    path = tmp_path / "settings.json"
    key = {"name": "alice", "key_sha256": hashlib.sha256(b"alice-key").hexdigest(), "models": ["echo"]}
    path.write_text(json.dumps({"service": {"api_keys": [key]}, "models": {"echo": {"backend": "stub"}}}))
    settings.LLMPOOL_SETTINGS = str(path)
    service_settings.cache_clear()
    yield
    service_settings.cache_clear()


async def test_the_keys_apply_here_too(keyed):
    async with asgi_client() as client:
        missing = await client.post("/v1/responses", json={"model": "other", "input": "hi"})
        refused = await client.post(
            "/v1/chat/completions", json={"model": "other", "messages": [{"role": "user", "content": "x"}]},
            headers={"Authorization": "Bearer alice-key"},
        )
        models = await client.get("/v1/models")
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == "invalid_api_key"
    assert missing.headers["WWW-Authenticate"] == 'Bearer realm="llm-pool"'
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "model_not_allowed"
    assert models.status_code == 401
