"""The chat completions answer shapes: the ``chat.completion`` object and the SSE chunks of a stream.

A stream is ``data: <chat.completion.chunk>`` lines: the assistant role first, one chunk per
delta (a thinking model's reasoning as ``delta.reasoning_content``, before its answer's
``delta.content``; each tool call as OpenAI streams one: a ``delta.tool_calls`` entry with its
``index``, ``id``, ``type`` and ``function.name`` (arguments ""), then its arguments; with logprobs asked for, ``choices[0].logprobs.content`` holds the entries of
the delta's tokens), one with the ``finish_reason``, then (with ``stream_options.include_usage``) one with no
choices and the ``usage``, then ``data: [DONE]``.  An error after the stream started is one
``data: {"error": {code, message, param}}`` line before ``[DONE]``, which the openai client
raises as an ``APIError``.
"""
from __future__ import annotations

import time
import uuid

from models_app.api.chat.protocol import ChatRequest
from models_app.api.inference import DONE, sse_data
from runtime.inputs.request import GENERATE_DELTA, GENERATE_REASONING, GENERATE_TOOL_CALL


class ChatCompletionBuilder:
    """Builds the answer of one chat completions request."""

    def __init__(self, request: ChatRequest):
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = request.generation.model
        self.include_usage = request.include_usage

    def final(self, result: dict) -> dict:
        """The ``chat.completion`` object of a non-streamed request: a thinking model's reasoning
        in ``message.reasoning_content`` (as vLLM, llama-server and DeepSeek answer it); tool calls
        in ``message.tool_calls``, with content null when the answer has no text."""
        calls = result.get("tool_calls")
        content = None if calls and not result["text"] else result["text"]
        message = {"role": "assistant", "content": content, "refusal": None}
        if calls:
            message["tool_calls"] = [_tool_call(call) for call in calls]
        if "reasoning" in result:
            message["reasoning_content"] = result["reasoning"]
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{
                "index": 0,
                "message": message,
                "finish_reason": result["finish_reason"],
                "logprobs": _logprobs(result.get("logprobs")),
            }],
            "usage": usage(result),
        }

    # -- SSE -----------------------------------------------------------------------------
    def _chunk(self, choices: list[dict], **fields) -> bytes:
        chunk = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                 "choices": choices, **fields}
        if self.include_usage:
            chunk.setdefault("usage", None)
        return sse_data(chunk)

    @staticmethod
    def _choice(delta: dict, finish_reason: str | None = None, logprobs: list[dict] | None = None) -> dict:
        return {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": _logprobs(logprobs)}

    def opening_chunk(self) -> bytes:
        return self._chunk([self._choice({"role": "assistant", "content": ""})])

    def delta_chunk(self, text: str, logprobs: list[dict] | None = None) -> bytes:
        return self._chunk([self._choice({"content": text}, logprobs=logprobs)])

    def reasoning_chunk(self, text: str) -> bytes:
        return self._chunk([self._choice({"reasoning_content": text})])

    def tool_call_chunks(self, index: int, call: dict) -> bytes:
        """One call as OpenAI streams it: its index, id, type and name first, then its arguments."""
        opening = {"index": index, "id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": ""}}
        arguments = {"index": index, "function": {"arguments": call["arguments"]}}
        return self._chunk([self._choice({"tool_calls": [opening]})]) + self._chunk(
            [self._choice({"tool_calls": [arguments]})]
        )

    def event_chunk(self, event: dict) -> bytes:
        """The chunk(s) of one of the runtime's generate events (``delta``, ``reasoning``,
        ``tool_call``); nothing for the others."""
        if event.get("event") == GENERATE_TOOL_CALL:
            return self.tool_call_chunks(event["index"], event["call"])
        if event.get("event") == GENERATE_REASONING:
            return self.reasoning_chunk(event["text"])
        if event.get("event") == GENERATE_DELTA:
            return self.delta_chunk(event["text"], event.get("logprobs"))
        return b""

    def closing_chunks(self, result: dict) -> list[bytes]:
        chunks = [self._chunk([self._choice({}, result["finish_reason"])])]
        if self.include_usage:
            chunks.append(self._chunk([], usage=usage(result)))
        return [*chunks, DONE]

    @staticmethod
    def error_chunks(envelope: dict) -> list[bytes]:
        return [sse_data(envelope), DONE]


def _tool_call(call: dict) -> dict:
    return {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}


def usage(result: dict) -> dict:
    """The usage object; ``prompt_tokens_details.cached_tokens`` where the engine reused prompt
    tokens from its KV cache (and said how many), ``completion_tokens_details.reasoning_tokens``
    where the runtime counted a thinking model's reasoning."""
    used = result["usage"]
    answer = {
        "prompt_tokens": used["input_tokens"],
        "completion_tokens": used["output_tokens"],
        "total_tokens": used["input_tokens"] + used["output_tokens"],
    }
    if "cached_tokens" in used:
        answer["prompt_tokens_details"] = {"cached_tokens": used["cached_tokens"]}
    if "reasoning_tokens" in used:
        answer["completion_tokens_details"] = {"reasoning_tokens": used["reasoning_tokens"]}
    return answer


def _logprobs(entries: list[dict] | None) -> dict | None:
    """``choice.logprobs``: the answer's token entries, or null where none were asked for."""
    return None if entries is None else {"content": entries, "refusal": None}
