"""GET /v1/admin/models and GET /v1/admin/gpu-memory against runtime-admin-api.md, over real HTTP.

One live service (module scope) holds a model of every backend; nothing here
loads a model, so the tests share it.  Start-up loading gets its own service.
"""
from __future__ import annotations

import time

import pytest
from runtime.redaction import REDACTED
from tests.conftest import LiveService, catalog_mirror, write_settings
from tests.spec_examples import (
    EXLLAMA_RECOMMENDATIONS,
    GGUF_RECOMMENDATION_NOTES,
    GGUF_RECOMMENDATIONS,
    LOAD_CONSTRAINTS,
    contract_view,
)

# ---- the contract, copied from the spec (the shared data: tests/spec_examples.py) ----------

# The keys of the AdminModelEntry example under "GET /v1/admin/models".
ENTRY_KEYS = {
    "name", "resolved_backend", "configured_enabled", "runtime_state", "is_loaded", "replicas", "replica_max",
    "loaded_replicas", "inflight_requests", "queue_depth", "runtime_inflight", "configured_target_inflight",
    "effective_target_inflight", "fairness", "last_error", "vram_estimate_mib", "vram_estimate_replica_count",
    "vram_estimate_source", "load_constraints", "load_recommendations", "load_override", "capabilities",
    "definition",
    # additive (docs/api.md): models that switch by themselves
    "group", "idle_expires_at", "keep_alive_seconds", "last_request_at", "waiting_requests", "last_reason",
    # additive (docs/observability.md): rolling request figures
    "stats",
    # additive (docs/api.md): memory-aware placement
    "placement", "memory",
    # additive (docs/observability.md): load progress
    "load_progress",
    # additive (docs/api.md): the warm tier (runtime.model.residency)
    "residency", "sleepable",
    # additive (docs/api.md): the node that serves it
    "node",
    # additive (docs/api.md): the context one request may use, a local GGUF file's description
    "context_length", "model_file",
}
# The keys of each item of "models" in the GET /v1/admin/gpu-memory example.
GPU_MODEL_KEYS = {
    "name", "runtime_state", "is_loaded", "configured_target_inflight", "effective_target_inflight",
    "vram_estimate_mib", "vram_estimate_replica_count", "vram_estimate_source",
}
GPU_KEYS = {"index", "name", "used_mib", "total_mib", "used_over_total"}
STATES = {"unloaded", "loading", "loaded", "unloading", "failed"}
VRAM_SOURCES = {"observed_load_delta", "model_artifact_size", "unavailable"}
# Common definition fields (the "Configured Model Definition" list plus the admin example's fields).
COMMON_FIELDS = {
    "model_path", "backend", "device", "prompt_format", "enable_thinking", "enabled", "replicas", "replica_max",
    "target_inflight", "modalities", "request_timeout_seconds", "isolation",
    "load_on_request", "load_wait_timeout_seconds", "queue_timeout_seconds", "ttl_seconds", "pinned", "keep_warm",
    "aliases",
    "reasoning_tags",
}

# load_recommendations of the llama_cpp AdminModelEntry example: the GGUF presets with their notes.
LLAMA_CPP_RECOMMENDATIONS = {
    "gguf_cache_type_pairs": {**GGUF_RECOMMENDATIONS["gguf_cache_type_pairs"], "notes": GGUF_RECOMMENDATION_NOTES}
}

# ---- the service -------------------------------------------------------------------------

GGUF_FILE_MIB = 3
MODELS = {
    "echo": {
        "backend": "stub",
        "replicas": 2,
        "replica_max": 3,
        "target_inflight": 4,
        "stub_vram_mib": 100,
        "modalities": ["image"],
        "thinking_modes": ["default", "enabled"],
    },
    "gemma-gguf": {
        "model_path": "weights/gemma.gguf",  # relative to the settings folder; written by the fixture
        "backend": "llama_cpp",
        "prompt_format": "gemma4_template",
        "replicas": 3,
        "replica_max": 4,
        "gguf_n_ctx": 4096,
    },
    "missing-gguf": {"model_path": "/nonexistent/models/missing.gguf", "backend": "llama_cpp"},
    "exl": {"model_path": "/nonexistent/exl3", "backend": "exllamav3", "prompt_format": "qwen3_template"},
    "vl": {"model_path": "/nonexistent/vllm", "backend": "vllm"},
    "vl-serve": {"backend": "vllm_serve", "vllm_serve_model": "org/model", "vllm_serve_api_key": "vllm-secret-key",
                 "vllm_serve_extra_args": ["--hf-token", "hf_secret_in_args", "--max-num-batched-tokens", "8192"]},
    "trt": {"backend": "trtllm_serve", "trtllm_serve_model": "org/model"},
    "sgl": {"backend": "sglang_serve", "sglang_serve_model": "org/model"},
    "lls": {"model_path": "/nonexistent/lls.gguf", "backend": "llama_server", "target_inflight": 4,
            "llama_server_env": {"HF_TOKEN": "hf_secret_token", "OMP_NUM_THREADS": "4"}},
    "ct2-model": {"model_path": "/nonexistent/ct2", "backend": "ct2"},
    "remote": {"backend": "openai_remote", "remote_base_url": "http://127.0.0.1:9/v1", "remote_model": "gpt",
               "remote_api_key": "sk-remote-secret", "remote_headers": {"Authorization": "Bearer header-secret"}},
}
# The secret values above: no output may show them (runtime.redaction).
SECRETS = ("vllm-secret-key", "hf_secret_in_args", "hf_secret_token", "sk-remote-secret", "header-secret")

# Each backend's own definition-field prefixes; every non-common key of its definition has one.
OWN_PREFIXES = {
    "stub": ("stub_",),
    "llama_cpp": ("gguf_",),
    "exllamav3": ("exllama_",),
    "vllm": ("vllm_",),
    "vllm_serve": ("vllm_",),
    "trtllm_serve": ("trtllm_",),
    "sglang_serve": ("sglang_",),
    "llama_server": ("llama_server_",),
    "ct2": ("ct2_",),
    "openai_remote": ("remote_",),
}
# Capability switches a stub definition carries so every capability check can be exercised.
STUB_CAPABILITY_FIELDS = {"thinking_modes", "response_formats", "multi_turn", "file_inputs", "raw_prompt", "sampling_options",
                          "tools", "tool_choice"}
# The backends whose definition has the unprefixed ``embeddings`` field (POST /v1/embeddings).
EMBEDDING_BACKENDS = {"stub", "llama_cpp", "llama_server", "vllm_serve", "openai_remote"}
# The same for ``rerank`` (POST /v1/rerank) and ``audio_transcription`` (a managed server's audio routes).
RERANK_BACKENDS = {"stub", "llama_cpp", "llama_server", "vllm_serve", "openai_remote"}
ADAPTER_BACKENDS = {"llama_cpp", "llama_server", "vllm", "vllm_serve"}  # LoRA adapters (settings.md)
AUDIO_BACKENDS = {"llama_server", "vllm_serve"}
FOREIGN_PREFIXES = ("gguf_", "exllama_", "vllm_", "trtllm_", "sglang_", "llama_server_", "ct2_", "remote_", "stub_")


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape):
    folder = tmp_path_factory.mktemp("admin_models")
    weights = folder / "weights"
    weights.mkdir()
    with open(weights / "gemma.gguf", "wb") as handle:
        handle.truncate(GGUF_FILE_MIB * 1024 * 1024)
    settings_path = write_settings(folder, MODELS)
    live = LiveService(settings_path, folder / "db.sqlite3").start()
    yield live
    assert live.stop() == 0


@pytest.fixture(scope="module")
def entries(service) -> dict[str, dict]:
    with service.client() as http:
        answer = http.get("/v1/admin/models")
    assert answer.status_code == 200
    models = answer.json()["models"]
    assert len(models) == len({m["name"] for m in models}), "a model is listed twice"
    return {model["name"]: model for model in models}


# ---- GET /v1/admin/models ----------------------------------------------------------------


def test_every_configured_model_is_listed_once(entries):
    assert set(entries) == set(MODELS)


def test_every_entry_has_exactly_the_spec_key_set(entries):
    for name, entry in entries.items():
        assert set(entry) == ENTRY_KEYS, name


def test_entry_field_types(entries):
    for name, entry in entries.items():
        assert entry["name"] == name
        assert entry["resolved_backend"] == MODELS[name]["backend"]
        assert entry["configured_enabled"] is False
        assert entry["runtime_state"] == "unloaded"
        assert entry["is_loaded"] is False
        for key in ("replicas", "replica_max", "loaded_replicas", "inflight_requests", "queue_depth",
                    "runtime_inflight", "configured_target_inflight", "effective_target_inflight",
                    "vram_estimate_replica_count"):
            assert type(entry[key]) is int, (name, key)
        assert (entry["loaded_replicas"], entry["inflight_requests"], entry["queue_depth"],
                entry["runtime_inflight"]) == (0, 0, 0, 0)
        assert entry["fairness"] == {"rejected_per_key_limit": 0, "rejected_executor_limit": 0, "keys": []}
        assert entry["last_error"] is None
        assert entry["vram_estimate_mib"] is None or type(entry["vram_estimate_mib"]) is int
        assert entry["vram_estimate_source"] in VRAM_SOURCES
        for key in ("load_constraints", "load_recommendations", "load_override", "capabilities", "definition"):
            assert isinstance(entry[key], dict), (name, key)
        assert entry["load_override"] == {}
        capabilities = entry["capabilities"]
        assert {"modalities", "file_inputs", "multi_turn", "thinking_modes", "response_formats"} <= set(capabilities)
        assert isinstance(capabilities["file_inputs"], bool) and isinstance(capabilities["multi_turn"], bool)
        assert "text" in capabilities["modalities"]
        assert "default" in capabilities["thinking_modes"]


def test_replica_fields_come_from_the_definition(entries):
    gguf = entries["gemma-gguf"]
    assert (gguf["replicas"], gguf["replica_max"]) == (3, 4)
    assert (gguf["definition"]["replicas"], gguf["definition"]["replica_max"]) == (3, 4)
    # replica_max defaults to replicas.
    assert (entries["vl"]["replicas"], entries["vl"]["replica_max"]) == (1, 1)


@pytest.mark.parametrize("name", list(MODELS))
def test_definition_has_common_fields_and_only_its_backends_fields(entries, name):
    definition = entries[name]["definition"]
    backend = MODELS[name]["backend"]
    assert COMMON_FIELDS <= set(definition)
    assert definition["backend"] == backend
    own = OWN_PREFIXES[backend]
    extra = STUB_CAPABILITY_FIELDS if backend == "stub" else set()
    extra = extra | ({"embeddings"} if backend in EMBEDDING_BACKENDS else set())
    extra = extra | ({"rerank"} if backend in RERANK_BACKENDS else set())
    extra = extra | ({"audio_transcription"} if backend in AUDIO_BACKENDS else set())
    extra = extra | ({"tool_call_format"} if backend == "llama_cpp" else set())  # the tool-call parser's format
    extra = extra | ({"adapters"} if backend in ADAPTER_BACKENDS else set())
    extra = extra | ({"adapters_loaded"} if backend in ADAPTER_BACKENDS - {"llama_server"} else set())
    for key in set(definition) - COMMON_FIELDS - extra:
        assert key.startswith(own), f"{name} ({backend}) shows foreign field {key}"
    if backend == "vllm":
        assert not any(key.startswith("vllm_serve_") for key in definition)


def test_definition_carries_the_configured_values(entries):
    definition = entries["gemma-gguf"]["definition"]
    assert definition["model_path"] == "weights/gemma.gguf"
    assert definition["prompt_format"] == "gemma4_template"
    assert definition["enabled"] is False
    assert definition["gguf_n_ctx"] == 4096
    # The llama_cpp keys of the spec's example definition are all present.
    assert {"enable_thinking", "gguf_n_gpu_layers", "gguf_flash_attn", "gguf_type_k", "gguf_type_v"} <= set(definition)
    stub = entries["echo"]["definition"]
    assert {key for key in stub if key.startswith("stub_")} >= {
        "stub_load_seconds", "stub_unload_seconds", "stub_fail_load", "stub_fail_replica", "stub_token_delay_ms",
        "stub_reply", "stub_vram_mib",
    }
    assert not any(key.startswith("gguf_") for key in stub)
    assert not any(key.startswith("stub_") for key in definition)


def test_secrets_in_definitions_are_redacted(service, entries):
    assert entries["remote"]["definition"]["remote_api_key"] == REDACTED
    assert entries["remote"]["definition"]["remote_headers"] == {"Authorization": REDACTED}
    assert entries["lls"]["definition"]["llama_server_env"] == {"HF_TOKEN": REDACTED, "OMP_NUM_THREADS": REDACTED}
    assert entries["lls"]["definition"]["llama_server_api_key"] is None  # unset stays null
    vllm_serve = entries["vl-serve"]["definition"]
    assert vllm_serve["vllm_serve_api_key"] == REDACTED and vllm_serve["vllm_serve_env"] == {}
    assert vllm_serve["vllm_serve_extra_args"] == ["--hf-token", REDACTED, "--max-num-batched-tokens", "8192"]
    with service.client() as http:
        listing = http.get("/v1/admin/models").text
    assert not any(secret in listing for secret in SECRETS)


def test_the_catalog_mirror_holds_the_definitions_redacted(service):
    rows = catalog_mirror(service)
    assert rows["remote"][2]["remote_api_key"] == REDACTED
    assert rows["lls"][2]["llama_server_env"] == {"HF_TOKEN": REDACTED, "OMP_NUM_THREADS": REDACTED}
    assert not any(secret in str(rows) for secret in SECRETS)


def test_llama_cpp_constraints_and_recommendations_equal_the_spec_example(entries):
    constraints = entries["gemma-gguf"]["load_constraints"]
    # Additive (docs/api.md): the fields POST .../reconfigure changes while the model is loaded.
    assert {key for key, entry in constraints.items() if entry.get("reconfigurable") is True} == {
        "gguf_n_ctx", "gguf_type_k", "gguf_type_v", "gguf_flash_attn", "adapters_loaded"
    }
    assert contract_view("llama_cpp", constraints) == LOAD_CONSTRAINTS["llama_cpp"]
    assert constraints["target_inflight"] == {"kind": "integer", "minimum": 1, "step": 1}  # additive
    assert entries["gemma-gguf"]["load_recommendations"] == LLAMA_CPP_RECOMMENDATIONS


@pytest.mark.parametrize(
    "name, expected",
    [
        (name, LOAD_CONSTRAINTS[MODELS[name]["backend"]])
        for name in ("exl", "vl", "vl-serve", "trt", "sgl", "lls", "remote", "echo", "ct2-model")
    ],
)
def test_load_constraints_equal_the_spec_shape(entries, name, expected):
    # llm-pool's additive keys and overrides aside (llama_server's restart-mode reconfigure).
    assert contract_view(MODELS[name]["backend"], entries[name]["load_constraints"]) == expected


def test_exllama_recommends_the_spec_pair_presets(entries):
    recommendations = entries["exl"]["load_recommendations"]
    assert set(recommendations) == {"exllama_cache_bit_pairs"}
    presets = dict(recommendations["exllama_cache_bit_pairs"])
    notes = presets.pop("notes", [])  # optional, as in the llama_cpp example
    assert presets == EXLLAMA_RECOMMENDATIONS["exllama_cache_bit_pairs"]
    assert all(isinstance(note, str) and note for note in notes)


@pytest.mark.parametrize("name", ["vl", "vl-serve", "trt", "sgl", "lls", "remote", "echo", "ct2-model"])
def test_backends_without_presets_recommend_nothing(entries, name):
    assert entries[name]["load_recommendations"] == {}


@pytest.mark.parametrize(
    "name, configured, effective",
    [("echo", 4, 1), ("lls", 4, 4), ("gemma-gguf", 1, 1), ("trt", 1, 1)],
)
def test_effective_target_inflight_is_clamped_for_non_concurrent_backends(entries, name, configured, effective):
    entry = entries[name]
    assert (entry["configured_target_inflight"], entry["effective_target_inflight"]) == (configured, effective)
    assert entry["definition"]["target_inflight"] == configured


def test_stub_vram_estimate_is_stub_vram_mib_times_replicas(entries):
    echo = entries["echo"]
    assert (echo["vram_estimate_mib"], echo["vram_estimate_replica_count"], echo["vram_estimate_source"]) == (
        200, 2, "model_artifact_size"
    )


def test_gguf_vram_estimate_is_the_artifact_size_times_replicas(entries):
    gguf = entries["gemma-gguf"]
    assert (gguf["vram_estimate_mib"], gguf["vram_estimate_replica_count"], gguf["vram_estimate_source"]) == (
        GGUF_FILE_MIB * 3, 3, "model_artifact_size"
    )
    missing = entries["missing-gguf"]
    assert (missing["vram_estimate_mib"], missing["vram_estimate_source"]) == (None, "unavailable")


def test_capabilities_follow_backend_and_definition(entries):
    echo = entries["echo"]["capabilities"]
    assert echo["modalities"] == ["text", "image"]
    assert echo["thinking_modes"] == ["default", "enabled"]
    gguf = entries["gemma-gguf"]["capabilities"]
    assert (gguf["multi_turn"], gguf["thinking_modes"]) == (True, ["default", "enabled", "disabled"])
    assert entries["vl-serve"]["capabilities"]["response_formats"] == ["text", "json_schema"]
    for name in ("trt", "sgl", "gemma-gguf", "echo"):
        assert entries[name]["capabilities"]["response_formats"] == ["text"], name
    assert entries["exl"]["capabilities"]["thinking_modes"] == ["default", "enabled", "disabled"]
    assert entries["remote"]["capabilities"]["file_inputs"] is False


# ---- GET /v1/admin/gpu-memory ------------------------------------------------------------


def test_gpu_memory_reports_gpus_or_why_not_and_every_model(service, entries):
    with service.client() as http:
        answer = http.get("/v1/admin/gpu-memory")
    assert answer.status_code == 200
    body = answer.json()
    assert set(body) == {"gpus", "models", "error", "devices"}  # devices: additive (the memory budgets)
    assert "cpu" in [device["device"] for device in body["devices"]]
    if body["gpus"]:
        assert body["error"] is None
        for gpu in body["gpus"]:
            assert set(gpu) == GPU_KEYS
            assert gpu["used_over_total"] == f"{gpu['used_mib']}MiB / {gpu['total_mib']}MiB"
    else:
        assert isinstance(body["error"], str) and body["error"]
    assert [m["name"] for m in body["models"]] == list(entries)
    for model in body["models"]:
        assert set(model) == GPU_MODEL_KEYS
        entry = entries[model["name"]]
        assert model == {key: entry[key] for key in GPU_MODEL_KEYS}


# ---- start-up loading --------------------------------------------------------------------


def test_enabled_models_load_in_the_background_at_start_up(live_service):
    service = live_service(
        {
            "boot": {"backend": "stub", "enabled": True, "stub_load_seconds": 3},
            "broken": {"backend": "stub", "enabled": True, "stub_fail_load": "no weights here"},
            "idle": {"backend": "stub"},
        }
    )
    with service.client() as http:
        started = time.monotonic()
        answer = http.get("/v1/admin/models")
        assert time.monotonic() - started < 2.0, "the API waited for the start-up load"
        states = {m["name"]: m["runtime_state"] for m in answer.json()["models"]}
        assert states["boot"] == "loading"
        assert states["idle"] == "unloaded"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            models = {m["name"]: m for m in http.get("/v1/admin/models").json()["models"]}
            if models["boot"]["runtime_state"] != "loading":
                break
            time.sleep(0.05)
        assert models["boot"]["runtime_state"] == "loaded"
        assert models["boot"]["configured_enabled"] is True
        assert models["boot"]["loaded_replicas"] == 1
        assert models["broken"]["runtime_state"] == "failed"
        assert "no weights here" in models["broken"]["last_error"]
        assert models["idle"]["runtime_state"] == "unloaded"
