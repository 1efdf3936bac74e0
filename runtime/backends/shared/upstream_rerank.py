"""The rerank client the managed servers and openai_remote speak (llama-server's, vLLM's, Jina's and
Cohere's rerank endpoint: one shape).

``create_rerank`` posts ``{"model", "query", "documents", "top_n": len(documents)}`` (the model name rewritten to the upstream's, every document asked for,
so the edge sorts and cuts them all alike) and answers one score per document in the documents'
order (from each result's ``index`` and ``relevance_score``) with the upstream's
``usage.prompt_tokens`` (or ``total_tokens``, which vLLM reports).  Error answers map as for chat
(``openai_chat.upstream_error``): a refused request is our 400, anything else ``failure``.
"""
from __future__ import annotations

import httpx

from runtime.backends.shared.openai_chat import upstream_error
from runtime.errors import LLMPoolError
from runtime.inputs.rerank import estimate_rerank_tokens


async def create_rerank(
    client: httpx.AsyncClient,
    url: str,
    model: str,
    query: str,
    documents: list[str],
    upstream: str,
    failure: type[LLMPoolError],
) -> tuple[list[float], int]:
    body = {"model": model, "query": query, "documents": documents, "top_n": len(documents)}
    response = await client.post(url, json=body)
    if response.status_code != 200:
        raise upstream_error(response.status_code, response.content, upstream, failure)
    try:
        answer = response.json()
        scores: dict[int, float] = {int(item["index"]): float(item["relevance_score"]) for item in answer["results"]}
    except (ValueError, KeyError, TypeError) as exc:
        raise failure(f"{upstream} answered 200 without rerank results (index, relevance_score): {exc!r}") from None
    if sorted(scores) != list(range(len(documents))):
        raise failure(f"{upstream} answered scores for documents {sorted(scores)} of {len(documents)}")
    usage = answer.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    tokens = usage.get("prompt_tokens", usage.get("total_tokens"))
    if not isinstance(tokens, int):
        # An upstream that reports no usage: the pairs' estimate, as the scheduler charges it.
        tokens = estimate_rerank_tokens(query, documents)
    return [scores[index] for index in range(len(documents))], tokens
