"""trtllm_serve: a managed local ``trtllm-serve`` process group, one per replica.

At load, llm-pool reads ``trtllm_config_yaml``, merges the effective
``trtllm_*`` values and ``max_batch_size`` (= ``target_inflight``) into a
temporary YAML and passes it through ``--config``; the extra args therefore
may set neither the batch size nor the config file, and the base YAML may not
set ``max_batch_size`` (a load that finds it there fails).  The temporary YAML
lives under ``<state_dir>/tmp`` and is removed when the replica stops.

``trtllm_serve_model`` (else ``model_path``) is a hub id, a checkpoint or an
engine folder.  trtllm-serve has no API-key flag: ``trtllm_serve_api_key`` is
only sent as the bearer token of llm-pool's requests (for a wrapper or proxy
that checks it).  ``trtllm_tool_parser`` (``--tool_parser``, which the extra args may not
set) starts the server for tool calling: trtllm-serve then parses its model's calls.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field

import runtime.backends.shared.managed as managed
import runtime.backends.shared.server_spec as server_spec
from runtime.backends.base import resolve_model_path
from runtime.backends.shared.common_fields import GEMMA4, FamilyDefinition, server_parts
from runtime.backends.shared.overrides import MIB_256, LoadOverride, integer_override

TRTLLM_CACHE_DTYPES = ["auto", "fp8", "nvfp4"]


class TrtllmServeDefinition(
    server_spec.server_fields(
        FamilyDefinition,
        "trtllm_serve",
        binary="trtllm-serve",
        startup_timeout_seconds=1800.0,
        owned_flags={
            "target_inflight": ("--max-batch-size",),
            "trtllm_config_yaml": ("--config", "--extra-llm-api-options"),
            "trtllm_tool_parser": ("--tool_parser",),
        },
    )
):
    # Base LLM API YAML; it is read, never written, and may not set max_batch_size.
    trtllm_config_yaml: str | None = None
    trtllm_reasoning_parser: str | None = None
    # Tool calling: trtllm-serve's parser of the model's call format (qwen3, qwen3_coder,
    # kimi_k2, deepseek_v3, deepseek_v31, deepseek_v32, glm4, ...: click checks the name).
    trtllm_tool_parser: str | None = None
    trtllm_max_seq_len: int | None = Field(None, ge=1)
    trtllm_max_num_tokens: int | None = Field(None, ge=1)
    # kv_cache_config.max_gpu_total_bytes
    trtllm_kv_cache_memory_bytes: int | None = Field(None, ge=1)
    trtllm_kv_cache_dtype: Literal["auto", "fp8", "nvfp4"] | None = None
    trtllm_enable_chunked_prefill: bool = False
    # kv_cache_config.free_gpu_memory_fraction: a safety ceiling when the byte budget should decide.
    trtllm_free_gpu_memory_fraction: float | None = Field(None, gt=0, le=1)


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
    options = [
        "--config", str(yaml_path),
        *server_spec.flag_args(
            ("--reasoning_parser", config["trtllm_reasoning_parser"]),
            ("--tool_parser", config["trtllm_tool_parser"]),
        ),
    ]
    model_args = [managed.server_target(config, "trtllm_serve", base_dir)]
    return server_spec.server_argv(config, "trtllm_serve", host, port, model_args, options)


def _launch(config: dict[str, Any], site: managed.LaunchSite) -> managed.ServerLaunch:
    merged = trtllm_config(config, read_base_yaml(config, site.base_dir))
    handle, name = tempfile.mkstemp(prefix=f"{site.stem}.", suffix=".yaml", dir=site.scratch_dir)
    with os.fdopen(handle, "w", encoding="utf-8") as target:
        yaml.safe_dump(merged, target, sort_keys=False)
    path = Path(name)
    return managed.ServerLaunch(trtllm_serve_command(config, site.host, site.port, site.base_dir, path), (path,))


TRTLLM_SERVE = managed.ServerProfile(
    program="trtllm-serve",
    prefix="trtllm_serve",
    build=_launch,
)


class TrtllmServeSpec(server_spec.ManagedServerSpec):
    profile = TRTLLM_SERVE
    definition_model = TrtllmServeDefinition

    def estimate_parts(self, definition, config, base_dir):
        """With ``trtllm_kv_cache_memory_bytes``: the checkpoint plus that KV budget."""
        paths = (definition.trtllm_serve_model, definition.model_path)
        return server_parts(base_dir, paths, kv_cache_bytes=config.get("trtllm_kv_cache_memory_bytes"))
    thinking_families = (GEMMA4,)
    tools_field = "trtllm_tool_parser"
    overrides = (
        integer_override("trtllm_max_seq_len", 256, 256),
        integer_override("trtllm_kv_cache_memory_bytes", MIB_256, MIB_256, unit="bytes", display_unit="mib"),
        integer_override("trtllm_max_num_tokens", 256, 256),
        LoadOverride("trtllm_enable_chunked_prefill", bool, {"kind": "boolean", "default": False}),
        LoadOverride(
            "trtllm_kv_cache_dtype",
            str,
            {
                "kind": "enum",
                "default": "auto",
                "allowed_values": list(TRTLLM_CACHE_DTYPES),
                "examples": list(TRTLLM_CACHE_DTYPES),
            },
        ),
    )
