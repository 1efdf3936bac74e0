"""The rerank request in the Jina / Cohere shape: its schema, and its translation into the
runtime's request.

``parse_rerank_body`` validates a POST /v1/rerank body: ``query`` a non-empty string;
``documents`` a non-empty list (at most ``limits.MAX_RERANK_DOCUMENTS``) of strings or of objects
``{"text": string}`` (Jina's form), which may be mixed; ``top_n`` how many of the best to answer
(all when left out or larger); ``return_documents`` whether each result carries its document
(Jina's default: true); ``user`` the fairness key unless the caller's API key or a fairness
header decided it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from models_app.api import limits
from models_app.api.request_body import json_object, validated
from runtime.errors import InvalidRequest
from runtime.inputs.rerank import RerankRequest

# Jina's and Cohere's clients post /v1/rerank; llama-server serves all three, vLLM the first two.
RERANK_PATHS = ("/v1/rerank", "/rerank", "/v1/reranking")


class RerankDocument(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: StrictStr


class RerankBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1)
    query: StrictStr = Field(min_length=1)
    documents: list[Union[StrictStr, RerankDocument]] = Field(min_length=1, max_length=limits.MAX_RERANK_DOCUMENTS)
    top_n: int | None = Field(None, ge=1, le=limits.MAX_FIELD_INTEGER)
    return_documents: bool = True
    user: str | None = None


@dataclass
class RerankCall:
    """A parsed rerank request: the runtime's request and what only the answer's shape needs."""

    rerank: RerankRequest
    top_n: int
    return_documents: bool = True


def parse_rerank_body(data: Any, fairness_key: str | None) -> RerankCall:
    """Validate a POST /v1/rerank body; ``fairness_key`` as for ``parse_chat_body``."""
    documents = json_object(data).get("documents")
    if isinstance(documents, list) and len(documents) > limits.MAX_RERANK_DOCUMENTS:  # named before each is read
        raise InvalidRequest(
            f"documents holds {len(documents)} documents; at most {limits.MAX_RERANK_DOCUMENTS} are accepted",
            param="documents",
        )
    body = validated(RerankBody, data, where=_without_branch)
    texts = [item if isinstance(item, str) else item.text for item in body.documents]
    return RerankCall(
        rerank=RerankRequest(
            request_id="",  # the runtime client names the exchange
            model=body.model,
            query=body.query,
            documents=texts,
            fairness_key=limits.fairness_key(fairness_key, body.user),
        ),
        top_n=min(body.top_n or len(texts), len(texts)),
        return_documents=body.return_documents,
    )


def _without_branch(loc: tuple) -> tuple:
    """A document's location without the union branch pydantic names (``str``, ``RerankDocument``)."""
    if len(loc) >= 3 and loc[0] == "documents":
        return loc[:2] + loc[3:]
    return loc
