"""The answers of OpenAI's audio endpoints, from the runtime's ``transcribe`` result (``text``,
``language``, ``duration``, ``segments``, ``usage``; runtime.inference.transcription).

``json``: ``{"text", "usage": {"type": "duration", "seconds"}}`` (whisper-1's usage: whole seconds,
rounded up); ``text``: the text alone; ``verbose_json``: ``{"task", "language", "duration", "text",
"segments" and/or "words", "usage"}``; ``srt`` and ``vtt``: one cue per segment, SubRip's
``HH:MM:SS,mmm`` and WebVTT's ``HH:MM:SS.mmm`` times.  A stream (``stream=true``) is OpenAI's
``transcript.text.delta`` event per segment, then ``transcript.text.done`` with the whole text.
"""
from __future__ import annotations

import math

from models_app.api.audio.protocol import AudioCall
from models_app.api.inference import PlainAnswer
SEGMENT_FIELDS = ("seek", "start", "end", "text", "tokens", "temperature", "avg_logprob", "compression_ratio", "no_speech_prob")


def usage(result: dict) -> dict:
    return {"type": "duration", "seconds": math.ceil(result["duration"])}


def answer(result: dict, call: AudioCall) -> dict | PlainAnswer:
    """The answer in the request's ``response_format``."""
    match call.response_format:
        case "text":
            return PlainAnswer((result["text"] + "\n").encode())
        case "srt":
            return PlainAnswer(srt(result["segments"]).encode())
        case "vtt":
            return PlainAnswer(vtt(result["segments"]).encode(), "text/vtt; charset=utf-8")
        case "verbose_json":
            return verbose_json(result, call)
    return {"text": result["text"], "usage": usage(result)}


def verbose_json(result: dict, call: AudioCall) -> dict:
    verbose = {
        "task": call.transcription.task,
        "language": result["language"],
        "duration": result["duration"],
        "text": result["text"],
    }
    if "segment" in call.granularities:
        verbose["segments"] = [
            {"id": index, **{key: segment[key] for key in SEGMENT_FIELDS}}
            for index, segment in enumerate(result["segments"])
        ]
    if "word" in call.granularities:
        verbose["words"] = [word for segment in result["segments"] for word in segment.get("words") or ()]
    verbose["usage"] = usage(result)
    return verbose


def srt(segments: list[dict]) -> str:
    cues = [f"{index}\n{_time(s['start'], ',')} --> {_time(s['end'], ',')}\n{s['text'].strip()}\n"
            for index, s in enumerate(segments, start=1)]
    return "\n".join(cues)


def vtt(segments: list[dict]) -> str:
    cues = [f"{_time(s['start'], '.')} --> {_time(s['end'], '.')}\n{s['text'].strip()}\n" for s in segments]
    return "\n".join(["WEBVTT\n", *cues])


def _time(seconds: float, separator: str) -> str:
    milliseconds = round(seconds * 1000)
    hours, milliseconds = divmod(milliseconds, 3_600_000)
    minutes, milliseconds = divmod(milliseconds, 60_000)
    seconds, milliseconds = divmod(milliseconds, 1000)
    return f"{hours:02d}:{minutes:02d}:{seconds:02d}{separator}{milliseconds:03d}"


def text_delta(segment: dict, first: bool) -> dict:
    """A streamed segment: its text as a ``transcript.text.delta`` (the first without its leading space)."""
    return {"type": "transcript.text.delta", "delta": segment["text"].lstrip() if first else segment["text"]}


def text_done(result: dict) -> dict:
    return {"type": "transcript.text.done", "text": result["text"], "usage": usage(result)}
