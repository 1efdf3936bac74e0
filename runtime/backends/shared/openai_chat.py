"""The OpenAI-compatible chat-completions client the managed servers and openai_remote speak.

``chat_request`` turns a ``GenerationRequest`` into a ``/v1/chat/completions``
body (instructions first as the system message, image and audio parts as chat
parts, a json_schema ``text.format`` as ``response_format`` where the server
takes it, the tools with their tool_choice and parallel_tool_calls, earlier calls
as the assistant's ``tool_calls`` and their results as ``tool`` messages, the
sampling options the request sets);
``chat_completion`` posts it, streamed or not as the body says, and translates
the answer into ``TextDelta`` / ``ToolCall`` / ``Finished``: the upstream parses
its model's calls, and they come back as it wrote them (its call ids kept; a
stream's ``delta.tool_calls`` fragments joined by index, each call yielded once
the stream ends).  ``upstream_error``
maps an upstream error answer: a refused request (400, 413, 422) is our 400
(``context_length_exceeded`` when the prompt does not fit), anything else the
caller's ``failure`` class.
"""
from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx

from runtime.backends.base import Finished, GenerationRequest, TextDelta
from runtime.backends.shared.prompts import CHAT_ROLES, TEXT_PARTS, template_variables
from runtime.errors import ContextLengthExceeded, FileInputUnsupported, InvalidRequest, LLMPoolError
from runtime.json_codec import loads
from runtime.inference.tool_calls import ToolCall, chosen_name

# Upstream statuses that mean the request itself was refused (too long, malformed).
REQUEST_REJECTED = (400, 413, 422)
# How llama-server, vLLM, SGLang and OpenAI word a prompt that does not fit the context.
CONTEXT_OVERFLOW = re.compile(r"context (length|size|window)|exceeds? the available context", re.IGNORECASE)


def chat_request(
    request: GenerationRequest,
    model: str,
    *,
    configured_thinking: bool | None = None,
    json_schema: bool = False,
    file_part: Callable[[dict], dict] | None = None,
    stream: bool | None = None,
    named_tool_choice: bool = True,
    repeat_penalty_field: str = "repetition_penalty",
) -> dict:
    """The ``/v1/chat/completions`` body for ``request``: streamed (with usage) when ``stream``
    (by default: when the client streams), else one answer, which spares the upstream and us a
    chunk per token.  ``named_tool_choice`` False: the server does not honour a named function
    as tool_choice, so it gets that function alone with "required" (``required_for_named``).
    The sampling options the request sets are sent by their OpenAI names, ``top_k`` as vLLM,
    SGLang and llama-server name it and ``repeat_penalty`` as ``repeat_penalty_field`` (vLLM's
    and SGLang's ``repetition_penalty``, llama-server's ``repeat_penalty``); the runtime refused
    those the model's ``capabilities.sampling_options`` lacks."""
    stream = request.stream if stream is None else stream
    body = {
        "model": model,
        "messages": chat_completion_messages(request, file_part),
        "stream": stream,
        **({"stream_options": {"include_usage": True}} if stream else {}),
        "max_tokens": request.max_output_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
    }
    for name, value in (
        ("seed", request.seed), ("presence_penalty", request.presence_penalty),
        ("frequency_penalty", request.frequency_penalty), ("top_k", request.top_k),
        (repeat_penalty_field, request.repeat_penalty),
    ):
        if value is not None:
            body[name] = value
    if request.logprobs is not None:  # each delta's logprobs come back in the chat completions shape
        body["logprobs"], body["top_logprobs"] = True, request.logprobs
    template_kwargs = template_variables(request, configured_thinking)
    if template_kwargs:
        body["chat_template_kwargs"] = template_kwargs
    response_format = request.response_format
    if json_schema and response_format and response_format.get("type") == "json_schema":
        body["response_format"] = chat_response_format(response_format)
    if request.tools:
        # Sent explicitly: a server's own default may be "none" (trtllm-serve's is).
        body["tools"] = request.tools
        body["tool_choice"] = request.tool_choice if request.tool_choice is not None else "auto"
        if request.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = request.parallel_tool_calls
        if not named_tool_choice:
            body = required_for_named(body)
    return body


def required_for_named(body: dict) -> dict:
    """``body`` with a named-function ``tool_choice`` as that one tool and "required", for a
    server that reads only the choice's string forms (llama-server treats an object as "auto");
    any other body as it is."""
    name = chosen_name(body.get("tool_choice"))
    if name is None or not isinstance(body.get("tools"), list):
        return body
    tools = [
        tool for tool in body["tools"] if isinstance(tool, dict) and (tool.get("function") or {}).get("name") == name
    ]
    return {**body, "tools": tools, "tool_choice": "required"}


def chat_completion_messages(request: GenerationRequest, file_part: Callable[[dict], dict] | None = None) -> list[dict]:
    """Responses API messages as chat messages; instructions first, as the system message.  An
    assistant's calls become its ``tool_calls`` (content null when it said nothing), a call's
    result a ``tool`` message with its ``tool_call_id``."""
    messages = [{"role": "system", "content": request.instructions}] if request.instructions else []
    for message in request.messages:
        parts = [_chat_part(part, file_part) for part in message["content"]]
        if all(part["type"] == "text" for part in parts):
            content: str | list | None = "".join(part["text"] for part in parts)
        else:
            content = parts
        chat = {"role": CHAT_ROLES.get(message["role"], message["role"]), "content": content}
        if message.get("tool_calls"):
            chat["content"] = content or None
            chat["tool_calls"] = [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
                for call in message["tool_calls"]
            ]
        if message["role"] == "tool":
            chat["tool_call_id"] = message.get("tool_call_id")
        messages.append(chat)
    return messages


def _chat_part(part: dict, file_part: Callable[[dict], dict] | None) -> dict:
    kind = part.get("type")
    if kind in TEXT_PARTS:
        return {"type": "text", "text": part.get("text", "")}
    if kind == "input_image":
        if not part.get("image_url"):
            raise InvalidRequest("input_image parts need an image_url for this model", param="input")
        image = {"url": part["image_url"]}
        if part.get("detail"):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    if kind == "input_audio":
        return {"type": "input_audio", "input_audio": part.get("input_audio") or {}}
    if kind == "input_file" and file_part is not None:
        return file_part(part)
    raise FileInputUnsupported(f"this model does not accept {kind} content", param="input")


def chat_response_format(response_format: dict) -> dict:
    """A Responses API ``text.format`` json_schema as the chat completions ``response_format``."""
    if "json_schema" in response_format:
        return {"type": "json_schema", "json_schema": response_format["json_schema"]}
    schema = {"name": response_format.get("name") or "response", "schema": response_format["schema"]}
    if "strict" in response_format:
        schema["strict"] = response_format["strict"]
    return {"type": "json_schema", "json_schema": schema}


async def chat_completion(
    client: httpx.AsyncClient, url: str, body: dict, upstream: str, failure: type[LLMPoolError]
) -> AsyncIterator[TextDelta | ToolCall | Finished]:
    """POST ``body`` (streamed or not, as it says) and translate the answer into deltas, the
    message's tool calls and the end.

    An upstream that refuses ``max_tokens`` for its context (vLLM and SGLang refuse a prompt plus
    ``max_tokens`` past the model's length) is asked once more without it: an output limit past
    the model's room is the room, as where a local engine stops at a full context (Claude Code
    sends 32000 whatever the model).  A prompt that does not fit is refused again, and that is
    the request's 400."""
    answered = False
    try:
        async for event in _completion(client, url, body, upstream, failure):
            answered = True
            yield event
    except ContextLengthExceeded:
        if answered or body.get("max_tokens") is None:
            raise
        unbounded = {key: value for key, value in body.items() if key != "max_tokens"}
        async for event in _completion(client, url, unbounded, upstream, failure):
            yield event


async def _completion(
    client: httpx.AsyncClient, url: str, body: dict, upstream: str, failure: type[LLMPoolError]
) -> AsyncIterator[TextDelta | ToolCall | Finished]:
    if body.get("stream"):
        async for event in stream_chat(client, url, body, upstream, failure):
            yield event
        return
    response = await client.post(url, json=body)
    if response.status_code != 200:
        raise upstream_error(response.status_code, response.content, upstream, failure)
    try:
        answer = response.json()
    except ValueError:
        raise failure(f"{upstream} answered 200 with a body that is not JSON") from None
    if not isinstance(answer, dict):
        raise failure(f"{upstream} answered 200 with {type(answer).__name__}, not a chat completion")
    if answer.get("error"):
        raise failure(f"{upstream} failed while generating: {error_text(answer)}")
    choices = answer.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        raise failure(f"{upstream} answered without a choice")
    message = choices[0].get("message") or {}
    text = message.get("content") or ""
    if text:
        yield TextDelta(text, logprobs=content_logprobs(choices[0]))
    calls = ToolCallFragments(upstream, failure)
    for index, call in enumerate(message.get("tool_calls") or ()):
        calls.add({"index": index, **call} if isinstance(call, dict) else call)
    for call in calls.complete():
        yield call
    reason = "length" if choices[0].get("finish_reason") == "length" else "stop"
    # An upstream that reports no usage: about four characters a token, as the scheduler estimates.
    yield upstream_finished(answer.get("usage"), answer.get("timings"), reason, max(1, len(text) // 4) if text else 0)


def content_logprobs(choice: dict) -> list | None:
    """A chat completion choice's ``logprobs.content`` (one entry per token, the shape
    ``TextDelta.logprobs`` carries), or None where it has none."""
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    return content if isinstance(content, list) else None


def upstream_finished(usage: Any, timings: Any, finish_reason: str, fallback_output: int) -> Finished:
    """The end of an upstream's answer: its ``usage``'s prompt and completion tokens (none reported:
    ``fallback_output`` tokens out), and the prompt tokens it reused from its cache,
    ``usage.prompt_tokens_details.cached_tokens`` (OpenAI's, vLLM's, llama-server's), else
    llama-server's ``timings.cache_n``; None where it says neither.  Speculative decoding's
    figures come from llama-server's ``timings.draft_n`` and ``timings.draft_n_accepted``."""
    usage = usage if isinstance(usage, dict) else {}
    timings = timings if isinstance(timings, dict) else {}
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if cached is None:
        cached = timings.get("cache_n")
    return Finished(
        input_tokens=usage.get("prompt_tokens") or 0,
        output_tokens=usage.get("completion_tokens") or fallback_output,
        finish_reason=finish_reason,
        cached_tokens=_count(cached),
        draft_tokens=_count(timings.get("draft_n")),
        accepted_tokens=_count(timings.get("draft_n_accepted")),
    )


def _count(value: Any) -> int | None:
    """A token count an upstream reported: a non-negative integer, else None."""
    return value if type(value) is int and value >= 0 else None


async def stream_chat(
    client: httpx.AsyncClient, url: str, body: dict, upstream: str, failure: type[LLMPoolError]
) -> AsyncIterator[TextDelta | ToolCall | Finished]:
    """POST a streamed chat completion and translate its SSE events; ``failure`` is the error
    class.  ``delta.tool_calls`` fragments are joined by index and the calls yielded, in index
    order, when the stream has ended."""
    async with client.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            raise upstream_error(response.status_code, await response.aread(), upstream, failure)
        finish, usage, timings, pieces, done = None, None, None, 0, False
        calls = ToolCallFragments(upstream, failure)
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            chunk = loads(data)
            if chunk.get("error"):
                raise failure(f"{upstream} failed while generating: {error_text(chunk)}")
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                text = delta.get("content")
                if text:
                    pieces += 1
                    yield TextDelta(text, logprobs=content_logprobs(choice))
                for fragment in delta.get("tool_calls") or ():
                    pieces += 1
                    calls.add(fragment)
                finish = choice.get("finish_reason") or finish
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
        if finish is None and not done:
            raise failure(f"{upstream} ended the stream without a finish reason")
    for call in calls.complete():
        yield call
    yield upstream_finished(usage, timings, "length" if finish == "length" else "stop", pieces)


class ToolCallFragments:
    """The tool calls of one answer, from the message's ``tool_calls`` or a stream's
    ``delta.tool_calls`` fragments (``{"index", "id", "function": {"name", "arguments"}}``).

    As the openai client joins a stream, the fragments of one index make one call: its name and
    arguments are the fragments' strings joined, its id the first one given (an upstream that
    gives none gets one of ours).  Arguments given as a JSON object (not text) are written as
    JSON text.  A call without a name is the upstream's fault (``failure``).
    """

    def __init__(self, upstream: str, failure: type[LLMPoolError]):
        self.upstream = upstream
        self.failure = failure
        self.calls: dict[int, dict] = {}

    def add(self, fragment: Any) -> None:
        if not isinstance(fragment, dict) or not isinstance(fragment.get("index", 0), int):
            raise self.failure(f"{self.upstream} answered a tool call without an index: {fragment!r}")
        call = self.calls.setdefault(fragment.get("index", 0), {"id": None, "name": "", "arguments": ""})
        if fragment.get("id") and call["id"] is None:
            call["id"] = str(fragment["id"])
        function = fragment.get("function") or {}
        call["name"] += function.get("name") or ""
        arguments = function.get("arguments")
        if isinstance(arguments, (dict, list)):
            arguments = json.dumps(arguments, ensure_ascii=False)
        call["arguments"] += arguments or ""

    def complete(self) -> list[ToolCall]:
        calls = []
        for index in sorted(self.calls):
            call = self.calls[index]
            if not call["name"]:
                raise self.failure(f"{self.upstream} answered tool call {index} without a function name")
            extra = {"id": call["id"]} if call["id"] else {}
            calls.append(ToolCall(name=call["name"], arguments=call["arguments"] or "{}", **extra))
        return calls


def upstream_error(status: int, body: bytes, upstream: str, failure: type[LLMPoolError]) -> LLMPoolError:
    """An upstream error answer as our error: a refused request is 400, anything else ``failure``."""
    try:
        detail = error_text(json.loads(body))
    except ValueError:
        detail = body.decode("utf-8", "replace").strip()[:500] or "(empty body)"
    message = f"{upstream} answered {status}: {detail}"
    if status in REQUEST_REJECTED:
        if CONTEXT_OVERFLOW.search(detail):
            return ContextLengthExceeded(message, param="input")
        return InvalidRequest(message, param="input")
    return failure(message)


def error_text(payload: Any) -> str:
    """The message of an OpenAI-style ``{"error": {"message"}}`` body (or of a looser one)."""
    if not isinstance(payload, dict):
        return str(payload)
    error = payload.get("error")
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error or payload.get("message") or payload.get("detail") or payload)
