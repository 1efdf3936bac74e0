"""The OpenAI chat completions request: its schema, and its translation into the typed request.

``parse_chat_body`` builds the same ``GenerationRequest`` the Responses parser builds (parts in
the Responses input shape: ``text`` -> ``input_text``, ``image_url`` -> ``input_image``), so
the runtime checks and runs both protocols alike.  Fields that change nothing here are
accepted and ignored.  ``seed``, the penalties and ``logprobs``/``top_logprobs`` are carried
in the typed request, and so are llama-server's ``top_k`` and ``repeat_penalty``; the runtime
refuses them for a model whose engine does not honour them (``capabilities.sampling_options``).  ``reasoning_effort`` is carried too (the runtime maps it
onto the model's thinking modes) unless ``thinking`` is set, which wins.  Fields the typed
path cannot honour (and that would silently change
the answer) are recorded in the ``ForwardedRequest``'s ``typed_refusals``, beside the client's
body: a model whose engine forwards the body to an OpenAI-compatible server lets that server
judge them; any other model answers 400 naming the first of them.

Tools: ``tools`` (type function: name, description, JSON-schema parameters, strict),
``tool_choice`` (none, auto, required, or a named function, which must be one of the tools)
and ``parallel_tool_calls`` go into the typed request, whose shape errors are 400 naming the
field; assistant messages' ``tool_calls`` and ``tool`` messages (``tool_call_id``, the
result's text) become the typed messages' ``tool_calls`` and ``tool_call_id``.  The runtime
refuses them for a model without ``capabilities.tools``.  The deprecated ``functions`` /
``function_call`` (and ``function`` messages) are not mapped: their answer is another shape
(``message.function_call``), so they are recorded as refused (tools_unsupported: use tools).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from models_app.api import limits
from models_app.api.openapi import response_format_schema, tool_choice_schema
from models_app.api.request_body import (
    OpenAIBody,
    OpenAIRequest,
    function_tools,
    json_object,
    openai_request,
    refuse_changes,
    refuse_unknown,
    text_shorthand,
    validated,
)
from runtime.errors import InvalidRequest, LLMPoolError, ToolsUnsupported
from runtime.inputs.chat_messages import typed_chat_messages


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


TOOL_NAME = r"^[A-Za-z0-9_-]{1,64}$"  # OpenAI's rule for a function's name


class CalledFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    arguments: str


class AssistantToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1)
    type: Literal["function"]
    function: CalledFunction


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=TOOL_NAME)
    description: str | None = None
    parameters: dict | None = None  # a JSON schema (of an object); none: the function takes no argument
    strict: bool | None = None


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: FunctionDefinition


class ChatMessage(BaseModel):
    # Other message fields (a name, an echoed reasoning_content) change nothing here.
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    # A list of parts holds one at least (as OpenAI's schema says); an empty user message is refused.
    content: list[ChatPart] | None = Field(None, min_length=1)
    tool_calls: list[AssistantToolCall] | None = None
    tool_call_id: str | None = None
    function_call: dict | None = None
    _string_content = text_shorthand("text")


class ChatBody(OpenAIBody):
    messages: list[ChatMessage] = Field(min_length=1, max_length=limits.MAX_MESSAGES)
    max_tokens: int | None = Field(None, ge=1, le=limits.MAX_FIELD_INTEGER)
    max_completion_tokens: int | None = Field(None, ge=1, le=limits.MAX_FIELD_INTEGER)
    response_format: Annotated[dict | None, WithJsonSchema(response_format_schema(("json_schema",)))] = None
    thinking: Literal["default", "enabled", "disabled"] | None = None  # llm-pool's, as on /v1/responses
    tools: list[FunctionTool] | None = Field(None, max_length=limits.MAX_TOOLS)
    # Checked by _tool_choice (400 naming tool_choice), whose rules the schema states.
    tool_choice: Annotated[str | dict | None, WithJsonSchema(tool_choice_schema({
        "function": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"],
                     "additionalProperties": False},
    }))] = None
    parallel_tool_calls: bool | None = None
    functions: list[dict] | None = None
    function_call: str | dict | None = None
    # Carried in the typed request (logprobs false changes nothing: left out).
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    # llama-server's and vLLM's extensions, carried where the engine has them (0 and 1: none).
    top_k: limits.TopK = None
    repeat_penalty: limits.RepeatPenalty = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    # Refused when set to anything that would change the answer (see _CHANGES_THE_ANSWER).
    modalities: list[str] | None = None
    audio: dict | None = None
    web_search_options: dict | None = None
    verbosity: str | None = None
    # Accepted for client compatibility; it changes nothing here.
    prediction: dict | None = None


_CHANGES_THE_ANSWER = {
    "logit_bias": bool,
    "modalities": lambda value: value != ["text"],
    "audio": lambda value: True,
    "web_search_options": lambda value: True,
    "verbosity": lambda value: True,
}


CHAT_COMPLETIONS_PATH = "/v1/chat/completions"


def parse_chat_body(data: Any, fairness_key: str | None) -> OpenAIRequest:
    """Validate a POST /v1/chat/completions body into the typed request (unset sampling left None);
    ``fairness_key`` as for ``parse_responses_body``."""
    limits.check_generation_bounds(json_object(data), items="messages")
    body = validated(ChatBody, data, where=_field_loc)
    refused: list[LLMPoolError] = []
    if body.n is not None and body.n > 1:
        refused.append(InvalidRequest("n must be 1: llm-pool generates one choice per request", param="n"))
    refuse_changes(body, _CHANGES_THE_ANSWER, refused)
    _refuse_legacy_functions(body, refused)
    tools = _tools(body)
    refuse_unknown(body, CHAT_COMPLETIONS_PATH, refused)
    for index, message in enumerate(body.messages):
        _check_message(index, message, refused)
    return openai_request(
        body, fairness_key, refused,
        messages=typed_chat_messages(data["messages"]),
        max_output_tokens=body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens,
        thinking=body.thinking,
        response_format=_response_format(body.response_format),
        logprobs=_logprobs(body),
        reasoning_effort=None if body.thinking is not None else body.reasoning_effort,
        **limits.sampling_knobs(body.top_k, body.repeat_penalty),
        tools=tools,
        tool_choice=_tool_choice(body.tool_choice, tools),
        parallel_tool_calls=body.parallel_tool_calls,
        path=CHAT_COMPLETIONS_PATH, data=data, messages_from_body=True,
    )


def _field_loc(loc: tuple) -> tuple:
    """Drop the tags pydantic puts in a location: the part type after a content index
    (messages.0.content.1.<tag>.text) and stop's shape (stop.<tag>.2)."""
    if len(loc) > 4 and loc[0] == "messages" and loc[2] == "content":
        return loc[:4] + loc[5:]
    if len(loc) > 1 and loc[0] == "stop":
        return loc[:1] + loc[2:]
    return loc


def _refuse_legacy_functions(body: ChatBody, refused: list[LLMPoolError]) -> None:
    """The deprecated functions / function_call: ignored under function_call "none", else refused."""
    if body.functions and body.function_call != "none":
        refused.append(ToolsUnsupported(
            "functions (deprecated) are not supported by this model; send them as tools", param="functions"
        ))
    if not body.functions and body.function_call not in (None, "none", "auto"):
        refused.append(ToolsUnsupported(f"function_call {body.function_call!r} needs functions", param="function_call"))


def _tools(body: ChatBody) -> list[dict] | None:
    """The tools in the typed request (chat's own shape, unset fields left out)."""
    functions = [tool.function.model_dump(exclude_none=True) for tool in body.tools or ()]
    return function_tools(functions, name_param="function.name")


def _tool_choice(choice: str | dict | None, tools: list[dict] | None) -> str | dict | None:
    """``tool_choice`` checked: none, auto, required (these two with tools) or
    ``{"type": "function", "function": {"name"}}`` naming one of the tools."""
    if choice is None:
        return None
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise InvalidRequest(
                f"tool_choice must be none, auto, required or a named function, not {choice!r}", param="tool_choice"
            )
        if choice == "required" and not tools:
            raise InvalidRequest("tool_choice \"required\" needs tools", param="tool_choice")
        return choice
    function = choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if choice.get("type") != "function" or not isinstance(name, str) or set(choice) != {"type", "function"}:
        raise InvalidRequest(
            'a named tool_choice is {"type": "function", "function": {"name": ...}}', param="tool_choice"
        )
    if name not in [tool["function"]["name"] for tool in tools or ()]:
        raise InvalidRequest(f"tool_choice names function {name!r}, which is not one of the tools", param="tool_choice")
    return {"type": "function", "function": {"name": name}}


def _check_message(index: int, message: ChatMessage, refused: list[LLMPoolError]) -> None:
    """Raise what makes a message invalid, record what the typed path refuses; the typed message
    itself is ``runtime.inputs.chat_messages.typed_chat_message`` of the client's own dict."""
    where = f"messages[{index}]"
    if message.role == "function" or message.function_call:
        refused.append(ToolsUnsupported(
            f"{where}: function messages and function_call (deprecated) are not supported by this model; "
            "use tool_calls and tool messages",
            param=where,
        ))
        return
    if message.content is None and message.role != "assistant":
        raise InvalidRequest(f"{where}.content: Field required", param=f"{where}.content")
    if message.role == "tool":
        if not message.tool_call_id:
            raise InvalidRequest(f"{where}.tool_call_id: a tool message answers a call: Field required",
                                 param=f"{where}.tool_call_id")
        if any(part.type not in ("text", "refusal") for part in message.content):
            raise InvalidRequest(f"{where}.content: a tool result is text", param=f"{where}.content")
    if message.tool_calls and message.role != "assistant":
        raise InvalidRequest(f"{where}.tool_calls: only an assistant message has tool calls",
                             param=f"{where}.tool_calls")


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
