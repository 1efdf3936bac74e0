"""One speech-to-text request (POST /v1/audio/transcriptions or /v1/audio/translations), from the
runtime's ``transcribe`` op to the engine and back.

It takes the path every request takes (``RuntimeService.op_transcribe``): the model lookup,
``check_transcription_request`` (400/403 before it is queued), the controller's admission (a
``load_on_request`` model loads for it; swap groups and memory apply), the scheduler (its priority
class, its fair share, its queue deadline: ``runtime.model.queueing``), the lease of one replica
and the model's ``request_timeout_seconds``.

Fairness is charged in tokens, as a generation is: ``AUDIO_TOKENS_PER_SECOND`` for each second of
audio (Whisper's encoder frames: 1500 per 30-second window) plus the transcript's tokens.  Before
the engine has decoded the file its length is estimated from its size (``ESTIMATED_BYTES_PER_SECOND``);
the engine's figures correct the charge when it is done.

An engine of a speech-to-text model has ``transcribe(request)``: an async iterator of
``TranscriptSegment`` then one ``Transcribed``.  A streamed request's segments go out as
``{"event": "segment", "segment": {...}}`` chunks after ``{"event": "admitted"}``.
"""
from __future__ import annotations

import math
from contextlib import aclosing

from runtime.errors import BackendError, TranscriptionUnsupported
from runtime.inference.deadline import request_deadline
from runtime.inputs.request import GENERATE_ADMITTED, GENERATE_WAITING
from runtime.inputs.transcription import TRANSCRIPT_SEGMENT, Transcribed, TranscriptionRequest, TranscriptSegment
from runtime.model.queueing import before_deadline, queue_ticket
from runtime.pool.catalog import CatalogEntry

AUDIO_TOKENS_PER_SECOND = 50
# About 128 kbit/s: between a compressed file and 16-bit 16 kHz PCM (32 kB/s); only the queue's
# order before the engine counts depends on it.
ESTIMATED_BYTES_PER_SECOND = 16_000


def audio_tokens(seconds: float) -> int:
    return math.ceil(seconds * AUDIO_TOKENS_PER_SECOND)


def estimate_audio_tokens(request: TranscriptionRequest) -> int:
    return audio_tokens(len(request.audio) / ESTIMATED_BYTES_PER_SECOND)


def check_transcription_request(entry: CatalogEntry, request: TranscriptionRequest, allow_remote: bool) -> None:
    """Refuse (400/403) what the model cannot take, before it is queued."""
    entry.refuse_remote(allow_remote)
    if not entry.spec.audio_transcription(entry.definition):
        raise TranscriptionUnsupported(
            f"model {entry.name} does not transcribe audio (its capabilities.audio_transcription is false)",
            param="model",
        )


async def run_transcription(pool, payload: dict, emit, record, allow_remote: bool) -> dict:
    """The ``transcribe`` op: ``{"text", "language", "duration", "segments", "usage"}``, where usage is
    ``{"seconds", "input_tokens", "output_tokens"}`` (input: the audio's tokens as charged)."""
    controller = pool.lookup(payload["model"])  # a name or an alias
    record.model = controller.name
    request = TranscriptionRequest.from_wire(payload)
    check_transcription_request(controller.entry, request, allow_remote)
    ticket = queue_ticket(request, controller.entry.definition, estimate_audio_tokens(request), record.started)

    async def waiting() -> None:  # the model loads for this request: a stream may open now
        if request.stream:
            await emit({"event": GENERATE_WAITING, "model": controller.name})

    dispatched = await before_deadline(ticket, controller.admit(ticket, record.waited_for_load(waiting)))
    record.admitted()
    segments: list[TranscriptSegment] = []
    done: Transcribed | None = None
    try:
        if request.stream:
            await emit({"event": GENERATE_ADMITTED})
        lease = await before_deadline(ticket, dispatched)
        record.leased(lease.replica)
        lease.check()
        done = await _transcribe_on_engine(controller, lease, request, segments, emit, record)
    finally:
        controller.finish(ticket, None if done is None else _tokens(done, segments))
    return {
        "text": "".join(segment.text for segment in segments).strip(),
        "language": done.language,
        "duration": done.duration,
        "segments": [segment.to_wire() for segment in segments],
        "usage": {"seconds": done.duration, "input_tokens": audio_tokens(done.duration),
                  "output_tokens": sum(len(segment.tokens) for segment in segments)},
    }


def _tokens(done: Transcribed, segments: list[TranscriptSegment]) -> int:
    return audio_tokens(done.duration) + sum(len(segment.tokens) for segment in segments)


async def _transcribe_on_engine(controller, lease, request: TranscriptionRequest,
                                segments: list[TranscriptSegment], emit, record) -> Transcribed:
    """The engine's ``transcribe`` within the model's request_timeout_seconds (504 past it, and an
    engine that does not stop is killed: ``timed_out``); each segment kept in ``segments`` and, for a
    stream, sent on."""
    done = None
    async with request_deadline(controller, lease):
        async with aclosing(lease.engine.transcribe(request)) as events:
            async for event in events:
                if isinstance(event, Transcribed):
                    done = event
                    continue
                record.saw_output()
                segments.append(event)
                if request.stream:
                    await emit({"event": TRANSCRIPT_SEGMENT, "segment": event.to_wire()})
    if done is None:
        raise BackendError(f"the {controller.entry.definition.backend} engine ended a transcription without a result")
    return done
