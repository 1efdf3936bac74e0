"""POST /v1/chat/completions: the second protocol on the one generate path.

``create_chat_completion`` parses the body into the same typed request as /v1/responses, runs
it through ``api.inference.generate`` (admission, capability checks, scheduler and error codes
are the runtime's, shared by both protocols) and shapes the chat completions answer; a model
whose engine forwards the client's body (the managed servers, openai_remote) answers with its
upstream's own JSON (``api.passthrough``).
``chat_completions_app`` serves it from ASGI; ``api.views.ChatCompletionCreateApi`` describes it in
the OpenAPI schema and serves it where the ASGI router is not in front.
"""
from __future__ import annotations

from collections.abc import AsyncIterator

from models_app.api.chat.protocol import parse_chat_body
from models_app.api.chat.shapes import ChatCompletionBuilder
from models_app.api.inference import generate, inference_app
from models_app.api.keys import Caller
from models_app.api.passthrough import forwarded_answer, relay
from models_app.transport.messages import REPLY_CHUNK, REPLY_RESULT
from runtime.errors import LLMPoolError


async def create_chat_completion(data, caller: Caller) -> dict | AsyncIterator[bytes]:
    """Run one chat completions request: the ``chat.completion`` object, or the SSE chunks of a
    stream.  Raises the request's error (LLMPoolError) before anything is sent (see ``generate``)."""
    request = parse_chat_body(data, caller.fairness_key)
    caller.check_model(request.generation.model)
    builder = ChatCompletionBuilder(request)
    outcome = await generate(request.generation)
    model = request.generation.model
    # A model that forwards the body to its upstream answers with the upstream's own JSON.
    if request.generation.stream:
        return relay(outcome, model, lambda messages: _sse(builder, messages))
    return forwarded_answer(outcome, model) or builder.final(outcome)


async def _sse(builder: ChatCompletionBuilder, messages: AsyncIterator[dict]) -> AsyncIterator[bytes]:
    try:
        yield builder.opening_chunk()
        async for message in messages:
            if message["kind"] == REPLY_CHUNK:
                chunk = builder.event_chunk(message["data"])  # an answer's or a reasoning's delta
                if chunk:
                    yield chunk
            elif message["kind"] == REPLY_RESULT:
                yield b"".join(builder.closing_chunks(message["data"]))
    except LLMPoolError as exc:
        yield b"".join(builder.error_chunks(exc.envelope()))
    finally:
        await messages.aclose()


chat_completions_app = inference_app(create_chat_completion, "/v1/chat/completions")
