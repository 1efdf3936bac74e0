"""vllm_serve: a managed local ``vllm serve`` subprocess, one per replica.

Same vLLM fields and load overrides as ``vllm``, plus how to start the
server.  ``target_inflight`` becomes ``--max-num-seqs``, so the extra args may
not set it.  The speculative fields become one ``--speculative-config`` JSON
and ``vllm_max_pixels`` is merged into ``--mm-processor-kwargs``, as the
in-process engine does (``runtime.backends.vllm_engine``).  Only this managed
backend forwards a json_schema ``response_format``.
"""
from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, model_validator

from runtime.backends.common_fields import (
    GEMMA4,
    NonEmptyStr,
    Port,
    artifact_estimate,
    check_extra_args,
    require_model_target,
    thinking_for_families,
)
from runtime.backends.managed import ManagedServerEngine, ServerLaunch, ServerProfile, flag_args, model_target
from runtime.backends.vllm import VllmFields, VllmSpec
from runtime.backends.vllm_engine import mm_processor_kwargs, speculative_config


class VllmServeDefinition(VllmFields):
    backend: Literal["vllm_serve"]
    vllm_serve_binary: NonEmptyStr = "vllm"
    # Hub id or local path passed to `vllm serve`; model_path is used when this is null.
    vllm_serve_model: NonEmptyStr | None = None
    vllm_serve_host: NonEmptyStr = "127.0.0.1"
    vllm_serve_port: Port | None = None  # null: a free port per replica
    vllm_serve_api_key: str | None = None
    vllm_serve_env: dict[str, str] = Field(default_factory=dict)
    vllm_serve_library_path: str | None = None
    vllm_serve_extra_args: list[str] = Field(default_factory=list)
    vllm_serve_startup_timeout_seconds: float = Field(900.0, gt=0)

    @model_validator(mode="after")
    def _serve_rules(self):
        require_model_target(self, "vllm_serve_model")
        check_extra_args("vllm_serve_extra_args", self.vllm_serve_extra_args, ("--max-num-seqs",), "target_inflight")
        return self


class VllmServeSpec(VllmSpec):
    name = "vllm_serve"
    definition_model = VllmServeDefinition
    concurrent = True

    def thinking_modes(self, definition):
        return thinking_for_families(definition, (GEMMA4,))

    def response_formats(self, definition):
        return ["text", "json_schema"]

    def vram_estimate(self, definition, config, replicas, base_dir):
        return artifact_estimate(base_dir, replicas, definition.model_path, definition.vllm_serve_model)

    def create_engine(self, model_name, config, replica_index, context):
        return ManagedServerEngine(VLLM_SERVE, model_name, config, replica_index, context)


def vllm_serve_target(config: dict[str, Any], base_dir: str) -> str:
    """What ``vllm serve`` loads (and the model name its API answers to)."""
    return model_target(config["vllm_serve_model"] or config["model_path"], base_dir)


def _json(value: dict | None) -> str | None:
    return json.dumps(value, separators=(",", ":")) if value else None


def vllm_serve_command(config: dict[str, Any], host: str, port: int, base_dir: str) -> list[str]:
    """The exact ``vllm serve`` argv for one replica of ``config`` (the effective definition)."""
    return [
        config["vllm_serve_binary"],
        "serve",
        vllm_serve_target(config, base_dir),
        "--host", host,
        "--port", str(port),
        "--max-num-seqs", str(config["target_inflight"]),
        "--tensor-parallel-size", str(config["vllm_tensor_parallel_size"]),
        "--dtype", config["vllm_dtype"],
        *flag_args(
            ("--max-model-len", config["vllm_max_model_len"]),
            ("--gpu-memory-utilization", config["vllm_gpu_memory_utilization"]),
            ("--kv-cache-dtype", config["vllm_kv_cache_dtype"]),
            ("--kv-cache-memory-bytes", config["vllm_kv_cache_memory_bytes"]),
            ("--quantization", config["vllm_quantization"]),
            ("--reasoning-parser", config["vllm_reasoning_parser"]),
            ("--mm-processor-kwargs", _json(mm_processor_kwargs(config))),
            ("--speculative-config", _json(speculative_config(config))),
            ("--api-key", config["vllm_serve_api_key"]),
        ),
        *(["--enforce-eager"] if config["vllm_enforce_eager"] else []),
        *(["--trust-remote-code"] if config["vllm_trust_remote_code"] else []),
        *config["vllm_serve_extra_args"],
    ]


VLLM_SERVE = ServerProfile(
    program="vllm serve",
    prefix="vllm_serve",
    build=lambda config, site: ServerLaunch(vllm_serve_command(config, site.host, site.port, site.base_dir)),
    served_model=vllm_serve_target,
    json_schema=True,
)
