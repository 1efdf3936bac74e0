"""The OpenAI Responses API request: its schema, and its translation into the typed request
(the answer's shapes: ``responses.shapes``).

A thinking model's reasoning (split off its answer by the runtime) is a ``reasoning`` output
item before the message (``content: [{"type": "reasoning_text", "text"}]``), streamed as
``response.reasoning_text.delta`` events; ``reasoning.effort`` maps onto ``thinking`` as
chat's ``reasoning_effort`` does.  ``include: ["message.output_text.logprobs"]`` (and
``top_logprobs``) asks for the answer's logprobs where the engine gives them.

Tools: ``tools`` (``{"type": "function", "name", "description", "parameters", "strict"}``)
and ``tool_choice`` (none, auto, required, ``{"type": "function", "name"}``) go into the typed
request in chat completions' shape; ``function_call`` input items (an earlier answer's calls)
join the assistant message before them as its ``tool_calls`` and ``function_call_output``
items become ``tool`` messages.  The answer's calls are ``function_call`` output items (after
the message, which is left out when the answer has no text), streamed as
``response.output_item.added``, ``response.function_call_arguments.delta`` / ``.done`` and
``response.output_item.done`` (``responses.shapes``).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    WithJsonSchema,
    field_validator,
)

from models_app.api import limits
from models_app.api.openapi import response_format_schema, tool_choice_schema
from models_app.api.request_body import function_tools, json_object, text_shorthand, validated
from runtime.errors import InvalidRequest
from runtime.inputs.request import GenerationRequest


class _Part(BaseModel):
    model_config = ConfigDict(extra="allow")


class TextPart(_Part):
    type: Literal["input_text", "output_text", "text"]
    text: str


class ImagePart(_Part):
    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: str | None = None


class FilePart(_Part):
    type: Literal["input_file"]
    file_id: str | None = None
    file_data: str | None = None
    file_url: str | None = None
    filename: str | None = None


class AudioPart(_Part):
    type: Literal["input_audio"]
    input_audio: dict | None = None


ContentPart = Annotated[Union[TextPart, ImagePart, FilePart, AudioPart], Field(discriminator="type")]


class InputMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["message"] | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: list[ContentPart] = Field(min_length=1)  # an empty user message is refused, as on chat
    id: str | None = None
    status: str | None = None

    _string_content = text_shorthand("input_text")  # a string, or a user's "", as on chat


TOOL_NAME = r"^[A-Za-z0-9_-]{1,64}$"


class FunctionCallItem(BaseModel):
    """An earlier answer's call, sent back with the conversation."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(BaseModel):
    """A call's result: ``output`` is its text (or a list of text parts)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[TextPart]
    id: str | None = None
    status: str | None = None


def _item_kind(value) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind or "message"


InputItem = Annotated[
    Union[
        Annotated[InputMessage, Tag("message")],
        Annotated[FunctionCallItem, Tag("function_call")],
        Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    ],
    Discriminator(_item_kind),
]
ITEM_TAGS = ("message", "function_call", "function_call_output")


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    name: str = Field(pattern=TOOL_NAME)
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class ReasoningOptions(BaseModel):
    model_config = ConfigDict(extra="allow")  # summary, generate_summary: nothing to summarise here
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None


LOGPROBS_INCLUDE = "message.output_text.logprobs"
RESPONSE_FORMAT = response_format_schema(("schema", "json_schema"))  # as _response_format checks it


class ResponsesBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1)
    input: list[InputItem] = Field(min_length=1, max_length=limits.MAX_MESSAGES)
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=limits.MAX_FIELD_INTEGER)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool = False
    thinking: Literal["default", "enabled", "disabled"] | None = None
    response_format: Annotated[dict | None, WithJsonSchema(RESPONSE_FORMAT)] = None
    # Responses-API style: text.format is the response_format when that is left out.
    text: Annotated[dict | None, WithJsonSchema({"anyOf": [
        {"type": "object", "properties": {"format": RESPONSE_FORMAT}}, {"type": "null"}]})] = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    source_lang_code: str | None = None
    target_lang_code: str | None = None
    # Accepted for client compatibility; they change nothing here.
    store: bool | None = None
    truncation: str | None = None
    service_tier: str | None = None
    include: list[str] | None = None
    stream_options: dict | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # reasoning.effort becomes ``thinking`` in the runtime (the model's thinking modes); an
    # explicit ``thinking`` wins.
    reasoning: ReasoningOptions | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[FunctionTool] | None = Field(None, max_length=limits.MAX_TOOLS)
    # Checked by _tool_choice (400 naming tool_choice), whose rules the schema states.
    tool_choice: Annotated[str | dict | None, WithJsonSchema(tool_choice_schema({"name": {"type": "string"}}))] = None
    parallel_tool_calls: bool | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _string_input(cls, value):
        # An empty string is no input, as [] is: both are refused by the list's minimum.
        if value == "":
            return []
        return [{"role": "user", "content": value}] if isinstance(value, str) else value


def parse_responses_body(data: Any, fairness_key: str | None) -> GenerationRequest:
    """Validate a POST /v1/responses body into the typed request the runtime and the engine get
    (sampling fields the client left out stay None: the runtime applies its defaults).
    ``fairness_key`` is what the edge decided (``api.keys``: an API key's bucket or a fairness
    header); None leaves the fairness key to the body's ``user``."""
    limits.check_generation_bounds(json_object(data), items="input")
    body = validated(ResponsesBody, data, where=_field_loc)
    messages = _messages(body.input)
    tools = _tools(body.tools)
    return GenerationRequest(
        request_id="",  # the runtime client names the exchange
        model=body.model,
        messages=messages,
        instructions=body.instructions,
        max_output_tokens=body.max_output_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        stream=body.stream,
        thinking=body.thinking,
        response_format=_response_format(body),
        metadata=body.metadata or {},
        fairness_key=limits.fairness_key(fairness_key, body.user),
        extra={
            key: value
            for key, value in (("source_lang_code", body.source_lang_code), ("target_lang_code", body.target_lang_code))
            if value is not None
        },
        reasoning_effort=None if body.thinking is not None or body.reasoning is None else body.reasoning.effort,
        logprobs=(body.top_logprobs or 0) if LOGPROBS_INCLUDE in (body.include or ()) or body.top_logprobs else None,
        tools=tools,
        tool_choice=_tool_choice(body.tool_choice, tools),
        parallel_tool_calls=body.parallel_tool_calls,
    )


def _messages(items: list) -> list[dict]:
    """The typed messages: a function_call item joins the assistant message just before it (or
    starts one) as one of its ``tool_calls``; a function_call_output is a ``tool`` message."""
    messages: list[dict] = []
    for item in items:
        if isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "name": item.name, "arguments": item.arguments}
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": [], "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            output = item.output if isinstance(item.output, str) else "".join(part.text for part in item.output)
            messages.append({"role": "tool", "content": [{"type": "input_text", "text": output}],
                             "tool_call_id": item.call_id})
        else:
            messages.append({"role": item.role, "content": _parts(item.content)})
    return messages


def _tools(tools: list[FunctionTool] | None) -> list[dict] | None:
    """The tools in chat completions' shape (the typed request's), unset fields left out."""
    return function_tools([tool.model_dump(exclude_none=True, exclude={"type"}) for tool in tools or ()])


def _tool_choice(choice: str | dict | None, tools: list[dict] | None) -> str | dict | None:
    """``tool_choice`` checked (none, auto, required, or ``{"type": "function", "name"}`` naming
    one of the tools), a named one in chat completions' shape."""
    if choice is None or choice in ("none", "auto"):
        return choice
    if choice == "required":
        if not tools:
            raise InvalidRequest('tool_choice "required" needs tools', param="tool_choice")
        return choice
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(choice.get("name"), str) \
            or set(choice) != {"type", "name"}:
        raise InvalidRequest(
            'tool_choice must be none, auto, required or {"type": "function", "name": ...}', param="tool_choice"
        )
    if choice["name"] not in [tool["function"]["name"] for tool in tools or ()]:
        raise InvalidRequest(f"tool_choice names function {choice['name']!r}, which is not one of the tools",
                             param="tool_choice")
    return {"type": "function", "function": {"name": choice["name"]}}


def _field_loc(loc: tuple) -> tuple:
    """Drop the tags pydantic puts after an item's index and a content index:
    input.0.<item tag>.content.1.<part tag>.text."""
    if len(loc) > 2 and loc[0] == "input" and loc[2] in ITEM_TAGS:
        loc = loc[:2] + loc[3:]
    if len(loc) > 4 and loc[0] == "input" and loc[2] == "content":
        return loc[:4] + loc[5:]
    return loc


def _parts(content: list) -> list[dict]:
    parts = []
    for part in content:
        dumped = part.model_dump(exclude_none=True)
        if part.type in ("output_text", "text"):
            dumped = {"type": "input_text", "text": part.text}
        parts.append(dumped)
    return parts


def _response_format(body: ResponsesBody) -> dict | None:
    fmt = body.response_format
    if fmt is None and body.text is not None:
        fmt = body.text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_schema", "json_object"):
        raise InvalidRequest("response_format.type must be text, json_schema or json_object", param="response_format")
    if fmt["type"] == "json_schema" and not isinstance(fmt.get("schema", fmt.get("json_schema")), dict):
        raise InvalidRequest("a json_schema response_format needs a schema object", param="response_format")
    return fmt
