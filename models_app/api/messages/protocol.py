"""The Anthropic Messages request (POST /v1/messages): its schema, and its translation into the
typed request.

``parse_messages_body`` builds the same ``GenerationRequest`` the chat and Responses parsers
build, so every rule of the runtime (capabilities, keys, fairness, load on request) applies
alike.  The translation, block by block:

- ``system`` (a string or text blocks) is the conversation's first ``system`` message; a message
  with role ``system`` inside ``messages`` (Claude Code sends one) is a system turn where it stands;
- a user message's ``text`` blocks are ``input_text`` parts, ``image`` blocks (base64 or URL)
  ``input_image`` parts (the runtime refuses them for a model without image input), and each
  ``tool_result`` a ``tool`` message of its own (its string or text blocks as the result's text),
  placed before the text of the same message;
- an assistant message's ``text`` blocks are its text, ``tool_use`` blocks its ``tool_calls``
  (``input`` written as JSON arguments); ``thinking`` and ``redacted_thinking`` from earlier turns
  are left out (a local model's template does not read a reasoning given back);
- ``tools`` (custom tools: ``name``, ``description``, ``input_schema``) are chat's function tools;
  ``tool_choice`` ``auto``/``any``/``tool``/``none`` is auto/required/the named function/none, and
  ``disable_parallel_tool_use`` keeps the answer to one call;
- ``thinking``: ``enabled`` asks the model's ``enabled`` mode (400 thinking_unsupported for a model
  without it); ``disabled`` and ``adaptive`` are reasoning efforts (none, medium) that a model
  without thinking modes ignores;
- ``max_tokens`` is the output limit: an engine stops where its context is full, so a value past
  the model's room (Claude Code sends 32000) is not refused; ``stop_sequences`` are the stop list;
- ``top_k`` is the typed request's (0: none), which the runtime refuses (400 naming it) for a model
  whose engine has no top-k (``capabilities.sampling_options``).

``cache_control`` on any block, ``metadata``, and the fields Claude Code adds that change nothing
here (``context_management``, ``output_config``, ``service_tier``, ``container``, ``mcp_servers``...)
are accepted and ignored.  A model whose engine forwards the client's OpenAI body upstream gets the
typed request (never a ``ForwardedRequest``): an Anthropic body is never sent on as an OpenAI one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from models_app.api import limits
from models_app.api.request_body import function_tools
from models_app.conf import service_settings
from runtime.config import json_path
from runtime.errors import InvalidRequest
from runtime.inputs.request import GenerationRequest

MESSAGES_PATH = "/v1/messages"


class _Block(BaseModel):
    # cache_control, citations and other per-block fields change nothing here.
    model_config = ConfigDict(extra="allow")


class TextBlock(_Block):
    type: Literal["text"]
    text: str


class Base64Source(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["base64"]
    media_type: str = Field(min_length=1)
    data: str = Field(min_length=1)


class UrlSource(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["url"]
    url: str = Field(min_length=1)


class ImageBlock(_Block):
    type: Literal["image"]
    source: Annotated[Union[Base64Source, UrlSource], Field(discriminator="type")]


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[Annotated[Union[TextBlock, ImageBlock], Field(discriminator="type")]] | None = None
    is_error: bool | None = None


class ThinkingBlock(_Block):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Block):
    type: Literal["redacted_thinking"]
    data: str


ContentBlock = Annotated[
    Union[TextBlock, ImageBlock, ToolUseBlock, ToolResultBlock, ThinkingBlock, RedactedThinkingBlock],
    Field(discriminator="type"),
]


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class Tool(BaseModel):
    # cache_control, defer_loading, input_examples... change nothing here.
    model_config = ConfigDict(extra="allow")
    type: Literal["custom"] | None = None
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,128}$")
    description: str | None = None
    input_schema: dict[str, Any]


class ToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, ge=0, le=limits.MAX_FIELD_INTEGER)


class Metadata(BaseModel):
    model_config = ConfigDict(extra="allow")
    user_id: str | None = None


class MessagesBody(BaseModel):
    # Fields Claude Code and newer SDKs add (context_management, output_config, service_tier,
    # container, mcp_servers, betas...) are accepted: they change nothing on a local model.
    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1, max_length=limits.MAX_MESSAGES)
    max_tokens: int = Field(ge=1, le=limits.MAX_FIELD_INTEGER)
    system: str | list[TextBlock] | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: limits.TopK = None
    stop_sequences: list[Annotated[str, Field(max_length=limits.MAX_STOP_LENGTH)]] | None = Field(
        None, max_length=limits.MAX_STOP_SEQUENCES
    )
    stream: bool | None = False
    tools: list[Tool] | None = Field(None, max_length=limits.MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    metadata: Metadata | None = None


class CountTokensBody(MessagesBody):
    """POST /v1/messages/count_tokens: the same body, with no output limit to give."""

    max_tokens: int | None = Field(None, ge=1, le=limits.MAX_FIELD_INTEGER)


@dataclass
class MessagesRequest:
    """A parsed Messages request: the typed request, and what only the answer's shape needs."""

    generation: GenerationRequest
    stop_sequences: tuple[str, ...] = ()


def parse_messages_body(data: Any, fairness_key: str | None) -> MessagesRequest:
    """Validate a POST /v1/messages body into the typed request (unset sampling left None);
    ``fairness_key`` is the edge's (``api.keys``), None when no key or header decided it."""
    return _typed_request(validated_body(data), fairness_key)


def parse_count_tokens_body(data: Any, fairness_key: str | None) -> MessagesRequest:
    """A POST /v1/messages/count_tokens body as the typed request its prompt would be."""
    return _typed_request(validated_body(data, CountTokensBody), fairness_key)


def _typed_request(body: MessagesBody, fairness_key: str | None) -> MessagesRequest:
    tools = _tools(body.tools)
    tool_choice, parallel = _tool_choice(body.tool_choice, tools)
    thinking, effort = _thinking(body.thinking)
    stop = [sequence for sequence in body.stop_sequences or () if sequence] or None
    return MessagesRequest(
        generation=GenerationRequest(
            request_id="",  # the runtime client names the exchange
            model=body.model,
            messages=typed_messages(body),
            max_output_tokens=body.max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k or None,
            stream=bool(body.stream),
            thinking=thinking,
            reasoning_effort=effort,
            fairness_key=_fairness_key(fairness_key, body.metadata),
            stop=stop,
            tools=tools,
            tool_choice=tool_choice,
            parallel_tool_calls=parallel,
        ),
        stop_sequences=tuple(stop or ()),
    )


def _fairness_key(decided: str | None, metadata: Metadata | None) -> str | None:
    """The edge's fairness key; without one, ``metadata.user_id`` where the operator lets it serve
    (``service.fairness_key_from_metadata``), else None."""
    if decided is not None or metadata is None or not service_settings().fairness_key_from_metadata:
        return decided
    limits.check_fairness_key(metadata.user_id, param="metadata.user_id")
    return metadata.user_id


def validated_body(data: Any, schema: type[MessagesBody] = MessagesBody) -> MessagesBody:
    """The body checked against ``schema`` (400 invalid_request naming the field)."""
    if not isinstance(data, dict):
        raise InvalidRequest("the request body must be a JSON object")
    limits.check_generation_bounds(data, items="messages")
    try:
        return schema.model_validate(data, strict=True)
    except ValidationError as exc:
        # Of a union's failures (a string, else blocks) the deepest says what is wrong.
        problem = max(exc.errors(), key=lambda error: len(error["loc"]))
        path = json_path(_field_loc(problem["loc"]))
        raise InvalidRequest(f"{path}: {problem['msg']}", param=path.removeprefix("$.")) from exc


def _field_loc(loc: tuple) -> tuple:
    """Drop the members pydantic names in a location: the union member a field was tried as
    (``str``, ``list[...]``) and the type tag of a block (after its index in a tagged list) or of
    an image's source."""
    kept = []
    for index, part in enumerate(loc):
        tagged = index > 1 and isinstance(loc[index - 1], int) and str(loc[index - 2]).startswith("list[tagged-union")
        tried_as = part == "str" or str(part).startswith("list[")
        if not (tried_as or tagged or (index > 0 and loc[index - 1] == "source")):
            kept.append(part)
    return tuple(kept)


def typed_messages(body: MessagesBody) -> list[dict]:
    """The conversation in the typed request's shape (``GenerationRequest.messages``)."""
    typed: list[dict] = []
    system = _system_text(body.system)
    if system is not None:
        typed.append({"role": "system", "content": [{"type": "input_text", "text": system}]})
    for index, message in enumerate(body.messages):
        blocks = [TextBlock(type="text", text=message.content)] if isinstance(message.content, str) else message.content
        where = f"messages[{index}]"
        if message.role == "assistant":
            typed.append(_assistant_message(blocks, where))
        else:
            typed.extend(_user_messages(message.role, blocks, where))
    return typed


def _system_text(system: str | list[TextBlock] | None) -> str | None:
    if system is None or isinstance(system, str):
        return system or None
    return "\n\n".join(block.text for block in system) or None


def _assistant_message(blocks: list, where: str) -> dict:
    parts, calls = [], []
    for index, block in enumerate(blocks):
        if block.type == "text":
            parts.append({"type": "input_text", "text": block.text})
        elif block.type == "tool_use":
            calls.append({"id": block.id, "name": block.name, "arguments": orjson.dumps(block.input).decode()})
        elif block.type in ("image", "tool_result"):
            raise InvalidRequest(f"{where}.content[{index}]: an assistant message has no {block.type} block",
                                 param=f"{where}.content[{index}]")
    message = {"role": "assistant", "content": parts}
    if calls:
        message["tool_calls"] = calls
    return message


def _user_messages(role: str, blocks: list, where: str) -> list[dict]:
    """A user (or system) message's tool results, each a ``tool`` message, then its other parts."""
    results, parts = [], []
    for index, block in enumerate(blocks):
        at = f"{where}.content[{index}]"
        if block.type == "text":
            parts.append({"type": "input_text", "text": block.text})
        elif block.type == "image":
            parts.append(_image_part(block))
        elif block.type == "tool_result" and role == "user":
            results.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": _result_parts(block, at)})
        elif block.type in ("tool_use", "tool_result"):
            raise InvalidRequest(f"{at}: a {role} message has no {block.type} block", param=at)
        # thinking blocks in a user turn carry nothing the model reads
    if role == "system" and any(part["type"] != "input_text" for part in parts):
        raise InvalidRequest(f"{where}.content: a system message is text", param=f"{where}.content")
    if not parts and not results:
        raise InvalidRequest(f"{where}.content: a {role} message needs content", param=f"{where}.content")
    return results + ([{"role": role, "content": parts}] if parts else [])


def _image_part(block: ImageBlock) -> dict:
    source = block.source
    url = source.url if source.type == "url" else f"data:{source.media_type};base64,{source.data}"
    return {"type": "input_image", "image_url": url}


def _result_parts(block: ToolResultBlock, where: str) -> list[dict]:
    """A tool result's text (a tool message is text: an image in a result is refused)."""
    content = block.content
    if content is None or isinstance(content, str):
        return [{"type": "input_text", "text": content or ""}]
    if any(item.type != "text" for item in content):
        raise InvalidRequest(f"{where}.content: a tool result is text here (no image blocks)", param=f"{where}.content")
    return [{"type": "input_text", "text": item.text} for item in content] or [{"type": "input_text", "text": ""}]


def _tools(tools: list[Tool] | None) -> list[dict] | None:
    """The tools in the typed request (chat completions' shape)."""
    return function_tools([_function(tool) for tool in tools or ()], noun="tool")


def _function(tool: Tool) -> dict:
    function = {"name": tool.name, "parameters": tool.input_schema}
    if tool.description is not None:
        function["description"] = tool.description
    return function


def _tool_choice(choice: ToolChoice | None, tools: list[dict] | None) -> tuple[str | dict | None, bool | None]:
    """The typed ``tool_choice`` and ``parallel_tool_calls`` of Anthropic's tool_choice."""
    if choice is None:
        return None, None
    parallel = False if choice.disable_parallel_tool_use else None
    if choice.type == "none":
        return "none", None
    if choice.type == "auto":
        return "auto", parallel
    if not tools:
        raise InvalidRequest(f'tool_choice "{choice.type}" needs tools', param="tool_choice")
    if choice.type == "any":
        return "required", parallel
    names = [tool["function"]["name"] for tool in tools]
    if choice.name not in names:
        raise InvalidRequest(f"tool_choice names tool {choice.name!r}, which is not one of the tools",
                             param="tool_choice.name")
    return {"type": "function", "function": {"name": choice.name}}, parallel


def _thinking(thinking: Thinking | None) -> tuple[str | None, str | None]:
    """``(thinking, reasoning_effort)`` of the typed request: ``enabled`` must be honoured (the
    runtime refuses it for a model without it); ``disabled`` and ``adaptive`` are efforts the
    runtime maps onto the model's modes where it has them and drops where it has not."""
    if thinking is None:
        return None, None
    if thinking.type == "enabled":
        return "enabled", None
    return None, "none" if thinking.type == "disabled" else "medium"
