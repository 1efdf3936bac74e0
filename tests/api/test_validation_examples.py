"""Every example of the spec's "Validation behavior" list, one test each, over real HTTP.

422 invalid_load_body: the body failed the schema before runtime logic ran.
400 invalid_load_request: structurally valid, but invalid for the backend or the state.
409 model_state_conflict: a lifecycle transition is in the way.
A rejected request leaves the model's entry exactly as it was.  The spec's
example load bodies, on the other hand, pass validation; the definitions name no
existing model or server binary, so each such load then ends in failed.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from tests.conftest import LiveService, model_entry, write_settings
from tests.spec_examples import (
    EXLLAMA_BODIES,
    GGUF_BODIES,
    INVALID_LOAD_BODY_EXAMPLES,
    INVALID_LOAD_REQUEST_EXAMPLES,
    LLAMA_SERVER_BODY,
    REPLICAS_BODY,
    SGLANG_BODY,
    TRTLLM_BODY,
    VLLM_BODY,
)

MODELS = {
    "gguf": {"model_path": "/nonexistent/gemma.gguf", "backend": "llama_cpp", "prompt_format": "gemma4_template"},
    "exl": {"model_path": "/nonexistent/exl3", "backend": "exllamav3"},
    "vl": {"model_path": "/nonexistent/vllm", "backend": "vllm"},
    "lls": {
        "model_path": "/nonexistent/lls.gguf",
        "backend": "llama_server",
        "replica_max": 3,
        "llama_server_binary": "/nonexistent/llama-server",
    },
    "trt": {
        "backend": "trtllm_serve",
        "trtllm_serve_model": "/nonexistent/engine",
        "trtllm_serve_binary": "/nonexistent/trtllm-serve",
    },
    "sgl": {
        "backend": "sglang_serve",
        "sglang_serve_model": "/nonexistent/model",
        "sglang_serve_binary": "/nonexistent/sglang",
    },
    "echo": {"backend": "stub", "replica_max": 2},
    "slow-unload": {"backend": "stub", "stub_unload_seconds": 1.5},
}
# The model each backend's spec examples are sent to (one model per engine backend).
MODEL_OF = {model["backend"]: name for name, model in MODELS.items() if model["backend"] != "stub"}


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape):
    folder = tmp_path_factory.mktemp("validation")
    live = LiveService(write_settings(folder, MODELS), folder / "db.sqlite3").start()
    yield live
    assert live.stop() == 0


def load(http: httpx.Client, name: str, body) -> httpx.Response:
    return http.post(f"/v1/admin/models/{name}/load", json=body)


def assert_rejected(http: httpx.Client, name: str, body, status: int, code: str) -> dict:
    """Send ``body``; check the status, code and envelope, and that the entry did not change."""
    before = model_entry(http, name)
    answer = load(http, name, body)
    assert answer.status_code == status, answer.text
    assert set(answer.json()) == {"error"}
    error = answer.json()["error"]
    assert set(error) == {"code", "message", "param"}
    assert error["code"] == code
    assert error["message"]
    assert model_entry(http, name) == before
    return error


# ---- 422: schema ---------------------------------------------------------------------------

SCHEMA_EXAMPLES = [(MODEL_OF[backend], field, value) for backend, field, value in INVALID_LOAD_BODY_EXAMPLES]


@pytest.mark.parametrize("name, field, value", SCHEMA_EXAMPLES, ids=[f"{f}={v}" for _, f, v in SCHEMA_EXAMPLES])
def test_spec_schema_example_is_422(http, name, field, value):
    error = assert_rejected(http, name, {field: value}, 422, "invalid_load_body")
    assert error["param"] == field


@pytest.mark.parametrize(
    "name, body, param",
    [
        ("gguf", {"gguf_context": 8192}, "gguf_context"),
        ("gguf", {"gguf_n_ctx": "8192"}, "gguf_n_ctx"),
        ("echo", {"replicas": 0}, "replicas"),
        ("echo", {"replicas": True}, "replicas"),
    ],
    ids=["unknown-key", "wrong-type", "replicas-0", "replicas-bool"],
)
def test_other_schema_failures_are_422(http, name, body, param):
    error = assert_rejected(http, name, body, 422, "invalid_load_body")
    assert error["param"] == param


def test_a_body_that_is_not_an_object_is_422(http):
    assert_rejected(http, "echo", [1, 2], 422, "invalid_load_body")


# ---- 400: invalid for the backend ----------------------------------------------------------

BACKEND_EXAMPLES = [
    (label, MODEL_OF[backend], body, param) for label, backend, body, param in INVALID_LOAD_REQUEST_EXAMPLES
]


@pytest.mark.parametrize("name, body, param", [e[1:] for e in BACKEND_EXAMPLES], ids=[e[0] for e in BACKEND_EXAMPLES])
def test_spec_backend_example_is_400(http, name, body, param):
    error = assert_rejected(http, name, body, 400, "invalid_load_request")
    assert error["param"] == param


def test_spec_example_overrides_while_loaded_is_400(http):
    assert http.post("/v1/admin/models/echo/load").json()["runtime_state"] == "loaded"
    try:
        error = assert_rejected(http, "echo", {"replicas": 2}, 400, "invalid_load_request")
        assert "unload" in error["message"]
    finally:
        assert http.post("/v1/admin/models/echo/unload").json()["runtime_state"] == "unloaded"
    # Unloaded, the same body is accepted.
    reloaded = load(http, "echo", {"replicas": 2})
    assert (reloaded.status_code, reloaded.json()["loaded_replicas"]) == (200, 2)
    assert http.post("/v1/admin/models/echo/unload").json()["runtime_state"] == "unloaded"


# ---- 409: state conflict -------------------------------------------------------------------


def test_spec_example_loading_while_unloading_is_409(service, http):
    assert http.post("/v1/admin/models/slow-unload/load").json()["runtime_state"] == "loaded"
    with ThreadPoolExecutor(1) as pool, service.client(timeout=15) as actor:
        unloading = pool.submit(actor.post, "/v1/admin/models/slow-unload/unload")
        deadline = time.monotonic() + 5
        while model_entry(http, "slow-unload")["runtime_state"] != "unloading":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert_rejected(http, "slow-unload", None, 409, "model_state_conflict")
        assert_rejected(http, "slow-unload", {}, 409, "model_state_conflict")
        assert unloading.result().json()["runtime_state"] == "unloaded"


# ---- the spec's example load bodies validate ----------------------------------------------

EXAMPLE_BODIES = [
    ("lls", REPLICAS_BODY),
    *[("gguf", body) for body in GGUF_BODIES],
    *[("exl", body) for body in EXLLAMA_BODIES],
    ("vl", VLLM_BODY),
    ("trt", TRTLLM_BODY),
    ("sgl", SGLANG_BODY),
    ("lls", LLAMA_SERVER_BODY),
]


@pytest.mark.parametrize("name, body", EXAMPLE_BODIES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(EXAMPLE_BODIES)])
def test_spec_example_body_passes_validation_and_the_load_then_fails(http, name, body):
    answer = load(http, name, body)
    assert answer.status_code == 200, answer.text
    result = answer.json()
    # The definitions point at no model (and no server binary), so every load ends in failed.
    assert (result["runtime_state"], result["is_loaded"], result["loaded_replicas"]) == ("failed", False, 0)
    assert isinstance(result["last_error"], str) and result["last_error"].strip()
    assert result["load_override"] == {}
    assert result["replicas"] == result["definition"]["replicas"]


def test_the_runtime_keeps_serving_after_failed_engine_loads(http):
    for name in ("gguf", "exl", "vl", "lls", "trt", "sgl"):
        assert load(http, name, None).json()["runtime_state"] == "failed"
    assert http.get("/v1/admin/models").status_code == 200
    assert http.post("/v1/admin/models/echo/load").json()["runtime_state"] == "loaded"
    answer = http.post("/v1/responses", json={"model": "echo", "input": "alive"})
    assert (answer.status_code, answer.json()["output"][0]["content"][0]["text"]) == (200, "alive")
    assert http.post("/v1/admin/models/echo/unload").json()["runtime_state"] == "unloaded"

