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
from tests.conftest import LiveService, write_settings

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


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape):
    folder = tmp_path_factory.mktemp("validation")
    live = LiveService(write_settings(folder, MODELS), folder / "db.sqlite3").start()
    yield live
    assert live.stop() == 0


@pytest.fixture
def http(service):
    with service.client(timeout=15) as client:
        yield client


def entry(http: httpx.Client, name: str) -> dict:
    return next(m for m in http.get("/v1/admin/models").json()["models"] if m["name"] == name)


def load(http: httpx.Client, name: str, body) -> httpx.Response:
    return http.post(f"/v1/admin/models/{name}/load", json=body)


def assert_rejected(http: httpx.Client, name: str, body, status: int, code: str) -> dict:
    """Send ``body``; check the status, code and envelope, and that the entry did not change."""
    before = entry(http, name)
    answer = load(http, name, body)
    assert answer.status_code == status, answer.text
    assert set(answer.json()) == {"error"}
    error = answer.json()["error"]
    assert set(error) == {"code", "message", "param"}
    assert error["code"] == code
    assert error["message"]
    assert entry(http, name) == before
    return error


# ---- 422: schema ---------------------------------------------------------------------------

SCHEMA_EXAMPLES = [
    ("lls", "target_inflight", 0),
    ("gguf", "gguf_n_ctx", 0),
    ("exl", "exllama_cache_size", 0),
    ("exl", "exllama_max_rq_tokens", 0),
    ("trt", "trtllm_kv_cache_memory_bytes", 0),
]


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
    ("gguf_type_k q8-0", "gguf", {"gguf_type_k": "q8-0"}, "gguf_type_k"),
    ("gguf_type_k foo", "gguf", {"gguf_type_k": "foo"}, "gguf_type_k"),
    ("k_bits without v_bits", "exl", {"exllama_cache_k_bits": 8}, "exllama_cache_v_bits"),
    (
        "quant with k/v bits",
        "exl",
        {"exllama_cache_quant": "8,8", "exllama_cache_k_bits": 8, "exllama_cache_v_bits": 8},
        "exllama_cache_quant",
    ),
    ("exllama_cache_size 8000", "exl", {"exllama_cache_size": 8000}, "exllama_cache_size"),
    ("exllama_cache_quant fp16", "exl", {"exllama_cache_quant": "fp16"}, "exllama_cache_quant"),
    ("llama_server_spec_type medusa", "lls", {"llama_server_spec_type": "medusa"}, "llama_server_spec_type"),
    ("llama_server_spec_draft_n_max 7", "lls", {"llama_server_spec_draft_n_max": 7}, "llama_server_spec_draft_n_max"),
    (
        "llama_server_spec_draft_p_min 1.5",
        "lls",
        {"llama_server_spec_draft_p_min": 1.5},
        "llama_server_spec_draft_p_min",
    ),
    ("trtllm_kv_cache_dtype int8", "trt", {"trtllm_kv_cache_dtype": "int8"}, "trtllm_kv_cache_dtype"),
    ("exllama fields to llama_cpp", "gguf", {"exllama_cache_size": 32768}, "exllama_cache_size"),
    ("llama-server fields to vllm", "vl", {"llama_server_n_ctx": 4096}, "llama_server_n_ctx"),
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
        while entry(http, "slow-unload")["runtime_state"] != "unloading":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert_rejected(http, "slow-unload", None, 409, "model_state_conflict")
        assert_rejected(http, "slow-unload", {}, 409, "model_state_conflict")
        assert unloading.result().json()["runtime_state"] == "unloaded"


# ---- the spec's example load bodies validate ----------------------------------------------

EXAMPLE_BODIES = [
    ("lls", {"replicas": 3, "target_inflight": 4}),
    ("gguf", {"gguf_n_ctx": 8192}),
    ("gguf", {"gguf_n_ctx": 16384}),
    ("gguf", {"gguf_n_ctx": 32768}),
    ("gguf", {"gguf_n_ctx": 32768, "gguf_flash_attn": "auto", "gguf_type_k": "q8_0", "gguf_type_v": "q4_0"}),
    ("exl", {"exllama_cache_size": 32768, "exllama_cache_quant": None, "exllama_max_rq_tokens": 32768}),
    ("exl", {"exllama_cache_size": 32768, "exllama_cache_quant": "8,8", "exllama_max_rq_tokens": 32768}),
    ("exl", {"exllama_cache_size": 32768, "exllama_cache_quant": "8,4", "exllama_max_rq_tokens": 32768}),
    (
        "exl",
        {
            "exllama_cache_size": 32768,
            "exllama_cache_k_bits": 8,
            "exllama_cache_v_bits": 4,
            "exllama_max_rq_tokens": 32768,
        },
    ),
    (
        "vl",
        {
            "vllm_max_model_len": 16384,
            "vllm_kv_cache_dtype": "fp8",
            "vllm_kv_cache_memory_bytes": 2147483648,
            "vllm_max_pixels": 4014080,
            "vllm_speculative_method": "mtp",
            "vllm_speculative_model": "google/gemma-4-26B-A4B-it-assistant",
            "vllm_speculative_moe_backend": "triton",
            "vllm_speculative_attention_backend": "triton_attn",
            "vllm_num_speculative_tokens": 1,
        },
    ),
    (
        "trt",
        {
            "target_inflight": 4,
            "trtllm_max_seq_len": 20480,
            "trtllm_kv_cache_memory_bytes": 8589934592,
            "trtllm_max_num_tokens": 8192,
            "trtllm_enable_chunked_prefill": False,
            "trtllm_kv_cache_dtype": "fp8",
        },
    ),
    (
        "sgl",
        {
            "target_inflight": 4,
            "sglang_context_length": 20480,
            "sglang_mem_fraction_static": 0.35,
            "sglang_max_total_tokens": 20480,
            "sglang_chunked_prefill_size": 8192,
            "sglang_kv_cache_dtype": "fp8_e4m3",
            "sglang_speculative_algorithm": "NEXTN",
            "sglang_speculative_draft_model": "google/gemma-4-26B-A4B-it-assistant",
            "sglang_speculative_num_steps": 5,
            "sglang_speculative_num_draft_tokens": 6,
            "sglang_speculative_eagle_topk": 1,
        },
    ),
    (
        "lls",
        {
            "llama_server_n_ctx": 4096,
            "llama_server_image_max_tokens": 512,
            "llama_server_spec_type": "draft-mtp",
            "llama_server_spec_draft_n_max": 4,
            "llama_server_spec_draft_p_min": 0.25,
        },
    ),
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

