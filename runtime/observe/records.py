"""One request's figures as the runtime observed it (``RequestRecord``): time, model, endpoint,
fairness key, priority class, status, tokens, timings, replica; the metrics and the activity ring
read it."""
from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field

from runtime.errors import LLMPoolError, error_codes
from runtime.queue_terms import DEFAULT_PRIORITY
from runtime.observe.read_models import iso_time

CANCELLED_STATUS = 499  # the caller went away (nginx's convention); counted with code "cancelled"
_ids = itertools.count(1)


@dataclass
class RequestRecord:
    endpoint: str
    fairness_key: str | None
    priority: str = DEFAULT_PRIORITY  # a class of PRIORITY_CLASSES (a metric label: nothing else)
    started: float = field(default_factory=time.monotonic)
    started_at: float = field(default_factory=time.time)
    model: str | None = None  # the catalog name, once the lookup found it
    replica: int | None = None
    first_token: float | None = None  # monotonic time of the engine's first output
    load_wait: float = 0.0  # seconds the request waited for its model's load (load_on_request)
    load_wait_started: float | None = None
    dispatched: float | None = None  # monotonic time it got a replica
    ended: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    draft_tokens: int | None = None  # speculative decoding: draft tokens verified (None: no speculation)
    accepted_tokens: int | None = None  # and of those, accepted
    status: int = 200
    code: str | None = None
    capture: dict | None = None  # {"request", "response"} when service.capture_requests
    id: int = field(default_factory=lambda: next(_ids))

    def saw_output(self) -> None:
        if self.first_token is None:
            self.first_token = time.monotonic()

    def waited_for_load(self, on_wait):
        """``on_wait`` (a writer's ``admit`` callback, or None) that also starts the load wait's clock;
        ``admitted`` stops it."""
        async def waiting() -> None:
            self.load_wait_started = time.monotonic()
            if on_wait is not None:
                await on_wait()
        return waiting

    def admitted(self) -> None:
        if self.load_wait_started is not None:
            self.load_wait = time.monotonic() - self.load_wait_started

    def leased(self, replica: int) -> None:
        self.replica, self.dispatched = replica, time.monotonic()

    def timings(self) -> dict:
        """The request's phases so far in nanoseconds, as Ollama reports them: ``load_ns`` waiting
        for its model's load, ``prompt_ns`` from getting a replica to the engine's first output
        (the prompt's evaluation), ``generation_ns`` from then on."""
        now = time.monotonic()
        start = self.dispatched if self.dispatched is not None else now
        first = self.first_token if self.first_token is not None else now
        return {
            "load_ns": round(self.load_wait * 1e9),
            "prompt_ns": round(max(0.0, first - start) * 1e9),
            "generation_ns": round(max(0.0, now - first) * 1e9),
        }

    def succeeded(self, input_tokens: int | None, output_tokens: int | None, usage: dict | None = None) -> None:
        """The answer's tokens; ``usage``'s ``draft_tokens`` and ``accepted_draft_tokens`` where it has them."""
        self.input_tokens, self.output_tokens = input_tokens or 0, output_tokens or 0
        if usage is not None and usage.get("draft_tokens") is not None:
            self.draft_tokens, self.accepted_tokens = usage["draft_tokens"], usage.get("accepted_draft_tokens") or 0
        self.ended = time.monotonic()

    def failed(self, error: BaseException) -> None:
        self.ended = time.monotonic()
        if isinstance(error, asyncio.CancelledError):
            self.status, self.code = CANCELLED_STATUS, "cancelled"
        elif isinstance(error, LLMPoolError):
            self.status = error.http_status
            self.code = error.code if error.code in error_codes() else "internal_error"
        else:
            self.status, self.code = 500, "internal_error"

    @property
    def duration(self) -> float:
        return max(0.0, (self.ended or time.monotonic()) - self.started)

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else max(0.0, self.first_token - self.started)

    @property
    def tokens_per_second(self) -> float | None:
        """Output tokens over the time after the first one (None without two tokens)."""
        if self.ttft is None or self.output_tokens < 2 or self.duration <= self.ttft:
            return None
        return (self.output_tokens - 1) / (self.duration - self.ttft)

    def to_wire(self) -> dict:
        """One item of GET /v1/admin/activity."""
        tps = self.tokens_per_second
        return {
            "id": self.id,
            "at": iso_time(self.started_at),
            "model": self.model,
            "endpoint": self.endpoint,
            "fairness_key": self.fairness_key,
            "status": self.status,
            "error_code": self.code,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "time_to_first_token_ms": None if self.ttft is None else round(self.ttft * 1000, 1),
            "duration_ms": round(self.duration * 1000, 1),
            "tokens_per_second": None if tps is None else round(tps, 2),
            "draft_tokens": self.draft_tokens,
            "accepted_draft_tokens": self.accepted_tokens,
            "replica": self.replica,
            "captured": self.capture is not None,
        }
