"""The DRF view of POST /v1/embeddings (``api.views.EmbeddingCreateApi``): it serves the endpoint
where the ASGI router of llmpool.asgi is not in front, as here through Django's own test client,
answers what the plain-ASGI front answers (both call ``api.embeddings.endpoint.create_embedding``),
and describes the endpoint in the OpenAPI schema."""
from __future__ import annotations


import pytest
from django.test import AsyncClient
from drf_spectacular.generators import SchemaGenerator
from openai.types import CreateEmbeddingResponse

from runtime.backends.stub.spec import stub_embedding
from tests.models_app.drf_runtime import serving_runtime

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
async def runtime(tmp_path, settings):
    async with serving_runtime(tmp_path, settings, {"vectors": {"backend": "stub", "embeddings": True}}):
        yield


async def test_an_answer(runtime):
    answer = await AsyncClient().post("/v1/embeddings", {"model": "vectors", "input": ["a", "b c"]},
                                      content_type="application/json")
    assert answer.status_code == 200
    body = CreateEmbeddingResponse.model_validate(answer.json(), strict=True)
    assert [item.embedding for item in body.data] == [stub_embedding("a", 8), stub_embedding("b c", 8)]
    assert body.usage.prompt_tokens == 3


async def test_errors_have_the_same_envelope(runtime):
    answer = await AsyncClient().post("/v1/embeddings", {"model": "vectors", "input": []}, content_type="application/json")
    assert answer.status_code == 400
    assert answer.json()["error"] == {"code": "invalid_request", "message": "input must not be empty", "param": "input"}


def test_the_openapi_schema_describes_the_endpoint():
    operation = SchemaGenerator().get_schema(request=None, public=True)["paths"]["/v1/embeddings"]["post"]
    assert operation["summary"] == "Create embeddings (OpenAI embeddings API)"
    assert "embeddings_unsupported" in operation["description"]
    assert {"200", "400", "401", "403", "404"} <= set(operation["responses"])
