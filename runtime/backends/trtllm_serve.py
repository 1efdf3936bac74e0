"""trtllm_serve: a managed local ``trtllm-serve`` process group, one per replica.

At load, llm-pool reads ``trtllm_config_yaml``, merges the effective
``trtllm_*`` values and ``max_batch_size`` (= ``target_inflight``) into a
temporary YAML and passes it through ``--config``; the extra args therefore
may set neither the batch size nor the config file, and the base YAML may not
set ``max_batch_size`` (a load that finds it there fails).  The temporary YAML
lives under ``<state_dir>/tmp`` and is removed when the replica stops.

trtllm-serve has no API-key flag: ``trtllm_serve_api_key`` is only sent as the
bearer token of llm-pool's requests (for a wrapper or proxy that checks it).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, model_validator

from runtime.backends.base import BackendSpec, resolve_model_path
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
from runtime.backends.managed import (
    LaunchSite,
    ManagedServerEngine,
    ServerLaunch,
    ServerProfile,
    flag_args,
    model_target,
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

    def create_engine(self, model_name, config, replica_index, context):
        return ManagedServerEngine(TRTLLM_SERVE, model_name, config, replica_index, context)


def trtllm_serve_target(config: dict[str, Any], base_dir: str) -> str:
    """What trtllm-serve loads (and the model name its API answers to)."""
    return model_target(config["trtllm_serve_model"] or config["model_path"], base_dir)


def trtllm_config(config: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """The base LLM API YAML merged with the effective values; raise ValueError on max_batch_size."""
    if "max_batch_size" in base:
        raise ValueError("trtllm_config_yaml must not set max_batch_size; target_inflight owns it")
    merged = {**base, "max_batch_size": config["target_inflight"]}
    for key in ("max_seq_len", "max_num_tokens"):
        if config[f"trtllm_{key}"] is not None:
            merged[key] = config[f"trtllm_{key}"]
    merged["enable_chunked_prefill"] = config["trtllm_enable_chunked_prefill"]
    kv_cache = dict(base.get("kv_cache_config") or {})
    for key, field in (
        ("max_gpu_total_bytes", "trtllm_kv_cache_memory_bytes"),
        ("dtype", "trtllm_kv_cache_dtype"),
        ("free_gpu_memory_fraction", "trtllm_free_gpu_memory_fraction"),
    ):
        if config[field] is not None:
            kv_cache[key] = config[field]
    if kv_cache:
        merged["kv_cache_config"] = kv_cache
    return merged


def read_base_yaml(config: dict[str, Any], base_dir: str) -> dict[str, Any]:
    path = resolve_model_path(config["trtllm_config_yaml"], base_dir)
    if path is None:
        return {}
    with open(path, encoding="utf-8") as source:
        base = yaml.safe_load(source)
    if base is None:
        return {}
    if not isinstance(base, dict):
        raise ValueError(f"trtllm_config_yaml {path} must hold a mapping")
    return base


def trtllm_serve_command(config: dict[str, Any], host: str, port: int, base_dir: str, yaml_path: Path) -> list[str]:
    """The exact trtllm-serve argv for one replica of ``config``, reading its LLM API YAML from ``yaml_path``."""
    return [
        config["trtllm_serve_binary"],
        trtllm_serve_target(config, base_dir),
        "--host", host,
        "--port", str(port),
        "--config", str(yaml_path),
        *flag_args(
            ("--reasoning_parser", config["trtllm_reasoning_parser"]),
            ("--tool_parser", config["trtllm_tool_parser"]),
        ),
        *config["trtllm_serve_extra_args"],
    ]


def _launch(config: dict[str, Any], site: LaunchSite) -> ServerLaunch:
    merged = trtllm_config(config, read_base_yaml(config, site.base_dir))
    handle, name = tempfile.mkstemp(prefix=f"{site.stem}.", suffix=".yaml", dir=site.scratch_dir)
    with os.fdopen(handle, "w", encoding="utf-8") as target:
        yaml.safe_dump(merged, target, sort_keys=False)
    path = Path(name)
    return ServerLaunch(trtllm_serve_command(config, site.host, site.port, site.base_dir, path), (path,))


TRTLLM_SERVE = ServerProfile(
    program="trtllm-serve",
    prefix="trtllm_serve",
    build=_launch,
    served_model=trtllm_serve_target,
)
