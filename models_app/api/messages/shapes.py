"""The Anthropic Messages answer shapes: the ``message`` object, its SSE events, its errors.

A non-streamed answer is one ``message``: its ``content`` blocks in the order the model produced
them (a thinking model's reasoning as a ``thinking`` block, the answer's text as a ``text`` block,
each tool call as a ``tool_use`` block whose ``input`` is the call's parsed arguments),
``stop_reason`` (``tool_use`` when the answer calls tools, ``max_tokens`` when it was cut at the
limit, ``stop_sequence`` with the ``stop_sequence`` that ended it, else ``end_turn``) and ``usage``.

A stream is named SSE events: ``message_start`` (the message with no content yet), then per block
``content_block_start``, its ``content_block_delta`` events (``thinking_delta``, ``text_delta``,
``input_json_delta`` with the call's arguments) and ``content_block_stop``; then ``message_delta``
(the stop reason, the output tokens and the input tokens, which the engine counts only once it has
run) and ``message_stop``.  While a load or a queue wait keeps the client waiting, ``ping``
events.  An error after the stream started is an ``error`` event in the error envelope below.

Errors on these paths are Anthropic's envelope ``{"type": "error", "error": {"type", "message"}}``
with llm-pool's own ``code`` (and ``param``) kept beside them in ``error``, and the same status.
"""
from __future__ import annotations

import uuid

import orjson

from models_app.api.errors import openai_envelope
from models_app.api.inference import json_bytes
from models_app.api.messages.protocol import MessagesRequest
from runtime.errors import LLMPoolError
from runtime.inputs.request import GENERATE_DELTA, GENERATE_REASONING, GENERATE_TOOL_CALL

# Anthropic's error type for each status llm-pool answers with (anything else is api_error).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}

PING = b'event: ping\ndata: {"type":"ping"}\n\n'


def error_envelope(exc: LLMPoolError) -> dict:
    """``exc`` in Anthropic's error envelope, llm-pool's code and param kept in ``error``."""
    error = openai_envelope(exc)["error"]
    return {"type": "error", "error": {"type": ERROR_TYPES.get(exc.http_status, "api_error"), **error}}


# ``error_envelope``'s schema in the OpenAPI document.
ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "type": {"type": "string", "enum": ["error"]},
        "error": {
            "type": "object",
            "properties": {"type": {"type": "string", "enum": sorted({*ERROR_TYPES.values(), "api_error"})},
                           "code": {"type": "string"}, "message": {"type": "string"},
                           "param": {"type": "string", "nullable": True}},
            "required": ["type", "code", "message", "param"],
        },
    },
    "required": ["type", "error"],
}


def sse_event(name: str, data: dict) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + json_bytes(data) + b"\n\n"


def stop_reason(result: dict) -> str:
    if result.get("tool_calls"):
        return "tool_use"
    if result["finish_reason"] == "length":
        return "max_tokens"
    return "stop_sequence" if result.get("stop_sequence") is not None else "end_turn"


def usage(result: dict) -> dict:
    """Anthropic's usage: ``input_tokens`` are the prompt tokens decoded for this request, and
    ``cache_read_input_tokens`` those an engine reused from its KV cache (their sum is the prompt)."""
    used = result["usage"]
    cached = used.get("cached_tokens", 0)
    return {
        "input_tokens": used["input_tokens"] - cached,
        "output_tokens": used["output_tokens"],
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def tool_input(arguments: str) -> dict:
    """A call's ``input``: its arguments (the JSON text of an object, as the runtime parses calls)."""
    parsed = orjson.loads(arguments or "{}")
    return parsed if isinstance(parsed, dict) else {"value": parsed}


class MessageBuilder:
    """Builds the answer of one Messages request."""

    def __init__(self, request: MessagesRequest):
        self.id = f"msg_{uuid.uuid4().hex}"
        self.model = request.generation.model
        self._open: str | None = None  # the type of the content block being streamed
        self._index = -1  # the index of the last block started

    def _message(self, content: list[dict], result: dict | None) -> dict:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": None if result is None else stop_reason(result),
            "stop_sequence": None if result is None else result.get("stop_sequence"),
            "usage": usage(result) if result is not None else {
                "input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
            },
        }

    def final(self, result: dict) -> dict:
        content = []
        if result.get("reasoning"):
            content.append({"type": "thinking", "thinking": result["reasoning"], "signature": ""})
        if result["text"]:
            content.append({"type": "text", "text": result["text"]})
        for call in result.get("tool_calls") or ():
            content.append(
                {"type": "tool_use", "id": call["id"], "name": call["name"], "input": tool_input(call["arguments"])}
            )
        return self._message(content, result)

    # -- SSE -----------------------------------------------------------------------------
    def opening_chunk(self) -> bytes:
        return sse_event("message_start", {"type": "message_start", "message": self._message([], None)})

    def _start(self, block: dict) -> bytes:
        closing = self._stop()
        self._index += 1
        self._open = block["type"]
        return closing + sse_event("content_block_start", {"type": "content_block_start", "index": self._index,
                                                           "content_block": block})

    def _stop(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return sse_event("content_block_stop", {"type": "content_block_stop", "index": self._index})

    def _delta(self, delta: dict) -> bytes:
        return sse_event("content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": delta})

    def event_chunk(self, event: dict) -> bytes:
        """The events of one of the runtime's generate events (``reasoning``, ``delta``,
        ``tool_call``); nothing for the others."""
        kind = event.get("event")
        if kind == GENERATE_REASONING:
            opening = b"" if self._open == "thinking" else self._start(
                {"type": "thinking", "thinking": "", "signature": ""}
            )
            return opening + self._delta({"type": "thinking_delta", "thinking": event["text"]})
        if kind == GENERATE_DELTA and event["text"]:
            opening = b"" if self._open == "text" else self._start({"type": "text", "text": ""})
            return opening + self._delta({"type": "text_delta", "text": event["text"]})
        if kind == GENERATE_TOOL_CALL:
            call = event["call"]
            return (
                self._start({"type": "tool_use", "id": call["id"], "name": call["name"], "input": {}})
                + self._delta({"type": "input_json_delta", "partial_json": call["arguments"]})
                + self._stop()
            )
        return b""

    def closing_chunks(self, result: dict) -> list[bytes]:
        used = usage(result)
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason(result), "stop_sequence": result.get("stop_sequence")},
            "usage": used,
        }
        return [self._stop(), sse_event("message_delta", delta), sse_event("message_stop", {"type": "message_stop"})]

    @staticmethod
    def error_chunks(envelope: dict) -> list[bytes]:
        return [sse_event("error", envelope)]
