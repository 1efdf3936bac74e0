"""POST /v1/embeddings through the ASGI application's route table (``api.routes``), in process:
the answer and the error envelope; and the endpoint's operation in the OpenAPI document,
written from the route table (``api.routes.add_inference_operations``)."""
from __future__ import annotations

import pytest
from drf_spectacular.generators import SchemaGenerator
from openai.types import CreateEmbeddingResponse

from models_app.api.embeddings.protocol import EmbeddingBody
from models_app.api.openapi import request_schema
from runtime.backends.stub.spec import stub_embedding
from tests.models_app.in_process import asgi_client, serving_runtime

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
async def runtime(tmp_path, settings):
    async with serving_runtime(tmp_path, settings, {"vectors": {"backend": "stub", "embeddings": True}}):
        yield


async def test_an_answer(runtime):
    async with asgi_client() as client:
        answer = await client.post("/v1/embeddings", json={"model": "vectors", "input": ["a", "b c"]})
    assert answer.status_code == 200
    body = CreateEmbeddingResponse.model_validate(answer.json(), strict=True)
    assert [item.embedding for item in body.data] == [stub_embedding("a", 8), stub_embedding("b c", 8)]
    assert body.usage.prompt_tokens == 3


async def test_errors_have_the_envelope(runtime):
    async with asgi_client() as client:
        answer = await client.post("/v1/embeddings", json={"model": "vectors", "input": []})
    assert answer.status_code == 400
    assert answer.json()["error"] == {"code": "invalid_request", "message": "input must not be empty", "param": "input"}


def test_the_openapi_schema_describes_the_endpoint():
    operation = SchemaGenerator().get_schema(request=None, public=True)["paths"]["/v1/embeddings"]["post"]
    assert operation["summary"] == "Create embeddings (OpenAI embeddings API)"
    assert "embeddings_unsupported" in operation["description"]
    assert {"200", "400", "401", "403", "404"} <= set(operation["responses"])
    assert set(operation["responses"]["200"]["content"]) == {"application/json"}  # never a stream
    assert operation["requestBody"]["content"]["application/json"]["schema"] == request_schema(EmbeddingBody)
