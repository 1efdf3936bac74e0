"""Ollama's answers: the objects of /api/chat and /api/generate, their NDJSON streams, errors.

Every object carries ``model`` (the name the client asked for) and ``created_at``; a chat
object its ``message`` (``role`` assistant, ``content``, the model's reasoning as
``thinking``, its calls as ``tool_calls`` with ``arguments`` an object), a generate object its
``response`` (and ``thinking``).  A stream is one JSON object a line: one per piece of the
answer (``done: false``), then the final one (``done: true``, ``done_reason`` "stop" or
"length", and the durations).  The durations are nanoseconds: ``total_duration`` from the
request's arrival to its final object (measured here), ``load_duration`` the wait for the
model's load, ``prompt_eval_duration`` from getting a replica to the first output,
``eval_duration`` from then to the end (measured by the runtime: its result's ``timings``).

While a stream waits for its model's load, it sends an object with empty content every few
seconds (``waiting_notice``): NDJSON has no comments, and an empty piece changes no client's text.
An error after the stream started is its last line, ``{"error": message}``, which the ollama
client raises as ``ResponseError``; before, it is the HTTP error with the same body
(``error_body``: Ollama's ``error`` and llm-pool's ``code``).
"""
from __future__ import annotations

import json
import time
from datetime import datetime, timezone

from models_app.api.inference import json_bytes
from runtime.errors import LLMPoolError
from runtime.inputs.request import GENERATE_DELTA, GENERATE_REASONING, GENERATE_TOOL_CALL

NDJSON = b"application/x-ndjson"


def error_body(exc: LLMPoolError) -> dict:
    """Ollama's error body, with llm-pool's machine-readable code beside its message."""
    return {"error": exc.message, "code": exc.code}


# ``error_body``'s schema in the OpenAPI document.
ERROR_SCHEMA = {
    "type": "object",
    "properties": {"error": {"type": "string"}, "code": {"type": "string"}},
    "required": ["error", "code"],
}


def line(data: dict) -> bytes:
    return json_bytes(data) + b"\n"


_second: list = [None, ""]  # the last whole second formatted, and its text


def now_iso() -> str:
    """The time now, ISO 8601 UTC with microseconds, as each object's ``created_at``; the date
    and time of day are formatted once a second (a stream sends an object per token)."""
    now = time.time()
    second = int(now)
    if second != _second[0]:
        _second[:] = [second, datetime.fromtimestamp(second, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")]
    return f"{_second[1]}.{int((now - second) * 1e6):06d}Z"


class Answer:
    """The objects of one /api/chat (``chat``) or /api/generate answer for ``model``; ``started``
    is the request's arrival (``time.monotonic``)."""

    def __init__(self, model: str, *, chat: bool, started: float):
        self.model, self.chat, self.started = model, chat, started

    def _object(self, content: str = "", *, thinking: str | None = None, calls: list[dict] | None = None,
                logprobs: list[dict] | None = None, done: bool = False) -> dict:
        data: dict = {"model": self.model, "created_at": now_iso()}
        if self.chat:
            message: dict = {"role": "assistant", "content": content}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = [_tool_call(call) for call in calls]
            data["message"] = message
        else:
            data["response"] = content
            if thinking:
                data["thinking"] = thinking
        if logprobs is not None:
            data["logprobs"] = [_logprob(entry) for entry in logprobs]
        data["done"] = done
        return data

    def piece(self, event: dict) -> bytes:
        """The line of one of the runtime's stream events (b"" for those it does not show)."""
        kind = event.get("event")
        if kind == GENERATE_DELTA:
            return line(self._object(event["text"], logprobs=event.get("logprobs")))
        if kind == GENERATE_REASONING:
            return line(self._object(thinking=event["text"]))
        if kind == GENERATE_TOOL_CALL:
            return line(self._object(calls=[event["call"]]))
        return b""

    def final(self, result: dict, *, whole: bool) -> dict:
        """The final object: with the whole answer (``whole``, a request that did not stream)
        or, ending a stream, with empty content."""
        if whole:
            data = self._object(result["text"], thinking=result.get("reasoning"), calls=result.get("tool_calls"),
                                logprobs=result.get("logprobs"), done=True)
        else:
            data = self._object(done=True)
        timings, usage = result.get("timings") or {}, result["usage"]
        data.update({
            "done_reason": "length" if result["finish_reason"] == "length" else "stop",
            "total_duration": round((time.monotonic() - self.started) * 1e9),
            "load_duration": timings.get("load_ns", 0),
            "prompt_eval_count": usage["input_tokens"],
            "prompt_eval_duration": timings.get("prompt_ns", 0),
            "eval_count": usage["output_tokens"],
            "eval_duration": timings.get("generation_ns", 0),
        })
        return data

    def loaded(self) -> dict:
        """The answer to a body without messages or prompt (Ollama's way to load a model)."""
        return {**self._object(done=True), "done_reason": "load"}


def waiting_notice(chat: bool):
    """The line a chat (``chat``) or generate stream sends while it waits for ``model``'s load."""

    def notice(model: str) -> bytes:
        return line(Answer(model, chat=chat, started=0.0)._object())

    return notice


def _tool_call(call: dict) -> dict:
    """A call as Ollama writes one: its arguments an object (the runtime's are JSON text)."""
    try:
        arguments = json.loads(call["arguments"] or "{}")
    except ValueError:
        arguments = {}
    return {"function": {"name": call["name"], "arguments": arguments if isinstance(arguments, dict) else {}}}


def _logprob(entry: dict) -> dict:
    alternatives = [{"token": top["token"], "logprob": top["logprob"]} for top in entry.get("top_logprobs") or ()]
    return {"token": entry["token"], "logprob": entry["logprob"], "top_logprobs": alternatives}
