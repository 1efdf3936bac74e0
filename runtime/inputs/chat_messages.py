"""Chat completions messages in the typed request's shape (``GenerationRequest.messages``).

The chat parser at the edge validates a ``/v1/chat/completions`` body (its errors, its
refusals) and builds the typed messages with ``typed_chat_messages``; the runtime builds
them again with the same function from the client's own body, which the request carries
anyway as a ``ForwardedRequest``.  So a chat request crosses the channel layer with its
conversation once, not twice (``ForwardedRequest.to_wire``).

The input is a validated body's ``messages`` as the client sent them (strict JSON types):
``content`` a string, a list of parts or absent; parts ``text``, ``refusal``,
``image_url``, ``input_audio``, ``file``; an assistant's ``tool_calls``; a tool message's
``tool_call_id``.  Other fields (a name, an echoed ``reasoning_content``, a part's extra
keys) change nothing here and are left out.
"""
from __future__ import annotations

from typing import Any

FILE_FIELDS = ("file_id", "file_data", "filename")


def typed_chat_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [typed_chat_message(message) for message in messages]


def typed_chat_message(message: dict[str, Any]) -> dict[str, Any]:
    """One message: ``{"role", "content": [parts]}``, with ``tool_call_id`` on a tool message and
    ``tool_calls`` (``{"id", "name", "arguments"}``) where the message has calls; a legacy
    function message (or one with ``function_call``) keeps its role and content only."""
    role = message["role"]
    content = message.get("content")
    parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else [
        typed_part(part) for part in content or ()
    ]
    typed = {"role": role, "content": parts}
    if role == "function" or message.get("function_call"):
        return typed
    if role == "tool":
        typed["tool_call_id"] = message["tool_call_id"]
    calls = message.get("tool_calls")
    if calls:
        typed["tool_calls"] = [
            {"id": call["id"], "name": call["function"]["name"], "arguments": call["function"]["arguments"]}
            for call in calls
        ]
    return typed


def typed_part(part: dict[str, Any]) -> dict[str, Any]:
    """A chat content part in the Responses input shape: ``text`` and ``refusal`` become
    ``input_text``, ``image_url`` ``input_image``, ``file`` ``input_file``."""
    kind = part["type"]
    if kind == "text":
        return {"type": "input_text", "text": part["text"]}
    if kind == "refusal":
        return {"type": "input_text", "text": part["refusal"]}
    if kind == "image_url":
        image_url = part["image_url"]
        image = {"type": "input_image", "image_url": image_url["url"]}
        if image_url.get("detail") is not None:
            image["detail"] = image_url["detail"]
        return image
    if kind == "input_audio":
        return {"type": "input_audio", "input_audio": part["input_audio"]}
    return {"type": "input_file", **{key: part["file"][key] for key in FILE_FIELDS if key in part["file"]}}
