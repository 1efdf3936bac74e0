"""OpenAI Responses API shapes: the request schema, its normalisation, and the output objects.

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
``response.output_item.done``.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)

from models_app.api import limits
from models_app.api.openapi import response_format_schema, tool_choice_schema
from runtime.config import json_path
from runtime.errors import InvalidRequest
from runtime.inputs.request import GENERATE_DELTA, GENERATE_REASONING, GENERATE_TOOL_CALL, GenerationRequest
from runtime.inference.tool_calls import chosen_name


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

    # Shorthands become the full form before validation, so no union of shapes hides the real problem
    # of an invalid body behind a "should be a valid string" for the other shape.  A user message's
    # "" is no content, as [] is: both are refused by the list's minimum.
    @field_validator("content", mode="before")
    @classmethod
    def _string_content(cls, value, info: ValidationInfo):
        if value == "" and info.data.get("role") == "user":
            return []
        return [{"type": "input_text", "text": value}] if isinstance(value, str) else value


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
    if not isinstance(data, dict):
        raise InvalidRequest("the request body must be a JSON object")
    limits.check_generation_bounds(data, items="input")
    try:
        body = ResponsesBody.model_validate(data, strict=True)
    except ValidationError as exc:
        problem = exc.errors()[0]
        path = json_path(_field_loc(problem["loc"]))
        raise InvalidRequest(f"{path}: {problem['msg']}", param=path.removeprefix("$.")) from exc
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
    if not tools:
        return None
    typed, seen = [], set()
    for index, tool in enumerate(tools):
        if tool.name in seen:
            raise InvalidRequest(f"tools[{index}]: a second function named {tool.name!r}", param=f"tools[{index}].name")
        seen.add(tool.name)
        function = tool.model_dump(exclude_none=True, exclude={"type"})
        typed.append({"type": "function", "function": function})
    return typed


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


# ---- output objects ----------------------------------------------------------------------


class ResponseBuilder:
    """Builds the response object and the SSE events of one request.

    A stream opens an output item when its first text arrives: the reasoning item (index 0) on
    the first reasoning delta, a message (after it) on the first answer delta, which closes
    the reasoning; a tool call closes the open item and is one ``function_call`` item, added and
    done at once (its arguments in one delta).  Answer text after a call opens another message.
    A stream that ended with neither text nor calls opens its message when it ends.
    """

    def __init__(self, request: GenerationRequest):
        self.id = f"resp_{uuid.uuid4().hex}"
        self.message_id = f"msg_{uuid.uuid4().hex}"
        self.reasoning_id = f"rs_{uuid.uuid4().hex}"
        self.created_at = int(time.time())
        self.request = request
        self.sequence = 0
        self._reasoning: list[str] | None = None  # streamed so far; None: no reasoning item opened
        self._reasoning_open = False
        self._items: list[dict] = []  # the output items streamed so far, done (the open message not yet)
        self._message: _OpenMessage | None = None  # the message being streamed

    def response(self, status: str, output: list[dict] | None = None, result: dict | None = None) -> dict:
        usage = None
        if result is not None:
            used = result["usage"]
            usage = {
                "input_tokens": used["input_tokens"],
                "input_tokens_details": {"cached_tokens": used.get("cached_tokens", 0), "cache_write_tokens": 0},
                "output_tokens": used["output_tokens"],
                "output_tokens_details": {"reasoning_tokens": used.get("reasoning_tokens", 0)},
                "total_tokens": used["input_tokens"] + used["output_tokens"],
            }
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "model": self.request.model,
            "status": status,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": self.request.instructions,
            "max_output_tokens": self.request.max_output_tokens,
            "metadata": self.request.metadata,
            "output": output or [],
            "parallel_tool_calls": self.request.parallel_tool_calls is not False,
            "temperature": self.request.temperature,
            "top_p": self.request.top_p,
            "tool_choice": _echoed_tool_choice(self.request.tool_choice),
            "tools": [_echoed_tool(tool) for tool in self.request.tools or ()],
            "usage": usage,
            "user": self.request.fairness_key,
        }

    def message(self, text: str, status: str, logprobs: list[dict] | None = None, item_id: str | None = None) -> dict:
        return {
            "type": "message",
            "id": item_id or self.message_id,
            "status": status,
            "role": "assistant",
            "content": [_output_text(text, logprobs)],
        }

    def reasoning_item(self, text: str | None, status: str) -> dict:
        content = [] if text is None else [{"type": "reasoning_text", "text": text}]
        return {
            "type": "reasoning", "id": self.reasoning_id, "summary": [], "content": content,
            "encrypted_content": None, "status": status,
        }

    @staticmethod
    def function_call(call: dict, status: str = "completed") -> dict:
        arguments = call["arguments"] if status == "completed" else ""
        return {
            "type": "function_call", "id": f"fc_{call['id'].removeprefix('call_')}", "call_id": call["id"],
            "name": call["name"], "arguments": arguments, "status": status,
        }

    def final(self, result: dict) -> dict:
        """The response of a request that did not stream: the reasoning, the message (left out
        when the answer is calls only) and the calls, in that order."""
        status = _status(result)
        output = []
        if "reasoning" in result:
            output.append(self.reasoning_item(result["reasoning"], "completed"))
        calls = result.get("tool_calls") or ()
        if result["text"] or not calls:
            message_status = "completed" if status == "completed" else "incomplete"
            output.append(self.message(result["text"], message_status, result.get("logprobs")))
        output.extend(self.function_call(call) for call in calls)
        return self.response(status, output, result)

    # -- SSE -----------------------------------------------------------------------------
    def event(self, event_type: str, **fields) -> bytes:
        data = {"type": event_type, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {event_type}\ndata: {json.dumps(data)}\n\n".encode()

    def opening_events(self) -> list[bytes]:
        started = self.response("in_progress")
        return [self.event("response.created", response=started), self.event("response.in_progress", response=started)]

    def event_bytes(self, event: dict) -> bytes:
        """The SSE events of one of the runtime's generate events (``reasoning``, ``delta``,
        ``tool_call``); nothing for the others."""
        if event.get("event") == GENERATE_REASONING:
            return b"".join(self._reasoning_events(event["text"]))
        if event.get("event") == GENERATE_DELTA:
            return b"".join(self._delta_events(event["text"], event.get("logprobs")))
        if event.get("event") == GENERATE_TOOL_CALL:
            return b"".join(self._tool_call_events(event["call"]))
        return b""

    def _reasoning_events(self, text: str) -> list[bytes]:
        events = []
        if self._reasoning is None:
            self._reasoning, self._reasoning_open = [], True
            events += [
                self.event("response.output_item.added", output_index=0, item=self.reasoning_item(None, "in_progress")),
                self.event("response.content_part.added", item_id=self.reasoning_id, output_index=0, content_index=0,
                           part={"type": "reasoning_text", "text": ""}),
            ]
        self._reasoning.append(text)
        events.append(self.event(
            "response.reasoning_text.delta", item_id=self.reasoning_id, output_index=0, content_index=0, delta=text
        ))
        return events

    def _close_reasoning(self) -> list[bytes]:
        if not self._reasoning_open:
            return []
        self._reasoning_open = False
        text = "".join(self._reasoning)
        part = {"type": "reasoning_text", "text": text}
        item = self.reasoning_item(text, "completed")
        self._items.append(item)
        return [
            self.event("response.reasoning_text.done", item_id=self.reasoning_id, output_index=0, content_index=0, text=text),
            self.event("response.content_part.done", item_id=self.reasoning_id, output_index=0, content_index=0, part=part),
            self.event("response.output_item.done", output_index=0, item=item),
        ]

    def _open_message(self) -> list[bytes]:
        if self._message is not None:
            return []
        events = self._close_reasoning()
        # The first message has the id the response was made with; one after a call, a new one.
        item_id = self.message_id if not any(item["type"] == "message" for item in self._items) \
            else f"msg_{uuid.uuid4().hex}"
        self._message = _OpenMessage(item_id, len(self._items), [] if self.request.logprobs is not None else None)
        item = {"type": "message", "id": item_id, "status": "in_progress", "role": "assistant", "content": []}
        part = {"type": "output_text", "text": "", "annotations": []}
        return events + [
            self.event("response.output_item.added", output_index=self._message.index, item=item),
            self.event("response.content_part.added", item_id=item_id, output_index=self._message.index,
                       content_index=0, part=part),
        ]

    def _close_message(self, status: str) -> list[bytes]:
        message, self._message = self._message, None
        if message is None:
            return []
        text = "".join(message.texts)
        item = self.message(text, status, message.logprobs, message.id)
        part = item["content"][0]
        self._items.append(item)
        return [
            self.event(
                "response.output_text.done", item_id=message.id, output_index=message.index, content_index=0,
                text=text, logprobs=part.get("logprobs", []),
            ),
            self.event("response.content_part.done", item_id=message.id, output_index=message.index, content_index=0,
                       part=part),
            self.event("response.output_item.done", output_index=message.index, item=item),
        ]

    def _delta_events(self, text: str, logprobs: list[dict] | None) -> list[bytes]:
        events = self._open_message()
        self._message.texts.append(text)
        if self._message.logprobs is not None:
            self._message.logprobs.extend(logprobs or ())
        delta_logprobs = [_delta_logprob(entry) for entry in logprobs or ()]
        events.append(self.event(
            "response.output_text.delta", item_id=self._message.id, output_index=self._message.index,
            content_index=0, delta=text, logprobs=delta_logprobs,
        ))
        return events

    def _tool_call_events(self, call: dict) -> list[bytes]:
        events = self._close_reasoning() + self._close_message("completed")
        index = len(self._items)
        added, done = self.function_call(call, "in_progress"), self.function_call(call)
        self._items.append(done)
        return events + [
            self.event("response.output_item.added", output_index=index, item=added),
            self.event("response.function_call_arguments.delta", item_id=done["id"], output_index=index,
                       delta=call["arguments"]),
            self.event("response.function_call_arguments.done", item_id=done["id"], output_index=index,
                       name=call["name"], arguments=call["arguments"]),
            self.event("response.output_item.done", output_index=index, item=done),
        ]

    def closing_events(self, result: dict) -> list[bytes]:
        status = _status(result)
        events = self._close_reasoning()
        if self._message is None and not any(item["type"] in ("message", "function_call") for item in self._items):
            events += self._open_message()  # an answer without text still has its message
        events += self._close_message("completed" if status == "completed" else "incomplete")
        final = self.response(status, list(self._items), result)
        done_type = "response.incomplete" if status == "incomplete" else "response.completed"
        return events + [self.event(done_type, response=final)]

    def error_event(self, envelope: dict) -> bytes:
        error = envelope["error"]
        return self.event("error", code=error["code"], message=error["message"], param=error["param"], error=error)


@dataclass
class _OpenMessage:
    """A message item being streamed: its id, output index, text so far and logprobs (None
    where the request asked for none)."""

    id: str
    index: int
    logprobs: list[dict] | None
    texts: list[str] = field(default_factory=list)


def _status(result: dict) -> str:
    return "incomplete" if result["finish_reason"] == "length" else "completed"


def _echoed_tool(tool: dict) -> dict:
    """A typed (chat-shaped) tool as the Responses API echoes it."""
    function = tool["function"]
    return {
        "type": "function", "name": function["name"], "description": function.get("description"),
        "parameters": function.get("parameters"), "strict": function.get("strict"),
    }


def _echoed_tool_choice(choice: str | dict | None):
    if isinstance(choice, dict):
        return {"type": "function", "name": chosen_name(choice)}
    return choice or "auto"


def _output_text(text: str, logprobs: list[dict] | None) -> dict:
    part = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = logprobs
    return part


def _delta_logprob(entry: dict) -> dict:
    """A logprobs entry as a text delta event has it (no bytes)."""
    return {
        "token": entry["token"], "logprob": entry["logprob"],
        "top_logprobs": [{"token": top["token"], "logprob": top["logprob"]} for top in entry["top_logprobs"]],
    }
