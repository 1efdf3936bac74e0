"""The generation pipeline: an engine's events, through the answer's filters, to the request's
stream and result.

The engine's events first pass the reasoning split (``runtime.inference.reasoning``: a thinking
model's reasoning goes out as ``reasoning`` events; a raw prompt's continuation is all answer).
The answer's text then passes a chain of filters, each with ``feed(text)`` and ``finish()``:

    tool-call parse -> stop sequences -> emit

The tool-call parser (``runtime.inference.tool_calls``) takes the calls out of the text; the stop
watch (``runtime.inference.stop_sequences``) holds text back while it may be the start of a stop
sequence, and once the text holds one, cuts it there: the engine's generate is closed (cancelled)
and the request finishes with ``stop``, the same for every backend.  A forwarded request's events
are its upstream's (``UpstreamChunk``, ``UpstreamAnswer``) and go on as they are: its upstream has
applied the stop sequences.  All of it runs within the model's request_timeout_seconds: past it
the engine's generate is cancelled (504), and an engine that does not stop within the grace of
that cancel is killed (``timed_out``).
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from runtime.backends.base import Finished, TextDelta
from runtime.backends.shared.forwarding import UpstreamAnswer, UpstreamChunk
from runtime.inference.deadline import request_deadline
from runtime.inference.admission import estimate_prompt_tokens
from runtime.inference.reasoning import ReasoningDelta, split_reasoning
from runtime.inference.stop_sequences import StopWatch
from runtime.inference.tool_calls import ToolCall, ToolCallParser, tool_parser
from runtime.inputs.request import (
    GENERATE_ADMITTED,
    GENERATE_DELTA,
    GENERATE_REASONING,
    GENERATE_TOOL_CALL,
    GENERATE_UPSTREAM,
    GenerationRequest,
    InferenceRequest,
)
from runtime.model.tickets import Ticket
from runtime.observe.records import RequestRecord

Emit = Callable[[dict], Awaitable[None]]


class AnswerFilters:
    """The answer text's chain: the tool-call parse (when the request has tools), then the stop
    sequences.  ``feed`` and ``finish`` return the text that passed, the calls found, and the stop
    sequence that ended the answer (None while none has)."""

    def __init__(self, tools: ToolCallParser | None, stops: StopWatch):
        self._tools = tools
        self._stops = stops

    def feed(self, text: str) -> tuple[str, list[ToolCall], str | None]:
        calls: list[ToolCall] = []
        if self._tools is not None:
            text, calls = self._tools.feed(text)
        text, stopped = self._stops.feed(text)
        return text, calls, self._stops.found if stopped else None

    def finish(self) -> tuple[str, list[ToolCall], str | None]:
        tail, calls = self._tools.finish() if self._tools is not None else ("", [])
        text, stopped = self._stops.feed(tail)
        if not stopped:
            text += self._stops.flush()
        return text, calls, self._stops.found if stopped else None


@dataclass
class Output:
    """What a request's engine produced so far, and what has gone out of it."""

    request: GenerationRequest  # the typed fields of either kind
    emit: Emit
    pieces: list[str] = field(default_factory=list)
    deltas: int = 0  # the engine's text events or upstream chunks (a stop sequence's output_tokens)
    finished: Finished | None = None
    answer: dict | None = None  # a forwarded request's upstream answer (not streamed)
    open_on_first_chunk: bool = False  # a forwarded stream not opened yet
    reasoning: list[str] = field(default_factory=list)  # split off the answer (runtime.inference.reasoning)
    reasoning_tokens: int = 0
    logprobs: list[dict] | None = None  # the answer's, when the request asked for them
    unsent_logprobs: list[dict] = field(default_factory=list)  # of answer text held back so far
    tool_calls: list[ToolCall] = field(default_factory=list)
    stop_sequence: str | None = None  # the request's stop sequence that ended the answer
    record: RequestRecord | None = None  # the request's activity record (its first output's time)

    def __post_init__(self):
        self.logprobs = None if self.request.logprobs is None else []

    async def send(self, event: dict) -> None:
        """``event`` to the API, when the request streams (an unstreamed answer is the result)."""
        if self.request.stream:
            await self.emit(event)

    async def open_stream(self) -> None:
        """Tell the API to open a forwarded stream (once): its upstream has answered."""
        if self.open_on_first_chunk:
            self.open_on_first_chunk = False
            await self.emit({"event": GENERATE_ADMITTED})

    async def upstream_chunk(self, chunk: dict) -> None:
        self.deltas += 1
        if self.request.stream:
            await self.open_stream()
            await self.emit({"event": GENERATE_UPSTREAM, "chunk": chunk})

    async def add_reasoning(self, event: ReasoningDelta) -> None:
        self.deltas += event.tokens
        self.reasoning_tokens += event.tokens
        if event.text:
            self.reasoning.append(event.text)
            await self.send({"event": GENERATE_REASONING, "text": event.text})

    async def add_tool_calls(self, calls: list[ToolCall]) -> None:
        """Keep (and stream) ``calls``; with ``parallel_tool_calls`` false, only the answer's first."""
        for call in calls:
            if self.request.parallel_tool_calls is False and self.tool_calls:
                return
            await self.send({"event": GENERATE_TOOL_CALL, "index": len(self.tool_calls), "call": call.to_wire()})
            self.tool_calls.append(call)

    async def add_answer(self, text: str, stop: str | None) -> None:
        """Answer text that passed the filters (with the logprobs of its tokens since the last);
        ``stop``: the stop sequence that ended the answer, if one did."""
        if stop is not None:
            self.unsent_logprobs = []  # the stop sequence's tokens, cut with it
        if text or (self.finished is not None and self.unsent_logprobs):
            self.pieces.append(text)
            delta = {"event": GENERATE_DELTA, "text": text}
            if self.logprobs is not None:
                delta["logprobs"], self.unsent_logprobs = self.unsent_logprobs, []
                self.logprobs.extend(delta["logprobs"])
            await self.send(delta)
        if stop is not None:
            self.stop_sequence = stop
            self.finished = Finished(
                input_tokens=estimate_prompt_tokens(self.request), output_tokens=self.deltas, finish_reason="stop"
            )

    def tokens_used(self, ticket: Ticket) -> int:
        if self.finished is not None:
            return self.finished.input_tokens + self.finished.output_tokens
        return ticket.cost_estimate + self.deltas

    def usage_so_far(self, ticket: Ticket, *, started: bool) -> dict:
        """What a request cut short used: its engine's counts once it finished, else its prompt's
        estimate (once it ``started`` on a replica) and the output counted so far."""
        if self.finished is not None:
            return {"input_tokens": self.finished.input_tokens, "output_tokens": self.finished.output_tokens}
        return {"input_tokens": ticket.cost_estimate if started else 0, "output_tokens": self.deltas}

    def result(self) -> dict:
        """The generate operation's answer (``text``, ``finish_reason``, ``usage`` and the rest)."""
        result = {
            "text": "".join(self.pieces),
            "finish_reason": "tool_calls" if self.tool_calls else self.finished.finish_reason,
            "usage": {"input_tokens": self.finished.input_tokens, "output_tokens": self.finished.output_tokens},
        }
        if self.finished.cached_tokens is not None:  # an engine that keeps its KV cache between requests
            result["usage"]["cached_tokens"] = self.finished.cached_tokens
        if self.finished.draft_tokens is not None:  # speculative decoding (the activity view and /metrics)
            result["usage"]["draft_tokens"] = self.finished.draft_tokens
            result["usage"]["accepted_draft_tokens"] = self.finished.accepted_tokens or 0
        if self.reasoning:
            result["reasoning"] = "".join(self.reasoning)
            result["usage"]["reasoning_tokens"] = min(self.reasoning_tokens, self.finished.output_tokens)
        if self.logprobs is not None:
            result["logprobs"] = self.logprobs
        if self.stop_sequence is not None:
            result["stop_sequence"] = self.stop_sequence
        if self.tool_calls:
            result["tool_calls"] = [call.to_wire() for call in self.tool_calls]
        if self.answer is not None:
            result["upstream"] = self.answer  # a forwarded request's answer, as the upstream wrote it
        return result


async def run_on_engine(controller, lease, runs: InferenceRequest, output: Output) -> None:
    """Stream the events of ``runs`` (the kind the model's engine takes: ``check_request``) through
    the pipeline into ``output``, whose ``request`` is its typed fields (the module docstring)."""
    request = output.request
    entry = controller.entry
    # A raw prompt's continuation is all text: its reasoning tags, if any, are the client's to read.
    tags = None if request.prompt is not None else entry.spec.reasoning_tags(entry.definition, entry.base_dir)
    events = split_reasoning(lease.engine.generate(runs), tags)
    filters = AnswerFilters(tool_parser(lease.engine, request), StopWatch(request.stop))
    try:
        async with request_deadline(controller, lease):
            async for event in events:
                lease.check()
                if output.record is not None and not isinstance(event, Finished):
                    output.record.saw_output()
                if await _take(event, output, filters):
                    break
    finally:
        close = getattr(events, "aclose", None)
        if close is not None:
            await close()  # a stop sequence ends the engine's generate here


async def _take(event, output: Output, filters: AnswerFilters) -> bool:
    """One engine event into ``output``; True when a stop sequence ended the answer."""
    match event:
        case UpstreamChunk(chunk=chunk):
            await output.upstream_chunk(chunk)
        case UpstreamAnswer(answer=answer):
            output.answer = answer
        case ReasoningDelta():
            await output.add_reasoning(event)
        case ToolCall():  # parsed already (an upstream's tool_calls)
            await output.add_tool_calls([event])
        case TextDelta():
            output.deltas += event.tokens
            output.unsent_logprobs.extend(event.logprobs or ())
            text, calls, stop = filters.feed(event.text)
            if calls:
                await output.add_tool_calls(calls)
            await output.add_answer(text, stop)
            return stop is not None
        case Finished():
            text, calls, stop = filters.finish()
            if calls:
                await output.add_tool_calls(calls)
            output.finished = event
            await output.add_answer(text, stop)
            return stop is not None
        case _:
            raise TypeError(f"an engine produced {type(event).__name__}, which no stage of the pipeline takes")
    return False
