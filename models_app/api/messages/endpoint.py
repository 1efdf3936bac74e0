"""POST /v1/messages: the Anthropic Messages API on the one generate path.

``create_message`` parses the body into the typed request (``messages.protocol``), runs it through
``api.inference.generate`` (admission, capability checks, scheduler and error codes are the
runtime's, shared by every protocol) and shapes the Messages answer (``messages.shapes``).
``messages_app`` serves it from ASGI with Anthropic's error envelope and ``ping`` events while a
stream waits: for its model's load (before ``message_start``), and, once it has started, every
``LOADING_NOTICE_SECONDS`` until its first event (a queue wait, a long prompt), as Anthropic's API
pings an idle stream, so proxies and client read timeouts keep it open.  ``count_tokens_app``
serves POST /v1/messages/count_tokens (``api.input_tokens``: the model's tokenizer and chat
template).  Claude Code's ``?beta=true`` query and the ``anthropic-version`` / ``anthropic-beta``
headers change nothing.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from models_app.api.answer_stream import shaped_stream
from models_app.api.inference import LOADING_NOTICE_SECONDS, generate, inference_app, parsed
from models_app.api.input_tokens import token_counter
from models_app.api.keys import Caller
from models_app.api.messages.protocol import MESSAGES_PATH, parse_count_tokens_body, parse_messages_body
from models_app.api.messages.shapes import PING, MessageBuilder, error_envelope


async def create_message(data, caller: Caller) -> dict | AsyncIterator[bytes]:
    """Run one Messages request: the message object, or the SSE events of a stream.

    Raises the request's error (LLMPoolError) before anything is sent (see ``generate``)."""
    request = await parsed(parse_messages_body, data, caller.fairness_key)
    model = await caller.resolve(request.generation.model)
    builder = MessageBuilder(request)
    outcome = await generate(request.generation, model)
    if request.generation.stream:
        return _sse(builder, outcome)
    return builder.final(outcome)


def _sse(builder: MessageBuilder, messages: AsyncIterator[dict]) -> AsyncIterator[bytes]:
    return shaped_stream(
        _pinged(messages), opening=builder.opening_chunk, chunk=builder.event_chunk,
        result=lambda data: b"".join(builder.closing_chunks(data)),
        failure=lambda exc: b"".join(builder.error_chunks(error_envelope(exc))), idle=PING, source=messages,
    )


async def _pinged(messages: AsyncIterator[dict]) -> AsyncIterator[dict | None]:
    """``messages``, with None after each ``LOADING_NOTICE_SECONDS`` that the first one did not
    arrive (the queue wait, the prompt's processing); the rest as they come (awaiting each in a
    task of its own would cost a task per token)."""
    first = asyncio.ensure_future(anext(messages, None))
    try:
        while not (await asyncio.wait((first,), timeout=LOADING_NOTICE_SECONDS))[0]:
            yield None
    finally:
        if not first.done():  # the client left while the first message was awaited
            first.cancel()
            await asyncio.gather(first, return_exceptions=True)
    message = first.result()
    if message is None:
        return
    yield message
    async for message in messages:
        yield message


messages_app = inference_app(create_message, MESSAGES_PATH, envelope=error_envelope, waiting_notice=lambda model: PING)
count_tokens_app = inference_app(
    token_counter(parse_count_tokens_body, lambda request: request.generation, lambda tokens: {"input_tokens": tokens}),
    MESSAGES_PATH + "/count_tokens",
    envelope=error_envelope,
    limited=False,  # counting takes no engine time: no key's limits apply
)
