"""Settings: the pydantic schemas, the settings.json + local.json merge, and the load body.

``load_settings(path)`` reads ``path`` and the ``local.json`` beside it,
deep-merges them (objects key by key, anything else replaces, a model or a swap
group set to ``null`` in local.json is removed) and validates the result.  Every problem is
reported as ``InvalidSettings`` naming the JSON path of each field.

A model's optional ``node`` (a node name or a list of them, docs/settings.md) says which runtime
workers serve it; ``load_settings(path, node=...)`` answers the catalog of that one node
(runtime.pool.nodes reads the field, before the backend's definition is validated, so every
backend has it alike).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from runtime.backends import BACKENDS
from runtime.backends.shared.adapters import adapter_id
from runtime.backends.shared.adapters import declared as declared_adapters
from runtime.backends.shared.overrides import TARGET_INFLIGHT, load_body_model
from runtime.errors import InvalidSettings, LoadBodyInvalid
from runtime.pool.nodes import for_node, node_problems, take_node_fields
from runtime.pool.devices import MemorySettings
from runtime.inputs.request import DecodingSettings
from runtime.key_terms import KeyTerms

MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:+-]{0,127}$")
API_KEY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}$")
HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")  # an HTTP token (RFC 9110)
# A browser's Origin header as it sends it (lower case, no path, no trailing slash), or "*".
CORS_ORIGIN = re.compile(r"^(\*|[a-z][a-z0-9+.-]*://([a-z0-9-]+(\.[a-z0-9-]+)*|\[[0-9a-f:.]+\])(:[0-9]{1,5})?)$")
DEFAULT_FAIRNESS_HEADER = "X-LLMPool-Fairness-Key"
# The code of a problem of one entry of service.api_keys (its path names the entry and the field).
API_KEY_INVALID = "api_key_invalid"
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ApiKey(KeyTerms):
    """One entry of ``service.api_keys``: a caller of the inference endpoints (``models_app/api/keys.py``).

    Only the key's sha256 is stored.  ``models`` is the list of models the key may use, or "*"
    for every model.  Its limits and queue terms are those a key of the database has
    (``runtime.key_terms``), read-only here.  The key's fairness bucket is ``fairness_key`` when
    set, else its ``name``; ``weight``, when set, is that bucket's fairness weight.
    """

    name: str = Field(pattern=API_KEY_NAME.pattern)
    key_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    models: list[str] | Literal["*"]

    @field_validator("models", mode="plain")
    @classmethod
    def _models(cls, value):
        # One message for the two shapes, instead of one per member of the union.
        if value == "*":
            return value
        if not isinstance(value, list) or not value:
            raise ValueError('must be "*" or a non-empty list of model names')
        for name in value:
            if not isinstance(name, str) or not MODEL_NAME.match(name):
                raise ValueError(f"model name {name!r} must match {MODEL_NAME.pattern}")
        return value

    @property
    def bucket(self) -> str:
        """The fairness key of every request made with this key."""
        return self.fairness_key if self.fairness_key is not None else self.name


def _cors_origin(origin: str) -> str:
    if not CORS_ORIGIN.match(origin):
        raise ValueError(
            f"{origin!r} is not an origin: scheme://host[:port] in lower case, without a path or a"
            ' trailing slash (such as "https://chat.example.com"), or "*"'
        )
    return origin


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
    # Who may use the inference endpoints; empty: anyone who reaches the port.
    api_keys: list[ApiKey] = Field(default_factory=list)
    # Where a request's fairness key comes from when no API key decides it (first present wins).
    fairness_key_headers: list[Annotated[str, Field(pattern=HEADER_NAME.pattern)]] = Field(
        default_factory=lambda: [DEFAULT_FAIRNESS_HEADER]
    )
    # POST /v1/messages: with no API key's bucket and no fairness header, the body's metadata.user_id
    # is the fairness key (Claude Code sends one per device and conversation).
    fairness_key_from_metadata: bool = False
    # The header a request may name its priority class in (interactive, default, batch), at most
    # its API key's class; null: the class is the key's alone (docs/scheduling.md).
    priority_header: str | None = Field(None, pattern=HEADER_NAME.pattern)
    # Ollama's API: a request's keep_alive sets how long its model stays loaded once idle (its TTL,
    # until the model unloads); off, keep_alive is ignored, so no client unloads or pins a model of
    # a shared pool (docs/api.md).
    ollama_keep_alive: bool = False
    # The browser origins that may call /v1 (CORS, models_app/api/cors.py); empty: CORS off.
    cors_allowed_origins: list[Annotated[str, AfterValidator(_cors_origin)]] = Field(default_factory=list)
    # GET /metrics: this token opens it to a scraper alone (the admin token opens it too).
    metrics_token: str | None = Field(None, min_length=1)
    # The runtime's ring of finished requests (GET /v1/admin/activity, the entries' stats).
    activity_requests: int = Field(1000, ge=1, le=100_000)
    # Keep each request's prompt and answer text in that ring (a privacy choice: off by default).
    capture_requests: bool = False
    # A stream whose client reads nothing for this long is ended and its request cancelled
    # (the HTTP server's write buffer is full: the engine slot is freed, not held by the client).
    stream_write_timeout_seconds: float = Field(60.0, gt=0, le=3600)
    # A request body that does not arrive in full within this long is answered 408 request_timeout.
    request_body_timeout_seconds: float = Field(60.0, gt=0, le=3600)
    # A connection's request head (request line and headers) must arrive in full within this long,
    # from the connection's start or the head's first byte (uvicorn; models_app/http/connections.py).
    http_head_timeout_seconds: float = Field(10.0, gt=0, le=3600)
    # An idle connection between requests is closed after this long; longer than the idle expiry
    # of the common clients (httpx and the openai SDK: 5 s), so none reuses one as it closes.
    http_keep_alive_timeout_seconds: float = Field(20.0, gt=0, le=3600)
    # POST /v1/audio/transcriptions and translations: the uploaded file's size at most (413 past it).
    # The file crosses the channel layer in one message (over Redis, one string: docs/settings.md).
    audio_max_upload_bytes: int = Field(25 * 1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    # Open connections at most (WebSockets included); the rest are answered 503 and closed.
    # null: half the process's file-descriptor limit, at most 1024.
    max_connections: int | None = Field(None, ge=1)


class FairnessSettings(_Strict):
    per_key_queue_limit: int = Field(64, ge=1)
    executor_queue_limit: int = Field(256, ge=1)
    default_weight: float = Field(1.0, gt=0)
    weights: dict[str, Annotated[float, Field(gt=0)]] = Field(default_factory=dict)
    reported_keys: int = Field(20, ge=1, le=1000)
    # A lower priority class passed over this many starts in a row while it waits gets the next
    # one (runtime.queue_terms.ClassTurns): the bound on its starvation.
    priority_starvation_limit: int = Field(8, ge=1, le=10_000)


class KvStoreSettings(_Strict):
    """``engine.kv_store``: the llama_cpp engine saves a replica's KV cache to the state folder when
    the model unloads, sleeps or shuts down, and restores it for a conversation that comes back
    (runtime.backends.llama_cpp.kv_store; docs/settings.md)."""

    enabled: bool = True
    max_mib: int = Field(4096, ge=0)  # the whole store; least recently used files go first
    max_model_mib: int = Field(1024, ge=0)  # the files of one model file and KV setting
    min_tokens: int = Field(256, ge=1)  # a shorter sequence is not worth a file


class RoutingSettings(_Strict):
    """``engine.routing``: which replica of a model a request goes to (runtime.model.routing;
    docs/scheduling.md).  ``prefix_affinity``: to the one whose cache holds the longest prefix of
    its conversation, within ``load_factor`` times the replicas' average load; off, to the least
    loaded."""

    prefix_affinity: bool = True
    load_factor: float = Field(1.25, ge=1.0, le=16.0)


class EngineSettings(_Strict):
    decoding: DecodingSettings = Field(default_factory=DecodingSettings)
    fairness: FairnessSettings = Field(default_factory=FairnessSettings)
    kv_store: KvStoreSettings = Field(default_factory=KvStoreSettings)
    routing: RoutingSettings = Field(default_factory=RoutingSettings)


ModelDefinition = Annotated[
    Union[tuple(spec.definition_model for spec in BACKENDS.values())],  # noqa: UP007
    Field(discriminator="backend"),
]


class GroupSettings(_Strict):
    """One swap group (``groups.<name>``): at most ``max_loaded`` of its members are loaded or
    loading at once; ``runtime.pool.groups`` enforces it and docs/settings.md states the rules."""

    members: list[str] = Field(min_length=1)
    max_loaded: int = Field(1, ge=1)
    # While another member waits for a slot, a busy member keeps its turn this long at most.
    max_turn_seconds: float = Field(60.0, gt=0, le=86400)


class Settings(_Strict):
    service: ServiceSettings = Field(default_factory=ServiceSettings)
    engine: EngineSettings = Field(default_factory=EngineSettings)
    models: dict[str, ModelDefinition] = Field(default_factory=dict)
    groups: dict[str, GroupSettings] = Field(default_factory=dict)
    # Device budgets and eviction (runtime.pool.memory; docs/settings.md, "Memory and devices").
    memory: MemorySettings = Field(default_factory=MemorySettings)

    @field_validator("groups", "models", mode="before")
    @classmethod
    def _entry_names(cls, value, info):
        if isinstance(value, dict):
            kind = "group" if info.field_name == "groups" else "model"
            for name in value:
                if not MODEL_NAME.match(name):
                    raise ValueError(f"{kind} name {name!r} must match {MODEL_NAME.pattern}")
        return value


@dataclass
class LoadedSettings:
    settings: Settings
    path: str
    base_dir: str
    # model name -> the files (settings.json, local.json) that declare it
    sources: dict[str, list[str]] = field(default_factory=dict)
    # The node these settings were read for (None: every model, whatever its ``node``).
    node: str | None = None
    # Every model of the file, this node's or not -> its ``node`` list (None: no ``node`` field).
    model_nodes: dict[str, list[str] | None] = field(default_factory=dict)


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
    except UnicodeDecodeError as exc:
        raise InvalidSettings(f"{path}: not UTF-8 (byte {exc.start}: {exc.reason})") from None
    except RecursionError:
        raise InvalidSettings(f"{path}: invalid JSON: nested too deeply") from None
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
        problem = {"path": json_path(item["loc"]), "message": message}
        if item["loc"][:2] == ("service", "api_keys"):  # a key's own fields: a script reads which key is at fault
            problem["code"] = API_KEY_INVALID
        problems.append(problem)
    return problems


def validate_settings(data: dict, *, path: str = "<settings>") -> Settings:
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        _raise_invalid(path, format_validation_error(exc), exc)
    problems = api_key_problems(settings) + alias_problems(settings) + group_problems(settings)
    if problems:
        _raise_invalid(path, problems)
    return settings


def _raise_invalid(path: str, problems: list[dict], cause: Exception | None = None):
    lines = "; ".join(f"{p['path']}: {p['message']}" for p in problems)
    raise InvalidSettings(f"{path}: {lines}", details=problems) from cause


def api_key_problems(settings: Settings) -> list[dict]:
    """What the schema cannot see in ``service.api_keys``: a name or a key declared twice, and a
    bucket's weight declared twice (by two keys, or by a key and ``engine.fairness.weights``)."""
    problems = []
    names: dict[str, int] = {}
    hashes: dict[str, int] = {}
    weights: dict[str, tuple[int, float]] = {}
    for index, key in enumerate(settings.service.api_keys):
        where = f"$.service.api_keys[{index}]"
        if key.name in names:
            message = f"the name {key.name!r} is used by api_keys[{names[key.name]}] too"
            problems.append({"path": f"{where}.name", "code": API_KEY_INVALID, "message": message})
        names.setdefault(key.name, index)
        if key.key_sha256 in hashes:
            message = f"the same key as api_keys[{hashes[key.key_sha256]}]"
            problems.append({"path": f"{where}.key_sha256", "code": API_KEY_INVALID, "message": message})
        hashes.setdefault(key.key_sha256, index)
        if key.weight is None:
            continue
        if key.bucket in settings.engine.fairness.weights:
            problems.append({
                "path": f"{where}.weight", "code": API_KEY_INVALID,
                "message": f"the fairness key {key.bucket!r} has a weight in engine.fairness.weights too",
            })
        elif key.bucket in weights and weights[key.bucket][1] != key.weight:
            problems.append({
                "path": f"{where}.weight", "code": API_KEY_INVALID,
                "message": f"the fairness key {key.bucket!r} has another weight in api_keys[{weights[key.bucket][0]}]",
            })
        weights.setdefault(key.bucket, (index, key.weight))
    return problems


def alias_problems(settings: Settings) -> list[dict]:
    """An alias, or an adapter's id (``<model>:<adapter>``) or alias, that is a model's name or
    that two models (or one model twice) declare: every name a client may give means one model."""
    problems = []
    owners: dict[str, str] = {}
    for name, definition in settings.models.items():
        names = [(f"$.models.{name}.aliases[{i}]", alias) for i, alias in enumerate(definition.aliases)]
        for adapter, declared in declared_adapters(definition).items():
            where = f"$.models.{name}.adapters.{adapter}"
            names += [(where, adapter_id(name, adapter))]
            names += [(f"{where}.aliases[{i}]", alias) for i, alias in enumerate(declared["aliases"])]
        for where, alias in names:
            if alias in settings.models:
                problems.append({"path": where, "message": f"{alias!r} is the name of a model"})
            elif alias in owners:
                problems.append({"path": where, "message": f"{alias!r} is an alias of {owners[alias]} already"})
            owners.setdefault(alias, name)
    return problems


def group_problems(settings: Settings) -> list[dict]:
    """Swap groups: members that are configured models, each in one group at most, and no more
    ``enabled`` members than the group may hold (start-up would swap its own preloads out)."""
    problems = []
    owners: dict[str, str] = {}
    for group, config in settings.groups.items():
        for index, member in enumerate(config.members):
            where = f"$.groups.{group}.members[{index}]"
            if member not in settings.models:
                problems.append({"path": where, "message": f"{member!r} is not a configured model"})
            elif member in owners:
                problems.append({"path": where, "message": f"{member!r} is a member of group {owners[member]} already"})
            owners.setdefault(member, group)
        enabled = [m for m in dict.fromkeys(config.members) if m in settings.models and settings.models[m].enabled]
        if len(enabled) > config.max_loaded:
            problems.append({
                "path": f"$.groups.{group}.max_loaded",
                "message": f"{len(enabled)} members are enabled ({', '.join(enabled)}) but max_loaded is "
                f"{config.max_loaded}",
            })
    return problems


def key_weights(service: ServiceSettings) -> dict[str, float]:
    """The fairness weight of each API key's bucket that sets one."""
    return {key.bucket: key.weight for key in service.api_keys if key.weight is not None}


def with_key_weights(fairness: FairnessSettings, weights: dict[str, float]) -> FairnessSettings:
    """``engine.fairness`` with the API keys' bucket weights among its ``weights``."""
    if not weights:
        return fairness
    return fairness.model_copy(update={"weights": {**fairness.weights, **weights}})


def local_path_for(settings_path: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(settings_path)), "local.json")


def load_settings(path: str, node: str | None = None) -> LoadedSettings:
    path = os.path.abspath(path)
    base = _read_json(path)
    local_path = local_path_for(path)
    overlay = _read_json(local_path) if os.path.exists(local_path) else {}
    merged = deep_merge(base, overlay)
    for section in ("models", "groups"):  # a model or group set to null in local.json is removed
        entries = merged.get(section)
        if isinstance(entries, dict):
            merged[section] = {name: value for name, value in entries.items() if value is not None}
    nodes, problems = take_node_fields(merged)
    if problems:
        _raise_invalid(path, problems)
    settings = validate_settings(merged, path=path)
    problems = node_problems(settings, nodes)
    if problems:
        _raise_invalid(path, problems)
    settings = for_node(settings, nodes, node)
    sources: dict[str, list[str]] = {}
    for name in settings.models:
        sources[name] = [
            os.path.basename(source)
            for source, data in ((path, base), (local_path, overlay))
            if isinstance(data.get("models"), dict) and data["models"].get(name) is not None
        ]
    return LoadedSettings(settings=settings, path=path, base_dir=os.path.dirname(path), sources=sources,
                          node=node, model_nodes=nodes)


# ---- the load body (schema level: 422) ----------------------------------------------------

# Derived from every backend's declared overrides (runtime/backends/shared/overrides.py).
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
