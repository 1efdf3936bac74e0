"""Ollama's request bodies, and their translation into the typed request.

The bodies are those of Ollama's ``api/types.go`` (the ``ollama`` client's ``_types.py``):
fields of the types are checked strictly (a 400 naming the field), fields Ollama does not
have are ignored, as Ollama's own JSON decoding ignores them.

- ``messages``: ``system``, ``user``, ``assistant``, ``tool`` with ``content`` text and
  ``images`` (base64, their type read from their first bytes: PNG, JPEG, GIF, WebP), an
  assistant's ``tool_calls`` (``arguments`` an object) and a tool result (its ``tool_name``, or
  ``tool_call_id``) answering the oldest unanswered call of that name (Ollama's calls have no
  ids: llm-pool numbers them);
- ``options``: ``num_predict`` (a negative one: the service's default), ``temperature``,
  ``top_p``, ``top_k`` (0: none), ``seed``, ``stop``, ``presence_penalty``, ``frequency_penalty``,
  ``repeat_penalty`` (1: none) go into the typed request, which the runtime refuses (400 naming
  the option) for a model whose engine lacks one (``capabilities.sampling_options``).  The others
  change nothing: sampling knobs the typed request does not carry (``mirostat``, ``min_p``,
  ``repeat_last_n`` ...) and the load-time ones; ``num_ctx`` is clamped to the loaded context (a
  model's context is its definition's, and ``/api/show`` tells it), never a reload;
- ``think``: true/false are thinking "enabled"/"disabled", "low"/"medium"/"high" a reasoning
  effort; ``format``: "json" is a JSON object's schema, an object is a JSON schema;
- ``keep_alive`` is ignored unless ``service.ollama_keep_alive`` is on, so that no client unloads or
  pins a model of a shared pool; on, it is the model's TTL from that request until it unloads
  (a number of seconds or a Go duration such as "10m"; 0 unloads it once idle, a negative one keeps it).

The request is a ``GenerationRequest``, never a ``ForwardedRequest``: a model whose engine
forwards OpenAI bodies gets the typed request, which its engine writes as its own.
"""
from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema

from models_app.api import limits
from models_app.conf import service_settings
from runtime.config import json_path
from runtime.errors import InvalidRequest
from runtime.inference.embedding import EmbeddingRequest
from runtime.inputs.request import GenerationRequest

_IMAGE_TYPES = ((b"\x89PNG", "image/png"), (b"\xff\xd8\xff", "image/jpeg"), (b"GIF8", "image/gif"))


def _only_empty(kind: dict, why: str) -> Any:
    """A field the document says is accepted only empty or null (``parse_generate`` refuses a value)."""
    return WithJsonSchema({"anyOf": [kind, {"type": "null"}], "description": f"Not supported: {why}; a value is "
                                                                              "refused (400)."})


class Options(BaseModel):
    model_config = ConfigDict(extra="ignore")
    num_predict: int | None = Field(None, ge=-2, le=limits.MAX_FIELD_INTEGER)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = Field(None, ge=limits.MIN_INTEGER, le=limits.MAX_INTEGER)
    stop: list[str] | None = Field(None, max_length=limits.MAX_STOP_SEQUENCES)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    top_k: limits.TopK = None
    repeat_penalty: limits.RepeatPenalty = None


class CalledFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    function: CalledFunction


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: list[str] | None = None
    thinking: str | None = None  # an earlier answer's reasoning: not sent back to the model
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None


class ToolFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"] = "function"
    function: ToolFunction


Think = bool | Literal["low", "medium", "high"] | None
Format = Literal["", "json"] | dict | None
KeepAlive = float | int | str | None


class _Generating(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str = Field(min_length=1)
    stream: bool = True
    format: Format = None
    options: Options | None = None
    think: Think = None
    keep_alive: KeepAlive = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)


class ChatBody(_Generating):
    messages: list[Message] = Field(default_factory=list, max_length=limits.MAX_MESSAGES)
    tools: list[Tool] | None = Field(None, max_length=limits.MAX_TOOLS)


class GenerateBody(_Generating):
    prompt: str = ""
    system: str | None = None
    images: list[str] | None = None
    raw: bool = False
    suffix: Annotated[str | None, _only_empty({"type": "string", "maxLength": 0}, "no fill-in-the-middle")] = None
    template: Annotated[str | None, _only_empty({"type": "string", "maxLength": 0},
                                                "prompts are rendered with the model's chat template")] = None
    context: Annotated[list[int] | None, _only_empty({"type": "array", "items": {"type": "integer"}, "maxItems": 0},
                                                     "send the conversation to /api/chat")] = None


class EmbedBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str = Field(min_length=1)
    # Empty strings in the list are refused by ``parse_embed`` (naming the item), as the schema says.
    input: Annotated[str | list[str], Field(min_length=1), WithJsonSchema({"anyOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1},
    ]})]
    truncate: bool | None = None
    dimensions: int | None = Field(None, ge=1, le=limits.MAX_FIELD_INTEGER)
    options: dict | None = None
    keep_alive: KeepAlive = None


class EmbeddingsBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str = Field(min_length=1)
    prompt: str = Field(min_length=1)
    options: dict | None = None
    keep_alive: KeepAlive = None


class ModelBody(BaseModel):
    """The model to show (or, on the model-management paths, to act on): ``model``, or the older
    ``name``; the first of them that is not empty names it."""

    model_config = ConfigDict(extra="ignore", json_schema_extra={"anyOf": [
        {"properties": {name: {"type": "string", "minLength": 1}}, "required": [name]} for name in ("model", "name")
    ]})
    model: str | None = None
    name: str | None = None


@dataclass
class OllamaCall:
    """A parsed /api/chat or /api/generate request: the typed request (None: a body without
    messages or prompt, which Ollama answers with ``done_reason: "load"``), what the answer's
    shape needs, and whether the client reads a stream."""

    model: str
    generation: GenerationRequest | None
    stream: bool


def validated(schema: type[BaseModel], data: Any) -> BaseModel:
    """``data`` as ``schema``, strictly; a 400 naming the first field that does not fit."""
    if not isinstance(data, dict):
        raise InvalidRequest("the request body must be a JSON object")
    try:
        return schema.model_validate(data, strict=True)
    except ValidationError as exc:
        problem = exc.errors()[0]
        path = json_path(tuple(part for part in problem["loc"] if not _is_branch_tag(part)))
        raise InvalidRequest(f"{path}: {problem['msg']}", param=path.removeprefix("$.")) from exc


def _is_branch_tag(part) -> bool:
    """Whether a location part names a union's branch (``bool``, ``literal['low',...]``), not a field."""
    return isinstance(part, str) and (part in ("bool", "str", "int", "float", "dict", "list", "none") or "[" in part)


def parse_chat(data: Any, fairness_key: str | None) -> OllamaCall:
    body = validated(ChatBody, data)
    if not body.messages:
        return OllamaCall(body.model, None, body.stream)
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools] if body.tools else None
    return OllamaCall(body.model, _generation(body, fairness_key, messages=_messages(body.messages), tools=tools),
                      body.stream)


def parse_generate(data: Any, fairness_key: str | None) -> OllamaCall:
    body = validated(GenerateBody, data)
    for name in ("suffix", "template"):
        if getattr(body, name):
            raise InvalidRequest(f"{name} is not supported: llm-pool renders prompts with the model's chat template",
                                 param=name)
    if body.context:
        raise InvalidRequest("context is not supported: send the conversation to /api/chat", param="context")
    if not body.prompt and not body.images:
        return OllamaCall(body.model, None, body.stream)
    if body.raw:
        if body.images or body.system:
            raise InvalidRequest("a raw prompt takes no images or system", param="raw")
        return OllamaCall(body.model, _generation(body, fairness_key, messages=[], prompt=body.prompt), body.stream)
    messages = [{"role": "system", "content": [_text(body.system)]}] if body.system else []
    messages.append({"role": "user", "content": _content(body.prompt, body.images, "images")})
    return OllamaCall(body.model, _generation(body, fairness_key, messages=messages), body.stream)


def parse_embed(data: Any, fairness_key: str | None) -> EmbeddingRequest:
    body = validated(EmbedBody, data)
    inputs = [body.input] if isinstance(body.input, str) else body.input
    for index, item in enumerate(inputs):
        if not item:
            raise InvalidRequest(f"input[{index}] must not be empty", param="input")
    return _embedding(body.model, inputs, body.dimensions, fairness_key)


def parse_embeddings(data: Any, fairness_key: str | None) -> EmbeddingRequest:
    body = validated(EmbeddingsBody, data)
    return _embedding(body.model, [body.prompt], None, fairness_key)


def shown_model(data: Any) -> str:
    body = validated(ModelBody, data)
    name = body.model or body.name
    if not name:
        raise InvalidRequest("model: Field required", param="model")
    return name


def _embedding(model: str, inputs: list[str], dimensions: int | None, fairness_key: str | None) -> EmbeddingRequest:
    return EmbeddingRequest(request_id="", model=model, inputs=inputs, dimensions=dimensions,
                            fairness_key=limits.fairness_key(fairness_key, None))


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_seconds(value: KeepAlive) -> float | None:
    """Ollama's keep_alive in seconds (negative: keep loaded): a number of seconds, a numeric string,
    or a Go duration ("5m", "1h30m", "-1m"); None when not given.  Anything else is 400."""
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            return float(text)
        except ValueError:
            pass
        sign, text = (-1.0, text[1:]) if text.startswith("-") else (1.0, text.removeprefix("+"))
        parts = _DURATION_PART.findall(text)
        if parts and "".join(number + unit for number, unit in parts) == text:
            return sign * sum(float(number) * _DURATION_UNITS[unit] for number, unit in parts)
    raise InvalidRequest(f"keep_alive {value!r} is not a duration (seconds, or such as \"5m\" or \"1h30m\")",
                         param="keep_alive")


def _generation(body: _Generating, fairness_key: str | None, **fields) -> GenerationRequest:
    options = body.options or Options()
    stop = [sequence for sequence in options.stop or () if sequence] or None
    for index, sequence in enumerate(stop or ()):
        if len(sequence) > limits.MAX_STOP_LENGTH:
            raise InvalidRequest(f"options.stop[{index}] is longer than {limits.MAX_STOP_LENGTH} characters",
                                 param=f"options.stop[{index}]")
    think = body.think
    response_format = _response_format(body.format)
    return GenerationRequest(
        request_id="",  # the runtime client names the exchange
        model=body.model,
        keep_alive_seconds=keep_alive_seconds(body.keep_alive) if service_settings().ollama_keep_alive else None,
        max_output_tokens=options.num_predict if options.num_predict and options.num_predict > 0 else None,
        temperature=options.temperature,
        top_p=options.top_p or None,
        seed=options.seed,
        stop=stop,
        presence_penalty=options.presence_penalty or None,
        frequency_penalty=options.frequency_penalty or None,
        **limits.sampling_knobs(options.top_k, options.repeat_penalty),
        thinking={True: "enabled", False: "disabled"}.get(think) if isinstance(think, bool) else None,
        reasoning_effort=think if isinstance(think, str) else None,
        response_format=response_format,
        logprobs=(body.top_logprobs or 0) if body.logprobs else None,
        # The runtime constrains a format only in an answer it sends whole: such a stream is sent
        # as one piece (models_app.api.ollama.endpoint).
        stream=body.stream and response_format is None,
        fairness_key=limits.fairness_key(fairness_key, None),
        **fields,
    )


def _response_format(fmt: Format) -> dict | None:
    if not fmt:
        return None
    schema = {"type": "object"} if fmt == "json" else fmt
    return {"type": "json_schema", "json_schema": {"name": "ollama_format", "schema": schema}}


def _messages(messages: list[Message]) -> list[dict]:
    """The typed messages of Ollama's: its calls numbered (``call_<message>_<n>``), each tool
    result given the id of the call it answers."""
    typed: list[dict] = []
    unanswered: list[tuple[str, str]] = []  # (id, name) of the calls not answered yet, oldest first
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if message.tool_calls and message.role != "assistant":
            raise InvalidRequest(f"{where}.tool_calls: only an assistant message has tool calls",
                                 param=f"{where}.tool_calls")
        if message.role == "user":
            typed.append({"role": "user", "content": _content(message.content, message.images, f"{where}.images")})
            continue
        if message.images:
            raise InvalidRequest(f"{where}.images: only a user message has images", param=f"{where}.images")
        entry: dict = {"role": message.role, "content": [_text(message.content)] if message.content else []}
        if message.role == "tool":
            entry["tool_call_id"] = message.tool_call_id or _answered(unanswered, message.tool_name, index)
        if message.tool_calls:
            calls = [(f"call_{index}_{n}", call.function) for n, call in enumerate(message.tool_calls)]
            entry["tool_calls"] = [{"id": call_id, "name": function.name, "arguments": json.dumps(function.arguments)}
                                   for call_id, function in calls]
            unanswered.extend((call_id, function.name) for call_id, function in calls)
        typed.append(entry)
    return typed


def _answered(unanswered: list[tuple[str, str]], name: str | None, index: int) -> str:
    """The id of the oldest unanswered call named ``name`` (any name when None), taken off the list."""
    for position, (call_id, called) in enumerate(unanswered):
        if name is None or called == name:
            del unanswered[position]
            return call_id
    return f"call_{index}_result"  # a result of no call in the conversation: the template shows it as such


def _text(text: str) -> dict:
    return {"type": "input_text", "text": text}


def _content(text: str, images: list[str] | None, where: str) -> list[dict]:
    parts = [_text(text)] if text else []
    parts += [{"type": "input_image", "image_url": _data_url(image, f"{where}[{n}]")}
              for n, image in enumerate(images or ())]
    if not parts:
        raise InvalidRequest(f"{where.rsplit('.', 1)[0]}: a user message needs content or images", param=where)
    return parts


def _data_url(image: str, where: str) -> str:
    """A base64 image as a data URL, its media type read from its first bytes."""
    try:
        head = base64.b64decode(image[:64], validate=True)
        base64.b64decode(image, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"{where}: an image is base64 data", param=where) from None
    kind = next((media for magic, media in _IMAGE_TYPES if head.startswith(magic)), None)
    if kind is None and head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        kind = "image/webp"
    if kind is None:
        raise InvalidRequest(f"{where}: not a PNG, JPEG, GIF or WebP image", param=where)
    return f"data:{kind};base64,{image}"
