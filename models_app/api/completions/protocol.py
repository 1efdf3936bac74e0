"""The OpenAI (legacy) completions request: its schema, and its translation into the typed request.

``parse_completion_body`` builds a ``GenerationRequest`` with a raw text ``prompt`` and no
messages: only a model whose engine runs raw prompts takes it (capability ``raw_prompt``;
else the runtime answers 400 ``raw_prompt_unsupported``).  As on chat completions, fields that
change nothing here are accepted and ignored, and what the typed path cannot honour (several
prompts, token-id prompts, ``n``/``best_of`` > 1, ``echo``, ``suffix``, ``logit_bias``, fields it
does not know) is recorded in ``GenerationRequest.refused`` with the client's body as
``passthrough``: a model whose engine forwards the body lets its upstream judge them; any other
model answers 400 naming the first of them.  ``seed``, the penalties and ``logprobs`` go into the
typed request's fields, which the runtime checks against the engine's
``capabilities.sampling_options`` (a penalty of 0 is no penalty: left unset).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from models_app.api import limits
from runtime.config import json_path
from runtime.errors import InvalidRequest, LLMPoolError
from runtime.inputs.request import GenerationRequest

COMPLETIONS_PATH = "/v1/completions"
PROMPT_SHAPES = "$.prompt: must be a string, a list of strings, a list of token ids or a list of such lists"


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = None


class CompletionBody(BaseModel):
    # Fields it does not declare are kept (model_extra) and recorded as refused: an upstream
    # that the body is forwarded to may know them (llama-server's n_probs, vLLM's top_k ...).
    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1)
    # Strict members: a list of token ids must not be read as a list of strings, or the reverse.
    # None of them empty (``_refuse_empty_prompt`` says so first, by name).
    prompt: Union[
        Annotated[StrictStr, Field(min_length=1)],
        Annotated[list[Annotated[StrictStr, Field(min_length=1)]], Field(min_length=1)],
        Annotated[list[StrictInt], Field(min_length=1)],
        Annotated[list[Annotated[list[StrictInt], Field(min_length=1)]], Field(min_length=1)],
    ]
    max_tokens: int | None = Field(None, ge=1, le=limits.MAX_FIELD_INTEGER)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int | None = Field(None, ge=1, le=limits.MAX_FIELD_INTEGER)
    best_of: int | None = Field(None, ge=1, le=limits.MAX_FIELD_INTEGER)
    echo: bool | None = None
    suffix: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: limits.StopSequences = None
    user: str | None = None
    seed: int | None = Field(None, ge=limits.MIN_INTEGER, le=limits.MAX_INTEGER)
    logprobs: int | None = Field(None, ge=0, le=20)  # alternatives per token (chat's top_logprobs bound)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    # Accepted for client compatibility; they change nothing here.
    store: bool | None = None
    metadata: dict | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None


# Refused (recorded) when set to a value that would change the answer.
_CHANGES_THE_ANSWER = {
    "n": lambda value: value > 1,
    "best_of": lambda value: value > 1,
    "echo": bool,
    "suffix": bool,
    "logit_bias": bool,
}


@dataclass
class CompletionRequest:
    """A parsed completions request: the typed request and what only the answer's shape needs."""

    generation: GenerationRequest
    include_usage: bool = False


def parse_completion_body(data: Any, fairness_key: str | None) -> CompletionRequest:
    """Validate a POST /v1/completions body into the typed request (unset sampling left None);
    ``fairness_key`` as for ``parse_responses_body``."""
    if not isinstance(data, dict):
        raise InvalidRequest("the request body must be a JSON object")
    limits.check_generation_bounds(data, items=None)
    _refuse_empty_prompt(data.get("prompt"))
    try:
        body = CompletionBody.model_validate(data, strict=True)
    except ValidationError as exc:
        problem = exc.errors()[0]
        if problem["loc"][:1] == ("prompt",) and problem["type"] != "missing":
            raise InvalidRequest(PROMPT_SHAPES, param="prompt") from exc
        loc = problem["loc"]
        path = json_path(loc[:1] if loc[:1] == ("stop",) else loc)  # not pydantic's union tag (stop.str)
        raise InvalidRequest(f"{path}: {problem['msg']}", param=path.removeprefix("$.")) from exc
    refused: list[LLMPoolError] = []
    prompt = _prompt(body.prompt, refused)
    for name, changes in _CHANGES_THE_ANSWER.items():
        value = getattr(body, name)
        if value is not None and changes(value):
            refused.append(InvalidRequest(f"{name} is not supported by this model; leave it out", param=name))
    for name in body.model_extra or {}:
        refused.append(InvalidRequest(f"{name} is not a field of /v1/completions for this model", param=name))
    stream = bool(body.stream)
    return CompletionRequest(
        generation=GenerationRequest(
            request_id="",  # the runtime client names the exchange
            model=body.model,
            messages=[],
            prompt=prompt,
            max_output_tokens=body.max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            stream=stream,
            fairness_key=limits.fairness_key(fairness_key, body.user),
            stop=_stop_sequences(body.stop),
            seed=body.seed,
            presence_penalty=body.presence_penalty or None,
            frequency_penalty=body.frequency_penalty or None,
            logprobs=body.logprobs,
            passthrough={"path": COMPLETIONS_PATH, "body": data},
            refused=[error.to_dict() for error in refused],
        ),
        include_usage=stream and body.stream_options is not None and bool(body.stream_options.include_usage),
    )


def _prompt(prompt: str | list, refused: list[LLMPoolError]) -> str:
    """The one text prompt the typed path runs.  Several prompts (one choice each) and prompts of
    token ids are recorded as refused; their text (none for token ids) still sizes the request."""
    if isinstance(prompt, str):
        texts = [prompt]
    elif all(isinstance(item, str) for item in prompt):
        texts = list(prompt)
    else:
        refused.append(InvalidRequest("prompt: token-id prompts are not supported by this model; send text", param="prompt"))
        return ""
    if len(texts) != 1:
        refused.append(InvalidRequest(
            f"prompt: this model takes exactly one prompt, got {len(texts)}", param="prompt"
        ))
    return "".join(texts)


def _refuse_empty_prompt(prompt: Any) -> None:
    """An empty prompt ("", [], or a list with an empty member) is refused for every model, as an
    empty user message is on chat completions: nothing is loaded or queued for it."""
    if prompt == "" or prompt == [] or isinstance(prompt, list) and any(member in ("", []) for member in prompt):
        raise InvalidRequest("prompt must not be empty", param="prompt")


def _stop_sequences(stop: str | list[str] | None) -> list[str] | None:
    sequences = [stop] if isinstance(stop, str) else list(stop or ())
    sequences = [sequence for sequence in sequences if sequence]
    return sequences or None
