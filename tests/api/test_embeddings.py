"""POST /v1/embeddings against a live service on stub models: the official openai client (single,
batch, base64), answers validated strictly against the openai package's CreateEmbeddingResponse,
the stub's documented vectors exactly, token arrays, the fields refused, the error codes shared
with the generation endpoints (embeddings_unsupported, unknown model, not loaded, timeout), the
inference keys (401, 403, the key's fairness bucket) and the scheduler (queue limit, the charge)."""
from __future__ import annotations

import base64
import hashlib
import math
import threading

import httpx
import numpy
import openai
import pytest
from openai.types import CreateEmbeddingResponse

from tests.conftest import model_entry, openai_client, service_with_loaded_models, wait_until

DIMS = 8
MODELS = {
    "vectors": {"backend": "stub", "embeddings": True, "stub_embedding_dimensions": DIMS},
    "wide": {"backend": "stub", "embeddings": True, "stub_embedding_dimensions": 1536},
    "meter": {"backend": "stub", "embeddings": True},
    "slow": {"backend": "stub", "embeddings": True, "stub_token_delay_ms": 1500},
    "timeout": {"backend": "stub", "embeddings": True, "stub_token_delay_ms": 5000, "request_timeout_seconds": 0.3},
    "chatty": {"backend": "stub"},
    "cold": {"backend": "stub", "embeddings": True},
}
ADMIN_TOKEN = "admin-secret"
FULL_KEY, TEAM_KEY = "key-full-0123456789", "key-team-0123456789"
API_KEYS = [
    {"name": "full", "key_sha256": hashlib.sha256(FULL_KEY.encode()).hexdigest(), "models": "*"},
    {"name": "limited", "key_sha256": hashlib.sha256(TEAM_KEY.encode()).hexdigest(),
     "models": ["vectors", "meter"], "fairness_key": "team"},
]


def expected(text: str, dims: int = DIMS) -> list[float]:
    """The stub's vector as docs/settings.md states it: SHAKE-256 bytes, (b - 127.5) / 127.5, unit length."""
    raw = [(byte - 127.5) / 127.5 for byte in hashlib.shake_256(text.encode()).digest(dims)]
    norm = math.sqrt(sum(value * value for value in raw))
    return [value / norm for value in raw]


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape):
    with service_with_loaded_models(
        tmp_path_factory.mktemp("embeddings"), MODELS, admin_token=ADMIN_TOKEN,
        service={"admin_token": ADMIN_TOKEN, "api_keys": API_KEYS},
        engine={"fairness": {"per_key_queue_limit": 1}},
    ) as live:
        yield live


@pytest.fixture
def http(service):
    with service.client(headers={"Authorization": f"Bearer {FULL_KEY}"}) as client:
        yield client


@pytest.fixture
def admin(service):
    with service.client(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as client:
        yield client


@pytest.fixture
def client(service):
    with openai_client(service, FULL_KEY) as client:
        yield client


def embed(http, model: str = "vectors", **fields) -> httpx.Response:
    return http.post("/v1/embeddings", json={"model": model, **fields})


def strict(answer: httpx.Response) -> CreateEmbeddingResponse:
    assert answer.status_code == 200, answer.text
    return CreateEmbeddingResponse.model_validate(answer.json(), strict=True)


def assert_error(answer: httpx.Response, status: int, code: str, param=None) -> None:
    assert answer.status_code == status, answer.text
    assert answer.json() == {"error": {"code": code, "message": answer.json()["error"]["message"], "param": param}}


# ---- the official client ------------------------------------------------------------------


def test_openai_client_single_input(client):
    # Left to itself the client asks for base64 and decodes it: float32 values.
    answer = client.embeddings.create(model="vectors", input="hello world")
    assert answer.object == "list" and answer.model == "vectors"
    assert [item.index for item in answer.data] == [0]
    assert answer.data[0].object == "embedding"
    assert answer.data[0].embedding == numpy.float32(expected("hello world")).tolist()
    assert (answer.usage.prompt_tokens, answer.usage.total_tokens) == (2, 2)


def test_openai_client_batch_keeps_the_order(client):
    texts = ["first", "the second one", "first", "a third"]
    answer = client.embeddings.create(model="vectors", input=texts, encoding_format="float")
    assert [item.index for item in answer.data] == [0, 1, 2, 3]
    assert [item.embedding for item in answer.data] == [expected(text) for text in texts]
    assert answer.data[0].embedding == answer.data[2].embedding  # the same input, the same vector
    assert answer.data[0].embedding != answer.data[1].embedding
    assert answer.usage.prompt_tokens == 1 + 3 + 1 + 2


def test_openai_client_base64_asked_explicitly(client):
    answer = client.embeddings.create(model="wide", input=["alpha", "beta"], encoding_format="base64")
    for item, text in zip(answer.data, ["alpha", "beta"]):
        assert isinstance(item.embedding, str)  # asked for explicitly, the client leaves it encoded
        decoded = numpy.frombuffer(base64.b64decode(item.embedding), dtype="<f4")
        assert decoded.tolist() == numpy.float32(expected(text, 1536)).tolist()


# ---- the answer, strictly ------------------------------------------------------------------


def test_float_answer_validates_strictly_with_exact_vectors(http):
    answer = strict(embed(http, input=["one", "two words"], user="someone"))
    assert [item.embedding for item in answer.data] == [expected("one"), expected("two words")]
    assert all(math.isclose(math.hypot(*item.embedding), 1.0, rel_tol=1e-12) for item in answer.data)
    assert answer.usage.model_dump() == {"prompt_tokens": 3, "total_tokens": 3}


def test_base64_is_little_endian_float32(http):
    raw = embed(http, input="hello", encoding_format="base64")
    assert raw.status_code == 200
    body = raw.json()
    encoded = body["data"][0]["embedding"]
    assert base64.b64decode(encoded) == numpy.asarray(expected("hello"), dtype="<f4").tobytes()
    decoded = {**body, "data": [{**body["data"][0], "embedding": numpy.frombuffer(base64.b64decode(encoded), "<f4").tolist()}]}
    CreateEmbeddingResponse.model_validate(decoded, strict=True)


@pytest.mark.parametrize(("given", "texts", "tokens"), [
    ([5, 6, 7], ["5 6 7"], 3),
    ([[1, 2, 3], [4]], ["1 2 3", "4"], 4),
])
def test_token_arrays(http, given, texts, tokens):
    answer = strict(embed(http, input=given))
    assert [item.embedding for item in answer.data] == [expected(text) for text in texts]
    assert answer.usage.prompt_tokens == tokens


# ---- refused ------------------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "param"), [
    ({}, "input"),
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": ["a", ""]}, "input"),
    ({"input": [[1], []]}, "input"),
    ({"input": ["a", 1]}, "input"),
    ({"input": [[1], "a"]}, "input"),
    ({"input": [1.5]}, "input"),
    ({"input": [True]}, "input"),
    ({"input": [-1]}, "input"),
    ({"input": {"text": "a"}}, "input"),
    ({"input": ["x"] * 2049}, "input"),
    ({"input": "a", "encoding_format": "hex"}, "encoding_format"),
    ({"input": "a", "dimensions": 0}, "dimensions"),
    ({"input": "a", "dimensions": 4}, "dimensions"),  # the stub's vectors have their own size
    ({"input": "a", "temperature": 1}, "temperature"),
])
def test_bad_fields_are_400_naming_them(http, fields, param):
    assert_error(embed(http, **fields), 400, "invalid_request", param)


def test_a_body_that_is_not_an_object(http):
    assert_error(http.post("/v1/embeddings", json=["vectors"]), 400, "invalid_request")
    assert_error(http.post("/v1/embeddings", content=b"{", headers={"content-type": "application/json"}),
                 400, "invalid_request")


def test_only_post(http):
    answer = http.get("/v1/embeddings")
    assert answer.status_code == 405 and answer.headers["allow"] == "POST"


# ---- errors shared with the generation endpoints ---------------------------------------------


def test_a_model_without_embeddings_is_embeddings_unsupported(http, client):
    assert_error(embed(http, model="chatty", input="x"), 400, "embeddings_unsupported", "model")
    with pytest.raises(openai.BadRequestError) as raised:
        client.embeddings.create(model="chatty", input="x")
    assert raised.value.code == "embeddings_unsupported"


def test_unknown_model_as_for_chat(http):
    assert_error(embed(http, model="nope", input="x"), 404, "unknown_model", "model")


def test_not_loaded_is_rejected_exactly_as_a_generation(http):
    answer = embed(http, model="cold", input="x")
    chat = http.post("/v1/chat/completions", json={"model": "cold", "messages": [{"role": "user", "content": "x"}]})
    assert_error(answer, 409, "model_not_loaded")
    assert answer.json() == chat.json()


def test_request_timeout(http):
    assert_error(embed(http, model="timeout", input="x"), 504, "request_timeout")


def test_capabilities_show_embeddings(http, admin):
    models = {item["id"]: item for item in http.get("/v1/models").json()["data"]}
    assert models["vectors"]["capabilities"]["embeddings"] is True
    assert models["chatty"]["capabilities"]["embeddings"] is False
    assert model_entry(admin, "cold")["capabilities"]["embeddings"] is True


def test_the_schema_documents_the_endpoint(admin):
    paths = admin.get("/v1/openapi.json").json()["paths"]
    assert "post" in paths["/v1/embeddings"]


# ---- keys ---------------------------------------------------------------------------------


def test_a_key_is_needed(service):
    with service.client() as anonymous:
        answer = embed(anonymous, input="x")
    assert_error(answer, 401, "invalid_api_key")
    assert answer.headers["www-authenticate"] == 'Bearer realm="llm-pool"'


def test_a_key_may_use_only_its_models(service):
    with service.client(headers={"Authorization": f"Bearer {TEAM_KEY}"}) as team:
        assert_error(embed(team, model="chatty", input="x"), 403, "model_not_allowed", "model")
        assert_error(embed(team, model="cold", input="x"), 403, "model_not_allowed", "model")
        assert embed(team, model="vectors", input="x").status_code == 200


# ---- admission and the scheduler --------------------------------------------------------------


def bucket(admin, model: str, key: str) -> dict | None:
    return next((k for k in model_entry(admin, model)["fairness"]["keys"] if k["key"] == key), None)


def test_charged_by_the_inputs_tokens_in_the_keys_bucket(service, http, admin):
    """The key's bucket, whatever ``user`` says; charged the engine's count (6 and 1 tokens), not the
    estimate of about four characters a token (3 and 1)."""
    with service.client(headers={"Authorization": f"Bearer {TEAM_KEY}"}) as team:
        assert embed(team, model="meter", input="x", user="alice").status_code == 200
    assert embed(http, model="meter", input="a b c d e f", user="alice").status_code == 200
    assert bucket(admin, "meter", "alice") is None
    scores = {key: bucket(admin, "meter", key)["normalized_score"] for key in ("team", "full")}
    assert scores == {"team": 0.0, "full": 5.0}


def test_queued_behind_a_busy_replica_and_limited_per_key(http, admin):
    """One replica, one request at a time: the second waits in the queue, the third is over the
    key's queue limit (engine.fairness.per_key_queue_limit = 1)."""
    answers: list[httpx.Response] = []
    threads = [threading.Thread(target=lambda: answers.append(embed(http, model="slow", input="x")))
               for _ in range(2)]
    threads[0].start()
    assert wait_until(lambda: model_entry(admin, "slow")["runtime_inflight"] == 1, timeout=10)
    threads[1].start()
    assert wait_until(lambda: model_entry(admin, "slow")["queue_depth"] == 1, timeout=10)
    assert_error(embed(http, model="slow", input="x"), 429, "fairness_key_queue_full")
    for thread in threads:
        thread.join(timeout=30)
    assert [answer.status_code for answer in answers] == [200, 200]
    assert model_entry(admin, "slow")["fairness"]["rejected_per_key_limit"] == 1
