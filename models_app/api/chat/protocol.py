"""The OpenAI chat completions request: its schema, and its translation into the typed request.

``parse_chat_body`` builds the same ``GenerationRequest`` the Responses parser builds (parts in
the Responses input shape: ``text`` -> ``input_text``, ``image_url`` -> ``input_image``), so
the runtime checks and runs both protocols alike.  Fields that change nothing here are
accepted and ignored.  ``seed``, the penalties and ``logprobs``/``top_logprobs`` are carried
in the typed request; the runtime refuses them for a model whose engine does not honour them
(``capabilities.sampling_options``).  ``reasoning_effort`` is carried too (the runtime maps it
onto the model's thinking modes) unless ``thinking`` is set, which wins.  Fields the typed
path cannot honour (and that would silently change
the answer) are recorded in ``GenerationRequest.refused``, with the client's body as
``passthrough``: a model whose engine forwards the body to an OpenAI-compatible server lets
that server judge them; any other model answers 400 naming the first of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from runtime.config import json_path
from runtime.errors import InvalidRequest, LLMPoolError, ToolsUnsupported
from runtime.request import GenerationRequest


class _Part(BaseModel):
    model_config = ConfigDict(extra="allow")


class TextPart(_Part):
    type: Literal["text"]
    text: str


class RefusalPart(_Part):
    type: Literal["refusal"]
    refusal: str


class ImageUrl(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(_Part):
    type: Literal["image_url"]
    image_url: ImageUrl


class AudioPart(_Part):
    type: Literal["input_audio"]
    input_audio: dict


class FilePart(_Part):
    type: Literal["file"]
    file: dict


ChatPart = Annotated[Union[TextPart, RefusalPart, ImagePart, AudioPart, FilePart], Field(discriminator="type")]


class ChatMessage(BaseModel):
    # Other message fields (a name, an echoed reasoning_content) change nothing here.
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: list[ChatPart] | None = None
    tool_calls: list[dict] | None = None
    function_call: dict | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _string_content(cls, value):
        return [{"type": "text", "text": value}] if isinstance(value, str) else value


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = None


class ChatBody(BaseModel):
    # Fields it does not declare are kept (model_extra) and recorded as refused: an upstream that
    # the body is forwarded to may know them (llama-server's n_probs and grammar, vLLM's top_k ...).
    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1)
    messages: list[ChatMessage]
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int | None = Field(None, ge=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    user: str | None = None
    response_format: dict | None = None
    thinking: Literal["default", "enabled", "disabled"] | None = None  # llm-pool's, as on /v1/responses
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    functions: list[dict] | None = None
    function_call: str | dict | None = None
    # Carried in the typed request (a penalty of 0 and logprobs false change nothing: left out).
    seed: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    # Refused when set to anything that would change the answer (see _CHANGES_THE_ANSWER).
    logit_bias: dict[str, float] | None = None
    modalities: list[str] | None = None
    audio: dict | None = None
    web_search_options: dict | None = None
    verbosity: str | None = None
    # Accepted for client compatibility; they change nothing here.
    store: bool | None = None
    metadata: dict | None = None
    parallel_tool_calls: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    prediction: dict | None = None


_CHANGES_THE_ANSWER = {
    "logit_bias": bool,
    "modalities": lambda value: value != ["text"],
    "audio": lambda value: True,
    "web_search_options": lambda value: True,
    "verbosity": lambda value: True,
}


CHAT_COMPLETIONS_PATH = "/v1/chat/completions"


@dataclass
class ChatRequest:
    """A parsed chat completions request: the typed request and what only the answer's shape needs."""

    generation: GenerationRequest
    include_usage: bool = False


def parse_chat_body(data: Any, fairness_key: str | None) -> ChatRequest:
    """Validate a POST /v1/chat/completions body into the typed request (unset sampling left None);
    ``fairness_key`` as for ``parse_responses_body``."""
    if not isinstance(data, dict):
        raise InvalidRequest("the request body must be a JSON object")
    try:
        body = ChatBody.model_validate(data)
    except ValidationError as exc:
        problem = exc.errors()[0]
        path = json_path(_field_loc(problem["loc"]))
        raise InvalidRequest(f"{path}: {problem['msg']}", param=path.removeprefix("$.")) from exc
    if not body.messages:
        raise InvalidRequest("messages must not be empty", param="messages")
    refused: list[LLMPoolError] = []
    _refuse_what_changes_the_answer(body, refused)
    _check_tools(body, refused)
    for name in body.model_extra or {}:
        refused.append(InvalidRequest(f"{name} is not a field of /v1/chat/completions for this model", param=name))
    messages = [_message(index, message, refused) for index, message in enumerate(body.messages)]
    stream = bool(body.stream)
    return ChatRequest(
        generation=GenerationRequest(
            request_id="",  # the runtime client names the exchange
            model=body.model,
            messages=messages,
            max_output_tokens=body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            stream=stream,
            thinking=body.thinking,
            response_format=_response_format(body.response_format),
            fairness_key=fairness_key if fairness_key is not None else body.user,
            stop=_stop_sequences(body.stop),
            seed=body.seed,
            presence_penalty=body.presence_penalty or None,
            frequency_penalty=body.frequency_penalty or None,
            logprobs=_logprobs(body),
            reasoning_effort=None if body.thinking is not None else body.reasoning_effort,
            passthrough={"path": CHAT_COMPLETIONS_PATH, "body": data},
            refused=[error.to_dict() for error in refused],
        ),
        include_usage=stream and body.stream_options is not None and bool(body.stream_options.include_usage),
    )


def _field_loc(loc: tuple) -> tuple:
    """Drop the part-type tag pydantic puts after a content index: messages.0.content.1.<tag>.text."""
    if len(loc) > 4 and loc[0] == "messages" and loc[2] == "content":
        return loc[:4] + loc[5:]
    return loc


def _refuse_what_changes_the_answer(body: ChatBody, refused: list[LLMPoolError]) -> None:
    if body.n is not None and body.n > 1:
        refused.append(InvalidRequest("n must be 1: llm-pool generates one choice per request", param="n"))
    for name, changes in _CHANGES_THE_ANSWER.items():
        value = getattr(body, name)
        if value is not None and changes(value):
            refused.append(InvalidRequest(f"{name} is not supported by this model; leave it out", param=name))


def _check_tools(body: ChatBody, refused: list[LLMPoolError]) -> None:
    """Tools are ignored under tool_choice (function_call) "none"; anything else that asks for
    them is tools_unsupported on the typed path until tool calling lands."""
    for tools, choice, names in (
        (body.tools, body.tool_choice, ("tools", "tool_choice")),
        (body.functions, body.function_call, ("functions", "function_call")),
    ):
        if tools and choice != "none":
            refused.append(ToolsUnsupported(
                f"{names[0]} are not supported by this model; only {names[1]} \"none\" is accepted", param=names[0]
            ))
        if not tools and choice not in (None, "none", "auto"):
            refused.append(ToolsUnsupported(f"{names[1]} {choice!r} needs tools", param=names[1]))


def _message(index: int, message: ChatMessage, refused: list[LLMPoolError]) -> dict:
    where = f"messages[{index}]"
    if message.role in ("tool", "function") or message.tool_calls or message.function_call:
        refused.append(ToolsUnsupported(f"{where}: tool calls and tool results are not supported by this model", param=where))
        return {"role": message.role, "content": [_part(part) for part in message.content or ()]}
    if message.content is None and message.role != "assistant":
        raise InvalidRequest(f"{where}.content: Field required", param=f"{where}.content")
    return {"role": message.role, "content": [_part(part) for part in message.content or ()]}


def _part(part) -> dict:
    """A chat content part in the Responses input shape the typed request carries."""
    if part.type == "text":
        return {"type": "input_text", "text": part.text}
    if part.type == "refusal":
        return {"type": "input_text", "text": part.refusal}
    if part.type == "image_url":
        image = {"type": "input_image", "image_url": part.image_url.url}
        if part.image_url.detail is not None:
            image["detail"] = part.image_url.detail
        return image
    if part.type == "input_audio":
        return {"type": "input_audio", "input_audio": part.input_audio}
    return {"type": "input_file", **{key: part.file[key] for key in ("file_id", "file_data", "filename") if key in part.file}}


def _response_format(fmt: dict | None) -> dict | None:
    if fmt is None:
        return None
    if fmt.get("type") not in ("text", "json_schema", "json_object"):
        raise InvalidRequest("response_format.type must be text, json_schema or json_object", param="response_format")
    if fmt["type"] == "json_schema" and not isinstance(fmt.get("json_schema"), dict):
        raise InvalidRequest("a json_schema response_format needs a json_schema object", param="response_format")
    return fmt


def _logprobs(body: ChatBody) -> int | None:
    """How many alternatives per token the client wants (0: the chosen token's logprob only), or
    None for no logprobs; top_logprobs needs logprobs true, as on OpenAI's API."""
    if body.top_logprobs and not body.logprobs:
        raise InvalidRequest("top_logprobs needs logprobs: true", param="top_logprobs")
    return (body.top_logprobs or 0) if body.logprobs else None


def _stop_sequences(stop: str | list[str] | None) -> list[str] | None:
    sequences = [stop] if isinstance(stop, str) else list(stop or ())
    sequences = [sequence for sequence in sequences if sequence]
    return sequences or None
