"""What the OpenAI-style generate protocols share (chat completions, completions).

Each protocol parses its body into the typed request (its ``parse``) and shapes the answer
with a builder: ``final(result)`` for a non-streamed answer; for a stream,
``opening_chunk()`` (b"" when the protocol sends none), ``event_chunk(event)`` per runtime
event (b"" for the events it does not show), ``closing_chunks(result)`` and, for an error
after the stream started, ``inference.sse_error``'s last event.  ``openai_create`` builds the
protocol's entry point from the two: key check, the one generate path
(``api.inference.generate``), and the forwarded answer of a model whose engine sends the
client's body on to its upstream (``api.passthrough``).
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from models_app.api.inference import Create, generate, parsed, sse_error
from models_app.api.keys import Caller
from models_app.api.passthrough import forwarded_answer, relay
from models_app.transport.messages import REPLY_CHUNK, REPLY_RESULT
from runtime.errors import LLMPoolError

def openai_create(parse: Callable[[Any, str | None], Any], builder: Callable[[Any], Any]) -> Create:
    """The entry point of a protocol: ``parse(body, fairness_key)`` gives its parsed request
    (with ``.generation``, the typed request), ``builder(request)`` its answer's builder."""

    async def create(data, caller: Caller) -> dict | AsyncIterator[bytes]:
        request = await parsed(parse, data, caller.fairness_key)
        resolved = await caller.resolve(request.generation.model)
        shapes = builder(request)
        outcome = await generate(request.generation, resolved)
        model = request.generation.model
        if request.generation.stream:
            return relay(outcome, model, lambda messages: _sse(shapes, messages))
        return forwarded_answer(outcome, model) or shapes.final(outcome)

    return create


async def _sse(shapes, messages: AsyncIterator[dict]) -> AsyncIterator[bytes]:
    try:
        opening = shapes.opening_chunk()
        if opening:
            yield opening
        async for message in messages:
            if message["kind"] == REPLY_CHUNK:
                chunk = shapes.event_chunk(message["data"])
                if chunk:
                    yield chunk
            elif message["kind"] == REPLY_RESULT:
                yield b"".join(shapes.closing_chunks(message["data"]))
    except LLMPoolError as exc:
        yield sse_error(exc)
    finally:
        await messages.aclose()
