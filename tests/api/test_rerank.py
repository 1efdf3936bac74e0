"""POST /v1/rerank (and /rerank, /v1/reranking) against a live service on stub models: the Jina /
Cohere answer with the stub's documented scores exactly, the order, top_n, return_documents,
documents as objects, the fields refused (400 naming them), rerank_unsupported on a chat model,
the errors shared with the other endpoints, capabilities, the inference keys, the fair-share
charge, load on request and the metrics' protocol label."""
from __future__ import annotations

import hashlib
import json

import httpx
import pytest

from models_app.api.limits import MAX_RERANK_DOCUMENTS
from tests.conftest import model_entry, service_with_loaded_models

MODELS = {
    "ranker": {"backend": "stub", "rerank": True},
    "meter": {"backend": "stub", "rerank": True},
    "chatty": {"backend": "stub"},
    "cold": {"backend": "stub", "rerank": True},
    "lazy": {"backend": "stub", "rerank": True, "load_on_request": True},
    "timeout": {"backend": "stub", "rerank": True, "stub_token_delay_ms": 5000, "request_timeout_seconds": 0.3},
}
ADMIN_TOKEN = "admin-secret"
FULL_KEY, TEAM_KEY = "key-full-0123456789", "key-team-0123456789"


def key(name: str, secret: str, models, **fields) -> dict:
    return {"name": name, "key_sha256": hashlib.sha256(secret.encode()).hexdigest(), "models": models, **fields}


# The full key may use every model; the team's only two, in a bucket of its own.
API_KEYS = [key("full", FULL_KEY, "*"), key("limited", TEAM_KEY, ["ranker", "meter"], fairness_key="team")]
QUERY = "where does the cat sleep"
DOCUMENTS = ["the dog sleeps outside", "a cat does sleep where it likes", "paris is a city", "the cat sat"]


def relevance(query: str, document: str) -> float:
    """The stub's score as docs/settings.md states it: the share of the query's distinct words
    (lower-cased) that are words of the document."""
    wanted = set(query.lower().split())
    return len(wanted & set(document.lower().split())) / len(wanted)


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape):
    with service_with_loaded_models(
        tmp_path_factory.mktemp("rerank"), MODELS, unloaded=("cold", "lazy"), admin_token=ADMIN_TOKEN,
        service={"admin_token": ADMIN_TOKEN, "api_keys": API_KEYS, "capture_requests": True},
    ) as live:
        yield live


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def http(service):
    with service.client(headers=bearer(FULL_KEY)) as client:
        yield client


@pytest.fixture
def admin(service):
    with service.client(headers=bearer(ADMIN_TOKEN)) as client:
        yield client


def rerank(http, model: str = "ranker", path: str = "/v1/rerank", **fields) -> httpx.Response:
    return http.post(path, json={"model": model, **fields})


def assert_error(answer: httpx.Response, status: int, code: str, param=None) -> None:
    assert answer.status_code == status, answer.text
    assert answer.json() == {"error": {"code": code, "message": answer.json()["error"]["message"], "param": param}}


# ---- the answer ----------------------------------------------------------------------------


def test_the_answer_in_full(http):
    answer = rerank(http, query=QUERY, documents=DOCUMENTS)
    assert answer.status_code == 200, answer.text
    scores = [relevance(QUERY, document) for document in DOCUMENTS]  # 1/5, 4/5, 0, 2/5
    order = sorted(range(len(DOCUMENTS)), key=lambda index: -scores[index])
    words = len(QUERY.split()) * len(DOCUMENTS) + sum(len(document.split()) for document in DOCUMENTS)
    assert answer.json() == {
        "object": "list",
        "model": "ranker",
        "results": [
            {"index": index, "relevance_score": scores[index], "document": {"text": DOCUMENTS[index]}}
            for index in order
        ],
        "usage": {"prompt_tokens": words, "total_tokens": words},
    }
    assert order == [1, 3, 0, 2]


def test_top_n_return_documents_and_document_objects(http):
    objects = [{"text": text} for text in DOCUMENTS[:2]] + DOCUMENTS[2:]  # Jina's objects, mixed with strings
    answer = rerank(http, query=QUERY, documents=objects, top_n=2, return_documents=False).json()
    assert answer["results"] == [
        {"index": 1, "relevance_score": 0.8},
        {"index": 3, "relevance_score": 0.4},
    ]
    everything = rerank(http, query=QUERY, documents=DOCUMENTS, top_n=50).json()["results"]
    assert [item["index"] for item in everything] == [1, 3, 0, 2]


def test_equal_scores_keep_the_documents_order(http):
    answer = rerank(http, query="cat", documents=["no", "cat one", "none", "cat two"]).json()
    assert [(item["index"], item["relevance_score"]) for item in answer["results"]] == [
        (1, 1.0), (3, 1.0), (0, 0.0), (2, 0.0),
    ]


@pytest.mark.parametrize("path", ["/rerank", "/v1/reranking"])
def test_the_other_paths_answer_alike(http, path):
    assert rerank(http, path=path, query=QUERY, documents=DOCUMENTS).json() == rerank(
        http, query=QUERY, documents=DOCUMENTS
    ).json()


# ---- refused ------------------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "param"), [
    ({"documents": ["a"]}, "query"),
    ({"query": 7, "documents": ["a"]}, "query"),
    ({"query": ["q"], "documents": ["a"]}, "query"),
    ({"query": "", "documents": ["a"]}, "query"),
    ({"query": "q"}, "documents"),
    ({"query": "q", "documents": []}, "documents"),
    ({"query": "q", "documents": "a"}, "documents"),
    ({"query": "q", "documents": ["a"] * (MAX_RERANK_DOCUMENTS + 1)}, "documents"),
    ({"query": "q", "documents": ["a", 3]}, "documents[1]"),
    ({"query": "q", "documents": [{"content": "a"}]}, "documents[0]"),
    ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
    ({"query": "q", "documents": ["a"], "return_documents": "yes"}, "return_documents"),
    ({"query": "q", "documents": ["a"], "temperature": 1}, "temperature"),
])
def test_bad_fields_are_400_naming_them(http, fields, param):
    answer = rerank(http, **fields)
    assert_error(answer, 400, "invalid_request", answer.json()["error"]["param"])
    assert answer.json()["error"]["param"].startswith(param)


def test_a_body_that_is_not_an_object(http):
    assert_error(http.post("/v1/rerank", json=["ranker"]), 400, "invalid_request")


def test_a_chat_model_is_rerank_unsupported(http):
    assert_error(rerank(http, model="chatty", query="q", documents=["a"]), 400, "rerank_unsupported", "model")


def test_errors_shared_with_the_other_endpoints(http):
    assert_error(rerank(http, model="nope", query="q", documents=["a"]), 404, "unknown_model", "model")
    assert_error(rerank(http, model="cold", query="q", documents=["a"]), 409, "model_not_loaded")
    assert_error(rerank(http, model="timeout", query="q", documents=["a"]), 504, "request_timeout")


def test_a_model_that_loads_on_request(http):
    answer = rerank(http, model="lazy", query="cat", documents=["cat"])
    assert answer.status_code == 200, answer.text
    assert answer.json()["results"] == [{"index": 0, "relevance_score": 1.0, "document": {"text": "cat"}}]


def test_capabilities_and_the_schema(http, admin):
    models = {item["id"]: item for item in http.get("/v1/models").json()["data"]}
    assert models["ranker"]["capabilities"]["rerank"] is True
    assert models["chatty"]["capabilities"]["rerank"] is False
    assert model_entry(admin, "cold")["capabilities"]["rerank"] is True
    schema = admin.get("/v1/openapi.json").json()["paths"]["/v1/rerank"]["post"]["requestBody"]
    properties = schema["content"]["application/json"]["schema"]["properties"]
    assert set(properties) == {"model", "query", "documents", "top_n", "return_documents", "user"}
    assert properties["documents"]["maxItems"] == MAX_RERANK_DOCUMENTS


# ---- keys, fairness, metrics ----------------------------------------------------------------


def test_a_key_is_needed_and_may_use_only_its_models(service):
    with service.client() as anonymous:
        assert_error(rerank(anonymous, query="q", documents=["a"]), 401, "invalid_api_key")
    with service.client(headers=bearer(TEAM_KEY)) as team:
        assert_error(rerank(team, model="chatty", query="q", documents=["a"]), 403, "model_not_allowed", "model")
        assert rerank(team, query="q", documents=["a"]).status_code == 200


def test_charged_by_the_pairs_tokens_in_the_keys_bucket(service, http, admin):
    """The key's bucket, whatever ``user`` says; charged the engine's count (the words of the query
    with each document: 2 and 6 tokens), not the estimate of about four characters a token (1 and 2)."""
    with service.client(headers=bearer(TEAM_KEY)) as team:
        assert rerank(team, model="meter", query="x", documents=["y"], user="alice").status_code == 200
    assert rerank(http, model="meter", query="a b", documents=["c", "d"], user="alice").status_code == 200
    keys = {item["key"]: item["normalized_score"] for item in model_entry(admin, "meter")["fairness"]["keys"]}
    assert keys == {"team": 0.0, "full": 4.0}


def test_metrics_and_activity_label_the_protocol(http, admin):
    assert rerank(http, path="/rerank", query="q", documents=["q"]).status_code == 200
    text = admin.get("/metrics").text
    counted = [line for line in text.splitlines()
               if line.startswith("llmpool_requests_total{") and 'endpoint="rerank"' in line and 'model="ranker"' in line]
    assert counted and all(float(line.rsplit(" ", 1)[1]) >= 1 for line in counted)
    [item] = admin.get("/v1/admin/activity", params={"model": "ranker", "limit": 1}).json()["requests"]
    assert item["endpoint"] == "rerank" and item["status"] == 200
    assert json.loads(item["capture"]["request"]) == {"query": "q", "documents": ["q"]}
