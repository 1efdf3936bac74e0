"""A rerank request as engines and the scheduler see it: the query and every document's text,
in the client's order (``runtime.inference.rerank`` checks and runs it), and its fair-share
charge before the engine counts."""
from __future__ import annotations

from dataclasses import dataclass

from runtime.inputs.wire import Wire
from runtime.queue_terms import DEFAULT_PRIORITY


@dataclass
class RerankRequest(Wire):
    """``documents`` as parsed (never empty); ``fairness_key``, ``priority``,
    ``queue_timeout_seconds`` and ``weight`` as for ``GenerationRequest``."""

    request_id: str
    model: str
    query: str
    documents: list[str]
    fairness_key: str | None = None
    priority: str = DEFAULT_PRIORITY
    queue_timeout_seconds: float | None = None
    weight: float | None = None


def estimate_rerank_tokens(query: str, documents: list[str]) -> int:
    """The fair-share charge before the engine counts: every (query, document) pair is read, at
    about four characters a token (as ``runtime.inference.admission.estimate_prompt_tokens``)."""
    return sum((len(query) + len(document)) // 4 + 1 for document in documents)
