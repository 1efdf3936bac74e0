"""The completions answer shapes: the ``text_completion`` object and the SSE chunks of a stream.

A stream is ``data: <text_completion>`` lines (the same object as the answer, one choice): one
per delta with ``finish_reason`` null, one with empty text and the ``finish_reason``, then (with
``stream_options.include_usage``) one with no choices and the ``usage``, then ``data: [DONE]``.
Until that last one, every chunk carries ``"usage": null`` when usage was asked for, as OpenAI
sends it.  An error after the stream started is one ``data: {"error": {code, message, param}}``
line before ``[DONE]``, which the openai client raises as an ``APIError``.

With ``logprobs`` asked for, a choice's ``logprobs`` is the legacy object (``tokens``,
``token_logprobs``, ``top_logprobs`` as token -> logprob maps, ``text_offset`` of each token in
the completion's text), built from the runtime's per-token entries (the chat completions shape).
"""
from __future__ import annotations

from models_app.api.openai_protocol import OpenAIAnswer, usage
from models_app.api.request_body import OpenAIRequest
from runtime.inputs.request import GENERATE_DELTA


class CompletionBuilder(OpenAIAnswer):
    """Builds the answer of one completions request."""

    def __init__(self, request: OpenAIRequest):
        super().__init__(request, id_prefix="cmpl-", chunk_object="text_completion")
        self.sent = 0  # characters of completion text streamed so far (the next token's text_offset)

    @staticmethod
    def _choice(text: str, finish_reason: str | None, logprobs: dict | None = None) -> dict:
        return {"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish_reason}

    def final(self, result: dict) -> dict:
        """The ``text_completion`` object of a non-streamed request."""
        logprobs = result.get("logprobs")
        choice = self._choice(result["text"], result["finish_reason"], None if logprobs is None else legacy_logprobs(logprobs))
        return self._object("text_completion", [choice], usage=usage(result))

    # -- SSE -----------------------------------------------------------------------------
    @staticmethod
    def opening_chunk() -> bytes:
        return b""  # a completion stream opens with its first text

    def event_chunk(self, event: dict) -> bytes:
        """The chunk of one of the runtime's generate events: a ``delta``'s; nothing for the others."""
        return self.delta_chunk(event) if event.get("event") == GENERATE_DELTA else b""

    def delta_chunk(self, delta: dict) -> bytes:
        """The chunk of one runtime ``delta`` event (its text, and its tokens' logprobs when asked)."""
        logprobs = delta.get("logprobs")
        chunk = self._chunk([self._choice(delta["text"], None, None if logprobs is None else legacy_logprobs(logprobs, self.sent))])
        self.sent += len(delta["text"])
        return chunk

    def finish_choice(self, finish_reason: str) -> dict:
        return self._choice("", finish_reason)


def legacy_logprobs(entries: list[dict], offset: int = 0) -> dict:
    """The completions ``logprobs`` object of per-token entries (``{"token", "logprob",
    "top_logprobs": [{"token", "logprob"}]}``) whose first token starts at ``offset``."""
    tokens, token_logprobs, top_logprobs, text_offset = [], [], [], []
    for entry in entries:
        tokens.append(entry["token"])
        token_logprobs.append(entry["logprob"])
        top_logprobs.append({alternative["token"]: alternative["logprob"] for alternative in entry.get("top_logprobs") or ()})
        text_offset.append(offset)
        offset += len(entry["token"])
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs, "text_offset": text_offset}
