"""What engines are handed: a typed inference request, or a client's body to forward.

Two kinds of request cross from the protocol parsers at the edge to the engines:

- ``GenerationRequest``, the typed request: what every protocol's parser builds and what a
  native engine runs.
- ``ForwardedRequest``, a client's OpenAI body (chat completions, completions) with the typed
  request parsed from it: an engine that forwards to an OpenAI-compatible server (the managed
  servers, openai_remote: ``BackendSpec.forwards_requests``) sends the body on as it is; any
  other engine runs its typed request.  Only the runtime knows which engine a model has, so
  the parser records what the typed request cannot honour (``typed_refusals``) and the
  runtime raises the first of them where the typed request is what runs
  (``runtime.inference.admission.check_request``).

Both cross the channel layer as ``to_wire()``; the runtime rebuilds either with
``request_from_wire``.  Sampling fields the client left out stay ``None`` until the runtime
applies the service's decoding defaults (``resolved``, with ``DecodingSettings``: the
settings' ``engine.decoding``), so an engine always gets concrete values.  The events a
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
# it (see ForwardedRequest); a forwarded request that does not stream has its upstream's answer in
# the result's "upstream".
GENERATE_UPSTREAM = "upstream"
# {"event": "cancelled", "usage": {"input_tokens", "output_tokens"}}: a generate's last message once
# its caller left before the answer (a stream closed early, a connection dropped): what it used
# until then (the prompt's estimate once it started, and the output counted so far), which the
# edge charges to the caller's key.
GENERATE_CANCELLED = "cancelled"

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
    the penalties, ``top_k``, ``repeat_penalty`` and ``logprobs`` need the backend's
    ``capabilities.sampling_options``.
    ``reasoning_effort`` (an OpenAI effort name) becomes ``thinking`` where the model has
    thinking modes; the parser leaves it None when the client chose ``thinking`` itself.

    ``prompt`` is a raw text prompt (POST /v1/completions): ``messages`` is then empty and
    only an engine that runs raw prompts takes it.
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
    top_k: int | None = None  # sample among the k likeliest tokens only (1: greedy)
    repeat_penalty: float | None = None  # llama.cpp's multiplicative penalty of repeated tokens (1: none)
    logprobs: int | None = None  # top alternatives per token wanted (0: the chosen token's only); None: none
    reasoning_effort: str | None = None  # mapped onto ``thinking`` by the runtime (runtime.inference.admission)
    prompt: str | None = None
    # How long the model stays loaded once idle, from this request on (Ollama's keep_alive, where
    # service.ollama_keep_alive lets clients say it): seconds, a negative value for no TTL; None: as
    # its definition says.
    keep_alive_seconds: float | None = None
    # How the request queues for its model, as the edge decided it from the caller's key and headers
    # (models_app.api.keys): its priority class, the seconds it may wait before it starts (None: its
    # model's queue_timeout_seconds), and its key's fairness weight (None: engine.fairness's).
    priority: str = DEFAULT_PRIORITY
    queue_timeout_seconds: float | None = None
    weight: float | None = None
    # The LoRA adapter of the model the request runs with (runtime.backends.shared.adapters): set
    # by the runtime from the model id the request names (ModelPool.lookup_target), never by a client.
    adapter: str | None = None

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
        which the channel layer packs anyway, so nothing is copied twice."""
        return {name: getattr(self, name) for name in _FIELD_NAMES}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> GenerationRequest:
        """The typed request of either kind's wire dict (a forwarded one's messages built from its
        body where it left them out); keys this version does not know are dropped."""
        fields = {key: value for key, value in data.items() if key in _KNOWN_FIELDS}
        if "messages" not in fields and data.get("passthrough") is not None:
            fields["messages"] = wire_messages(data)
        return cls(**fields)

    def last_user_text(self) -> str:
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return "".join(p.get("text", "") for p in message["content"] if p.get("type") == "input_text")
        return ""


_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(GenerationRequest))
_KNOWN_FIELDS = frozenset(_FIELD_NAMES)


@dataclass
class ForwardedRequest:
    """A client's OpenAI body, which an engine that forwards sends on as it is (its model renamed).

    ``path`` is the upstream path it was sent to (``/v1/chat/completions``, ``/v1/completions``),
    ``body`` the client's JSON object.  ``typed`` is the same request parsed: what admission, the
    fair share and the activity read whichever engine runs it, and what a native engine runs.
    ``messages_from_body``: ``typed.messages`` are ``runtime.inputs.chat_messages`` of the body's,
    so the wire form carries the conversation once and the runtime builds them again.
    ``typed_refusals`` lists what the typed request cannot honour, as error dicts (``code``,
    ``message``, ``param``): an upstream that gets the body judges those fields itself; where the
    typed request runs instead, the first one is the request's 400.
    """

    typed: GenerationRequest
    path: str
    body: dict
    messages_from_body: bool = False
    typed_refusals: list[dict] = field(default_factory=list)

    def to_wire(self) -> dict[str, Any]:
        """The typed request's wire dict with the body under ``passthrough`` (``{"path", "body"}``,
        ``"messages_from_body": true`` when set, then without the typed ``messages``) and the
        typed refusals under ``refused``."""
        wire = self.typed.to_wire()
        forward = {"path": self.path, "body": self.body}
        if self.messages_from_body:
            forward[_MESSAGES_FROM_BODY] = True
            del wire["messages"]
        wire["passthrough"], wire["refused"] = forward, self.typed_refusals
        return wire

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> ForwardedRequest:
        forward = data["passthrough"]
        return cls(GenerationRequest.from_wire(data), forward["path"], forward["body"],
                   forward.get(_MESSAGES_FROM_BODY) is True, data.get("refused") or [])


InferenceRequest = GenerationRequest | ForwardedRequest
_MESSAGES_FROM_BODY = "messages_from_body"


def request_from_wire(data: dict[str, Any]) -> InferenceRequest:
    """The request of a generate payload, of the kind the edge sent."""
    if data.get("passthrough") is not None:
        return ForwardedRequest.from_wire(data)
    return GenerationRequest.from_wire(data)


def typed_request(request: InferenceRequest) -> GenerationRequest:
    """The typed fields of either kind: what admission, the fair share and the answer's filters read."""
    match request:
        case ForwardedRequest(typed=typed):
            return typed
        case GenerationRequest():
            return request


def with_typed(request: InferenceRequest, typed: GenerationRequest) -> InferenceRequest:
    """``request`` of the same kind with ``typed`` as its typed fields (a forwarded body unchanged)."""
    match request:
        case ForwardedRequest():
            return dataclasses.replace(request, typed=typed)
        case GenerationRequest():
            return typed


def wire_messages(data: dict[str, Any]) -> list[dict]:
    """The typed messages of either kind's wire dict, built from the client's body where it left
    them out (what reads the wire form without ``from_wire``, such as the activity's capture, needs this)."""
    if "messages" in data:
        return data["messages"] or []
    forward = data.get("passthrough")
    if forward is None or forward.get(_MESSAGES_FROM_BODY) is not True:
        return []
    return typed_chat_messages(forward["body"]["messages"])
