"""Helpers the backend definitions share: model-family prompt formats, extra-args rules, estimates.

Managed-server backends (llama_server, vllm_serve, trtllm_serve, sglang_serve)
pass some flags themselves because a load field owns them (``target_inflight``
becomes ``--parallel``, ``--max-num-seqs``...); ``check_extra_args`` keeps an
operator's extra CLI args from setting those flags a second time.
"""
from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from runtime.backends.base import THINKING_ALL, THINKING_DEFAULT_ONLY, CommonDefinition, artifact_size_mib

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
