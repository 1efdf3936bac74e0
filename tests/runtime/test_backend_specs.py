"""Backend specs against runtime-admin-api.md: load_constraints, load overrides, settings, capabilities."""
from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from runtime.backends import BACKENDS
from runtime.config import parse_load_body, validate_settings
from runtime.errors import InvalidLoadRequest, InvalidSettings
from tests.spec_examples import (
    ADDITIVE_OVERRIDES,
    EXLLAMA_BODIES,
    EXLLAMA_CONSTRAINTS,
    EXLLAMA_RECOMMENDATIONS,
    LLAMA_SERVER_BODY,
    LLAMA_SERVER_CONSTRAINTS,
    LOAD_CONSTRAINTS,
    REPLICAS_BODY,
    SGLANG_BODY,
    SGLANG_CONSTRAINTS,
    TRTLLM_BODY,
    TRTLLM_CONSTRAINTS,
    VLLM_BODY,
    VLLM_CONSTRAINTS,
    contract_view,
)

# ---- minimal valid definitions ------------------------------------------------------------

MINIMAL = {
    "llama_cpp": {"model_path": "/models/m.gguf"},
    "llama_server": {"model_path": "/models/m.gguf"},
    "exllamav3": {"model_path": "/models/m-exl3"},
    "vllm": {"model_path": "/models/m"},
    "vllm_serve": {"vllm_serve_model": "google/gemma-4-26B-A4B-it"},
    "trtllm_serve": {"trtllm_serve_model": "google/gemma-4-26B-A4B-it"},
    "sglang_serve": {"sglang_serve_model": "google/gemma-4-26B-A4B-it"},
    "ct2": {"model_path": "/models/m-ct2"},
    "openai_remote": {"remote_base_url": "https://api.example.com/v1", "remote_model": "gpt-x"},
}


def definition(backend: str, **fields):
    return BACKENDS[backend].definition_model.model_validate({"backend": backend, **MINIMAL[backend], **fields})


def validate_body(backend: str, body: dict, **fields) -> dict:
    """The admin load path: schema (422) first, then the backend rules (400) without replicas."""
    overrides = parse_load_body(body)
    overrides.pop("replicas", None)
    return BACKENDS[backend].validate_overrides(definition(backend, **fields), overrides)


def ordered(value) -> str:
    """JSON text keeps key order, so equal texts mean equal keys, values and order."""
    return json.dumps(value)


# ---- load_constraints ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "expected"),
    [
        (backend, LOAD_CONSTRAINTS[backend])
        for backend in (
            "exllamav3", "vllm", "vllm_serve", "trtllm_serve", "sglang_serve", "llama_server", "ct2", "openai_remote"
        )
    ],
)
def test_load_constraints_match_the_spec(backend, expected):
    actual = contract_view(backend, BACKENDS[backend].load_constraints(definition(backend)))  # additive keys aside
    assert actual == expected
    assert ordered(actual) == ordered(expected)


@pytest.mark.parametrize(
    ("backend", "concurrent"),
    [
        ("llama_server", True),
        ("openai_remote", True),
        ("vllm_serve", True),
        ("trtllm_serve", True),
        ("sglang_serve", True),
        ("exllamav3", False),
        ("vllm", False),
        ("ct2", False),
    ],
)
def test_only_server_backends_are_concurrent(backend, concurrent):
    spec = BACKENDS[backend]
    assert spec.concurrent is concurrent
    assert spec.effective_target_inflight(4) == (4 if concurrent else 1)


@pytest.mark.parametrize(
    ("backend", "fields"),
    [
        ("exllamav3", list(EXLLAMA_CONSTRAINTS)),
        ("vllm", list(VLLM_CONSTRAINTS)),
        ("vllm_serve", list(VLLM_CONSTRAINTS)),
        ("trtllm_serve", list(TRTLLM_CONSTRAINTS)),
        ("sglang_serve", list(SGLANG_CONSTRAINTS)),
        ("llama_server", list(LLAMA_SERVER_CONSTRAINTS)),
        ("ct2", []),
        ("openai_remote", []),
    ],
)
def test_override_fields_are_the_spec_list(backend, fields):
    additive = ADDITIVE_OVERRIDES.get(backend, ())
    assert sorted(f for f in BACKENDS[backend].override_fields if f not in additive) == sorted(fields)


def test_exllama_recommends_the_spec_presets():
    recommendations = BACKENDS["exllamav3"].load_recommendations(definition("exllamav3"))
    presets = recommendations["exllama_cache_bit_pairs"]
    assert list(recommendations) == ["exllama_cache_bit_pairs"]
    expected = EXLLAMA_RECOMMENDATIONS["exllama_cache_bit_pairs"]
    assert ordered({k: v for k, v in presets.items() if k != "notes"}) == ordered(expected)
    assert presets["notes"] and all(isinstance(note, str) for note in presets["notes"])


@pytest.mark.parametrize(
    "backend", ["llama_server", "vllm", "vllm_serve", "trtllm_serve", "sglang_serve", "ct2", "openai_remote"]
)
def test_other_backends_recommend_nothing(backend):
    assert BACKENDS[backend].load_recommendations(definition(backend)) == {}


# ---- accepted load bodies (the spec's examples) -------------------------------------------

ACCEPTED_BODIES = [
    ("llama_server", REPLICAS_BODY),
    ("trtllm_serve", REPLICAS_BODY),
    *[("exllamav3", body) for body in EXLLAMA_BODIES],
    ("exllamav3", {"exllama_cache_k_bits": None, "exllama_cache_v_bits": None}),
    ("exllamav3", {"exllama_cache_quant": "6"}),
    *[(backend, VLLM_BODY) for backend in ("vllm", "vllm_serve")],
    ("vllm", {"vllm_kv_cache_dtype": "fp8_inc"}),
    ("vllm_serve", {"vllm_kv_cache_dtype": "bfloat16", "target_inflight": 8}),
    ("vllm", {"vllm_speculative_method": None, "vllm_speculative_moe_backend": None}),
    ("trtllm_serve", TRTLLM_BODY),
    ("sglang_serve", SGLANG_BODY),
    ("sglang_serve", {"sglang_speculative_num_steps": 3, "sglang_speculative_num_draft_tokens": 4}),
    (
        "sglang_serve",
        {
            "sglang_speculative_eagle_topk": 4,
            "sglang_speculative_num_steps": 3,
            "sglang_speculative_num_draft_tokens": 8,
        },
    ),
    ("sglang_serve", {"sglang_chunked_prefill_size": -1, "sglang_speculative_algorithm": None}),
    ("llama_server", LLAMA_SERVER_BODY),
    ("llama_server", {"llama_server_spec_type": None}),
    ("llama_cpp", {"gguf_spec_type": "ngram-simple", "gguf_spec_draft_n_max": 12, "gguf_spec_draft_p_min": 0.5}),
    ("llama_server", {"llama_server_spec_type": "ngram-mod", "llama_server_spec_ngram_n_max": 64,
                      "llama_server_spec_draft_n_min": 16, "llama_server_spec_ngram_size_n": 24}),
    ("llama_server", {"llama_server_spec_type": "ngram-map-k4v", "llama_server_spec_ngram_min_hits": 2}),
    ("openai_remote", {"target_inflight": 16}),
]


@pytest.mark.parametrize(("backend", "body"), ACCEPTED_BODIES)
def test_spec_example_bodies_are_accepted(backend, body):
    expected = {key: value for key, value in body.items() if key != "replicas"}
    assert validate_body(backend, body) == expected


def test_exllama_bits_stay_in_the_override_and_fold_into_the_effective_quant():
    spec = BACKENDS["exllamav3"]
    configured = definition("exllamav3", exllama_cache_quant="4")
    overrides = spec.validate_overrides(configured, {"exllama_cache_k_bits": 8, "exllama_cache_v_bits": 4})
    assert overrides == {"exllama_cache_k_bits": 8, "exllama_cache_v_bits": 4}
    effective = spec.effective_config(configured, overrides)
    assert effective["exllama_cache_quant"] == "8,4"
    assert "exllama_cache_k_bits" not in effective
    reset = spec.effective_config(configured, {"exllama_cache_k_bits": None, "exllama_cache_v_bits": None})
    assert reset["exllama_cache_quant"] is None


def test_exllama_null_quant_override_wins_over_the_definition():
    spec = BACKENDS["exllamav3"]
    configured = definition("exllamav3", exllama_cache_quant="8,8")
    assert spec.effective_config(configured, {"exllama_cache_quant": None})["exllama_cache_quant"] is None


def test_sglang_derives_draft_tokens_when_topk_is_one():
    spec = BACKENDS["sglang_serve"]
    configured = definition("sglang_serve", sglang_speculative_algorithm="NEXTN")
    assert spec.effective_config(configured, {"sglang_speculative_num_steps": 3})[
        "sglang_speculative_num_draft_tokens"
    ] == 4
    assert spec.effective_config(configured, {})["sglang_speculative_num_draft_tokens"] == 6
    wide = spec.effective_config(
        configured, {"sglang_speculative_eagle_topk": 4, "sglang_speculative_num_draft_tokens": 8}
    )
    assert wide["sglang_speculative_num_draft_tokens"] == 8


# ---- rejected load bodies (400 invalid_load_request) --------------------------------------

REJECTED_BODIES = [
    ("exllamav3", {"exllama_cache_size": 8000}, "exllama_cache_size"),
    ("exllamav3", {"exllama_cache_size": 128}, "exllama_cache_size"),
    ("exllamav3", {"exllama_cache_quant": "fp16"}, "exllama_cache_quant"),
    ("exllamav3", {"exllama_cache_quant": "9"}, "exllama_cache_quant"),
    ("exllamav3", {"exllama_cache_quant": "8,1"}, "exllama_cache_quant"),
    ("exllamav3", {"exllama_cache_k_bits": 8}, "exllama_cache_v_bits"),
    ("exllamav3", {"exllama_cache_v_bits": None}, "exllama_cache_k_bits"),
    ("exllamav3", {"exllama_cache_k_bits": 8, "exllama_cache_v_bits": None}, "exllama_cache_k_bits"),
    ("exllamav3", {"exllama_cache_k_bits": 9, "exllama_cache_v_bits": 8}, "exllama_cache_k_bits"),
    (
        "exllamav3",
        {"exllama_cache_quant": "8", "exllama_cache_k_bits": 8, "exllama_cache_v_bits": 8},
        "exllama_cache_quant",
    ),
    (
        "exllamav3",
        {"exllama_cache_quant": None, "exllama_cache_k_bits": None, "exllama_cache_v_bits": None},
        "exllama_cache_quant",
    ),
    ("exllamav3", {"target_inflight": 2}, "target_inflight"),
    ("llama_server", {"llama_server_spec_type": "medusa"}, "llama_server_spec_type"),
    ("llama_server", {"llama_server_spec_type": "draft-mtp", "llama_server_spec_draft_n_max": 2000},
     "llama_server_spec_draft_n_max"),
    ("llama_server", {"llama_server_spec_draft_n_max": 7}, "llama_server_spec_draft_n_max"),
    ("llama_server", {"llama_server_spec_type": "draft-simple", "llama_server_spec_draft_n_max": 7},
     "llama_server_spec_draft_n_max"),  # the contract's range, 1 to 6
    ("llama_server", {"llama_server_spec_type": "draft-mtp", "llama_server_spec_ngram_n_max": 16},
     "llama_server_spec_ngram_n_max"),  # an n-gram mode's knob
    ("llama_server", {"llama_server_spec_type": "ngram-mod", "llama_server_spec_ngram_n_max": 2000},
     "llama_server_spec_ngram_n_max"),
    ("llama_server", {"llama_server_spec_type": "draft-simple"}, "llama_server_spec_type"),
    ("llama_server", {"llama_server_spec_type": "ngram-mod", "llama_server_spec_draft_p_min": 0.5},
     "llama_server_spec_draft_p_min"),
    ("llama_server", {"llama_server_spec_type": "ngram-simple", "llama_server_spec_draft_n_min": 2},
     "llama_server_spec_draft_n_min"),
    ("llama_server", {"llama_server_spec_type": "ngram-cache", "llama_server_spec_ngram_size_n": 4},
     "llama_server_spec_ngram_size_n"),
    ("llama_server", {"llama_server_spec_type": "draft-mtp", "llama_server_spec_ngram_min_hits": 2},
     "llama_server_spec_ngram_min_hits"),
    ("llama_server", {"llama_server_spec_type": "draft-mtp", "llama_server_spec_draft_n_max": 2,
                      "llama_server_spec_draft_n_min": 3}, "llama_server_spec_draft_n_min"),
    ("llama_server", {"llama_server_spec_draft_p_min": 1.5}, "llama_server_spec_draft_p_min"),
    ("llama_cpp", {"gguf_spec_type": "ngram-mod"}, "gguf_spec_type"),
    ("llama_cpp", {"gguf_spec_type": "draft-simple"}, "gguf_spec_type"),
    ("llama_cpp", {"gguf_spec_draft_n_max": 65}, "gguf_spec_draft_n_max"),
    ("llama_cpp", {"gguf_spec_draft_p_min": 1.5}, "gguf_spec_draft_p_min"),
    ("llama_server", {"llama_server_spec_draft_p_min": -0.1}, "llama_server_spec_draft_p_min"),
    ("trtllm_serve", {"trtllm_kv_cache_dtype": "int8"}, "trtllm_kv_cache_dtype"),
    ("trtllm_serve", {"trtllm_max_seq_len": 20000}, "trtllm_max_seq_len"),
    ("llama_cpp", {"exllama_cache_size": 32768}, "exllama_cache_size"),
    ("llama_cpp", {"exllama_cache_quant": "8,4"}, "exllama_cache_quant"),
    ("vllm", {"llama_server_n_ctx": 4096}, "llama_server_n_ctx"),
    ("vllm_serve", {"llama_server_spec_type": "draft-mtp"}, "llama_server_spec_type"),
    ("vllm", {"target_inflight": 4}, "target_inflight"),
    ("vllm", {"vllm_kv_cache_dtype": "int8"}, "vllm_kv_cache_dtype"),
    ("vllm", {"vllm_max_model_len": 1000}, "vllm_max_model_len"),
    ("vllm_serve", {"vllm_kv_cache_memory_bytes": 1000}, "vllm_kv_cache_memory_bytes"),
    ("sglang_serve", {"sglang_speculative_num_draft_tokens": 4}, "sglang_speculative_num_draft_tokens"),
    (
        "sglang_serve",
        {"sglang_speculative_num_steps": 3, "sglang_speculative_num_draft_tokens": 6},
        "sglang_speculative_num_draft_tokens",
    ),
    ("sglang_serve", {"sglang_kv_cache_dtype": "fp8"}, "sglang_kv_cache_dtype"),
    ("sglang_serve", {"sglang_mem_fraction_static": 0.0}, "sglang_mem_fraction_static"),
    ("ct2", {"vllm_max_model_len": 4096}, "vllm_max_model_len"),
    ("openai_remote", {"gguf_n_ctx": 4096}, "gguf_n_ctx"),
]


@pytest.mark.parametrize(("backend", "body", "param"), REJECTED_BODIES)
def test_invalid_overrides_are_400(backend, body, param):
    with pytest.raises(InvalidLoadRequest) as caught:
        validate_body(backend, body)
    assert caught.value.http_status == 400
    assert caught.value.code == "invalid_load_request"
    assert caught.value.param == param


def test_a_draft_model_mode_is_accepted_where_the_definition_names_the_draft_file():
    body = {"llama_server_spec_type": "draft-simple", "llama_server_spec_draft_n_max": 6}
    assert validate_body("llama_server", body, llama_server_draft_model="/models/draft.gguf") == body


def test_a_speculative_override_checks_the_knobs_the_definition_set():
    """The definition's knobs fit its mode; a load override that switches the mode must still fit them."""
    configured = {"llama_server_spec_type": "draft-mtp", "llama_server_spec_draft_p_min": 0.5}
    with pytest.raises(InvalidLoadRequest) as caught:
        validate_body("llama_server", {"llama_server_spec_type": "ngram-mod"}, **configured)
    assert caught.value.param == "llama_server_spec_draft_p_min"
    assert validate_body("llama_server", {"llama_server_spec_type": "ngram-mod", "llama_server_spec_draft_p_min": None},
                         **configured)


def test_a_llama_cpp_draft_model_mode_needs_the_definitions_draft_file():
    body = {"gguf_spec_type": "draft-simple", "gguf_spec_draft_n_max": 4}
    assert validate_body("llama_cpp", body, gguf_spec_draft_model="/models/draft.gguf") == body
    with pytest.raises(InvalidLoadRequest) as caught:
        validate_body("llama_cpp", body)
    assert caught.value.param == "gguf_spec_type"


def test_sglang_draft_tokens_conflict_uses_the_configured_steps():
    configured = {"sglang_speculative_num_steps": 2}
    assert validate_body("sglang_serve", {"sglang_speculative_num_draft_tokens": 3}, **configured)
    with pytest.raises(InvalidLoadRequest):
        validate_body("sglang_serve", {"sglang_speculative_num_draft_tokens": 6}, **configured)


# ---- settings-level validation ------------------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "fields"),
    [
        ("llama_server", {"llama_server_extra_args": ["--jinja", "--parallel", "4"]}),
        ("llama_server", {"llama_server_extra_args": ["-np", "4"]}),
        ("llama_server", {"llama_server_extra_args": ["--parallel=4"]}),
        ("vllm_serve", {"vllm_serve_extra_args": ["--max-num-seqs", "8"]}),
        ("vllm_serve", {"vllm_serve_extra_args": ["--max_num_seqs=8"]}),
        ("trtllm_serve", {"trtllm_serve_extra_args": ["--max_batch_size", "8"]}),
        ("trtllm_serve", {"trtllm_serve_extra_args": ["--max-batch-size=8"]}),
        ("trtllm_serve", {"trtllm_serve_extra_args": ["--config", "other.yaml"]}),
        ("sglang_serve", {"sglang_serve_extra_args": ["--max-running-requests", "8"]}),
    ],
)
def test_extra_args_may_not_set_flags_target_inflight_owns(backend, fields):
    with pytest.raises(ValidationError, match="must not set"):
        definition(backend, **fields)


@pytest.mark.parametrize(
    ("backend", "fields"),
    [
        ("llama_server", {"llama_server_extra_args": ["--jinja", "--ctx-size", "8192", "-ngl", "99"]}),
        ("vllm_serve", {"vllm_serve_extra_args": ["--max-num-batched-tokens", "8192"]}),
        ("trtllm_serve", {"trtllm_serve_extra_args": ["--max_beam_width", "1"]}),
        ("sglang_serve", {"sglang_serve_extra_args": ["--enable-metrics"]}),
    ],
)
def test_other_extra_args_are_kept(backend, fields):
    assert getattr(definition(backend, **fields), next(iter(fields))) == next(iter(fields.values()))


@pytest.mark.parametrize("quant", ["fp16", "8,", ",8", "1", "9", "8,9", "8;4", "8,4,2", "", " 8", "8\n"])
def test_bad_exllama_cache_quant_in_a_definition_is_rejected(quant):
    with pytest.raises(ValidationError, match="exllama_cache_quant"):
        definition("exllamav3", exllama_cache_quant=quant)


@pytest.mark.parametrize("quant", [None, "2", "8", "8,4", "4,8"])
def test_exllama_cache_quant_formats_are_accepted(quant):
    assert definition("exllamav3", exllama_cache_quant=quant).exllama_cache_quant == quant


@pytest.mark.parametrize(
    ("backend", "fields"),
    [
        ("exllamav3", {"exllama_cache_size": 1000}),
        ("exllamav3", {"exllama_cache_size": 128}),
        ("vllm", {"vllm_kv_cache_dtype": "int8"}),
        ("vllm", {"vllm_gpu_memory_utilization": 1.5}),
        ("vllm_serve", {"vllm_serve_port": 70000}),
        ("trtllm_serve", {"trtllm_kv_cache_dtype": "int8"}),
        ("sglang_serve", {"sglang_kv_cache_dtype": "fp8"}),
        ("sglang_serve", {"sglang_speculative_num_steps": 3, "sglang_speculative_num_draft_tokens": 6}),
        ("llama_server", {"llama_server_spec_type": "medusa"}),
        ("llama_server", {"llama_server_spec_draft_n_max": 7}),
        ("llama_server", {"llama_server_spec_type": "draft-mtp", "llama_server_spec_draft_n_max": 2000}),
        ("llama_server", {"llama_server_spec_type": "draft-eagle3"}),
        ("llama_server", {"llama_server_spec_type": "ngram-map-k", "llama_server_spec_draft_p_min": 0.1}),
        ("llama_server", {"llama_server_n_ctx": "4096"}),
        ("llama_cpp", {"gguf_spec_type": "draft-simple"}),
        ("llama_cpp", {"gguf_spec_type": "ngram-mod"}),
        ("llama_cpp", {"gguf_spec_ngram_size_n": 0}),
        ("openai_remote", {"remote_base_url": "api.example.com"}),
        ("openai_remote", {"remote_api_key": "k", "remote_api_key_env": "REMOTE_KEY"}),
        ("ct2", {"ct2_compute_type": "int4"}),
        ("vllm", {"prompt_format": "gemma4"}),
        ("vllm", {"gguf_n_ctx": 4096}),
    ],
)
def test_invalid_definition_fields_are_rejected(backend, fields):
    with pytest.raises(ValidationError):
        definition(backend, **fields)


@pytest.mark.parametrize(
    "model",
    [
        {"backend": "llama_server"},
        {"backend": "exllamav3"},
        {"backend": "vllm"},
        {"backend": "vllm_serve"},
        {"backend": "trtllm_serve"},
        {"backend": "sglang_serve"},
        {"backend": "ct2"},
        {"backend": "openai_remote", "remote_model": "gpt-x"},
        {"backend": "openai_remote", "remote_base_url": "https://api.example.com/v1"},
    ],
)
def test_a_definition_must_name_its_model(model):
    with pytest.raises(InvalidSettings):
        validate_settings({"models": {"m": model}})


def test_serve_backends_accept_model_path_as_the_target():
    for backend in ("vllm_serve", "trtllm_serve", "sglang_serve"):
        model = {"backend": backend, "model_path": "/models/m"}
        assert validate_settings({"models": {"m": model}}).models["m"].backend == backend


def test_settings_union_builds_every_backend():
    models = {backend: {"backend": backend, **fields} for backend, fields in MINIMAL.items()}
    settings = validate_settings({"models": models})
    assert {name: type(d).__name__ for name, d in settings.models.items()} == {
        name: BACKENDS[name].definition_model.__name__ for name in MINIMAL
    }


def test_vllm_accepts_every_vllm_cache_dtype_in_definitions():
    assert definition("vllm", vllm_kv_cache_dtype="fp8_e5m2").vllm_kv_cache_dtype == "fp8_e5m2"
    assert definition("vllm_serve", vllm_kv_cache_dtype="nvfp4").vllm_kv_cache_dtype == "nvfp4"


# ---- capabilities -------------------------------------------------------------------------

ALL_THINKING = ["default", "enabled", "disabled"]


@pytest.mark.parametrize(
    ("backend", "fields", "expected"),
    [
        ("vllm", {"prompt_format": "gemma4_template"}, ALL_THINKING),
        ("vllm", {"prompt_format": "qwen3_template"}, ALL_THINKING),
        ("vllm", {"prompt_format": "mistral_template"}, ["default"]),
        ("vllm", {}, ["default"]),
        ("vllm_serve", {"prompt_format": "gemma4_template"}, ALL_THINKING),
        ("vllm_serve", {"prompt_format": "qwen3_template"}, ["default"]),
        ("trtllm_serve", {"prompt_format": "gemma4_template"}, ALL_THINKING),
        ("trtllm_serve", {"prompt_format": "qwen3_template"}, ["default"]),
        ("sglang_serve", {"prompt_format": "gemma4_template"}, ALL_THINKING),
        ("sglang_serve", {"prompt_format": "qwen3_template"}, ["default"]),
        ("exllamav3", {"prompt_format": "gemma4_template"}, ALL_THINKING),
        ("exllamav3", {"prompt_format": "qwen3_template"}, ALL_THINKING),
        ("exllamav3", {"prompt_format": "generic"}, ["default"]),
        ("ct2", {"prompt_format": "qwen3_template"}, ALL_THINKING),
        ("ct2", {"prompt_format": "gemma4_template"}, ["default"]),
        ("llama_server", {"prompt_format": "gemma4_template"}, ["default"]),
        ("openai_remote", {"remote_thinking": True}, ALL_THINKING),
        ("openai_remote", {}, ["default"]),
    ],
)
def test_thinking_modes(backend, fields, expected):
    assert BACKENDS[backend].capabilities(definition(backend, **fields))["thinking_modes"] == expected


@pytest.mark.parametrize("backend", list(MINIMAL))
def test_multi_turn_response_formats_and_remote(backend):
    capabilities = BACKENDS[backend].capabilities(definition(backend))
    # The contract lists multi-turn for the chat-serving backends only (not exllamav3, ct2).
    assert capabilities["multi_turn"] is (backend not in ("exllamav3", "ct2"))
    json_schema = ["text", "json_schema"]
    assert capabilities["response_formats"] == (json_schema if backend == "vllm_serve" else ["text"])
    assert BACKENDS[backend].is_remote(definition(backend)) is (backend == "openai_remote")


@pytest.mark.parametrize(
    ("backend", "fields", "expected"),
    [
        ("openai_remote", {"remote_file_mode": "inline"}, True),
        ("openai_remote", {"remote_file_mode": "upload"}, True),
        ("openai_remote", {}, False),
        ("vllm_serve", {}, False),
        ("llama_server", {}, False),
    ],
)
def test_file_inputs(backend, fields, expected):
    assert BACKENDS[backend].capabilities(definition(backend, **fields))["file_inputs"] is expected


def test_capabilities_carry_the_configured_modalities():
    capabilities = BACKENDS["vllm_serve"].capabilities(definition("vllm_serve", modalities=["image"]))
    assert capabilities["modalities"] == ["text", "image"]


# ---- VRAM estimates -----------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["llama_server", "exllamav3", "vllm", "ct2"])
def test_vram_estimate_from_a_local_artifact(tmp_path, backend):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "weights.bin").write_bytes(b"\0" * (3 * 1024 * 1024))
    spec = BACKENDS[backend]
    configured = definition(backend, model_path="model")
    assert spec.vram_estimate(configured, {}, 2, str(tmp_path)) == (6, "model_artifact_size")


@pytest.mark.parametrize("backend", ["vllm_serve", "trtllm_serve", "sglang_serve"])
def test_serve_vram_estimate_uses_a_local_target(tmp_path, backend):
    (tmp_path / "weights.bin").write_bytes(b"\0" * (2 * 1024 * 1024))
    spec = BACKENDS[backend]
    local = definition(backend, **{f"{backend}_model": str(tmp_path)})
    assert spec.vram_estimate(local, {}, 3, "/") == (6, "model_artifact_size")
    hub = definition(backend)
    assert spec.vram_estimate(hub, {}, 3, str(tmp_path)) == (None, "unavailable")


def test_vram_estimate_is_unavailable_without_an_artifact(tmp_path):
    assert BACKENDS["vllm"].vram_estimate(definition("vllm", model_path="missing"), {}, 1, str(tmp_path)) == (
        None,
        "unavailable",
    )
    assert BACKENDS["openai_remote"].vram_estimate(definition("openai_remote"), {}, 1, str(tmp_path)) == (
        None,
        "unavailable",
    )
