"""POST /v1/completions through the ASGI application's route table (``api.routes``), in process:
the answer, the stream, the error envelope and the keys; and the endpoint's operation in the
OpenAPI document, written from the route table (``api.routes.add_inference_operations``)."""
from __future__ import annotations

import hashlib
import json

import pytest
from drf_spectacular.generators import SchemaGenerator
from openai.types import Completion

from models_app.api.completions.protocol import CompletionBody
from models_app.api.openapi import request_schema
from models_app.conf import service_settings
from tests.models_app.in_process import asgi_client, serving_runtime

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
async def runtime(tmp_path, settings):
    async with serving_runtime(tmp_path, settings, {"echo": {"backend": "stub"}}):
        yield


async def test_a_non_streamed_answer(runtime):
    async with asgi_client() as client:
        answer = await client.post("/v1/completions", json={"model": "echo", "prompt": "one two three"})
    assert answer.status_code == 200
    body = Completion.model_validate(answer.json(), strict=True)
    assert (body.object, body.choices[0].text, body.usage.total_tokens) == ("text_completion", "one two three", 6)


async def test_a_streamed_answer(runtime):
    async with asgi_client() as client:
        answer = await client.post("/v1/completions", json={"model": "echo", "prompt": "one two", "stream": True})
    assert answer.status_code == 200
    assert answer.headers["Content-Type"] == "text/event-stream"
    lines = [line[6:] for line in answer.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    assert [json.loads(line)["choices"][0]["text"] for line in lines[:-1]] == ["one", " two", ""]


async def test_errors_have_the_envelope(runtime):
    async with asgi_client() as client:
        answer = await client.post("/v1/completions", json={"model": "nope", "prompt": "hi"})
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
        async with asgi_client() as client:
            missing = await client.post("/v1/completions", json=body)
            refused = await client.post("/v1/completions", json=body, headers={"Authorization": "Bearer alice-key"})
        assert (missing.status_code, missing.json()["error"]["code"]) == (401, "invalid_api_key")
        assert (refused.status_code, refused.json()["error"]["code"]) == (403, "model_not_allowed")
    finally:
        service_settings.cache_clear()


def test_the_openapi_schema_describes_the_endpoint():
    operation = SchemaGenerator().get_schema(request=None, public=True)["paths"]["/v1/completions"]["post"]
    assert operation["summary"] == "Create a text completion (OpenAI legacy completions API)"
    assert operation["operationId"] == "v1_completions_create"
    assert "raw_prompt_unsupported" in operation["description"]
    assert {"200", "400", "401", "403", "404"} <= set(operation["responses"])
    assert set(operation["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    assert operation["requestBody"] == {
        "content": {"application/json": {"schema": request_schema(CompletionBody)}}, "required": True,
    }
