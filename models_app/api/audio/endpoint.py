"""POST /v1/audio/transcriptions and /v1/audio/translations: OpenAI's audio protocol on the runtime's
``transcribe`` operation.

The ASGI front reads the multipart body whole, at most ``service.audio_max_upload_bytes`` and a
margin for the other fields (413 ``request_too_large`` past it), and ``form.parse_form`` splits it;
``create_transcription`` / ``create_translation`` parse the form (``protocol``), check the caller's key
may use the model, ask the runtime (``OP_TRANSCRIBE``: the same model lookup, lifecycle rejections,
admission, fair-share scheduler and error codes as a generation; the audio crosses the channel
layer as msgpack bytes) and shape the answer (``shapes``).

A database key is charged a transcription in the tokens its fair share is counted in
(docs/scheduling.md): its ``input_tokens`` are the audio's (50 a second), its ``output_tokens``
the transcript's, in its usage rows, its tokens per minute and its budget alike, whether the
answer is streamed or not.  The answer itself shows OpenAI's usage (the audio's seconds).
"""
from __future__ import annotations

from collections.abc import AsyncIterator

from models_app import placement
from models_app.api.audio import shapes
from models_app.api.audio.form import parse_form
from models_app.api.audio.protocol import TRANSCRIPTIONS_PATH, TRANSLATIONS_PATH, parse_audio_form
from models_app.api.errors import error_answer
from models_app.api.inference import PlainAnswer, inference_app, parsed, runtime_stream, sse_data, runtime_wire
from models_app.api.keys import Caller
from models_app.conf import service_settings
from models_app.quotas import admission
from models_app.transport.messages import OP_TRANSCRIBE, REPLY_CHUNK, REPLY_RESULT
from runtime.errors import LLMPoolError
from runtime.inputs.transcription import TRANSCRIBE, TRANSCRIPT_SEGMENT, TRANSLATE

# Room for the form's other fields and its part headers beside the file.
FORM_MARGIN_BYTES = 1024 * 1024


def _form(body: bytes, headers: dict[str, str]):
    return parse_form(body, headers.get("content-type"), service_settings().audio_max_upload_bytes)


def _max_body_bytes() -> int:
    return service_settings().audio_max_upload_bytes + FORM_MARGIN_BYTES


async def _create(form, caller: Caller, task: str) -> dict | PlainAnswer | AsyncIterator[bytes]:
    """Run one audio request; raises its error (LLMPoolError) before anything is sent."""
    call = await parsed(parse_audio_form, form, task, caller.fairness_key)
    model = await caller.resolve(call.transcription.model)
    wire = runtime_wire({**call.transcription.to_wire(), "model": model})
    if not call.transcription.stream:
        result = await placement.call(OP_TRANSCRIBE, wire)
        admission.count(model, result["usage"])
        return shapes.answer(result, call)
    return _events(await runtime_stream(OP_TRANSCRIBE, wire, model))


async def _events(messages: AsyncIterator[dict]) -> AsyncIterator[bytes]:
    """OpenAI's transcript events: a delta per segment, then the whole text; an error after the
    stream opened is its last event (the error envelope)."""
    first = True
    try:
        async for message in messages:
            data = message["data"]
            if message["kind"] == REPLY_CHUNK and data.get("event") == TRANSCRIPT_SEGMENT:
                yield sse_data(shapes.text_delta(data["segment"], first))
                first = False
            elif message["kind"] == REPLY_RESULT:
                yield sse_data(shapes.text_done(data))
    except LLMPoolError as exc:
        yield sse_data(error_answer(exc).body)
    finally:
        await messages.aclose()


async def create_transcription(form, caller: Caller):
    return await _create(form, caller, TRANSCRIBE)


async def create_translation(form, caller: Caller):
    return await _create(form, caller, TRANSLATE)


transcriptions_app = inference_app(create_transcription, TRANSCRIPTIONS_PATH, parse_body=_form,
                                   max_body_bytes=_max_body_bytes)
translations_app = inference_app(create_translation, TRANSLATIONS_PATH, parse_body=_form,
                                 max_body_bytes=_max_body_bytes)
