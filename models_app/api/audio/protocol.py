"""OpenAI's audio requests (POST /v1/audio/transcriptions and /v1/audio/translations): their form,
and its translation into the runtime's ``TranscriptionRequest``.

``parse_audio_form`` takes the multipart form (``form.parse_form``) the way OpenAI's API takes it:
``file`` (required: the audio), ``model`` (required), ``language`` (ISO-639-1), ``prompt``,
``temperature`` (0 to 1), ``response_format`` (``json``, ``text``, ``srt``, ``vtt`` or
``verbose_json``), ``timestamp_granularities[]`` (``segment``, ``word``: with ``verbose_json``
only), ``stream`` (``true`` with ``json`` or ``text``: the transcript's text as server-sent events)
and ``user`` (the fairness key unless the caller's API key or a fairness header decided it).
Any other field is refused naming it, as is a field given twice that takes one value.
``FORM_SCHEMA`` states the same in the OpenAPI document, from the same constants.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from models_app.api import limits
from models_app.api.audio.form import MAX_FIELD_BYTES, Form
from runtime.errors import InvalidRequest
from runtime.inputs.transcription import TranscriptionRequest

TRANSCRIPTIONS_PATH = "/v1/audio/transcriptions"
TRANSLATIONS_PATH = "/v1/audio/translations"
RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
STREAMED_FORMATS = ("json", "text")
GRANULARITIES = ("segment", "word")
ONE_VALUE_FIELDS = ("model", "language", "prompt", "temperature", "response_format", "stream", "user")
LIST_FIELDS = ("timestamp_granularities[]", "timestamp_granularities")
LANGUAGE_PATTERN = "^([A-Za-z]{2,3})?$"  # an ISO 639 code's letters; empty: left out (detected)

_GRANULARITIES_SCHEMA = {"type": "array", "items": {"type": "string", "enum": list(GRANULARITIES)}}
# The form as ``parse_audio_form`` takes it, for the OpenAPI document (``api.routes``).  What it
# cannot state is in the descriptions: a field given twice, the bounds in bytes, the rules that tie
# one field to another (stream, timestamp_granularities[] against response_format).
FORM_SCHEMA = {
    "type": "object",
    "properties": {
        "file": {"type": "string", "format": "binary", "minLength": 1,
                 "description": "The audio (what FFmpeg reads). At most service.audio_max_upload_bytes, else 413 "
                                "request_too_large; one the engine cannot decode is 400."},
        "model": {"type": "string", "minLength": 1},
        "language": {"type": "string", "pattern": LANGUAGE_PATTERN,
                     "description": "The language spoken, an ISO-639-1 code; empty or left out, it is detected."},
        "prompt": {"type": "string"},
        "temperature": {"type": "number", "minimum": 0, "maximum": 1,
                        "description": "Empty or left out: Whisper's fallback schedule."},
        "response_format": {"type": "string", "enum": list(RESPONSE_FORMATS)},
        "timestamp_granularities[]": {**_GRANULARITIES_SCHEMA,
                                      "description": "With response_format verbose_json only."},
        "timestamp_granularities": {**_GRANULARITIES_SCHEMA, "description": "timestamp_granularities[] by "
                                                                             "the name some clients send."},
        "stream": {"type": "boolean", "description": f"With response_format {' or '.join(STREAMED_FORMATS)} only."},
        "user": {"type": "string", "maxLength": limits.MAX_FAIRNESS_KEY_LENGTH,
                 "description": "The fairness key, unless the API key or a fairness header decides it."},
    },
    "required": ["file", "model"],
    "additionalProperties": False,
    "description": f"Each text field at most {MAX_FIELD_BYTES} bytes, and given once.",
}


@dataclass
class AudioCall:
    """A parsed audio request: the runtime's request and what only the answer's shape needs."""

    transcription: TranscriptionRequest
    response_format: str = "json"
    granularities: tuple[str, ...] = ("segment",)


def parse_audio_form(form: Form, task: str, fairness_key: str | None) -> AudioCall:
    """Validate an audio ``form`` for ``task`` (transcribe, translate); raises InvalidRequest naming the field."""
    for name in form.fields:
        if name not in ONE_VALUE_FIELDS and name not in LIST_FIELDS:
            raise InvalidRequest(f"{name} is not a field of this endpoint", param=name)
    upload = form.files.get("file")
    if upload is None:
        raise InvalidRequest("file is required: the audio to transcribe, as a file part of the form", param="file")
    for name in form.files:
        if name != "file":
            raise InvalidRequest(f"{name} is not a file field of this endpoint (the audio goes in file)", param=name)
    if not upload.data:
        raise InvalidRequest("file is empty", param="file")
    model = _one(form, "model")
    if not model:
        raise InvalidRequest("model is required", param="model")
    response_format = _one(form, "response_format") or "json"
    if response_format not in RESPONSE_FORMATS:
        raise InvalidRequest(f"response_format must be one of {', '.join(RESPONSE_FORMATS)}", param="response_format")
    stream = _boolean(form, "stream")
    if stream and response_format not in STREAMED_FORMATS:
        raise InvalidRequest(f"stream is supported with response_format {' or '.join(STREAMED_FORMATS)} only",
                             param="stream")
    granularities = _granularities(form, response_format)
    return AudioCall(
        TranscriptionRequest(
            request_id="",  # the runtime client names the exchange
            model=model,
            audio=upload.data,
            filename=upload.filename,
            task=task,
            language=_language(form),  # for a translation: the language spoken, else detected
            prompt=_one(form, "prompt") or None,
            temperature=_temperature(form),
            word_timestamps="word" in granularities,
            stream=stream,
            fairness_key=limits.fairness_key(fairness_key, _one(form, "user")),
        ),
        response_format=response_format,
        granularities=granularities,
    )


def _one(form: Form, name: str) -> str | None:
    values = form.fields.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise InvalidRequest(f"{name} is given {len(values)} times; it takes one value", param=name)
    return values[0]


def _boolean(form: Form, name: str) -> bool:
    value = _one(form, name)
    if value is None or value.lower() == "false":
        return False
    if value.lower() == "true":
        return True
    raise InvalidRequest(f"{name} must be true or false", param=name)


def _language(form: Form) -> str | None:
    value = _one(form, "language")
    if value is None or value == "":
        return None
    if not re.fullmatch(LANGUAGE_PATTERN, value):
        raise InvalidRequest("language must be an ISO-639-1 code such as \"en\"", param="language")
    return value.lower()


def _temperature(form: Form) -> float | None:
    value = _one(form, "temperature")
    if value is None or value == "":
        return None
    try:
        temperature = float(value)
    except ValueError:
        raise InvalidRequest("temperature must be a number from 0 to 1", param="temperature") from None
    if not math.isfinite(temperature) or not 0 <= temperature <= 1:
        raise InvalidRequest("temperature must be a number from 0 to 1", param="temperature")
    return temperature


def _granularities(form: Form, response_format: str) -> tuple[str, ...]:
    values = [*form.fields.get("timestamp_granularities[]", ()), *form.fields.get("timestamp_granularities", ())]
    for value in values:
        if value not in GRANULARITIES:
            raise InvalidRequest(f"timestamp_granularities[] holds {value!r}; each must be segment or word",
                                 param="timestamp_granularities")
    if values and response_format != "verbose_json":
        raise InvalidRequest("timestamp_granularities needs response_format verbose_json",
                             param="timestamp_granularities")
    return tuple(dict.fromkeys(values)) or ("segment",)
