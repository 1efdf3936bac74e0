"""Tool calls in a model's own output: the formats open model families write them in.

A typed engine (llama_cpp) renders the tools through the model's chat template; the model
answers in its family's format, which ``ToolCallParser`` reads as the text arrives:

- ``hermes`` (Hermes, Qwen 2.5/3, SmolLM3 and most templates that take ``tools``):
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, after optional text;
- ``llama3_json`` (Llama 3.1–3.3): the whole answer is ``{"name": ..., "parameters": {...}}``
  (optionally after ``<|python_tag|>``; several calls separated by ``;``);
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``;
- ``json`` (what a grammar-constrained answer is, for tool_choice "required" or a named
  function): the whole answer is one call object or a list of them (``constrained_schema``).

``detect_format`` picks the format from the chat template's text.  The parser never lets the
markup out as text: what could start a call is held back until it is known.  A call whose
arguments do not parse as JSON, or that names no offered tool, is given back as text (the
request then ends ``stop``), never as a broken tool call.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

FORMATS = ("hermes", "llama3_json", "mistral", "json")

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
MISTRAL_TAG = "[TOOL_CALLS]"


@dataclass
class ToolCall:
    """One parsed call: ``arguments`` is the JSON text of an object."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_wire(self) -> dict:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}


def choice_kind(choice: str | dict | None) -> str:
    """The kind of a ``tool_choice`` (capabilities.tool_choice): "none", "auto" (None too),
    "required", or "function" for a named function."""
    if choice is None:
        return "auto"
    return "function" if isinstance(choice, dict) else choice


def chosen_name(choice: str | dict | None) -> str | None:
    """The function a named ``tool_choice`` names (chat's ``{"type", "function": {"name"}}`` or
    the Responses API's ``{"type", "name"}``), else None."""
    if not isinstance(choice, dict):
        return None
    return (choice.get("function") or {}).get("name") or choice.get("name")


def format_for(formats: dict[str, str] | None, request) -> str | None:
    """``tool_call_format(request)`` of an engine whose answers' formats are fixed at load:
    ``formats`` maps a tool_choice kind ("auto", "required", "function") to the format the
    model then answers in (``json`` where a grammar constrains it); None or a missing kind: no
    calls to read.  The engine process reports its engine's map in the ``loaded`` frame."""
    if not formats or not request.tools:
        return None
    return formats.get(choice_kind(request.tool_choice))


def tool_parser(engine, request) -> ToolCallParser | None:
    """The parser of ``request``'s answer on ``engine``, or None when the request offers no
    tools (or ``tool_choice`` "none") or the engine's text holds no calls to read.

    An engine that renders tools into its prompt says in which format its model answers with
    ``tool_call_format(request) -> str | None`` (``json`` where a grammar constrains the answer);
    an engine that gets calls already parsed (an upstream's ``tool_calls``) yields ``ToolCall``
    events instead and has no such method.
    """
    if not request.tools or request.tool_choice == "none":
        return None
    answer_format = getattr(engine, "tool_call_format", None)
    fmt = answer_format(request) if answer_format is not None else None
    if fmt is None:
        return None
    names = [tool["function"]["name"] for tool in request.tools if tool.get("type") == "function" and tool.get("function")]
    return ToolCallParser(fmt, names)


def detect_format(template: str | None) -> str | None:
    """The tool-call format a chat template's model writes, or None when it takes no tools."""
    if not template:
        return None
    if HERMES_OPEN in template:
        return "hermes"
    if MISTRAL_TAG in template:
        return "mistral"
    if PYTHON_TAG in template or ("ipython" in template and '"parameters"' in template):
        return "llama3_json"
    if "tools" in template:
        return "hermes"  # a template that takes tools without naming a format: the most common one
    return None


def constrained_schema(tools: list[dict], choice: str | dict, parallel: bool) -> dict:
    """The JSON schema of a grammar-constrained answer (format ``json``): one call of the named
    function, or of any offered function for ``required``; a list of them when ``parallel``."""
    functions = [tool["function"] for tool in tools if tool.get("type") == "function"]
    if isinstance(choice, dict):
        wanted = chosen_name(choice)
        functions = [function for function in functions if function["name"] == wanted]
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": function["name"]},
                "arguments": function.get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
        }
        for function in functions
    ]
    one = calls[0] if len(calls) == 1 else {"anyOf": calls}
    if parallel and not isinstance(choice, dict):
        return {"type": "array", "items": one, "minItems": 1}
    return one


class ToolCallParser:
    """Reads a generation's text in ``fmt`` as it arrives.

    ``feed(text)`` and ``finish()`` answer ``(text, calls)``: the text that may go out now and
    the calls completed so far.  ``names`` are the offered tools' names: a call of any other
    name is text.
    """

    def __init__(self, fmt: str, names: list[str]):
        if fmt not in FORMATS:
            raise ValueError(f"unknown tool-call format {fmt!r} (known: {', '.join(FORMATS)})")
        self.fmt = fmt
        self.names = set(names)
        self.held = ""
        self.started = False  # llama3_json / mistral / json: the answer is a call, held to its end
        self.decided = fmt == "hermes"
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self.held += text
        if self.fmt == "hermes":
            return self._hermes(final=False)
        return self._whole_answer(final=False)

    def finish(self) -> tuple[str, list[ToolCall]]:
        if self.fmt == "hermes":
            return self._hermes(final=True)
        return self._whole_answer(final=True)

    # -- hermes: text, then <tool_call>...</tool_call> blocks --------------------------------
    def _hermes(self, final: bool) -> tuple[str, list[ToolCall]]:
        # The whitespace just before a call is the call's, not the answer's: it is held back
        # until what follows is known, and dropped before a call that parses.
        out, calls = [], []
        while True:
            start = self.held.find(HERMES_OPEN)
            if start < 0:
                keep = 0
                if not final:
                    keep = _partial_suffix(self.held, HERMES_OPEN)
                    keep += _trailing_space(self.held[: len(self.held) - keep])
                out.append(self.held[: len(self.held) - keep])
                self.held = self.held[len(self.held) - keep:]
                break
            before = self.held[:start]
            end = self.held.find(HERMES_CLOSE, start)
            if end < 0:
                text_end = start - _trailing_space(before)
                out.append(self.held[:text_end])
                self.held = self.held[text_end:]
                if final:  # an unclosed block: try it as a call, else it is text
                    call = self._call(self.held.lstrip()[len(HERMES_OPEN):])
                    if call:
                        calls.append(call)
                    else:
                        out.append(self.held)
                    self.held = ""
                break
            block = self.held[start: end + len(HERMES_CLOSE)]
            call = self._call(block[len(HERMES_OPEN): -len(HERMES_CLOSE)])
            if call:
                out.append(before[: len(before) - _trailing_space(before)])
                calls.append(call)
            else:
                out.append(before + block)
            self.held = self.held[end + len(HERMES_CLOSE):]
        text = "".join(out)
        if self.calls or calls:
            text = text if text.strip() else ""  # the whitespace between calls is not an answer
        self.calls.extend(calls)
        return text, calls

    # -- formats where the whole answer is the call(s) ----------------------------------------
    def _whole_answer(self, final: bool) -> tuple[str, list[ToolCall]]:
        if not self.decided:
            stripped = self.held.lstrip()
            marker = {"llama3_json": PYTHON_TAG, "mistral": MISTRAL_TAG}.get(self.fmt)
            if not stripped:
                if final:
                    self.decided = True
                    text, self.held = self.held, ""
                    return text, []
                return "", []
            if stripped[0] in "{[" or (marker and stripped.startswith(marker)):
                self.decided, self.started = True, True
            elif marker and marker.startswith(stripped) and not final:
                return "", []  # maybe the marker, still arriving
            else:
                self.decided = True
        if not self.started:
            text, self.held = self.held, ""
            return text, []
        if not final:
            return "", []
        body = self.held.strip()
        for marker in (PYTHON_TAG, MISTRAL_TAG):
            body = body.removeprefix(marker).strip()
        calls = self._calls_of(body)
        if calls is None:
            text, self.held = self.held, ""
            return text, []
        self.held = ""
        self.calls.extend(calls)
        return "", calls

    def _calls_of(self, body: str) -> list[ToolCall] | None:
        """Every call in ``body`` (an object, a list, or ``;``-separated objects), or None."""
        try:
            parsed = json.loads(body)
        except ValueError:
            parts = [part.strip() for part in body.split(";") if part.strip()]
            if len(parts) < 2:
                return None
            calls = [self._call(part) for part in parts]
            return calls if all(calls) else None
        items = parsed if isinstance(parsed, list) else [parsed]
        calls = [self._call_of(item) for item in items]
        return calls if calls and all(calls) else None

    def _call(self, text: str) -> ToolCall | None:
        try:
            return self._call_of(json.loads(text))
        except ValueError:
            return None

    def _call_of(self, item) -> ToolCall | None:
        if not isinstance(item, dict) or item.get("name") not in self.names:
            return None
        arguments = item.get("arguments", item.get("parameters", {}))
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if not isinstance(arguments, dict):
            return None
        return ToolCall(name=item["name"], arguments=json.dumps(arguments, ensure_ascii=False))


def _trailing_space(text: str) -> int:
    return len(text) - len(text.rstrip())


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest tail of ``text`` that begins ``marker``."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
