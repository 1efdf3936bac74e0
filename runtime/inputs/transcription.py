"""What a speech-to-text engine is handed: ``TranscriptionRequest``, and the events its
``transcribe`` yields (``TranscriptSegment`` per piece of speech, then ``Transcribed``).

The edge (``models_app.api.audio``) parses a multipart POST /v1/audio/transcriptions (or
translations) into a ``TranscriptionRequest``; it crosses the channel layer as ``to_wire()``, the
audio as msgpack bytes, and an engine process's socket the same way.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from runtime.inputs.wire import Wire
from runtime.queue_terms import DEFAULT_PRIORITY

TRANSCRIBE, TRANSLATE = "transcribe", "translate"  # OpenAI's two paths: the language kept, or English
# A streamed request's chunk per segment: {"event": "segment", "segment": TranscriptSegment.to_wire()}.
TRANSCRIPT_SEGMENT = "segment"


@dataclass
class TranscriptionRequest(Wire):
    """One request: ``audio`` the uploaded file as sent (wav, mp3, flac, ogg, webm: the engine
    decodes it), ``task`` transcribe or translate (into English), ``language`` an ISO-639-1 code or
    None (detected), ``prompt`` text the transcript should follow on from (names, spelling),
    ``temperature`` None for the engine's fallback schedule, ``word_timestamps`` whether each
    segment carries its words' timings, ``stream`` whether segments go out as they are decoded;
    ``fairness_key``, ``priority``, ``queue_timeout_seconds`` and ``weight`` as for
    ``GenerationRequest``."""

    request_id: str
    model: str
    audio: bytes
    filename: str = "audio"
    task: Literal["transcribe", "translate"] = TRANSCRIBE
    language: str | None = None
    prompt: str | None = None
    temperature: float | None = None
    word_timestamps: bool = False
    stream: bool = False
    fairness_key: str | None = None
    priority: str = DEFAULT_PRIORITY
    queue_timeout_seconds: float | None = None
    weight: float | None = None


@dataclass
class TranscriptSegment(Wire):
    """One decoded piece of speech, as OpenAI's ``verbose_json`` segment: its times in seconds from
    the start of the audio, its text and token ids, and the decoder's figures (``seek``: where the
    decoder's 30-second window began, in 10 ms frames).  ``words``:
    ``[{"word", "start", "end"}]`` when the request asked for word timestamps."""

    start: float
    end: float
    text: str
    tokens: list[int] = dataclasses.field(default_factory=list)
    seek: int = 0
    temperature: float = 0.0
    avg_logprob: float = 0.0
    compression_ratio: float = 0.0
    no_speech_prob: float = 0.0
    words: list[dict] | None = None


@dataclass
class Transcribed:
    """The end of a transcription: the language spoken (detected or as asked) and the audio's
    duration in seconds."""

    language: str
    duration: float
