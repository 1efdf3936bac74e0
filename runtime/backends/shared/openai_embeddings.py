"""The OpenAI-compatible embeddings client the managed servers and openai_remote speak.

``create_embeddings`` posts ``{"model", "input", "encoding_format": "float"[, "dimensions"]}`` to
the upstream's embeddings path (the model name rewritten to the upstream's, the inputs as the
client sent them: strings or token arrays) and answers the vectors in input order with the
upstream's ``usage.prompt_tokens``.  The client's ``encoding_format`` is the edge's business:
the upstream always answers floats, which the edge encodes.  Error answers map as for chat
(``openai_chat.upstream_error``): a refused request is our 400, anything else ``failure``.
"""
from __future__ import annotations

import httpx

from runtime.backends.shared.openai_chat import upstream_error
from runtime.errors import LLMPoolError


async def create_embeddings(
    client: httpx.AsyncClient,
    url: str,
    model: str,
    inputs: list,
    dimensions: int | None,
    upstream: str,
    failure: type[LLMPoolError],
) -> tuple[list[list[float]], int]:
    body = {"model": model, "input": inputs, "encoding_format": "float"}
    if dimensions is not None:
        body["dimensions"] = dimensions
    response = await client.post(url, json=body)
    if response.status_code != 200:
        raise upstream_error(response.status_code, response.content, upstream, failure)
    try:
        answer = response.json()
        items = sorted(answer["data"], key=lambda item: item["index"])
        vectors = [[float(value) for value in item["embedding"]] for item in items]
    except (ValueError, KeyError, TypeError) as exc:
        raise failure(f"{upstream} answered 200 without a list of float embeddings: {exc!r}") from None
    if len(vectors) != len(inputs):
        raise failure(f"{upstream} answered {len(vectors)} embeddings for {len(inputs)} inputs")
    usage = answer.get("usage") or {}
    prompt_tokens = usage.get("prompt_tokens")
    if not isinstance(prompt_tokens, int):
        # An upstream that reports no usage: the inputs' estimate, as the scheduler charges it.
        prompt_tokens = sum(len(item) if isinstance(item, list) else len(item) // 4 + 1 for item in inputs)
    return vectors, prompt_tokens
