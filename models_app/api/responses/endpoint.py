"""POST /v1/responses: the one implementation, and its plain-ASGI front.

``create_response`` parses the body into the typed request, runs it through the shared
``api.inference.generate`` exchange and shapes the Responses API answer.  ``responses_app``
serves it straight from ASGI (``api.inference.inference_app``), at its path in the route table
(``api.routes``).
"""
from __future__ import annotations

from collections.abc import AsyncIterator

from models_app.api.errors import error_answer
from models_app.api.inference import generate, inference_app, parsed
from models_app.api.input_tokens import token_counter
from models_app.api.keys import Caller
from models_app.api.responses.protocol import parse_responses_body
from models_app.api.responses.shapes import ResponseBuilder
from models_app.transport.messages import REPLY_CHUNK, REPLY_RESULT
from runtime.errors import LLMPoolError


async def create_response(data, caller: Caller) -> dict | AsyncIterator[bytes]:
    """Run one Responses API request: the response object, or the SSE events of a stream.

    Raises the request's error (LLMPoolError) before anything is sent (see ``generate``).
    """
    request = await parsed(parse_responses_body, data, caller.fairness_key)
    model = await caller.resolve(request.model)
    builder = ResponseBuilder(request)
    outcome = await generate(request, model)
    if request.stream:
        return _sse(builder, outcome)
    return builder.final(outcome)


async def _sse(builder: ResponseBuilder, messages: AsyncIterator[dict]) -> AsyncIterator[bytes]:
    # Events that are ready together go out as one body chunk: one write, one read for the client.
    try:
        yield b"".join(builder.opening_events())
        async for message in messages:
            if message["kind"] == REPLY_CHUNK:
                events = builder.event_bytes(message["data"])  # an answer's or a reasoning's delta
                if events:
                    yield events
            elif message["kind"] == REPLY_RESULT:
                yield b"".join(builder.closing_events(message["data"]))
    except LLMPoolError as exc:
        yield builder.error_event(error_answer(exc).body)
    finally:
        await messages.aclose()


responses_app = inference_app(create_response, "/v1/responses")
# POST /v1/responses/input_tokens: the body's prompt tokens (api.input_tokens), as OpenAI answers them.
responses_input_tokens_app = inference_app(
    token_counter(parse_responses_body, lambda request: request,
                  lambda tokens: {"object": "response.input_tokens", "input_tokens": tokens}),
    "/v1/responses/input_tokens",
    limited=False,  # counting takes no engine time: no key's limits apply
)
