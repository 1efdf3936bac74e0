"""The Responses API answer shapes: the ``response`` object and the SSE events of a stream.

A thinking model's reasoning is a ``reasoning`` output item before the message (``content:
[{"type": "reasoning_text", "text"}]``), streamed as ``response.reasoning_text.delta`` events.
The answer's tool calls are ``function_call`` output items (after the message, which is left out
when the answer has no text), streamed as ``response.output_item.added``,
``response.function_call_arguments.delta`` / ``.done`` and ``response.output_item.done``.  An
error after the stream started is its last event, ``error``.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from runtime.inference.tool_calls import chosen_name
from runtime.inputs.request import GENERATE_DELTA, GENERATE_REASONING, GENERATE_TOOL_CALL, GenerationRequest


class ResponseBuilder:
    """Builds the response object and the SSE events of one request.

    A stream opens an output item when its first text arrives: the reasoning item (index 0) on
    the first reasoning delta, a message (after it) on the first answer delta, which closes
    the reasoning; a tool call closes the open item and is one ``function_call`` item, added and
    done at once (its arguments in one delta).  Answer text after a call opens another message.
    A stream that ended with neither text nor calls opens its message when it ends.
    """

    def __init__(self, request: GenerationRequest):
        self.id = f"resp_{uuid.uuid4().hex}"
        self.message_id = f"msg_{uuid.uuid4().hex}"
        self.reasoning_id = f"rs_{uuid.uuid4().hex}"
        self.created_at = int(time.time())
        self.request = request
        self.sequence = 0
        self._reasoning: list[str] | None = None  # streamed so far; None: no reasoning item opened
        self._reasoning_open = False
        self._items: list[dict] = []  # the output items streamed so far, done (the open message not yet)
        self._message: _OpenMessage | None = None  # the message being streamed

    def response(self, status: str, output: list[dict] | None = None, result: dict | None = None) -> dict:
        usage = None
        if result is not None:
            used = result["usage"]
            usage = {
                "input_tokens": used["input_tokens"],
                "input_tokens_details": {"cached_tokens": used.get("cached_tokens", 0), "cache_write_tokens": 0},
                "output_tokens": used["output_tokens"],
                "output_tokens_details": {"reasoning_tokens": used.get("reasoning_tokens", 0)},
                "total_tokens": used["input_tokens"] + used["output_tokens"],
            }
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "model": self.request.model,
            "status": status,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": self.request.instructions,
            "max_output_tokens": self.request.max_output_tokens,
            "metadata": self.request.metadata,
            "output": output or [],
            "parallel_tool_calls": self.request.parallel_tool_calls is not False,
            "temperature": self.request.temperature,
            "top_p": self.request.top_p,
            "tool_choice": _echoed_tool_choice(self.request.tool_choice),
            "tools": [_echoed_tool(tool) for tool in self.request.tools or ()],
            "usage": usage,
            "user": self.request.fairness_key,
        }

    def message(self, text: str, status: str, logprobs: list[dict] | None = None, item_id: str | None = None) -> dict:
        return {
            "type": "message",
            "id": item_id or self.message_id,
            "status": status,
            "role": "assistant",
            "content": [_output_text(text, logprobs)],
        }

    def reasoning_item(self, text: str | None, status: str) -> dict:
        content = [] if text is None else [{"type": "reasoning_text", "text": text}]
        return {
            "type": "reasoning", "id": self.reasoning_id, "summary": [], "content": content,
            "encrypted_content": None, "status": status,
        }

    @staticmethod
    def function_call(call: dict, status: str = "completed") -> dict:
        arguments = call["arguments"] if status == "completed" else ""
        return {
            "type": "function_call", "id": f"fc_{call['id'].removeprefix('call_')}", "call_id": call["id"],
            "name": call["name"], "arguments": arguments, "status": status,
        }

    def final(self, result: dict) -> dict:
        """The response of a request that did not stream: the reasoning, the message (left out
        when the answer is calls only) and the calls, in that order."""
        status = _status(result)
        output = []
        if "reasoning" in result:
            output.append(self.reasoning_item(result["reasoning"], "completed"))
        calls = result.get("tool_calls") or ()
        if result["text"] or not calls:
            message_status = "completed" if status == "completed" else "incomplete"
            output.append(self.message(result["text"], message_status, result.get("logprobs")))
        output.extend(self.function_call(call) for call in calls)
        return self.response(status, output, result)

    # -- SSE -----------------------------------------------------------------------------
    def event(self, event_type: str, **fields) -> bytes:
        data = {"type": event_type, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {event_type}\ndata: {json.dumps(data)}\n\n".encode()

    def opening_events(self) -> list[bytes]:
        started = self.response("in_progress")
        return [self.event("response.created", response=started), self.event("response.in_progress", response=started)]

    def event_bytes(self, event: dict) -> bytes:
        """The SSE events of one of the runtime's generate events (``reasoning``, ``delta``,
        ``tool_call``); nothing for the others."""
        if event.get("event") == GENERATE_REASONING:
            return b"".join(self._reasoning_events(event["text"]))
        if event.get("event") == GENERATE_DELTA:
            return b"".join(self._delta_events(event["text"], event.get("logprobs")))
        if event.get("event") == GENERATE_TOOL_CALL:
            return b"".join(self._tool_call_events(event["call"]))
        return b""

    def _reasoning_events(self, text: str) -> list[bytes]:
        events = []
        if self._reasoning is None:
            self._reasoning, self._reasoning_open = [], True
            events += [
                self.event("response.output_item.added", output_index=0, item=self.reasoning_item(None, "in_progress")),
                self.event("response.content_part.added", item_id=self.reasoning_id, output_index=0, content_index=0,
                           part={"type": "reasoning_text", "text": ""}),
            ]
        self._reasoning.append(text)
        events.append(self.event(
            "response.reasoning_text.delta", item_id=self.reasoning_id, output_index=0, content_index=0, delta=text
        ))
        return events

    def _close_reasoning(self) -> list[bytes]:
        if not self._reasoning_open:
            return []
        self._reasoning_open = False
        text = "".join(self._reasoning)
        part = {"type": "reasoning_text", "text": text}
        item = self.reasoning_item(text, "completed")
        self._items.append(item)
        return [
            self.event("response.reasoning_text.done", item_id=self.reasoning_id, output_index=0, content_index=0, text=text),
            self.event("response.content_part.done", item_id=self.reasoning_id, output_index=0, content_index=0, part=part),
            self.event("response.output_item.done", output_index=0, item=item),
        ]

    def _open_message(self) -> list[bytes]:
        if self._message is not None:
            return []
        events = self._close_reasoning()
        # The first message has the id the response was made with; one after a call, a new one.
        item_id = self.message_id if not any(item["type"] == "message" for item in self._items) \
            else f"msg_{uuid.uuid4().hex}"
        self._message = _OpenMessage(item_id, len(self._items), [] if self.request.logprobs is not None else None)
        item = {"type": "message", "id": item_id, "status": "in_progress", "role": "assistant", "content": []}
        part = {"type": "output_text", "text": "", "annotations": []}
        return events + [
            self.event("response.output_item.added", output_index=self._message.index, item=item),
            self.event("response.content_part.added", item_id=item_id, output_index=self._message.index,
                       content_index=0, part=part),
        ]

    def _close_message(self, status: str) -> list[bytes]:
        message, self._message = self._message, None
        if message is None:
            return []
        text = "".join(message.texts)
        item = self.message(text, status, message.logprobs, message.id)
        part = item["content"][0]
        self._items.append(item)
        return [
            self.event(
                "response.output_text.done", item_id=message.id, output_index=message.index, content_index=0,
                text=text, logprobs=part.get("logprobs", []),
            ),
            self.event("response.content_part.done", item_id=message.id, output_index=message.index, content_index=0,
                       part=part),
            self.event("response.output_item.done", output_index=message.index, item=item),
        ]

    def _delta_events(self, text: str, logprobs: list[dict] | None) -> list[bytes]:
        events = self._open_message()
        self._message.texts.append(text)
        if self._message.logprobs is not None:
            self._message.logprobs.extend(logprobs or ())
        delta_logprobs = [_delta_logprob(entry) for entry in logprobs or ()]
        events.append(self.event(
            "response.output_text.delta", item_id=self._message.id, output_index=self._message.index,
            content_index=0, delta=text, logprobs=delta_logprobs,
        ))
        return events

    def _tool_call_events(self, call: dict) -> list[bytes]:
        events = self._close_reasoning() + self._close_message("completed")
        index = len(self._items)
        added, done = self.function_call(call, "in_progress"), self.function_call(call)
        self._items.append(done)
        return events + [
            self.event("response.output_item.added", output_index=index, item=added),
            self.event("response.function_call_arguments.delta", item_id=done["id"], output_index=index,
                       delta=call["arguments"]),
            self.event("response.function_call_arguments.done", item_id=done["id"], output_index=index,
                       name=call["name"], arguments=call["arguments"]),
            self.event("response.output_item.done", output_index=index, item=done),
        ]

    def closing_events(self, result: dict) -> list[bytes]:
        status = _status(result)
        events = self._close_reasoning()
        if self._message is None and not any(item["type"] in ("message", "function_call") for item in self._items):
            events += self._open_message()  # an answer without text still has its message
        events += self._close_message("completed" if status == "completed" else "incomplete")
        final = self.response(status, list(self._items), result)
        done_type = "response.incomplete" if status == "incomplete" else "response.completed"
        return events + [self.event(done_type, response=final)]

    def error_event(self, envelope: dict) -> bytes:
        error = envelope["error"]
        return self.event("error", code=error["code"], message=error["message"], param=error["param"], error=error)


@dataclass
class _OpenMessage:
    """A message item being streamed: its id, output index, text so far and logprobs (None
    where the request asked for none)."""

    id: str
    index: int
    logprobs: list[dict] | None
    texts: list[str] = field(default_factory=list)


def _status(result: dict) -> str:
    return "incomplete" if result["finish_reason"] == "length" else "completed"


def _echoed_tool(tool: dict) -> dict:
    """A typed (chat-shaped) tool as the Responses API echoes it."""
    function = tool["function"]
    return {
        "type": "function", "name": function["name"], "description": function.get("description"),
        "parameters": function.get("parameters"), "strict": function.get("strict"),
    }


def _echoed_tool_choice(choice: str | dict | None):
    if isinstance(choice, dict):
        return {"type": "function", "name": chosen_name(choice)}
    return choice or "auto"


def _output_text(text: str, logprobs: list[dict] | None) -> dict:
    part = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = logprobs
    return part


def _delta_logprob(entry: dict) -> dict:
    """A logprobs entry as a text delta event has it (no bytes)."""
    return {
        "token": entry["token"], "logprob": entry["logprob"],
        "top_logprobs": [{"token": top["token"], "logprob": top["logprob"]} for top in entry["top_logprobs"]],
    }
