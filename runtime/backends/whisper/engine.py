"""The Whisper engine: one ``faster_whisper.WhisperModel`` (a CTranslate2 Whisper model) per replica.

Loading, decoding and transcription run in threads, never on the event loop.  The uploaded file is
decoded to 16 kHz mono by faster-whisper's ``decode_audio`` (PyAV, FFmpeg's libraries: wav, mp3,
flac, ogg, webm and the rest FFmpeg reads); a file it cannot read is the client's error (400
``invalid_request`` on ``file``), never the engine's.  Segments stream out as faster-whisper decodes
them; closing the stream stops the decoding between two segments.

The model answers speech-to-text only: a generation asked of it is refused before it is queued
(``WhisperSpec.generates``).
"""
from __future__ import annotations

import asyncio
import gc
import io
import threading
from contextlib import aclosing
from functools import partial
from typing import Any

from runtime.backends.base import EngineUnavailable, resolve_model_path
from runtime.backends.ct2.engine import split_device
from runtime.backends.shared.in_process import generate_in_thread
from runtime.errors import BackendError, InvalidRequest
from runtime.inputs.transcription import Transcribed, TranscriptionRequest, TranscriptSegment


def import_faster_whisper():
    try:
        import av
        import faster_whisper
    except ImportError as exc:
        raise EngineUnavailable(
            f"faster-whisper is not installed in this environment ({exc.name} is missing); "
            "install the faster-whisper and av packages"
        ) from exc
    return faster_whisper, av


class WhisperEngine:
    """One replica.  ``_busy`` is held by a running transcription and by unload, so the model is
    never dropped under a transcription that is still winding down."""

    def __init__(self, config: dict[str, Any], context: dict):
        self.config = config
        self.model_name = context.get("model_name", "")
        self.model_path = resolve_model_path(config["model_path"], context["base_dir"])
        self._model = None
        self._busy = threading.Lock()

    # ---- lifecycle -------------------------------------------------------------------
    async def load(self) -> None:
        await asyncio.to_thread(self._load_blocking)

    def _load_blocking(self) -> None:
        faster_whisper, _ = import_faster_whisper()
        device, device_index = split_device(self.config["device"])
        self._model = faster_whisper.WhisperModel(
            self.model_path,
            device=device,
            device_index=device_index,
            compute_type=self.config["whisper_compute_type"],
            cpu_threads=self.config["whisper_cpu_threads"],
            num_workers=1,
            local_files_only=True,  # a folder on disk: never a download
        )

    async def unload(self) -> None:
        await asyncio.to_thread(self._unload_blocking)

    def _unload_blocking(self) -> None:
        with self._busy:
            self._model = None
            gc.collect()

    # ---- requests --------------------------------------------------------------------
    async def transcribe(self, request: TranscriptionRequest):
        if self._model is None:
            raise BackendError("the Whisper engine is not loaded")

        produce = partial(self._transcribe_blocking, request)
        async with aclosing(generate_in_thread(produce, name="whisper-transcribe", engine="Whisper")) as events:
            async for event in events:
                yield event

    def _transcribe_blocking(self, request: TranscriptionRequest, emit, stop: threading.Event) -> None:
        faster_whisper, av = import_faster_whisper()
        with self._busy:
            model = self._model
            try:
                audio = faster_whisper.decode_audio(
                    io.BytesIO(request.audio), sampling_rate=model.feature_extractor.sampling_rate
                )
            except (av.error.FFmpegError, ValueError, IndexError, EOFError) as exc:
                raise InvalidRequest(
                    f"file: {request.filename!r} could not be decoded as audio ({exc})", param="file"
                ) from None
            if request.language is not None and request.language not in model.supported_languages:
                raise InvalidRequest(
                    f"language {request.language!r} is not one this model knows (an ISO-639-1 code such as \"en\")",
                    param="language",
                )
            segments, info = model.transcribe(
                audio,
                language=request.language,
                task=request.task,
                initial_prompt=request.prompt or None,
                word_timestamps=request.word_timestamps,
                beam_size=self.config["whisper_beam_size"],
                vad_filter=self.config["whisper_vad_filter"],
                **({} if request.temperature is None else {"temperature": request.temperature}),
            )
            for segment in segments:  # decoded one by one as this loop asks for them
                emit(_segment(segment))
                if stop.is_set():
                    return
            emit(Transcribed(language=info.language, duration=round(float(info.duration), 3)))


def _segment(segment) -> TranscriptSegment:
    words = None
    if segment.words is not None:
        words = [{"word": word.word, "start": round(float(word.start), 3), "end": round(float(word.end), 3)}
                 for word in segment.words]
    return TranscriptSegment(
        start=round(float(segment.start), 3),
        end=round(float(segment.end), 3),
        text=segment.text,
        tokens=[int(token) for token in segment.tokens],
        seek=int(segment.seek),
        temperature=float(segment.temperature or 0.0),
        avg_logprob=float(segment.avg_logprob),
        compression_ratio=float(segment.compression_ratio),
        no_speech_prob=float(segment.no_speech_prob),
        words=words,
    )
