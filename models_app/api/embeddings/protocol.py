"""The OpenAI embeddings request: its schema, and its translation into the runtime's request.

``parse_embedding_body`` validates a POST /v1/embeddings body the way OpenAI's API takes it:
``input`` a string, a list of strings (a batch), a token array or a list of token arrays (at
most 2048 inputs, none empty); ``encoding_format`` ``float`` (the default) or ``base64``;
``dimensions`` a positive integer (the runtime refuses it where the model cannot honour it);
``user`` the fairness key unless the caller's API key or a fairness header decided it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from models_app.api import limits
from models_app.api.request_body import json_object, validated
from runtime.inference.embedding import EmbeddingRequest
from runtime.errors import InvalidRequest

EMBEDDINGS_PATH = "/v1/embeddings"
MAX_INPUTS = 2048  # as OpenAI's API


Tokens = list[Annotated[StrictInt, Field(ge=0)]]


class EmbeddingBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1)
    # What ``_inputs`` refuses by name first (an empty batch or input, too many, a negative token id),
    # in the schema too.
    input: Union[
        Annotated[StrictStr, Field(min_length=1)],
        Annotated[list[Annotated[StrictStr, Field(min_length=1)]], Field(min_length=1, max_length=MAX_INPUTS)],
        Annotated[Tokens, Field(min_length=1)],
        Annotated[list[Annotated[Tokens, Field(min_length=1)]], Field(min_length=1, max_length=MAX_INPUTS)],
    ]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1, le=limits.MAX_FIELD_INTEGER)
    user: str | None = None


@dataclass
class EmbeddingCall:
    """A parsed embeddings request: the runtime's request and what only the answer's shape needs."""

    embedding: EmbeddingRequest
    encoding_format: str = "float"


def parse_embedding_body(data: Any, fairness_key: str | None) -> EmbeddingCall:
    """Validate a POST /v1/embeddings body; ``fairness_key`` as for ``parse_chat_body``."""
    if "input" in json_object(data) and not _one_shape(data["input"]):
        raise InvalidRequest(
            "$.input: must be a string, a list of strings, a token array (a list of integers) or a list of token arrays",
            param="input",
        )
    inputs = _inputs(data["input"]) if "input" in data else None
    body = validated(EmbeddingBody, data, where=lambda loc: loc[:1])  # a union's branch says nothing to a client
    return EmbeddingCall(
        embedding=EmbeddingRequest(
            request_id="",  # the runtime client names the exchange
            model=body.model,
            inputs=inputs,
            dimensions=body.dimensions,
            fairness_key=limits.fairness_key(fairness_key, body.user),
        ),
        encoding_format=body.encoding_format,
    )


def _one_shape(value: Any) -> bool:
    """Whether ``input`` is one of the four shapes (the union alone would accept a list mixing them)."""
    if isinstance(value, str):
        return True
    if not isinstance(value, list):
        return False
    kinds = {_kind(item) for item in value}
    return len(kinds) <= 1 and None not in kinds


def _kind(item: Any) -> str | None:
    if isinstance(item, str):
        return "string"
    if isinstance(item, int) and not isinstance(item, bool):
        return "token"
    if isinstance(item, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in item):
        return "tokens"
    return None


def _inputs(value) -> list[str] | list[list[int]]:
    """Every input of the request (of one of the four shapes: ``_one_shape``), in order; refuses an
    empty batch, an empty input, too many, a negative token id."""
    if isinstance(value, str):
        inputs = [value]
    elif value and isinstance(value[0], int):
        inputs = [list(value)]
    else:
        inputs = list(value)
    if not inputs:
        raise InvalidRequest("input must not be empty", param="input")
    if len(inputs) > MAX_INPUTS:
        raise InvalidRequest(f"input holds {len(inputs)} inputs; at most {MAX_INPUTS} are accepted", param="input")
    for index, item in enumerate(inputs):
        if not item:
            where = f"input[{index}]" if isinstance(value, list) and not isinstance(value[0], int) else "input"
            raise InvalidRequest(f"{where} must not be empty", param="input")
        if not isinstance(item, str) and any(token < 0 for token in item):
            raise InvalidRequest(f"input[{index}] holds a negative token id", param="input")
    return inputs
