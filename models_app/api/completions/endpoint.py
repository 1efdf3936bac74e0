"""POST /v1/completions: the legacy text completion protocol on the one generate path.

``create_completion`` parses the body into the typed request with a raw ``prompt``, runs it
through ``api.inference.generate`` (admission, capability checks, scheduler and error codes are
the runtime's, shared with /v1/responses and /v1/chat/completions) and shapes the
``text_completion`` answer; a model whose engine forwards the client's body (the managed
servers, openai_remote: to their server's own /v1/completions) answers with its upstream's own
JSON (``api.passthrough``).  ``completions_app`` serves it from ASGI;
``api.views.CompletionCreateApi`` describes it in the OpenAPI schema and serves it where the
ASGI router is not in front.
"""
from __future__ import annotations

from collections.abc import AsyncIterator

from models_app.api.completions.protocol import COMPLETIONS_PATH, parse_completion_body
from models_app.api.completions.shapes import CompletionBuilder
from models_app.api.inference import generate, inference_app
from models_app.api.keys import Caller
from models_app.api.passthrough import forwarded_answer, relay
from models_app.transport.messages import REPLY_CHUNK, REPLY_RESULT
from runtime.errors import LLMPoolError
from runtime.request import GENERATE_DELTA


async def create_completion(data, caller: Caller) -> dict | AsyncIterator[bytes]:
    """Run one completions request: the ``text_completion`` object, or the SSE chunks of a
    stream.  Raises the request's error (LLMPoolError) before anything is sent (see ``generate``)."""
    request = parse_completion_body(data, caller.fairness_key)
    caller.check_model(request.generation.model)
    builder = CompletionBuilder(request)
    outcome = await generate(request.generation)
    model = request.generation.model
    if request.generation.stream:
        return relay(outcome, model, lambda messages: _sse(builder, messages))
    return forwarded_answer(outcome, model) or builder.final(outcome)


async def _sse(builder: CompletionBuilder, messages: AsyncIterator[dict]) -> AsyncIterator[bytes]:
    try:
        async for message in messages:
            if message["kind"] == REPLY_CHUNK:
                if message["data"].get("event") == GENERATE_DELTA:
                    yield builder.delta_chunk(message["data"])
            elif message["kind"] == REPLY_RESULT:
                yield b"".join(builder.closing_chunks(message["data"]))
    except LLMPoolError as exc:
        yield b"".join(builder.error_chunks(exc.envelope()))
    finally:
        await messages.aclose()


completions_app = inference_app(create_completion, COMPLETIONS_PATH)
