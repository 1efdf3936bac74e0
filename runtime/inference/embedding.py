"""One embedding request (POST /v1/embeddings), from the edge to the engine, and what the runtime
checks and runs of it.

The edge parses the body into an ``EmbeddingRequest`` (``inputs``: every string, or every token
array, of the request, in order); it crosses the channel layer as ``to_wire()``.  The runtime
takes it through the same path as a generation (``RuntimeService.op_embed``): the model lookup,
``check_embedding_request`` (400/403 before it is queued), the controller's admission and its
fair-share scheduler (a ``Ticket`` charged by the inputs' estimated tokens, corrected to the
engine's count), the lease of one replica and the model's ``request_timeout_seconds``.

An engine of an embedding model has ``embed(inputs, dimensions=None) -> (vectors, prompt_tokens)``:
one vector per input, in order, and the tokens it read.  The local engines (llama_cpp, stub)
answer L2-normalized vectors (unit length, as OpenAI's and llama-server's); an upstream
(llama_server, vllm_serve, openai_remote) answers what it computes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from runtime.errors import BackendError, EmbeddingsUnsupported, InvalidRequest
from runtime.inference.deadline import request_deadline
from runtime.inputs.wire import Wire
from runtime.queue_terms import DEFAULT_PRIORITY

if TYPE_CHECKING:  # runtime.pool.catalog imports the backends, which import this module
    from runtime.pool.catalog import CatalogEntry

# Inputs are every string or every token array of a request.
Inputs = list[str] | list[list[int]]


@dataclass
class EmbeddingRequest(Wire):
    """``inputs`` as parsed (never empty; no input empty); ``dimensions`` the vector size asked
    for, or None (the model's own); ``fairness_key``, ``priority``, ``queue_timeout_seconds`` and
    ``weight`` as for ``GenerationRequest``."""

    request_id: str
    model: str
    inputs: Inputs
    dimensions: int | None = None
    fairness_key: str | None = None
    priority: str = DEFAULT_PRIORITY
    queue_timeout_seconds: float | None = None
    weight: float | None = None

    @property
    def token_arrays(self) -> bool:
        return bool(self.inputs) and not isinstance(self.inputs[0], str)


def estimate_input_tokens(request: EmbeddingRequest) -> int:
    """The fair-share charge before the engine counts: a token array's length, else about four
    characters a token (as ``runtime.inference.admission.estimate_prompt_tokens``)."""
    if request.token_arrays:
        return sum(len(tokens) for tokens in request.inputs)
    return sum(len(text) // 4 + 1 for text in request.inputs)


def check_embedding_request(entry: CatalogEntry, request: EmbeddingRequest, allow_remote: bool) -> None:
    """Refuse (400/403) what the model cannot take, before it is queued."""
    spec, definition = entry.spec, entry.definition
    entry.refuse_remote(allow_remote)
    if not spec.embeddings(definition):
        raise EmbeddingsUnsupported(
            f"model {entry.name} does not compute embeddings (its definition does not set embeddings: true)",
            param="model",
        )
    if request.dimensions is not None and not spec.embedding_dimensions(definition):
        raise InvalidRequest(
            f"model {entry.name} answers vectors of its own size; dimensions is not supported "
            f"by backend {definition.backend} (leave it out)",
            param="dimensions",
        )


async def embed_on_engine(controller, lease, request: EmbeddingRequest) -> tuple[list[list[float]], int]:
    """The embed of ``lease``'s engine within the model's request_timeout_seconds (504 past it, and
    an engine that does not stop is killed: ``timed_out``); checks that the engine answered one
    vector per input."""
    async with request_deadline(controller, lease):
        vectors, prompt_tokens = await lease.engine.embed(request.inputs, dimensions=request.dimensions)
    if len(vectors) != len(request.inputs):
        raise BackendError(f"the engine of model {controller.name} answered {len(vectors)} vectors "
                           f"for {len(request.inputs)} inputs")
    return vectors, prompt_tokens
