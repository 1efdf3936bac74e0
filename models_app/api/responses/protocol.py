"""OpenAI Responses API shapes: the request schema, its normalisation, and the output objects.

A thinking model's reasoning (split off its answer by the runtime) is a ``reasoning`` output
item before the message (``content: [{"type": "reasoning_text", "text"}]``), streamed as
``response.reasoning_text.delta`` events; ``reasoning.effort`` maps onto ``thinking`` as
chat's ``reasoning_effort`` does.  ``include: ["message.output_text.logprobs"]`` (and
``top_logprobs``) asks for the answer's logprobs where the engine gives them.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from runtime.config import json_path
from runtime.errors import InvalidRequest
from runtime.request import GENERATE_DELTA, GENERATE_REASONING, GenerationRequest


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
    content: list[ContentPart]
    id: str | None = None
    status: str | None = None

    # Shorthands become the full form before validation, so no union of shapes hides the real problem
    # of an invalid body behind a "should be a valid string" for the other shape.
    @field_validator("content", mode="before")
    @classmethod
    def _string_content(cls, value):
        return [{"type": "input_text", "text": value}] if isinstance(value, str) else value


class ReasoningOptions(BaseModel):
    model_config = ConfigDict(extra="allow")  # summary, generate_summary: nothing to summarise here
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None


LOGPROBS_INCLUDE = "message.output_text.logprobs"


class ResponsesBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1)
    input: list[InputMessage]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool = False
    thinking: Literal["default", "enabled", "disabled"] | None = None
    response_format: dict | None = None
    text: dict | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    source_lang_code: str | None = None
    target_lang_code: str | None = None
    # Accepted for client compatibility; they change nothing here.
    store: bool | None = None
    truncation: str | None = None
    service_tier: str | None = None
    parallel_tool_calls: bool | None = None
    include: list[str] | None = None
    stream_options: dict | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # reasoning.effort becomes ``thinking`` in the runtime (the model's thinking modes); an
    # explicit ``thinking`` wins.
    reasoning: ReasoningOptions | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)

    @field_validator("input", mode="before")
    @classmethod
    def _string_input(cls, value):
        return [{"role": "user", "content": value}] if isinstance(value, str) else value


def parse_responses_body(data: Any, fairness_key: str | None) -> GenerationRequest:
    """Validate a POST /v1/responses body into the typed request the runtime and the engine get
    (sampling fields the client left out stay None: the runtime applies its defaults).
    ``fairness_key`` is what the edge decided (``api.keys``: an API key's bucket or a fairness
    header); None leaves the fairness key to the body's ``user``."""
    if not isinstance(data, dict):
        raise InvalidRequest("the request body must be a JSON object")
    try:
        body = ResponsesBody.model_validate(data)
    except ValidationError as exc:
        problem = exc.errors()[0]
        path = json_path(_field_loc(problem["loc"]))
        raise InvalidRequest(f"{path}: {problem['msg']}", param=path.removeprefix("$.")) from exc
    messages = [{"role": m.role, "content": _parts(m.content)} for m in body.input]
    if not messages:
        raise InvalidRequest("input must not be empty", param="input")
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
        fairness_key=fairness_key if fairness_key is not None else body.user,
        extra={
            key: value
            for key, value in (("source_lang_code", body.source_lang_code), ("target_lang_code", body.target_lang_code))
            if value is not None
        },
        reasoning_effort=None if body.thinking is not None or body.reasoning is None else body.reasoning.effort,
        logprobs=(body.top_logprobs or 0) if LOGPROBS_INCLUDE in (body.include or ()) or body.top_logprobs else None,
    )


def _field_loc(loc: tuple) -> tuple:
    """Drop the part-type tag pydantic puts after a content index: input.0.content.1.<tag>.text."""
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
    the first reasoning delta, the message (after it) on the first answer delta, which closes
    the reasoning; one that had no text opens its message when it ends.
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
        self._message_index: int | None = None  # the message item's output_index once opened

    def response(self, status: str, text: str | None = None, result: dict | None = None) -> dict:
        output = []
        if result is not None and "reasoning" in result:
            output.append(self.reasoning_item(result["reasoning"], "completed"))
        if text is not None:
            logprobs = result.get("logprobs") if result is not None else None
            output.append(self.message(text, "completed" if status == "completed" else "incomplete", logprobs))
        usage = None
        if result is not None:
            used = result["usage"]
            usage = {
                "input_tokens": used["input_tokens"],
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
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
            "output": output,
            "parallel_tool_calls": False,
            "temperature": self.request.temperature,
            "top_p": self.request.top_p,
            "tool_choice": "auto",
            "tools": [],
            "usage": usage,
            "user": self.request.fairness_key,
        }

    def message(self, text: str, status: str, logprobs: list[dict] | None = None) -> dict:
        return {
            "type": "message",
            "id": self.message_id,
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

    def final(self, result: dict) -> dict:
        status = "incomplete" if result["finish_reason"] == "length" else "completed"
        return self.response(status, result["text"], result)

    # -- SSE -----------------------------------------------------------------------------
    def event(self, event_type: str, **fields) -> bytes:
        data = {"type": event_type, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {event_type}\ndata: {json.dumps(data)}\n\n".encode()

    def opening_events(self) -> list[bytes]:
        started = self.response("in_progress")
        return [self.event("response.created", response=started), self.event("response.in_progress", response=started)]

    def event_bytes(self, event: dict) -> bytes:
        """The SSE events of one of the runtime's generate events (``reasoning``, ``delta``);
        nothing for the others."""
        if event.get("event") == GENERATE_REASONING:
            return b"".join(self._reasoning_events(event["text"]))
        if event.get("event") == GENERATE_DELTA:
            return b"".join(self._delta_events(event["text"], event.get("logprobs")))
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
        return [
            self.event("response.reasoning_text.done", item_id=self.reasoning_id, output_index=0, content_index=0, text=text),
            self.event("response.content_part.done", item_id=self.reasoning_id, output_index=0, content_index=0, part=part),
            self.event("response.output_item.done", output_index=0, item=self.reasoning_item(text, "completed")),
        ]

    def _open_message(self) -> list[bytes]:
        if self._message_index is not None:
            return []
        events = self._close_reasoning()
        self._message_index = 0 if self._reasoning is None else 1
        item = {"type": "message", "id": self.message_id, "status": "in_progress", "role": "assistant", "content": []}
        part = {"type": "output_text", "text": "", "annotations": []}
        return events + [
            self.event("response.output_item.added", output_index=self._message_index, item=item),
            self.event("response.content_part.added", item_id=self.message_id, output_index=self._message_index,
                       content_index=0, part=part),
        ]

    def _delta_events(self, text: str, logprobs: list[dict] | None) -> list[bytes]:
        events = self._open_message()
        delta_logprobs = [_delta_logprob(entry) for entry in logprobs or ()]
        events.append(self.event(
            "response.output_text.delta", item_id=self.message_id, output_index=self._message_index, content_index=0,
            delta=text, logprobs=delta_logprobs,
        ))
        return events

    def closing_events(self, result: dict) -> list[bytes]:
        final = self.final(result)
        events = self._open_message()
        index = self._message_index
        message = final["output"][index]
        part = message["content"][0]
        done_type = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        return events + [
            self.event(
                "response.output_text.done", item_id=self.message_id, output_index=index, content_index=0,
                text=result["text"], logprobs=part.get("logprobs", []),
            ),
            self.event("response.content_part.done", item_id=self.message_id, output_index=index, content_index=0, part=part),
            self.event("response.output_item.done", output_index=index, item=message),
            self.event(done_type, response=final),
        ]

    def error_event(self, envelope: dict) -> bytes:
        error = envelope["error"]
        return self.event("error", code=error["code"], message=error["message"], param=error["param"], error=error)


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
