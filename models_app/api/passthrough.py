"""Forwarded answers: an upstream server's own JSON, sent on to the client.

A model whose engine forwards the client's body to an OpenAI-compatible server (the managed
servers and openai_remote, given a ``ForwardedRequest``) answers with that server's chunks
(the runtime's ``upstream`` events) or its whole answer (the result's ``upstream``).  They reach
the client as the upstream wrote them, with ``model`` set to the name the client asked for.
Every protocol whose parser builds a ``ForwardedRequest`` (chat completions, completions) answers through:

- ``forwarded_answer(result, model)``: the upstream's answer, or None when the model ran the
  typed request itself (then the protocol shapes the result);
- ``relay(messages, model, typed)``: the SSE bytes of a stream: ``data: <chunk>`` per upstream
  chunk, then ``data: [DONE]``; a stream the model runs itself is ``typed(messages)``'s.  The
  first message tells which it is: a forwarded stream opens with its upstream's first chunk.

An error after a forwarded stream opened is one ``data: {"error": {code, message, param}}``
line before ``[DONE]``, as the typed shapes send it (the openai client raises it as APIError).
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from models_app.api.inference import DONE, sse_data, sse_error
from models_app.transport.messages import REPLY_CHUNK, REPLY_RESULT
from runtime.errors import LLMPoolError
from runtime.inputs.request import GENERATE_UPSTREAM

Messages = AsyncIterator[dict]


def forwarded_answer(result: dict, model: str) -> dict | None:
    """The upstream's answer to a forwarded request that did not stream, named ``model``."""
    answer = result.get("upstream")
    return None if answer is None else {**answer, "model": model}


def _is_upstream(message: dict | None) -> bool:
    return message is not None and message["kind"] == REPLY_CHUNK and message["data"].get("event") == GENERATE_UPSTREAM


async def relay(messages: Messages, model: str, typed: Callable[[Messages], AsyncIterator[bytes]]) -> AsyncIterator[bytes]:
    """The SSE bytes of a stream: the upstream's chunks when the model forwarded the request,
    else ``typed``'s.  Closing it closes ``messages`` (the runtime then cancels the request)."""
    try:
        try:
            first = await anext(messages, None)
        except LLMPoolError as exc:
            yield sse_error(exc)
            return
        shaped = _forwarded(_chained(first, messages), model) if _is_upstream(first) else typed(_chained(first, messages))
        async for piece in shaped:
            yield piece
    finally:
        await messages.aclose()


async def _forwarded(messages: Messages, model: str) -> AsyncIterator[bytes]:
    try:
        async for message in messages:
            if _is_upstream(message):
                yield sse_data({**message["data"]["chunk"], "model": model})
            elif message["kind"] == REPLY_RESULT:
                yield DONE
    except LLMPoolError as exc:
        yield sse_error(exc)


async def _chained(first: dict | None, rest: Messages) -> Messages:
    if first is not None:
        yield first
    async for message in rest:
        yield message
