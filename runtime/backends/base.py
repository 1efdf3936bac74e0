"""What every backend provides: a definition schema, live-load rules and an engine.

A ``BackendSpec`` is pure description and validation (constraints, overrides,
capabilities, VRAM estimate); ``create_engine`` builds the object that really
loads weights and generates.  An engine whose library is missing from this
process (vllm, exllamav3, ctranslate2 not installed) raises ``EngineUnavailable``
from its load, which ends the load in ``failed`` with that message.
"""
from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from runtime.backends.shared.overrides import TARGET_INFLIGHT, LoadOverride
from runtime.errors import InvalidLoadRequest
from runtime.pool.devices import check_device_field
from runtime.inputs.request import ForwardedRequest, GenerationRequest
from runtime.queue_terms import MAX_QUEUE_TIMEOUT_SECONDS
from runtime.pool.model_files import locate_model_file

Modality = Literal["text", "image", "audio"]
THINKING_ALL = ["default", "enabled", "disabled"]
THINKING_DEFAULT_ONLY = ["default"]
# The request fields an engine may honour beyond temperature and top_p (capabilities.sampling_options).
SAMPLING_OPTIONS = ("seed", "presence_penalty", "frequency_penalty", "logprobs", "top_k", "repeat_penalty")
# OpenAI's reasoning efforts and the thinking mode each one means (runtime.inference.admission maps them).
REASONING_EFFORT_THINKING = {
    "none": "disabled", "minimal": "disabled", "low": "enabled", "medium": "enabled", "high": "enabled",
    "xhigh": "enabled", "max": "enabled",
}
THINK_TAGS = ("<think>", "</think>")
# The kinds of tool_choice (capabilities.tool_choice): a named function is "function".
TOOL_CHOICES = ("none", "auto", "required", "function")
# request_timeout_seconds of a model in engine processes when its definition leaves it out: an
# engine stuck past it is killed (runtime.model.controller, ``timed_out``), so it must not be unbounded.
ENGINE_PROCESS_REQUEST_TIMEOUT_SECONDS = 600.0


class EngineUnavailable(RuntimeError):
    """The backend's engine cannot run in this process (not built, not installed)."""


class CommonDefinition(BaseModel):
    """Fields every model definition has, whatever its backend."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model_path: str | None = None
    # Where the model is placed (runtime.pool.memory): "auto" (null: the backend's default_device),
    # "cpu", "cuda:N", or a list of "cuda:N" for a tensor-parallel server.
    device: str | list[str] | None = None
    prompt_format: str | None = None
    enable_thinking: bool | None = None
    enabled: bool = False
    replicas: int = Field(1, ge=1, le=64)
    replica_max: int | None = Field(None, ge=1, le=64)
    target_inflight: int = Field(1, ge=1, le=4096)
    modalities: list[Modality] = Field(default_factory=lambda: ["text"])
    # The most seconds one request may hold a replica, from dispatch to its last token; when it
    # runs out the request ends with 504 request_timeout and the engine is cancelled.  Left out:
    # ENGINE_PROCESS_REQUEST_TIMEOUT_SECONDS with isolation "process", else null (no limit).
    request_timeout_seconds: float | None = Field(None, gt=0, le=86400)
    # "process": each replica's engine runs in an engine process of its own (runtime/engine_process),
    # so a native fault kills that process, not the runtime; "none": in the runtime's own process.
    isolation: Literal["process", "none"] = "none"
    # Switching by itself (docs/settings.md, "Models that switch by themselves"): a request for this
    # model while it is unloaded starts its load and waits for it, at most load_wait_timeout_seconds.
    load_on_request: bool = False
    load_wait_timeout_seconds: float = Field(600.0, gt=0, le=86400)
    # How long a request may wait for this model (its load and its queue) before it starts: past it,
    # 503 queue_deadline_exceeded, unstarted.  A request's X-LLMPool-Queue-Timeout header replaces
    # it.  null: no limit.
    queue_timeout_seconds: float | None = Field(None, gt=0, le=MAX_QUEUE_TIMEOUT_SECONDS)
    # Unload (gracefully) after this many seconds with nothing active or queued; null: never.
    ttl_seconds: int | None = Field(None, ge=1, le=31_536_000)
    # Never unloaded by its TTL or a swap group; only by an admin unload.
    pinned: bool = False
    # Come back (when its swap group is free again) after a swap took it away; see docs/settings.md.
    keep_warm: bool = False
    # Extra names clients may use for this model (unique across the catalog; runtime.config checks);
    # one with "*" is a pattern standing for every name it matches (runtime.pool.catalog.canonical_model).
    aliases: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9*][A-Za-z0-9._:+*-]{0,127}$")]] = Field(
        default_factory=list
    )
    # The tags around a thinking model's reasoning in its output (docs/settings.md, "Reasoning"):
    # null: the backend detects them (BackendSpec.reasoning_tags); []: never split; [start, end].
    reasoning_tags: list[Annotated[str, Field(min_length=1)]] | None = None

    @field_validator("device")
    @classmethod
    def _device(cls, value):
        return check_device_field(value)

    @model_validator(mode="after")
    def _replicas_within_max(self):
        if self.replica_max is None:
            self.replica_max = self.replicas
        if self.replicas > self.replica_max:
            raise ValueError(f"replicas ({self.replicas}) must not exceed replica_max ({self.replica_max})")
        if "text" not in self.modalities:
            self.modalities = ["text", *self.modalities]
        if self.reasoning_tags is not None and len(self.reasoning_tags) not in (0, 2):
            raise ValueError("reasoning_tags must be [] or [start, end]")
        return self

    @model_validator(mode="after")
    def _engine_process_request_timeout(self):
        if self.isolation == "process" and "request_timeout_seconds" not in self.model_fields_set:
            self.request_timeout_seconds = ENGINE_PROCESS_REQUEST_TIMEOUT_SECONDS
        return self


# ---- generation protocol -------------------------------------------------------------


@dataclass
class TextDelta:
    """Text the engine produced since its last event.  ``tokens``: how many tokens it holds;
    ``logprobs``: one entry per token (``{"token", "logprob", "bytes", "top_logprobs"}``, the
    chat completions shape) when the request asked for them."""

    text: str
    tokens: int = 1
    logprobs: list[dict] | None = None


@dataclass
class Finished:
    """The end of a generation.  ``cached_tokens``: how many of the ``input_tokens`` an engine
    that keeps its KV cache between requests reused instead of computing them (None: an engine
    that does not say).  ``draft_tokens``, ``accepted_tokens``: with speculative decoding, the
    draft tokens the model verified and how many of them it accepted (None: no speculation)."""

    input_tokens: int
    output_tokens: int
    finish_reason: Literal["stop", "length"] = "stop"
    cached_tokens: int | None = None
    draft_tokens: int | None = None
    accepted_tokens: int | None = None


class Engine(Protocol):
    """One loaded replica.  All methods run on the runtime's event loop."""

    async def load(self) -> None: ...

    async def unload(self) -> None: ...

    # A ForwardedRequest comes only to an engine whose spec forwards (BackendSpec.forwards_requests);
    # every other engine gets the typed GenerationRequest.
    def generate(self, request: GenerationRequest | ForwardedRequest) -> AsyncIterator[TextDelta | Finished]: ...

    # An engine of an embedding model (BackendSpec.embeddings) also has
    # ``async embed(inputs, *, dimensions=None) -> (vectors, prompt_tokens)``: see runtime.inference.embedding.
    # An engine of a speech-to-text model (BackendSpec.audio_transcription) has ``transcribe(request)``,
    # an async iterator of TranscriptSegment then Transcribed: see runtime.inference.transcription.
    # One of a reranking model (BackendSpec.rerank) has
    # ``async rerank(query, documents) -> (scores, prompt_tokens)``: see runtime.inference.rerank.


# ---- spec ----------------------------------------------------------------------------


class BackendSpec:
    """Description and validation rules of one backend (stateless, one instance each)."""

    name: ClassVar[str]
    definition_model: ClassVar[type[CommonDefinition]]
    # The load-body fields this backend accepts besides ``replicas`` and ``target_inflight``,
    # in the order load_constraints lists them: the one declaration of each override.
    overrides: ClassVar[tuple[LoadOverride, ...]] = ()
    # Backends that may run more than one request per replica; only they take target_inflight.
    concurrent: ClassVar[bool] = False
    # Whether a loaded model can sleep (runtime.model.residency: its engines' ``sleep``/``wake``).
    sleepable: ClassVar[bool] = False
    # Whether a reconfigure can build the new inference state before it frees the old one
    # (runtime.model.residency: its engines' ``reconfigure(config, overlap=True)``), where memory allows.
    make_before_break: ClassVar[bool] = False

    def context_length(self, config: dict[str, Any]) -> int | None:
        """The context size (tokens) an effective config gives a replica, where the backend knows it."""
        return None

    def can_sleep(self, definition: CommonDefinition) -> bool:
        """Whether a loaded model of ``definition`` can sleep: ``sleepable``, or what the definition
        says where the server must be started for it (vllm_serve's ``vllm_enable_sleep_mode``)."""
        return self.sleepable

    def sleeping_mib(self, definition: CommonDefinition, config: dict[str, Any], base_dir: str, awake_mib: int) -> int:
        """What one replica is expected to hold asleep, MiB, given the ``awake_mib`` it holds
        awake (runtime.pool.memory's relief before eviction; a measured figure replaces it after the
        sleep where the engine measures itself).  By default nothing is freed."""
        return awake_mib

    def reconfigurable_fields(self) -> frozenset[str]:
        """The overrides whose load_constraints entry says ``"reconfigurable": true``."""
        return frozenset(o.name for o in self.overrides if o.constraint.get("reconfigurable"))

    @property
    def override_fields(self) -> tuple[str, ...]:
        return tuple(override.name for override in self.overrides)

    def accepted_overrides(self) -> dict[str, LoadOverride]:
        """Every override a load body may carry for this backend, by name."""
        accepted = (TARGET_INFLIGHT, *self.overrides) if self.concurrent else self.overrides
        return {override.name: override for override in accepted}

    # -- what the admin API shows ------------------------------------------------------
    def load_constraints(self, definition: CommonDefinition) -> dict:
        return {name: dict(override.constraint) for name, override in self.accepted_overrides().items()}

    def load_recommendations(self, definition: CommonDefinition) -> dict:
        return {}

    def multi_turn(self, definition: CommonDefinition) -> bool:
        return True

    def thinking_modes(self, definition: CommonDefinition) -> list[str]:
        return list(THINKING_DEFAULT_ONLY)

    def response_formats(self, definition: CommonDefinition) -> list[str]:
        return ["text"]

    def file_inputs(self, definition: CommonDefinition) -> bool:
        return False

    def is_remote(self, definition: CommonDefinition) -> bool:
        return False

    def forwards_requests(self, definition: CommonDefinition) -> bool:
        """Whether the engine sends the client's own body (a ``ForwardedRequest``) as it is
        to an OpenAI-compatible upstream, which then judges every field llm-pool does not own."""
        return False

    def embeddings(self, definition: CommonDefinition) -> bool:
        """Whether the model answers POST /v1/embeddings: its definition's ``embeddings`` field,
        which only the backends that can embed declare (false everywhere else)."""
        return bool(getattr(definition, "embeddings", False))

    def generates(self, definition: CommonDefinition) -> bool:
        """Whether the model generates text (chat, responses, completions, messages); a
        speech-to-text model does not, and a generation asked of it is 400 before it is queued."""
        return True

    def audio_transcription(self, definition: CommonDefinition) -> bool:
        """Whether the model answers POST /v1/audio/transcriptions and /v1/audio/translations: a
        speech-to-text backend (whisper), or a managed server whose definition says its server
        serves the route (``audio_transcription``: the request is passed through)."""
        return bool(getattr(definition, "audio_transcription", False))

    def embedding_dimensions(self, definition: CommonDefinition) -> bool:
        """Whether an embedding request may ask for ``dimensions``: only where the upstream is
        sent it and judges it (a local engine answers vectors of the model's own size)."""
        return False

    def rerank(self, definition: CommonDefinition) -> bool:
        """Whether the model answers POST /v1/rerank: its definition's ``rerank`` field, which
        only the backends that can score (query, document) pairs declare (false everywhere else)."""
        return bool(getattr(definition, "rerank", False))

    def raw_prompt(self, definition: CommonDefinition) -> bool:
        """Whether the model takes a raw text prompt (``GenerationRequest.prompt``, POST
        /v1/completions): an engine that tokenizes it as it is, without a chat template, or one
        that forwards the client's body to an upstream (which then runs it)."""
        return self.forwards_requests(definition)

    def sampling_options(self, definition: CommonDefinition) -> list[str]:
        """Which of SAMPLING_OPTIONS the engine honours; a request that sets another is refused
        (400 naming the field) unless the engine forwards the client's body (its upstream then
        judges them all)."""
        return list(SAMPLING_OPTIONS) if self.forwards_requests(definition) else []

    def tools(self, definition: CommonDefinition) -> bool:
        """Whether the model takes ``tools`` (tool calling): its engine renders them and reads
        the calls out of the answer, or sends them to an upstream that does.  A request with
        tools and a tool_choice other than "none" for a model without them is 400
        tools_unsupported (unless the engine forwards the body: its upstream judges it)."""
        return False

    def tool_choices(self, definition: CommonDefinition) -> list[str]:
        """The kinds of ``tool_choice`` the model honours (of TOOL_CHOICES); "none" (the tools
        ignored) everywhere, all of them where it takes tools."""
        return list(TOOL_CHOICES) if self.tools(definition) else ["none"]

    def reasoning_tags(self, definition: CommonDefinition, base_dir: str) -> tuple[str, str] | None:
        """The (start, end) tags around the model's reasoning in its output, or None: the runtime
        splits the text between them off the answer (runtime.inference.reasoning).  The definition's
        ``reasoning_tags`` first; else ``<think>``/``</think>`` for the Qwen3 family."""
        if definition.reasoning_tags is not None:
            return tuple(definition.reasoning_tags) or None
        return THINK_TAGS if definition.prompt_format == "qwen3_template" else None

    def capabilities(self, definition: CommonDefinition) -> dict:
        thinking_modes = self.thinking_modes(definition)
        return {
            "modalities": list(definition.modalities),
            "file_inputs": self.file_inputs(definition),
            "multi_turn": self.multi_turn(definition),
            "raw_prompt": self.raw_prompt(definition),
            "thinking_modes": thinking_modes,
            "response_formats": self.response_formats(definition),
            "sampling_options": self.sampling_options(definition),
            "reasoning_efforts": [
                effort for effort, mode in REASONING_EFFORT_THINKING.items() if mode in thinking_modes
            ],
            "thinking_token_budget": None,
            "embeddings": self.embeddings(definition),
            "audio_transcription": self.audio_transcription(definition),
            "rerank": self.rerank(definition),
            "tools": self.tools(definition),
            "tool_choice": self.tool_choices(definition),
        }

    def effective_target_inflight(self, configured: int) -> int:
        return configured if self.concurrent else 1

    def prefix_cache_sequences(self, target_inflight: int) -> int:
        """How many conversations one replica's cache is taken to keep with ``target_inflight``
        slots (runtime.model.routing sends a conversation back to the replica that holds it); 0,
        the default: no prefix cache is known, requests go to the least loaded replica."""
        return 0

    # -- load overrides ----------------------------------------------------------------
    def validate_overrides(self, definition: CommonDefinition, overrides: dict[str, Any]) -> dict[str, Any]:
        """Check a schema-valid, sparse load body for this backend; raise InvalidLoadRequest (400).

        ``overrides`` holds only the keys the client sent (null included) and
        excludes ``replicas``.  Returns the overrides to keep as ``load_override``.
        """
        accepted = self.accepted_overrides()
        for key in overrides:
            if key not in accepted:
                raise InvalidLoadRequest(
                    f"{key} is not a load override of backend {self.name}", param=key
                )
        for key, value in overrides.items():
            if value is not None:
                accepted[key].check(value)
        self.check_override_combination(definition, overrides)
        return dict(overrides)

    def check_override_combination(self, definition: CommonDefinition, overrides: dict[str, Any]) -> None:
        """Backend rules that span several fields; raise InvalidLoadRequest."""

    # -- engine --------------------------------------------------------------------------
    def effective_config(self, definition: CommonDefinition, overrides: dict[str, Any]) -> dict[str, Any]:
        """The definition with the load override applied (key presence wins, null included)."""
        merged = definition.model_dump()
        merged.update(overrides)
        return merged

    def create_engine(self, model_name: str, config: dict[str, Any], replica_index: int, context: dict) -> Engine:
        """One replica's engine, not loaded yet; every backend builds its own."""
        raise NotImplementedError

    def warm_up(self) -> None:
        """Import what this backend's engine needs before any load (in a spare engine process).

        Nothing by default.  A library that is missing is not an error here: the load raises
        ``EngineUnavailable`` as it would have without the warm-up.
        """

    def default_device(self, definition: CommonDefinition) -> str:
        """Where a definition with ``device`` null is placed (runtime.pool.memory): a GPU when there is one."""
        return "auto"

    def vram_estimate(
        self, definition: CommonDefinition, config: dict[str, Any], replicas: int, base_dir: str
    ) -> tuple[int | None, str]:
        """(MiB for ``replicas`` replicas, source) before any load was measured."""
        return None, "unavailable"

    def estimate_parts(self, definition: CommonDefinition, config: dict[str, Any], base_dir: str) -> dict | None:
        """One replica's memory estimate in parts (runtime.pool.memory, the admin entry's
        ``memory.estimate_parts``): ``weights_mib``, ``kv_cache_mib``, ``compute_mib``,
        ``overhead_mib``, and ``device_fraction`` for a server that takes that share of its
        device whatever it needs.  None: the backend has only ``vram_estimate``'s total."""
        return None


def resolve_model_path(path: str | None, base_dir: str) -> str | None:
    """Where ``path`` points: absolute, relative to the settings folder, or ``package:`` (see
    runtime/pool/model_files.py); URLs and hub ids come back as given, an unknown package as None."""
    if path is None or "://" in path:
        return path
    return locate_model_file(path, base_dir)


def artifact_size_mib(path: str | None, base_dir: str) -> int | None:
    """Size of a model file or folder in MiB, or None when it cannot be read."""
    resolved = resolve_model_path(path, base_dir)
    if not resolved or not os.path.exists(resolved):
        return None
    if os.path.isfile(resolved):
        total = os.path.getsize(resolved)
    else:
        total = sum(
            os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(resolved) for name in names
        )
    return max(1, -(-total // (1024 * 1024)))

