"""What the OpenAI-style generate protocols share (chat completions, completions).

Each protocol parses its body into the typed request (its ``parse``) and shapes the answer
with a builder (an ``OpenAIAnswer``): ``final(result)`` for a non-streamed answer; for a
stream, ``opening_chunk()`` (b"" when the protocol sends none), ``event_chunk(event)`` per
runtime event (b"" for the events it does not show) and ``closing_chunks(result)``; an error
after the stream started is ``inference.sse_error``'s last event.  ``openai_create`` builds the
protocol's entry point from the two: key check, the one generate path
(``api.inference.generate``), and the forwarded answer of a model whose engine sends the
client's body on to its upstream (``api.passthrough``).
"""
from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from models_app.api.answer_stream import shaped_stream
from models_app.api.inference import DONE, Create, generate, parsed, sse_data, sse_error
from models_app.api.keys import Caller
from models_app.api.passthrough import forwarded_answer, relay


def openai_create(parse: Callable[[Any, str | None], Any], builder: Callable[[Any], Any]) -> Create:
    """The entry point of a protocol: ``parse(body, fairness_key)`` gives its parsed request
    (an ``OpenAIRequest``), ``builder(request)`` its answer's builder."""

    async def create(data, caller: Caller) -> dict | AsyncIterator[bytes]:
        request = await parsed(parse, data, caller.fairness_key)
        model = request.forwarded.typed.model
        resolved = await caller.resolve(model)
        shapes = builder(request)
        outcome = await generate(request.forwarded, resolved)
        if request.forwarded.typed.stream:
            return relay(outcome, model, lambda messages: _sse(shapes, messages))
        return forwarded_answer(outcome, model) or shapes.final(outcome)

    return create


def _sse(shapes, messages: AsyncIterator[dict]) -> AsyncIterator[bytes]:
    return shaped_stream(messages, opening=shapes.opening_chunk, chunk=shapes.event_chunk,
                         result=lambda data: b"".join(shapes.closing_chunks(data)), failure=sse_error)


class OpenAIAnswer:
    """What a chat completion's and a text completion's answers share: the id, creation time and
    model every object and chunk carries, and a stream's end: the chunk with the
    ``finish_reason`` (``finish_choice``), then (with ``stream_options.include_usage``) one with
    no choices and the ``usage``, then ``data: [DONE]``.  Until that last one, every chunk carries
    ``"usage": null`` when usage was asked for, as OpenAI sends it."""

    def __init__(self, request, *, id_prefix: str, chunk_object: str):
        self.id = f"{id_prefix}{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = request.forwarded.typed.model
        self.include_usage = request.include_usage
        self.chunk_object = chunk_object

    def _object(self, kind: str, choices: list[dict], **fields) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "choices": choices, **fields}

    def _chunk(self, choices: list[dict], **fields) -> bytes:
        chunk = self._object(self.chunk_object, choices, **fields)
        if self.include_usage:
            chunk.setdefault("usage", None)
        return sse_data(chunk)

    def finish_choice(self, finish_reason: str) -> dict:
        raise NotImplementedError

    def closing_chunks(self, result: dict) -> list[bytes]:
        chunks = [self._chunk([self.finish_choice(result["finish_reason"])])]
        if self.include_usage:
            chunks.append(self._chunk([], usage=usage(result)))
        return [*chunks, DONE]


def usage(result: dict) -> dict:
    """The usage object; ``prompt_tokens_details.cached_tokens`` where the engine reused prompt
    tokens from its KV cache (and said how many), ``completion_tokens_details.reasoning_tokens``
    where the runtime counted a thinking model's reasoning."""
    used = result["usage"]
    answer = {
        "prompt_tokens": used["input_tokens"],
        "completion_tokens": used["output_tokens"],
        "total_tokens": used["input_tokens"] + used["output_tokens"],
    }
    if "cached_tokens" in used:
        answer["prompt_tokens_details"] = {"cached_tokens": used["cached_tokens"]}
    if "reasoning_tokens" in used:
        answer["completion_tokens_details"] = {"reasoning_tokens": used["reasoning_tokens"]}
    return answer
