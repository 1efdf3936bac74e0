"""Helpers the backend definitions share: model-family prompt formats, extra-args rules, estimates.

Managed-server backends (llama_server, vllm_serve, trtllm_serve, sglang_serve)
pass some flags themselves because a load field owns them (``target_inflight``
becomes ``--parallel``, ``--max-num-seqs``...); ``check_extra_args`` keeps an
operator's extra CLI args from setting those flags a second time.
"""
from __future__ import annotations

import json
import math
import os
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from runtime.backends.base import (
    THINKING_ALL,
    THINKING_DEFAULT_ONLY,
    CommonDefinition,
    artifact_size_mib,
    resolve_model_path,
)

# prompt_format values that name a model family; backends that template chats
# themselves use them only to decide which thinking controls are safe.
FAMILY_PROMPT_FORMATS = ("generic", "mistral_template", "qwen3_template", "gemma4_template")
GEMMA4 = "gemma4_template"
QWEN3 = "qwen3_template"

Port = Annotated[int, Field(ge=1, le=65535)]
NonEmptyStr = Annotated[str, Field(min_length=1)]


class FamilyDefinition(CommonDefinition):
    """A definition whose ``prompt_format`` only names the model family."""

    @field_validator("prompt_format")
    @classmethod
    def _known_family(cls, value: str | None) -> str | None:
        if value is not None and value not in FAMILY_PROMPT_FORMATS:
            raise ValueError(f"prompt_format must be one of {', '.join(FAMILY_PROMPT_FORMATS)}")
        return value


class LibraryFields(CommonDefinition):
    """A model a Python library loads (ct2, exllamav3, vllm, whisper): ``model_path`` names it, and
    it runs in an engine process by default, so a native fault kills that process only."""

    isolation: Literal["process", "none"] = "process"  # a native fault kills the engine process only

    @model_validator(mode="after")
    def _has_model(self):
        require_model_target(self)
        return self


def _flag_name(arg: str) -> str:
    """The flag an argument sets, with long-flag underscores read as dashes (``--a_b=1`` -> ``--a-b``)."""
    name = arg.split("=", 1)[0]
    return name.replace("_", "-") if name.startswith("--") else name


def check_extra_args(field: str, args: list[str], forbidden: tuple[str, ...], owner: str) -> None:
    """Raise ValueError when ``args`` set one of the ``forbidden`` flags (``owner`` sets it instead)."""
    forbidden_names = {_flag_name(flag) for flag in forbidden}
    for arg in args:
        if _flag_name(arg) in forbidden_names:
            raise ValueError(f"{field} must not set {arg.split('=', 1)[0]}; {owner} owns it")


def require_model_target(definition: CommonDefinition, target_field: str | None = None) -> None:
    """Raise ValueError unless ``model_path`` (or the backend's own target field) names the model."""
    target = getattr(definition, target_field) if target_field else None
    if definition.model_path is None and target is None:
        where = f"model_path or {target_field}" if target_field else "model_path"
        raise ValueError(f"{where} must name the model to load")


def refuse_engine_process(definition: CommonDefinition, where_it_runs: str) -> None:
    """Raise ValueError for ``isolation: "process"`` on a backend whose model runs outside the runtime already."""
    if definition.isolation == "process":
        raise ValueError(
            f'isolation "process" does not apply to {definition.backend}: {where_it_runs}; '
            'leave isolation out or set it to "none"'
        )


def refuse_embeddings_with_rerank(definition: CommonDefinition) -> None:
    """Raise ValueError for ``embeddings`` and ``rerank`` both true on a llama.cpp model: one
    context pools one way, and a reranker's rank pooling yields a score, not a vector."""
    if getattr(definition, "embeddings", False) and getattr(definition, "rerank", False):
        raise ValueError(
            "embeddings and rerank must not both be true: llama.cpp pools a context one way "
            "(rank pooling answers a relevance score, not a vector); declare two models of the file"
        )


def thinking_for_families(definition: CommonDefinition, families: tuple[str, ...]) -> list[str]:
    """All thinking modes for the listed prompt-format families, only ``default`` otherwise."""
    return list(THINKING_ALL) if definition.prompt_format in families else list(THINKING_DEFAULT_ONLY)


def artifact_estimate(base_dir: str, replicas: int, *paths: str | None) -> tuple[int | None, str]:
    """VRAM estimate from the first local model artifact among ``paths``, or unavailable (hub ids, missing)."""
    for path in paths:
        size = artifact_size_mib(path, base_dir)
        if size is not None:
            return size * replicas, "model_artifact_size"
    return None, "unavailable"


# A margin for a server's compute buffers over its weights and KV cache (not measured on a GPU yet).
SERVER_COMPUTE_MARGIN = 0.05


def server_parts(base_dir: str, paths: tuple[str | None, ...], *, kv_cache_bytes: int | None = None,
                 device_fraction: float | None = None) -> dict | None:
    """A GPU server's estimate parts (``BackendSpec.estimate_parts``): the local artifact's size
    as its weights with a configured KV budget, or the share of the device it takes
    (``device_fraction``: counted of the device's total by runtime.pool.memory); None when neither
    applies (the artifact total of ``vram_estimate`` counts then)."""
    weights = next((size for size in (artifact_size_mib(path, base_dir) for path in paths) if size is not None), None)
    if device_fraction is not None:
        return {"weights_mib": weights or 0, "kv_cache_mib": 0, "compute_mib": 0, "overhead_mib": 0,
                "device_fraction": device_fraction}
    if kv_cache_bytes is None or weights is None:
        return None
    kv = -(-kv_cache_bytes // (1024 * 1024))
    return {"weights_mib": weights, "kv_cache_mib": kv,
            "compute_mib": math.ceil((weights + kv) * SERVER_COMPUTE_MARGIN), "overhead_mib": 0}


def hf_kv_bytes_per_token(base_dir: str, path: str | None, dtype_bytes: int = 2) -> int | None:
    """K and V bytes per token of a local Hugging Face checkpoint (its config.json: layers × KV
    heads × head dim × 2 × ``dtype_bytes``), or None when it cannot be read."""
    resolved = resolve_model_path(path, base_dir)
    if not resolved or not os.path.isdir(resolved):
        return None
    try:
        with open(os.path.join(resolved, "config.json"), encoding="utf-8") as handle:
            config = json.load(handle)
        config = config.get("text_config", config)
        layers = int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None
    return layers * kv_heads * head_dim * 2 * dtype_bytes

