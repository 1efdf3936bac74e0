"""Which definitions may say embeddings: true, what capabilities.embeddings reports, and what the
runtime refuses of an embedding request before it is queued (runtime.inference.embedding)."""
from __future__ import annotations

import pytest

from runtime.backends import BACKENDS
from runtime.config import load_settings
from runtime.inference.embedding import EmbeddingRequest, check_embedding_request, estimate_input_tokens
from runtime.pool.catalog import CatalogEntry
from runtime.errors import EmbeddingsUnsupported, InvalidRequest, InvalidSettings, RemoteExecutionDisallowed
from tests.conftest import write_settings

EMBEDDING_BACKENDS = {
    "llama_cpp": {"model_path": "/m.gguf"},
    "llama_server": {"model_path": "/m.gguf"},
    "vllm_serve": {"vllm_serve_model": "org/m"},
    "openai_remote": {"remote_base_url": "http://remote/v1", "remote_model": "m"},
    "stub": {},
}


def Entry(backend: str, **fields) -> CatalogEntry:
    """A catalog entry of model ``m`` on ``backend`` with the definition ``fields``."""
    definition = BACKENDS[backend].definition_model.model_validate({"backend": backend, **fields})
    return CatalogEntry(name="m", definition=definition, sources=(), base_dir="")


@pytest.mark.parametrize("backend", sorted(EMBEDDING_BACKENDS))
def test_the_embedding_backends_declare_the_field(backend):
    fields = EMBEDDING_BACKENDS[backend]
    assert BACKENDS[backend].capabilities(Entry(backend, **fields).definition)["embeddings"] is False
    assert BACKENDS[backend].capabilities(Entry(backend, embeddings=True, **fields).definition)["embeddings"] is True


@pytest.mark.parametrize("backend", sorted(set(BACKENDS) - set(EMBEDDING_BACKENDS)))
def test_the_others_refuse_it_in_the_settings(tmp_path, backend):
    path = write_settings(tmp_path, {"m": {"backend": backend, "model_path": "/m", "embeddings": True}})
    with pytest.raises(InvalidSettings) as refused:
        load_settings(str(path))
    assert "embeddings" in refused.value.message


def request(**fields) -> EmbeddingRequest:
    return EmbeddingRequest(request_id="r", model="m", inputs=["a b c d e f g h"], **fields)


def test_a_model_without_embeddings_is_refused_first():
    with pytest.raises(EmbeddingsUnsupported) as refused:
        check_embedding_request(Entry("stub"), request(dimensions=4), allow_remote=True)
    assert (refused.value.http_status, refused.value.param) == (400, "model")


@pytest.mark.parametrize(("backend", "allowed"), [
    ("stub", False), ("llama_cpp", False), ("llama_server", False), ("vllm_serve", True), ("openai_remote", True),
])
def test_dimensions_only_where_the_upstream_judges_them(backend, allowed):
    entry = Entry(backend, embeddings=True, **EMBEDDING_BACKENDS[backend])
    check_embedding_request(entry, request(), allow_remote=True)
    if allowed:
        check_embedding_request(entry, request(dimensions=4), allow_remote=True)
    else:
        with pytest.raises(InvalidRequest) as refused:
            check_embedding_request(entry, request(dimensions=4), allow_remote=True)
        assert refused.value.param == "dimensions"


def test_a_remote_model_needs_remote_execution():
    entry = Entry("openai_remote", embeddings=True, **EMBEDDING_BACKENDS["openai_remote"])
    with pytest.raises(RemoteExecutionDisallowed):
        check_embedding_request(entry, request(), allow_remote=False)


def test_the_charge_before_the_engine_counts():
    assert estimate_input_tokens(request()) == 15 // 4 + 1
    assert estimate_input_tokens(EmbeddingRequest("r", "m", [[1, 2, 3], [4]])) == 4
