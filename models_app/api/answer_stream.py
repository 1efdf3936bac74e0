"""A streamed answer in a protocol's own shapes: what OpenAI's SSE, Anthropic's SSE and Ollama's
NDJSON streams share.

The runtime's messages (``api.inference.generate``'s stream: ``chunk`` deltas, then the
``result``) become the protocol's bytes through its shaping functions; an error after the stream
started is the stream's last piece (the headers went out with 200), and closing the answer closes
the runtime's stream, which cancels the request there.
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from models_app.transport.messages import REPLY_CHUNK, REPLY_RESULT
from runtime.errors import LLMPoolError


async def shaped_stream(
    messages: AsyncIterator[dict | None],
    *,
    chunk: Callable[[dict], bytes],
    result: Callable[[dict], bytes],
    failure: Callable[[LLMPoolError], bytes],
    opening: Callable[[], bytes] | None = None,
    idle: bytes = b"",
    source: AsyncIterator[dict] | None = None,
) -> AsyncIterator[bytes]:
    """``opening()``, then ``chunk(data)`` of each runtime chunk and ``result(data)`` of the
    result (an empty piece is not sent), ``idle`` for each None in ``messages`` (a protocol's
    keep-alive while the request waits); ``failure(error)`` for an error raised meanwhile.
    ``source``: the runtime's stream when ``messages`` wraps it (closed too, even when the
    wrapper never started)."""
    try:
        if opening is not None and (piece := opening()):
            yield piece
        async for message in messages:
            if message is None:
                piece = idle
            elif message["kind"] == REPLY_CHUNK:
                piece = chunk(message["data"])
            elif message["kind"] == REPLY_RESULT:
                piece = result(message["data"])
            else:
                continue
            if piece:
                yield piece
    except LLMPoolError as exc:
        yield failure(exc)
    finally:
        await messages.aclose()
        if source is not None:
            await source.aclose()
