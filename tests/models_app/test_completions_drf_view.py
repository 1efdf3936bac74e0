"""The DRF view of POST /v1/completions (``api.views.CompletionCreateApi``): it serves the endpoint where
the ASGI router of llmpool.asgi is not in front, as here through Django's own test client, answers
what the plain-ASGI front answers (both call ``api.completions.endpoint.create_completion``), and
describes the endpoint in the OpenAPI schema."""
from __future__ import annotations

import hashlib
import json

import pytest
from django.test import AsyncClient
from drf_spectacular.generators import SchemaGenerator
from openai.types import Completion

from models_app.conf import service_settings
from tests.models_app.drf_runtime import serving_runtime

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
async def runtime(tmp_path, settings):
    async with serving_runtime(tmp_path, settings, {"echo": {"backend": "stub"}}):
        yield


async def test_a_non_streamed_answer(runtime):
    answer = await AsyncClient().post("/v1/completions", {"model": "echo", "prompt": "one two three"},
                                      content_type="application/json")
    assert answer.status_code == 200
    body = Completion.model_validate(answer.json(), strict=True)
    assert (body.object, body.choices[0].text, body.usage.total_tokens) == ("text_completion", "one two three", 6)


async def test_a_streamed_answer(runtime):
    answer = await AsyncClient().post(
        "/v1/completions", {"model": "echo", "prompt": "one two", "stream": True}, content_type="application/json"
    )
    assert answer.status_code == 200
    assert answer["Content-Type"] == "text/event-stream"
    text = b"".join([chunk async for chunk in answer.streaming_content]).decode()
    lines = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    assert [json.loads(line)["choices"][0]["text"] for line in lines[:-1]] == ["one", " two", ""]


async def test_errors_have_the_same_envelope(runtime):
    answer = await AsyncClient().post("/v1/completions", {"model": "nope", "prompt": "hi"}, content_type="application/json")
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "unknown_model"


async def test_the_keys_apply_here_too(tmp_path, settings):
    path = tmp_path / "settings.json"
    key = {"name": "alice", "key_sha256": hashlib.sha256(b"alice-key").hexdigest(), "models": ["echo"]}
    path.write_text(json.dumps({"service": {"api_keys": [key]}, "models": {"echo": {"backend": "stub"}}}))
    settings.LLMPOOL_SETTINGS = str(path)
    service_settings.cache_clear()
    try:
        body = {"model": "other", "prompt": "hi"}
        missing = await AsyncClient().post("/v1/completions", body, content_type="application/json")
        assert (missing.status_code, missing.json()["error"]["code"]) == (401, "invalid_api_key")
        refused = await AsyncClient().post("/v1/completions", body, content_type="application/json",
                                           headers={"Authorization": "Bearer alice-key"})
        assert (refused.status_code, refused.json()["error"]["code"]) == (403, "model_not_allowed")
    finally:
        service_settings.cache_clear()


def test_the_openapi_schema_describes_the_endpoint():
    operation = SchemaGenerator().get_schema(request=None, public=True)["paths"]["/v1/completions"]["post"]
    assert operation["summary"] == "Create a text completion (OpenAI legacy completions API)"
    assert "raw_prompt_unsupported" in operation["description"]
    assert {"200", "400", "401", "403", "404"} <= set(operation["responses"])
