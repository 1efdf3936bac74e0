"""The OpenAI (legacy) completions request: its schema, and its translation into the typed request.

``parse_completion_body`` builds a ``GenerationRequest`` with a raw text ``prompt`` and no
messages: only a model whose engine runs raw prompts takes it (capability ``raw_prompt``;
else the runtime answers 400 ``raw_prompt_unsupported``).  As on chat completions, fields that
change nothing here are accepted and ignored, and what the typed path cannot honour (several
prompts, token-id prompts, ``n``/``best_of`` > 1, ``echo``, ``suffix``, ``logit_bias``, fields it
does not know) is recorded in the ``ForwardedRequest``'s ``typed_refusals``, beside the client's
body: a model whose engine forwards the body lets its upstream judge them; any other model
answers 400 naming the first of them.  ``seed``, the penalties and ``logprobs`` go into the
typed request's fields, which the runtime checks against the engine's
``capabilities.sampling_options`` (a penalty of 0 is no penalty: left unset).
"""
from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import Field, StrictInt, StrictStr

from models_app.api import limits
from models_app.api.request_body import (
    OpenAIBody,
    OpenAIRequest,
    json_object,
    openai_request,
    refuse_changes,
    refuse_unknown,
    validated,
)
from runtime.errors import InvalidRequest, LLMPoolError

COMPLETIONS_PATH = "/v1/completions"
PROMPT_SHAPES = "$.prompt: must be a string, a list of strings, a list of token ids or a list of such lists"


class CompletionBody(OpenAIBody):
    # Strict members: a list of token ids must not be read as a list of strings, or the reverse.
    # None of them empty (``_refuse_empty_prompt`` says so first, by name).
    prompt: Union[
        Annotated[StrictStr, Field(min_length=1)],
        Annotated[list[Annotated[StrictStr, Field(min_length=1)]], Field(min_length=1)],
        Annotated[list[StrictInt], Field(min_length=1)],
        Annotated[list[Annotated[list[StrictInt], Field(min_length=1)]], Field(min_length=1)],
    ]
    max_tokens: int | None = Field(None, ge=1, le=limits.MAX_FIELD_INTEGER)
    best_of: int | None = Field(None, ge=1, le=limits.MAX_FIELD_INTEGER)
    echo: bool | None = None
    suffix: str | None = None
    logprobs: int | None = Field(None, ge=0, le=20)  # alternatives per token (chat's top_logprobs bound)


# Refused (recorded) when set to a value that would change the answer.
_CHANGES_THE_ANSWER = {
    "n": lambda value: value > 1,
    "best_of": lambda value: value > 1,
    "echo": bool,
    "suffix": bool,
    "logit_bias": bool,
}


def parse_completion_body(data: Any, fairness_key: str | None) -> OpenAIRequest:
    """Validate a POST /v1/completions body into the typed request (unset sampling left None);
    ``fairness_key`` as for ``parse_responses_body``."""
    limits.check_generation_bounds(json_object(data), items=None)
    _refuse_empty_prompt(data.get("prompt"))
    body = validated(CompletionBody, data, where=_field_loc, shapes={"prompt": PROMPT_SHAPES})
    refused: list[LLMPoolError] = []
    prompt = _prompt(body.prompt, refused)
    refuse_changes(body, _CHANGES_THE_ANSWER, refused)
    refuse_unknown(body, COMPLETIONS_PATH, refused)
    return openai_request(
        body, fairness_key, refused, messages=[], prompt=prompt, max_output_tokens=body.max_tokens,
        logprobs=body.logprobs, path=COMPLETIONS_PATH, data=data,
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


def _field_loc(loc: tuple) -> tuple:
    """stop's location without pydantic's union tag (stop.str)."""
    return loc[:1] if loc[:1] == ("stop",) else loc
