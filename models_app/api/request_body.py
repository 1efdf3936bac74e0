"""What the inference protocols' parsers share: a body that is a JSON object, validated strictly
by the protocol's pydantic model with its first problem answered as one 400 ``invalid_request``
naming the field (``$.messages[0].content: ...``, ``param`` the path without ``$.``), and the
OpenAI fields that chat completions and completions read alike (``stream_options``, ``stop``,
the fields refused where they would change the answer).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from models_app.api import limits
from runtime.config import json_path
from runtime.errors import InvalidRequest, LLMPoolError
from runtime.inputs.request import ForwardedRequest, GenerationRequest

Body = TypeVar("Body", bound=BaseModel)


def json_object(data: Any) -> dict:
    """``data`` when it is a JSON object; anything else is refused before any field is read."""
    if not isinstance(data, dict):
        raise InvalidRequest("the request body must be a JSON object")
    return data


def validated(model: type[Body], data: dict, *, where: Callable[[tuple], tuple] = tuple,
              shapes: dict[str, str] | None = None) -> Body:
    """``data`` validated strictly as ``model``.  ``where`` turns pydantic's location of the first
    problem into the client's (dropping a union's branch or a discriminator's tag, which say
    nothing to a client); a top-level field in ``shapes`` whose value has the wrong shape is
    refused with its message there instead of pydantic's (a field of several shapes)."""
    try:
        return model.model_validate(data, strict=True)
    except ValidationError as exc:
        problem = exc.errors()[0]
        field = problem["loc"][0] if problem["loc"] else None
        if shapes and field in shapes and problem["type"] != "missing":
            raise InvalidRequest(shapes[field], param=field) from exc
        path = json_path(where(problem["loc"]))
        raise InvalidRequest(f"{path}: {problem['msg']}", param=path.removeprefix("$.")) from exc


def text_shorthand(part_type: str):
    """A message's ``content`` validator (run before the field's own): a string becomes one text
    part of ``part_type``, so no union of shapes hides an invalid body's real problem behind a
    "should be a valid string" for the other shape; a user message's "" is no content, as [] is,
    and both are refused by the list's minimum."""
    def shorthand(cls, value, info: ValidationInfo):
        if value == "" and info.data.get("role") == "user":
            return []
        return [{"type": part_type, "text": value}] if isinstance(value, str) else value

    return field_validator("content", mode="before")(classmethod(shorthand))


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = None


class OpenAIBody(BaseModel):
    """The fields chat completions and completions bodies share (what ``openai_request`` reads).

    Fields a body does not declare are kept (``model_extra``) and recorded as refused: an upstream
    that the body is forwarded to may know them (llama-server's n_probs and grammar, vLLM's top_k ...)."""

    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int | None = Field(None, ge=1, le=limits.MAX_FIELD_INTEGER)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: limits.StopSequences = None
    user: str | None = None
    # Carried in the typed request (a penalty of 0 changes nothing: left out).
    seed: int | None = Field(None, ge=limits.MIN_INTEGER, le=limits.MAX_INTEGER)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    # Refused when set to anything that would change the answer (each protocol's ``refuse_changes``).
    logit_bias: dict[str, float] | None = None
    # Accepted for client compatibility; they change nothing here.
    store: bool | None = None
    metadata: dict | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None


@dataclass
class OpenAIRequest:
    """A parsed chat completions or completions request: the client's body with its typed request
    (what the runtime gets) and what only the answer's shape needs."""

    forwarded: ForwardedRequest
    include_usage: bool = False


def openai_request(body: OpenAIBody, fairness_key: str | None, refused: list[LLMPoolError], *,
                   path: str, data: dict, messages_from_body: bool = False, **fields) -> OpenAIRequest:
    """The parsed request of a chat completions or completions ``body`` (``data`` as the client
    sent it to ``path``): the typed request of ``fields`` (the protocol's own) and the fields both
    read alike; ``fairness_key`` as the edge decided it, else the body's ``user``; ``refused`` what
    the typed request cannot honour; ``messages_from_body`` as ``ForwardedRequest`` says."""
    stream = bool(body.stream)
    typed = GenerationRequest(
        request_id="",  # the runtime client names the exchange
        model=body.model,
        temperature=body.temperature,
        top_p=body.top_p,
        stream=stream,
        fairness_key=limits.fairness_key(fairness_key, body.user),
        stop=stop_sequences(body.stop),
        seed=body.seed,
        presence_penalty=body.presence_penalty or None,  # a penalty of 0 is none
        frequency_penalty=body.frequency_penalty or None,
        **fields,
    )
    forwarded = ForwardedRequest(typed, path, data, messages_from_body, [error.to_dict() for error in refused])
    options = body.stream_options
    return OpenAIRequest(forwarded, stream and options is not None and bool(options.include_usage))


def function_tools(functions: list[dict], *, noun: str = "function", name_param: str = "name") -> list[dict] | None:
    """``functions`` (each ``{"name", ...}``) as the typed request's tools, chat completions' shape
    (``{"type": "function", "function"}``); None for none.  A second function of one name is a 400
    naming it (``tools[i].<name_param>``, the protocol's ``noun`` in the message)."""
    if not functions:
        return None
    seen: set[str] = set()
    for index, function in enumerate(functions):
        name = function["name"]
        if name in seen:
            raise InvalidRequest(f"tools[{index}]: a second {noun} named {name!r}",
                                 param=f"tools[{index}].{name_param}")
        seen.add(name)
    return [{"type": "function", "function": function} for function in functions]


def stop_sequences(stop: str | list[str] | None) -> list[str] | None:
    """``stop`` as the typed request takes it: a list of the non-empty sequences, or None."""
    sequences = [stop] if isinstance(stop, str) else list(stop or ())
    sequences = [sequence for sequence in sequences if sequence]
    return sequences or None


def refuse_changes(body: BaseModel, changes_the_answer: dict[str, Callable[[Any], bool]],
                   refused: list[LLMPoolError]) -> None:
    """Record each field of ``changes_the_answer`` set to a value that would change the answer
    (the typed path cannot honour it; a model that forwards the body lets its upstream judge)."""
    for name, changes in changes_the_answer.items():
        value = getattr(body, name)
        if value is not None and changes(value):
            refused.append(InvalidRequest(f"{name} is not supported by this model; leave it out", param=name))


def refuse_unknown(body: BaseModel, path: str, refused: list[LLMPoolError]) -> None:
    """Record each field the protocol's model does not declare (kept in ``model_extra``)."""
    for name in body.model_extra or {}:
        refused.append(InvalidRequest(f"{name} is not a field of {path} for this model", param=name))
