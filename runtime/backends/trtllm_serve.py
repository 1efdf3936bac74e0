"""trtllm_serve: a managed local ``trtllm-serve`` process group, one per replica.

At load, llm-pool reads ``trtllm_config_yaml``, merges the effective
``trtllm_*`` values and ``max_batch_size`` (= ``target_inflight``) into a
temporary YAML and passes it through ``--config``; the extra args therefore
may set neither the batch size nor the config file.  The engine lands with the
trtllm_serve issue.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from runtime.backends.base import BackendSpec
from runtime.backends.common_fields import (
    GEMMA4,
    FamilyDefinition,
    NonEmptyStr,
    Port,
    artifact_estimate,
    check_extra_args,
    require_model_target,
    thinking_for_families,
)

TRTLLM_CACHE_DTYPES = ["auto", "fp8", "nvfp4"]


class TrtllmServeDefinition(FamilyDefinition):
    backend: Literal["trtllm_serve"]
    trtllm_serve_binary: NonEmptyStr = "trtllm-serve"
    # Hub id, checkpoint or engine folder passed to trtllm-serve; model_path is used when this is null.
    trtllm_serve_model: NonEmptyStr | None = None
    trtllm_serve_host: NonEmptyStr = "127.0.0.1"
    trtllm_serve_port: Port | None = None  # null: a free port per replica
    trtllm_serve_api_key: str | None = None
    trtllm_serve_env: dict[str, str] = Field(default_factory=dict)
    trtllm_serve_library_path: str | None = None
    trtllm_serve_extra_args: list[str] = Field(default_factory=list)
    trtllm_serve_startup_timeout_seconds: float = Field(1800.0, gt=0)
    # Base LLM API YAML; it is read, never written, and may not set max_batch_size.
    trtllm_config_yaml: str | None = None
    trtllm_reasoning_parser: str | None = None
    trtllm_tool_parser: str | None = None
    trtllm_max_seq_len: int | None = Field(None, ge=1)
    trtllm_max_num_tokens: int | None = Field(None, ge=1)
    # kv_cache_config.max_gpu_total_bytes
    trtllm_kv_cache_memory_bytes: int | None = Field(None, ge=1)
    trtllm_kv_cache_dtype: Literal["auto", "fp8", "nvfp4"] | None = None
    trtllm_enable_chunked_prefill: bool = False
    # kv_cache_config.free_gpu_memory_fraction: a safety ceiling when the byte budget should decide.
    trtllm_free_gpu_memory_fraction: float | None = Field(None, gt=0, le=1)

    @model_validator(mode="after")
    def _serve_rules(self):
        require_model_target(self, "trtllm_serve_model")
        check_extra_args(
            "trtllm_serve_extra_args", self.trtllm_serve_extra_args, ("--max-batch-size",), "target_inflight"
        )
        check_extra_args(
            "trtllm_serve_extra_args",
            self.trtllm_serve_extra_args,
            ("--config", "--extra-llm-api-options"),
            "trtllm_config_yaml",
        )
        return self


class TrtllmServeSpec(BackendSpec):
    name = "trtllm_serve"
    definition_model = TrtllmServeDefinition
    concurrent = True
    override_fields = (
        "trtllm_max_seq_len",
        "trtllm_kv_cache_memory_bytes",
        "trtllm_max_num_tokens",
        "trtllm_enable_chunked_prefill",
        "trtllm_kv_cache_dtype",
    )

    def backend_constraints(self, definition):
        return {
            "trtllm_max_seq_len": {"kind": "integer", "minimum": 256, "step": 256},
            "trtllm_kv_cache_memory_bytes": {
                "kind": "integer",
                "minimum": 268435456,
                "step": 268435456,
                "unit": "bytes",
                "display_unit": "mib",
            },
            "trtllm_max_num_tokens": {"kind": "integer", "minimum": 256, "step": 256},
            "trtllm_enable_chunked_prefill": {"kind": "boolean", "default": False},
            "trtllm_kv_cache_dtype": {
                "kind": "enum",
                "default": "auto",
                "allowed_values": list(TRTLLM_CACHE_DTYPES),
                "examples": list(TRTLLM_CACHE_DTYPES),
            },
        }

    def thinking_modes(self, definition):
        return thinking_for_families(definition, (GEMMA4,))

    def vram_estimate(self, definition, config, replicas, base_dir):
        return artifact_estimate(base_dir, replicas, definition.model_path, definition.trtllm_serve_model)
