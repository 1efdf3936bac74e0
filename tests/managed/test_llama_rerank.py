"""Rerank for real: a tiny reranker GGUF (tests/llama_cpp/reranker_gguf.py: a 2-layer BERT with a
classification head, random weights, rank pooling) served by the llama_cpp engine (in its engine
process) and by llama-server started with --reranking, in one ``manage.py serve``.

The same request through both gives the same order and the same scores (both run llama.cpp's rank
pooling over the same token layout: ``format_prompt_rerank``'s), one score per document, the
usage the tokens of every pair ([CLS] query [SEP] [SEP] document [SEP]: words + 4 each); a
``tokenizer.chat_template.rerank`` in the GGUF changes the layout in both alike; a llama_cpp
reranker refuses a chat (400) and advertises rerank, not tools; a GGUF without rank pooling
(SmolLM2) fails a llama_cpp load with rerank: true."""
from __future__ import annotations

import pytest

from tests.llama_cpp.reranker_gguf import write_reranker_gguf
from tests.managed.helpers import pidfiles

QUERY = "where does the cat sleep"
DOCUMENTS = ["the cat sleeps on the mat", "quantum physics", "paris is the capital of france", "a dog sat",
             "the bird flies in the sky", "cat"]
TEMPLATE = "[CLS]{document}[SEP]{query}[SEP]"  # the document first: a layout of its own


@pytest.fixture(scope="module")
def reranker_files(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("reranker")
    return {
        "plain": str(write_reranker_gguf(folder / "reranker.gguf")),
        "templated": str(write_reranker_gguf(folder / "templated.gguf", rerank_template=TEMPLATE)),
    }


def cpp(path: str) -> dict:
    return {"backend": "llama_cpp", "model_path": path, "rerank": True, "gguf_n_ctx": 512, "gguf_n_threads": 1,
            "gguf_n_gpu_layers": 0, "gguf_flash_attn": "off"}


def server(path: str, binary: str) -> dict:
    return {"backend": "llama_server", "model_path": path, "rerank": True, "llama_server_binary": binary,
            "llama_server_n_ctx": 512, "llama_server_n_gpu_layers": 0, "llama_server_flash_attn": "off",
            "llama_server_startup_timeout_seconds": 60.0, "llama_server_extra_args": ["--threads", "1"]}


def ranked(http, model: str, query: str = QUERY, documents=DOCUMENTS) -> dict:
    answer = http.post("/v1/rerank", json={"model": model, "query": query, "documents": documents,
                                           "return_documents": False})
    assert answer.status_code == 200, answer.text
    return answer.json()


def scores_of(answer: dict) -> dict[int, float]:
    return {item["index"]: item["relevance_score"] for item in answer["results"]}


def assert_same_scores(one: dict, other: dict) -> None:
    """The same order, and each document's score within float noise (threads split sums apart)."""
    assert [item["index"] for item in one["results"]] == [item["index"] for item in other["results"]]
    for index, score in scores_of(one).items():
        assert score == pytest.approx(scores_of(other)[index], abs=1e-4)


def pair_tokens(extra: int) -> int:
    return sum(len(QUERY.split()) + len(document.split()) + extra for document in DOCUMENTS)


def test_llama_cpp_and_llama_server_score_alike(live_service, reranker_files, llama_server_binary, smollm2_gguf,
                                                 state_dir):
    models = {
        "cpp": cpp(reranker_files["plain"]),
        "server": server(reranker_files["plain"], llama_server_binary),
        "cpp-templated": cpp(reranker_files["templated"]),
        "server-templated": server(reranker_files["templated"], llama_server_binary),
    }
    live = live_service({**models, "not-a-reranker": cpp(str(smollm2_gguf))})
    with live.client(timeout=120) as http:
        for name in models:
            answer = http.post(f"/v1/admin/models/{name}/load").json()
            assert (answer["runtime_state"], answer["last_error"]) == ("loaded", None), answer
        refused = http.post("/v1/admin/models/not-a-reranker/load").json()
        servers = [record["argv"] for record in pidfiles(state_dir) if record["argv"][0].endswith("llama-server")]
        assert len(servers) == 2 and all("--reranking" in argv for argv in servers)
        by_cpp, by_server = ranked(http, "cpp"), ranked(http, "server")
        alone = ranked(http, "cpp", documents=[DOCUMENTS[3]])
        other_query = ranked(http, "cpp", query="cat", documents=[DOCUMENTS[3]])
        templated_cpp, templated_server = ranked(http, "cpp-templated"), ranked(http, "server-templated")
        chat = http.post("/v1/chat/completions", json={"model": "cpp", "messages": [{"role": "user", "content": "hi"}]})
        capabilities = {item["id"]: item["capabilities"] for item in http.get("/v1/models").json()["data"]}

    # One score per document, sorted, the documents told apart; both engines agree.
    assert sorted(scores_of(by_cpp)) == list(range(len(DOCUMENTS)))
    listed = [item["relevance_score"] for item in by_cpp["results"]]
    assert listed == sorted(listed, reverse=True) and len({round(score, 4) for score in listed}) == len(DOCUMENTS)
    assert_same_scores(by_cpp, by_server)
    assert by_cpp["usage"] == by_server["usage"] == {"prompt_tokens": pair_tokens(4), "total_tokens": pair_tokens(4)}
    # A score is its pair's alone: the same with other documents beside it, another with another query.
    assert scores_of(alone)[0] == pytest.approx(scores_of(by_cpp)[3], abs=1e-6)
    assert scores_of(other_query)[0] != pytest.approx(scores_of(alone)[0], abs=1e-4)
    # The GGUF's rerank template ([CLS] document [SEP] query [SEP]) lays the pair out in both alike.
    assert_same_scores(templated_cpp, templated_server)
    assert scores_of(templated_cpp)[0] != pytest.approx(scores_of(by_cpp)[0], abs=1e-4)
    assert templated_cpp["usage"]["prompt_tokens"] == templated_server["usage"]["prompt_tokens"] == pair_tokens(3)
    # A llama_cpp reranker answers rerank only, and says so.
    assert (chat.status_code, chat.json()["error"]["code"], chat.json()["error"]["param"]) == (
        400, "invalid_request", "model")
    assert capabilities["cpp"]["rerank"] and not capabilities["cpp"]["tools"] and not capabilities["cpp"]["raw_prompt"]
    # A GGUF without rank pooling (SmolLM2, a generative model) is no reranker: its load fails saying so.
    assert refused["runtime_state"] == "failed"
    assert "is not a reranker" in refused["last_error"] and "pooling_type none" in refused["last_error"]
