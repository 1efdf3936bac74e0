"""POST /v1/rerank forwarded to managed servers and openai_remote, through a real ``manage.py serve``:
the exact command lines (llama-server's --reranking, vLLM's --runner pooling), the fake vllm's
/v1/rerank (the model renamed to the upstream's, every document asked for, the scores put back
in the documents' order and sorted by the edge), its refusals mapped as a generation's are, and a
remote's rerank endpoint under ``<remote_base_url>/rerank``."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from runtime.backends.llama_server.spec import llama_server_command
from runtime.backends.vllm_serve.spec import vllm_serve_command
from tests.managed.helpers import TARGET, records
from tests.managed.test_commands import BASE, HOST, LLAMA_BASE, PORT, effective
from tests.managed.test_embedding_commands import LLAMA_DEFAULTS
from tests.managed import test_managed_embeddings as embeddings
from tests.managed.test_managed_embeddings import error_of, logged, vllm_model

pooling_remote = embeddings.pooling_remote  # the fake remote with --runner pooling, a fixture
QUERY = "cat sat mat"
DOCUMENTS = ["a dog", "the cat sat on the mat", "cat"]


def test_llama_server_is_started_with_reranking():
    config = effective("llama_server", {"model_path": "/models/m.gguf", "rerank": True}, {})
    assert llama_server_command(config, HOST, PORT, BASE) == [*LLAMA_BASE, *LLAMA_DEFAULTS, "--reranking"]


@pytest.mark.parametrize("backend", ["llama_server", "llama_cpp"])
def test_embeddings_and_rerank_together_are_refused(backend):
    with pytest.raises(ValueError, match="embeddings and rerank must not both be true"):
        effective(backend, {"model_path": "/models/m.gguf", "rerank": True, "embeddings": True}, {})
    assert effective(backend, {"model_path": "/models/m.gguf", "rerank": True}, {})["rerank"] is True


def test_vllm_serve_reranks_with_the_pooling_runner():
    config = effective("vllm_serve", {"vllm_serve_model": TARGET, "rerank": True}, {})
    assert vllm_serve_command(config, HOST, PORT, BASE)[-2:] == ["--runner", "pooling"]


def test_vllm_serve_and_a_remote_forward_rerank(live_service, fake_bin, pooling_remote, tmp_path, state_dir):
    remote = {"backend": "openai_remote", "remote_base_url": pooling_remote, "remote_model": "remote-model",
              "remote_api_key": "k-1", "rerank": True}
    models = {"ranker": vllm_model(fake_bin, tmp_path, rerank=True), "remote": remote,
              "plain": {**remote, "rerank": False}}
    service = live_service(models, service={"allow_remote_execution": True})
    with service.client() as http:
        for name in models:
            assert http.post(f"/v1/admin/models/{name}/load").json()["runtime_state"] == "loaded"
        [start] = records(tmp_path / "vllm.jsonl")
        assert start["argv"][-2:] == ["--runner", "pooling"]
        answer = http.post("/v1/rerank", json={"model": "ranker", "query": QUERY, "documents": DOCUMENTS, "top_n": 2})
        assert answer.status_code == 200, answer.text
        assert answer.json() == {
            "object": "list", "model": "ranker",
            "results": [{"index": 1, "relevance_score": 3.0, "document": {"text": DOCUMENTS[1]}},
                        {"index": 2, "relevance_score": 1.0, "document": {"text": DOCUMENTS[2]}}],
            "usage": {"prompt_tokens": 9 + 2 + 6 + 1, "total_tokens": 18},  # vLLM's total_tokens
        }
        assert logged(tmp_path)[-1] == {"model": TARGET, "query": QUERY, "documents": DOCUMENTS, "top_n": 3}
        refused = http.post("/v1/rerank", json={"model": "ranker", "query": "__error_400__", "documents": ["x"]})
        assert error_of(refused)[:2] == (400, "invalid_request")
        assert "answered 400: query refused" in refused.json()["error"]["message"]

        # The remote's rerank endpoint, under <remote_base_url>/rerank, named by remote_model.
        answer = http.post("/v1/rerank", json={"model": "remote", "query": QUERY, "documents": DOCUMENTS,
                                               "return_documents": False})
        assert answer.status_code == 200, answer.text
        assert answer.json()["results"] == [
            {"index": 1, "relevance_score": 3.0}, {"index": 2, "relevance_score": 1.0},
            {"index": 0, "relevance_score": 0.0},
        ]
        assert logged(tmp_path)[-1] == {"model": "remote-model", "query": QUERY, "documents": DOCUMENTS, "top_n": 3}
        plain = http.post("/v1/rerank", json={"model": "plain", "query": QUERY, "documents": DOCUMENTS})
        assert error_of(plain) == (400, "rerank_unsupported", "model")
    assert service.stop() == 0


@pytest.mark.parametrize("backend", ["ct2", "vllm", "sglang_serve"])
def test_a_backend_that_cannot_rerank_refuses_the_field(backend):
    with pytest.raises(ValidationError, match="rerank"):
        effective(backend, {"model_path": "/models/m", "rerank": True}, {})
