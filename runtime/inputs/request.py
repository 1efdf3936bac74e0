"""One typed inference request, from the protocol parser at the edge to the engine.

Each API protocol's parser (``models_app/api/<protocol>/protocol.py``) builds a
``GenerationRequest`` from its body; it crosses the channel layer as ``to_wire()`` and
the runtime rebuilds it with ``from_wire``.
Sampling fields the client left out stay ``None`` until the runtime applies the
service's decoding defaults (``resolved``, with ``DecodingSettings``: the settings'
``engine.decoding``), so an engine always gets concrete values.  The events a
generate operation streams are named here too.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from runtime.inputs.chat_messages import typed_chat_messages
from runtime.queue_terms import DEFAULT_PRIORITY

# What a generate operation emits while it runs (its result ends it).
GENERATE_ADMITTED = "admitted"  # queued: the API may answer a stream's headers now
# {"event": "waiting", "model": ...}: the request waits for its model to load (load_on_request); a
# stream may open now (errors from here on come as its error event) and tell the client it waits.
GENERATE_WAITING = "waiting"
GENERATE_DELTA = "delta"  # {"event": "delta", "text": ..., "logprobs": [...] when asked}
# {"event": "tool_call", "index": n, "call": {"id", "name", "arguments"}}: one complete call of the answer
GENERATE_TOOL_CALL = "tool_call"
GENERATE_REASONING = "reasoning"  # {"event": "reasoning", "text": ...}: the model's reasoning, not its answer
# {"event": "upstream", "chunk": {...}}: a forwarded stream's chunk, the upstream's JSON as it wrote
# it (see GenerationRequest.passthrough); a forwarded request that does not stream has its
# upstream's answer in the result's "upstream".
GENERATE_UPSTREAM = "upstream"

THINKING_DEFAULT = "default"


class DecodingSettings(BaseModel):
    """``engine.decoding`` in the settings: what a request that leaves a sampling field out gets."""

    model_config = ConfigDict(extra="forbid", strict=True)

    temperature: float = Field(0.7, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    max_output_tokens: int = Field(512, ge=1)


@dataclass
class GenerationRequest:
    """One inference request.

    ``messages`` are ``{"role", "content": [parts]}`` with parts in the Responses API's
    input shape (``{"type": "input_text", "text"}``, ``input_image``, ``input_file``,
    ``input_audio``); an assistant message may carry ``tool_calls`` (``[{"id", "name",
    "arguments": JSON text}]``) and a ``"tool"`` message (a call's result, its text in
    ``content``) its ``tool_call_id``.  ``tools`` are chat completions' tool objects
    (``{"type": "function", "function": {"name", "description", "parameters", "strict"}}``)
    whichever protocol sent them, ``tool_choice`` "none", "auto", "required" or
    ``{"type": "function", "function": {"name"}}`` (None: "auto"), and
    ``parallel_tool_calls`` False keeps the answer to one call.  ``None`` in a sampling
    field means "the service's default".
    ``stop``, ``seed``, ``tools`` and ``tool_choice`` are carried for the protocols that
    have them; an engine that cannot honour one is refused before it is queued.  ``seed``,
    the penalties and ``logprobs`` need the backend's ``capabilities.sampling_options``.
    ``reasoning_effort`` (an OpenAI effort name) becomes ``thinking`` where the model has
    thinking modes; the parser leaves it None when the client chose ``thinking`` itself.

    ``prompt`` is a raw text prompt (POST /v1/completions): ``messages`` is then empty and
    only an engine that runs raw prompts takes it.  ``passthrough`` is the client's own body
    and the upstream path it was sent to (``{"path": "/v1/chat/completions", "body": {...}}``;
    ``"messages_from_body": true`` when ``messages`` are ``runtime.inputs.chat_messages`` of the body's),
    which an engine that forwards to an OpenAI-compatible server (the managed servers,
    openai_remote) sends on as it is, model name rewritten.  ``refused`` lists what the typed
    path cannot honour, as error dicts (``code``, ``message``, ``param``): the parser records
    them instead of raising, because only the runtime knows whether the model's engine
    forwards the body (then the upstream judges those fields) or runs it itself (then the
    first one is the request's 400).
    """

    request_id: str
    messages: list[dict]
    model: str = ""
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    thinking: str | None = None
    response_format: dict | None = None
    metadata: dict = field(default_factory=dict)
    fairness_key: str | None = None
    extra: dict = field(default_factory=dict)  # backend-specific request fields (TranslateGemma codes)
    stream: bool = False  # the client reads deltas as they come (engines that proxy an upstream ask it alike)
    stop: list[str] | None = None
    seed: int | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logprobs: int | None = None  # top alternatives per token wanted (0: the chosen token's only); None: none
    reasoning_effort: str | None = None  # mapped onto ``thinking`` by the runtime (runtime.inference.admission)
    prompt: str | None = None
    # How long the model stays loaded once idle, from this request on (Ollama's keep_alive, where
    # service.ollama_keep_alive lets clients say it): seconds, a negative value for no TTL; None: as
    # its definition says.
    keep_alive_seconds: float | None = None
    # How the request queues for its model, as the edge decided it from the caller's key and headers
    # (models_app.api.keys): its priority class, and the seconds it may wait before it starts (None:
    # its model's queue_timeout_seconds).
    priority: str = DEFAULT_PRIORITY
    queue_timeout_seconds: float | None = None
    passthrough: dict | None = None
    refused: list[dict] = field(default_factory=list)

    def resolved(self, decoding: DecodingSettings | None = None) -> GenerationRequest:
        """A copy with every unset sampling field given the service's default: ``decoding``
        (``engine.decoding`` of the settings), or the settings' own defaults."""
        decoding = decoding if decoding is not None else DecodingSettings()

        def pick(value, default):
            return default if value is None else value

        return dataclasses.replace(
            self,
            max_output_tokens=pick(self.max_output_tokens, decoding.max_output_tokens),
            temperature=pick(self.temperature, decoding.temperature),
            top_p=pick(self.top_p, decoding.top_p),
            thinking=pick(self.thinking, THINKING_DEFAULT),
        )

    def to_wire(self) -> dict[str, Any]:
        """The request as a plain dict (msgpack- and JSON-safe) for the channel layer.

        Shallow: its values are the request's own lists and dicts (every field is a plain value),
        which the channel layer packs anyway; ``dataclasses.asdict`` deep-copied them first, which
        cost more than the rest of building the message for a long conversation.  A chat request
        whose messages are built from the client's body (``passthrough["messages_from_body"]``)
        leaves them out: ``from_wire`` builds them again from the body, so the conversation
        crosses the channel layer once."""
        wire = {name: getattr(self, name) for name in _FIELD_NAMES}
        if _messages_from_body(self.passthrough):
            del wire["messages"]
        return wire

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> GenerationRequest:
        """Rebuild a request from ``to_wire``'s dict; keys this version does not know are dropped."""
        fields = {key: value for key, value in data.items() if key in _KNOWN_FIELDS}
        if "messages" not in fields and _messages_from_body(fields.get("passthrough")):
            fields["messages"] = wire_messages(data)
        return cls(**fields)

    def last_user_text(self) -> str:
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return "".join(p.get("text", "") for p in message["content"] if p.get("type") == "input_text")
        return ""


_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(GenerationRequest))
_KNOWN_FIELDS = frozenset(_FIELD_NAMES)


def _messages_from_body(passthrough: dict | None) -> bool:
    return passthrough is not None and passthrough.get("messages_from_body") is True


def wire_messages(data: dict[str, Any]) -> list[dict]:
    """The typed messages of ``to_wire``'s dict, built from the client's body where it left them
    out (what reads the wire form without ``from_wire``, such as the activity's capture, needs this)."""
    if "messages" in data or not _messages_from_body(data.get("passthrough")):
        return data.get("messages") or []
    return typed_chat_messages(data["passthrough"]["body"]["messages"])
