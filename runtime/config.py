"""Settings: the pydantic schemas, the settings.json + local.json merge, and the load body.

``load_settings(path)`` reads ``path`` and the ``local.json`` beside it,
deep-merges them (objects key by key, anything else replaces, a model set to
``null`` in local.json is removed) and validates the result.  Every problem is
reported as ``InvalidSettings`` naming the JSON path of each field.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from runtime.backends import BACKENDS
from runtime.backends.overrides import TARGET_INFLIGHT, load_body_model
from runtime.errors import InvalidSettings, LoadBodyInvalid
from runtime.request import DecodingSettings

MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:+-]{0,127}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ServiceSettings(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=1, le=65535)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    admin_token: str | None = Field(None, min_length=1)
    # How long the API waits for any message from the runtime before answering 503 runtime_unavailable.
    runtime_reply_timeout_seconds: float = Field(2.0, gt=0, le=600)
    # Upper bound on one admin load / unload call; the runtime keeps working after it passes.
    admin_call_timeout_seconds: float = Field(3600.0, gt=0)
    # Remote models (openai_remote) send prompts off this machine: opt in explicitly.
    allow_remote_execution: bool = False
    # Which models GET /v1/models lists: every configured one, or only those loaded now.
    list_models: Literal["all", "loaded"] = "all"


class FairnessSettings(_Strict):
    per_key_queue_limit: int = Field(64, ge=1)
    executor_queue_limit: int = Field(256, ge=1)
    default_weight: float = Field(1.0, gt=0)
    weights: dict[str, Annotated[float, Field(gt=0)]] = Field(default_factory=dict)
    reported_keys: int = Field(20, ge=1, le=1000)


class EngineSettings(_Strict):
    decoding: DecodingSettings = Field(default_factory=DecodingSettings)
    fairness: FairnessSettings = Field(default_factory=FairnessSettings)


ModelDefinition = Annotated[
    Union[tuple(spec.definition_model for spec in BACKENDS.values())],  # noqa: UP007
    Field(discriminator="backend"),
]


class Settings(_Strict):
    service: ServiceSettings = Field(default_factory=ServiceSettings)
    engine: EngineSettings = Field(default_factory=EngineSettings)
    models: dict[str, ModelDefinition] = Field(default_factory=dict)

    @field_validator("models", mode="before")
    @classmethod
    def _model_names(cls, value):
        if isinstance(value, dict):
            for name in value:
                if not MODEL_NAME.match(name):
                    raise ValueError(f"model name {name!r} must match {MODEL_NAME.pattern}")
        return value


@dataclass
class LoadedSettings:
    settings: Settings
    path: str
    base_dir: str
    # model name -> the files (settings.json, local.json) that declare it
    sources: dict[str, list[str]] = field(default_factory=dict)


def deep_merge(base: Any, overlay: Any) -> Any:
    """Objects merge key by key; anything else in ``overlay`` replaces ``base``."""
    if isinstance(base, dict) and isinstance(overlay, dict):
        merged = dict(base)
        for key, value in overlay.items():
            merged[key] = deep_merge(base[key], value) if key in base else value
        return merged
    return overlay


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except json.JSONDecodeError as exc:
        raise InvalidSettings(f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from exc
    except OSError as exc:
        raise InvalidSettings(f"{path}: cannot be read: {exc.strerror}") from exc
    if not isinstance(data, dict):
        raise InvalidSettings(f"{path}: the top level must be a JSON object")
    return data


def json_path(loc: tuple) -> str:
    """pydantic error location -> JSON path, without the discriminator tag of a model."""
    parts = list(loc)
    if len(parts) >= 3 and parts[0] == "models" and parts[2] in BACKENDS:
        del parts[2]
    path = "$"
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def format_validation_error(error: ValidationError) -> list[dict]:
    problems = []
    for item in error.errors():
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            message = "unknown field"
        elif item["type"] == "union_tag_invalid":
            message = f"unknown backend; expected one of {', '.join(BACKENDS)}"
        elif item["type"] == "union_tag_not_found":
            message = "missing field 'backend'"
        problems.append({"path": json_path(item["loc"]), "message": message})
    return problems


def validate_settings(data: dict, *, path: str = "<settings>") -> Settings:
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        problems = format_validation_error(exc)
        lines = "; ".join(f"{p['path']}: {p['message']}" for p in problems)
        raise InvalidSettings(f"{path}: {lines}", details=problems) from exc


def local_path_for(settings_path: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(settings_path)), "local.json")


def load_settings(path: str) -> LoadedSettings:
    path = os.path.abspath(path)
    base = _read_json(path)
    local_path = local_path_for(path)
    overlay = _read_json(local_path) if os.path.exists(local_path) else {}
    merged = deep_merge(base, overlay)
    models = merged.get("models")
    if isinstance(models, dict):
        merged["models"] = {name: value for name, value in models.items() if value is not None}
    settings = validate_settings(merged, path=path)
    sources: dict[str, list[str]] = {}
    for name in settings.models:
        sources[name] = [
            os.path.basename(source)
            for source, data in ((path, base), (local_path, overlay))
            if isinstance(data.get("models"), dict) and data["models"].get(name) is not None
        ]
    return LoadedSettings(settings=settings, path=path, base_dir=os.path.dirname(path), sources=sources)


# ---- the load body (schema level: 422) ----------------------------------------------------

# Derived from every backend's declared overrides (runtime/backends/overrides.py).
LoadBody = load_body_model([TARGET_INFLIGHT, *(override for spec in BACKENDS.values() for override in spec.overrides)])
_LOAD_BODY = TypeAdapter(LoadBody)


def parse_load_body(data: Any) -> dict[str, Any]:
    """Validate a load body; return only the keys the client sent (null included)."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise LoadBodyInvalid("the load body must be a JSON object")
    try:
        body = _LOAD_BODY.validate_python(data)
    except ValidationError as exc:
        problems = format_validation_error(exc)
        first = problems[0]
        raise LoadBodyInvalid(
            "; ".join(f"{p['path']}: {p['message']}" for p in problems),
            param=first["path"].removeprefix("$."),
            details=problems,
        ) from exc
    return body.model_dump(exclude_unset=True)
