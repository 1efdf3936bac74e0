"""whisper: Whisper speech-to-text models in CTranslate2's format, through faster-whisper, by default
in an engine process per replica.

This module holds the definition schema; whisper has no live-load overrides.  ``model_path`` is
the converted model's folder (``model.bin``, ``config.json``, ``tokenizer.json``,
``vocabulary.txt``: what ``ct2-transformers-converter`` writes, or a faster-whisper model from a
hub, downloaded beforehand); its size is the memory estimate.  The model answers
POST /v1/audio/transcriptions and /v1/audio/translations (``capabilities.audio_transcription``)
and nothing else: ``generates`` is false.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from runtime.backends.ct2.spec import Ct2ComputeType
from runtime.backends.shared.common_fields import LibraryFields
from runtime.backends.shared.in_process import LibrarySpec
from runtime.backends.whisper.engine import WhisperEngine, import_faster_whisper


class WhisperDefinition(LibraryFields):
    backend: Literal["whisper"]
    whisper_compute_type: Ct2ComputeType = "default"
    whisper_cpu_threads: int = Field(0, ge=0, le=1024)  # 0: CTranslate2 picks (OMP_NUM_THREADS, else 4)
    # 1: greedy decoding (fastest); OpenAI's whisper and faster-whisper default to 5.
    whisper_beam_size: int = Field(5, ge=1, le=16)
    # Skip the silence first (Silero VAD, which faster-whisper ships): faster on long recordings.
    whisper_vad_filter: bool = False


class WhisperSpec(LibrarySpec, engine=WhisperEngine, library=import_faster_whisper):
    name = "whisper"
    definition_model = WhisperDefinition

    def generates(self, definition) -> bool:
        return False

    def audio_transcription(self, definition) -> bool:
        return True

    def multi_turn(self, definition) -> bool:
        return False
