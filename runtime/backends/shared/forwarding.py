"""Pass-through: the client's own body sent to an OpenAI-compatible upstream, its answer sent back.

The managed servers and openai_remote forward a ``ForwardedRequest`` (``path``, ``body``: the
client's JSON body and the path it was posted to) instead of re-encoding it, so every field the
upstream supports (logprobs, tools, n, grammar, n_probs...) works as the upstream documents it.
``forwarded_body`` is what the upstream gets: the client's body with ``model`` set to the
upstream's name, llm-pool's own fields (``thinking``) left out (its choice goes in
``chat_template_kwargs`` where the body has messages, as on the typed path), and, for a stream,
``stream_options.include_usage`` forced on, so the upstream's usage counts the request's tokens
for the fair-share scheduler.

``forward`` posts it to the same path on the upstream and yields:

- streamed: one ``UpstreamChunk`` per SSE data event, the upstream's JSON as it wrote it (the
  usage-only chunk and the ``usage`` fields left out again when the client did not ask for
  them), then ``Finished``;
- not streamed: one ``UpstreamAnswer`` with the upstream's JSON answer, then ``Finished``.
  With ``stream_upstream`` (llama-server) the upstream is asked for a stream all the same and
  its chunks are put back together into the answer it would have sent (``assemble``): llama-server
  notices a client that left only between the chunks of a stream, or, not streamed, only after a
  whole second in which no other task of the server answered anything (another slot's tokens, a
  ``/slots`` or ``/metrics`` poll), so a busy server would finish an abandoned answer.  The
  engine leaves it off for an answer held to a few tokens (``answer_bound``,
  ``ServerProfile.streams_upstream``): unstreamed, such a call costs about 1 ms less.

``Finished`` carries the upstream's usage (``prompt_tokens``, ``completion_tokens``, and the
cached prompt tokens of ``openai_chat.upstream_finished``); an upstream
that reports none is charged no prompt and one token per chunk (streamed) or about four
characters a token of the answer's text.  Nothing here depends on the path: /v1/chat/completions
and /v1/completions are forwarded alike.  An upstream's refusal (400, 413, 422) is our 400 with
its message (``openai_chat.upstream_error``); anything else the caller's ``failure`` class.
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import httpx

from runtime.backends.base import Finished
from runtime.backends.shared.openai_chat import error_text, upstream_error, upstream_finished
from runtime.errors import LLMPoolError
from runtime.json_codec import loads

# Request fields that are llm-pool's own and that no upstream knows.
LLM_POOL_FIELDS = ("thinking",)


@dataclass
class UpstreamChunk:
    """One event of a forwarded stream: the upstream's parsed JSON chunk."""

    chunk: dict


@dataclass
class UpstreamAnswer:
    """The upstream's whole JSON answer to a forwarded request that does not stream."""

    answer: dict


def forwarded_body(body: dict, model: str, template_kwargs: dict | None = None) -> dict:
    """The body the upstream gets for the client's ``body`` (see the module docstring)."""
    sent = {key: value for key, value in body.items() if key not in LLM_POOL_FIELDS}
    sent["model"] = model
    if sent.get("stream"):
        options = sent.get("stream_options")
        sent["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    if template_kwargs and "messages" in sent:  # only a chat has a template
        chosen = sent.get("chat_template_kwargs")
        sent["chat_template_kwargs"] = {**template_kwargs, **(chosen if isinstance(chosen, dict) else {})}
    return sent


# The body fields that hold an answer to a number of tokens: OpenAI's and llama.cpp's own.
TOKEN_BOUNDS = ("max_tokens", "max_completion_tokens", "n_predict")


def answer_bound(body: dict) -> int | None:
    """The most tokens the client's ``body`` lets the upstream write (the largest of
    ``TOKEN_BOUNDS`` it sets), or None where it sets none, or sets one to no bound (llama.cpp's
    ``n_predict`` -1) or to anything but a positive integer."""
    bounds = [body[field] for field in TOKEN_BOUNDS if body.get(field) is not None]
    if not bounds or not all(type(bound) is int and bound > 0 for bound in bounds):
        return None
    return max(bounds)


def usage_wanted(body: dict) -> bool:
    """Whether the client's own stream asked for the usage chunk."""
    options = body.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


async def forward(
    client: httpx.AsyncClient,
    path: str,
    passthrough_body: dict,
    model: str,
    upstream: str,
    failure: type[LLMPoolError],
    template_kwargs: dict | None = None,
    stream_upstream: bool = False,
) -> AsyncIterator[UpstreamChunk | UpstreamAnswer | Finished]:
    """POST the client's body (see ``forwarded_body``) to ``path`` and yield the upstream's answer;
    ``stream_upstream``: a request that does not stream is streamed from the upstream all the same
    and given back whole (see the module docstring)."""
    if stream_upstream and not passthrough_body.get("stream"):
        streamed = forwarded_body({**passthrough_body, "stream": True}, model, template_kwargs)
        chunks: list[dict] = []
        async with aclosing(_stream(client, path, streamed, True, upstream, failure)) as events:
            async for event in events:
                if isinstance(event, UpstreamChunk):
                    chunks.append(event.chunk)
                else:
                    yield UpstreamAnswer(assemble(chunks))
                    yield event
        return
    body = forwarded_body(passthrough_body, model, template_kwargs)
    if body.get("stream"):
        # aclosing: closing this generator closes the stream (and its connection) at once, not when
        # the inner generator is collected.
        async with aclosing(_stream(client, path, body, usage_wanted(passthrough_body), upstream, failure)) as events:
            async for event in events:
                yield event
        return
    response = await client.post(path, json=body)
    if response.status_code != 200:
        raise upstream_error(response.status_code, response.content, upstream, failure)
    answer = _json_object(response.content, upstream, failure)
    yield UpstreamAnswer(answer)
    choices = [choice for choice in answer.get("choices") or () if isinstance(choice, dict)]
    text = "".join(_choice_text(choice) for choice in choices)
    reasons = {choice.get("finish_reason") for choice in choices}
    yield _finished(answer.get("usage"), answer.get("timings"), reasons, max(1, len(text) // 4) if text else 0)


async def _stream(
    client: httpx.AsyncClient, path: str, body: dict, wanted: bool, upstream: str, failure: type[LLMPoolError]
) -> AsyncIterator[UpstreamChunk | Finished]:
    """The upstream's SSE stream, chunk by chunk; closing this generator closes the connection,
    which is how the upstream learns that the client went away."""
    async with client.stream("POST", path, json=body) as response:
        if response.status_code != 200:
            raise upstream_error(response.status_code, await response.aread(), upstream, failure)
        usage, timings, reasons, pieces, done = None, None, set(), 0, False
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue  # blank separators, comments (": ping"), event names
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            chunk = _json_object(data, upstream, failure)
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
            for choice in chunk.get("choices") or ():
                if isinstance(choice, dict):
                    reasons.add(choice.get("finish_reason"))
                    pieces += bool(_choice_text(choice))
            if not wanted:
                if "usage" in chunk and not chunk.get("choices"):
                    continue  # the usage-only chunk the client did not ask for
                chunk.pop("usage", None)
            yield UpstreamChunk(chunk)
        if not done:
            raise failure(f"{upstream} ended the stream without [DONE]")
    yield _finished(usage, timings, reasons, pieces)


def assemble(chunks: list[dict]) -> dict:
    """The answer an OpenAI-style upstream sends unstreamed, from the chunks of its stream.

    The top-level fields are the chunks' (the first one's ``id``, ``created``, ``model``; later
    chunks add theirs, such as llama-server's ``timings`` and the usage chunk's ``usage``), the
    ``object`` the unstreamed one (``chat.completion``; a completion's ``text_completion`` stays).
    Each choice, by its index: the deltas become the ``message`` (its texts joined, ``role`` as
    first given, ``tool_calls`` joined by their index with their arguments' fragments in order),
    a completion's ``text`` joined, ``logprobs`` joined list by list, the last ``finish_reason``.
    """
    answer: dict[str, Any] = {}
    choices: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for key, value in chunk.items():
            if key == "choices":
                continue
            if key not in answer or key not in ("id", "created", "model"):
                answer[key] = value
        for choice in chunk.get("choices") or ():
            if isinstance(choice, dict):
                _add_choice(choices.setdefault(choice.get("index", 0), {"index": choice.get("index", 0)}), choice)
    if answer.get("object") == "chat.completion.chunk":
        answer["object"] = "chat.completion"
    answer["choices"] = [_chat_choice(choices[index]) for index in sorted(choices)]
    return answer


def _add_choice(whole: dict[str, Any], piece: dict[str, Any]) -> None:
    """One chunk's ``piece`` of a choice added to what came before (``assemble``)."""
    for key, value in piece.items():
        if key == "delta" and isinstance(value, dict):
            message = whole.setdefault("message", {})
            for field, part in value.items():
                if field == "tool_calls" and isinstance(part, list):
                    _add_tool_calls(message.setdefault("tool_calls", []), part)
                elif isinstance(part, str) and field != "role" and isinstance(message.get(field), str):
                    message[field] += part
                elif part is not None and (field != "role" or "role" not in message):
                    message[field] = part
        elif key == "text" and isinstance(value, str):
            whole["text"] = whole.get("text", "") + value
        elif key == "logprobs" and isinstance(value, dict):
            joined = whole.get("logprobs") if isinstance(whole.get("logprobs"), dict) else {}
            for field, part in value.items():
                earlier = joined.get(field)
                joined[field] = earlier + part if isinstance(part, list) and isinstance(earlier, list) else part
            whole["logprobs"] = joined
        elif key == "finish_reason":
            if value is not None or "finish_reason" not in whole:
                whole["finish_reason"] = value
        elif key not in whole or value is not None:
            whole[key] = value


def _add_tool_calls(calls: list[dict], fragments: list) -> None:
    """Stream fragments of tool calls added to ``calls``: a fragment with a new index starts a
    call, one with a known index adds its arguments (and any field it names first)."""
    for fragment in fragments:
        if not isinstance(fragment, dict):
            continue
        index = fragment.get("index", len(calls))  # a server that leaves it out sends each call whole
        call = next((c for c in calls if c["index"] == index), None)
        if call is None:
            calls.append({**fragment, "index": index, "function": dict(fragment.get("function") or {})})
            continue
        for field, part in fragment.items():
            if field == "function" and isinstance(part, dict):
                function = call["function"]
                for name, value in part.items():
                    if name == "arguments" and isinstance(value, str):
                        function["arguments"] = (function.get("arguments") or "") + value
                    elif value is not None and not function.get(name):
                        function[name] = value
            elif part is not None and not call.get(field):
                call[field] = part


def _chat_choice(choice: dict[str, Any]) -> dict[str, Any]:
    """A chat choice as an unstreamed answer has it: no ``index`` on its tool calls, and
    ``content`` null where none came."""
    message = choice.get("message")
    if message is not None:
        message.setdefault("content", None)
        for call in message.get("tool_calls") or ():
            call.pop("index", None)
    return choice


def _finished(usage: Any, timings: Any, reasons: set, fallback_output: int) -> Finished:
    """The end of a forwarded request: the upstream's usage and cached tokens (``upstream_finished``)."""
    return upstream_finished(usage, timings, "length" if "length" in reasons else "stop", fallback_output)


def _choice_text(choice: Any) -> str:
    """A choice's text: a chat message's or delta's content, or a completion's text."""
    if not isinstance(choice, dict):
        return ""
    message = choice.get("message") or choice.get("delta") or {}
    text = message.get("content") if isinstance(message, dict) else None
    text = text if isinstance(text, str) else choice.get("text")
    return text if isinstance(text, str) else ""


def _json_object(data: str | bytes, upstream: str, failure: type[LLMPoolError]) -> dict:
    try:
        value = loads(data)
    except ValueError:
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
        raise failure(f"{upstream} answered with a body that is not JSON: {text[:200]!r}") from None
    if not isinstance(value, dict):
        raise failure(f"{upstream} answered {type(value).__name__}, not a JSON object")
    if value.get("error"):
        raise failure(f"{upstream} failed while generating: {error_text(value)}")
    return value
