"""The OpenAI-compatible transcription client the managed servers speak (vllm_serve, llama_server
with ``audio_transcription: true``).

``create_transcription`` posts the request to the server's ``/v1/audio/transcriptions`` (or
``/translations``) as OpenAI's multipart form: the file as the client sent it, the server's model
name, ``language``, ``prompt``, ``temperature`` where given, and ``response_format`` verbose_json
(with ``timestamp_granularities[]`` word where the client asked for words), so its segments and
their times come back whatever shape the client asked for (the edge shapes them).  A server that
answers without segments (plain ``{"text"}``) gives one segment of the whole text.  Error answers
map as for chat (``openai_chat.upstream_error``): a refused request is our 400, anything else
``failure``.
"""
from __future__ import annotations

import secrets

import httpx

from runtime.backends.shared.openai_chat import upstream_error
from runtime.errors import LLMPoolError
from runtime.inputs.transcription import TRANSLATE, Transcribed, TranscriptionRequest, TranscriptSegment

SEGMENT_FIELDS = ("seek", "temperature", "avg_logprob", "compression_ratio", "no_speech_prob")


def audio_path(request: TranscriptionRequest) -> str:
    return "/v1/audio/translations" if request.task == TRANSLATE else "/v1/audio/transcriptions"


def multipart_form(fields: list[tuple[str, str]], filename: str, data: bytes) -> tuple[bytes, str]:
    """The body and content type of a ``multipart/form-data`` form (RFC 7578): ``fields`` as text
    parts, then ``data`` as the part ``file``."""
    boundary = f"llmpool-{secrets.token_hex(16)}"
    safe_name = filename.replace('"', "'").replace("\r", " ").replace("\n", " ")
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
             for name, value in fields]
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{safe_name}"\r\n'
                 "Content-Type: application/octet-stream\r\n\r\n".encode() + data + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


def form_fields(request: TranscriptionRequest, model: str) -> list[tuple[str, str]]:
    fields = [("model", model), ("response_format", "verbose_json")]
    if request.language:
        fields.append(("language", request.language))
    if request.prompt:
        fields.append(("prompt", request.prompt))
    if request.temperature is not None:
        fields.append(("temperature", repr(request.temperature)))
    if request.word_timestamps:
        fields += [("timestamp_granularities[]", "segment"), ("timestamp_granularities[]", "word")]
    return fields


async def create_transcription(
    client: httpx.AsyncClient,
    model: str,
    request: TranscriptionRequest,
    upstream: str,
    failure: type[LLMPoolError],
) -> tuple[list[TranscriptSegment], Transcribed]:
    body, content_type = multipart_form(form_fields(request, model), request.filename, request.audio)
    response = await client.post(audio_path(request), content=body, headers={"Content-Type": content_type})
    if response.status_code != 200:
        error = upstream_error(response.status_code, response.content, upstream, failure)
        if error.param == "input":
            error.param = "file"
        raise error
    try:
        return transcript_of(response.json(), request)
    except (ValueError, KeyError, TypeError) as exc:
        raise failure(f"{upstream} answered 200 without a transcription: {exc!r}") from None


def transcript_of(answer: dict, request: TranscriptionRequest) -> tuple[list[TranscriptSegment], Transcribed]:
    """A verbose_json (or json) answer as segments and their end; words go to the segment they fall in."""
    text = str(answer["text"])
    duration = float(answer.get("duration") or 0.0)
    listed = answer.get("segments") or [{"start": 0.0, "end": duration, "text": text}]
    segments = [
        TranscriptSegment(start=float(item["start"]), end=float(item["end"]), text=str(item["text"]),
                          tokens=[int(token) for token in item.get("tokens") or ()],
                          **{key: item[key] for key in SEGMENT_FIELDS if isinstance(item.get(key), (int, float))},
                          words=[] if request.word_timestamps else None)
        for item in listed
    ]
    for word in (answer.get("words") or ()) if request.word_timestamps else ():
        start = float(word["start"])
        home = next((s for s in reversed(segments) if s.start <= start), segments[0])
        home.words.append({"word": str(word["word"]), "start": start, "end": float(word["end"])})
    language = str(answer.get("language") or request.language or "")
    return segments, Transcribed(language=language, duration=duration)
