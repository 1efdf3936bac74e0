"""One rerank request (POST /v1/rerank), from the edge to the engine, and what the runtime checks
and runs of it.

The edge parses the body into a ``RerankRequest`` (``runtime.inputs.rerank``) (the query and every document's text, in the
client's order); it crosses the channel layer as ``to_wire()``.  The runtime takes it through
the same path as an embedding (``RuntimeService.op_rerank``): the model lookup,
``check_rerank_request`` (400/403 before it is queued), the controller's admission and its
fair-share scheduler (a ``Ticket`` charged by the pairs' estimated tokens, corrected to the
engine's count), the lease of one replica and the model's ``request_timeout_seconds``.

An engine of a reranking model has ``rerank(query, documents) -> (scores, prompt_tokens)``: one
relevance score per document, in the documents' order (the edge sorts them and keeps the top
ones), and the tokens it read.  llama_cpp scores each (query, document) pair with its rank
pooling as llama-server does; the managed servers and openai_remote answer what their upstream's
rerank endpoint computes; the stub a documented deterministic score.
"""
from __future__ import annotations

from runtime.errors import BackendError, RerankUnsupported
from runtime.inference.deadline import request_deadline
from runtime.inputs.rerank import RerankRequest
from runtime.pool.catalog import CatalogEntry


def check_rerank_request(entry: CatalogEntry, allow_remote: bool) -> None:
    """Refuse (400/403) what the model cannot take, before it is queued."""
    entry.refuse_remote(allow_remote)
    if not entry.spec.rerank(entry.definition):
        raise RerankUnsupported(
            f"model {entry.name} does not rerank (its definition does not set rerank: true)", param="model"
        )


async def rerank_on_engine(controller, lease, request: RerankRequest) -> tuple[list[float], int]:
    """The rerank of ``lease``'s engine within the model's request_timeout_seconds (504 past it,
    and an engine that does not stop is killed: ``timed_out``); checks that the engine answered
    one score per document."""
    async with request_deadline(controller, lease):
        scores, prompt_tokens = await lease.engine.rerank(request.query, request.documents)
    if len(scores) != len(request.documents):
        raise BackendError(f"the engine of model {controller.name} answered {len(scores)} scores "
                           f"for {len(request.documents)} documents")
    return scores, prompt_tokens
