"""What the runtime remembers of the requests it served: one ``RequestRecord`` per request,
fed to the metrics (runtime.observe.metrics) and kept in a bounded ring (``ActivityRing``) that
GET /v1/admin/activity and the admin entry's rolling ``stats`` read.

A record holds figures only (time, model, endpoint, fairness key, status, tokens, timings,
replica).  The prompt and the answer are kept only when ``service.capture_requests`` is true,
cut to ``CAPTURE_LIMIT_CHARS`` each: a privacy choice of the operator's (docs/observability.md).
"""
from __future__ import annotations

import asyncio
import itertools
import json
import math
import time
from collections import deque
from dataclasses import dataclass, field

from runtime.errors import LLMPoolError, error_codes
from runtime.observe.metrics import endpoint_label
from runtime.observe.params import count_param
from runtime.observe.read_models import iso_time
from runtime.inputs.request import wire_messages

CANCELLED_STATUS = 499  # the caller went away (nginx's convention); counted with code "cancelled"
CAPTURE_LIMIT_CHARS = 16_384  # of a captured prompt and of a captured answer
STATS_WINDOW_SECONDS = 300.0  # the admin entry's rolling figures
_ids = itertools.count(1)


@dataclass
class RequestRecord:
    endpoint: str
    fairness_key: str | None
    started: float = field(default_factory=time.monotonic)
    started_at: float = field(default_factory=time.time)
    model: str | None = None  # the catalog name, once the lookup found it
    replica: int | None = None
    first_token: float | None = None  # monotonic time of the engine's first output
    ended: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    status: int = 200
    code: str | None = None
    capture: dict | None = None  # {"request", "response"} when service.capture_requests
    id: int = field(default_factory=lambda: next(_ids))

    def saw_output(self) -> None:
        if self.first_token is None:
            self.first_token = time.monotonic()

    def succeeded(self, input_tokens: int | None, output_tokens: int | None) -> None:
        self.input_tokens, self.output_tokens = input_tokens or 0, output_tokens or 0
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
            "replica": self.replica,
            "captured": self.capture is not None,
        }


def capture_of(payload: dict, result: dict | None) -> dict:
    """The request's messages / input and the answer's text, each cut to CAPTURE_LIMIT_CHARS."""
    asked = {key: payload[key] for key in ("prompt", "instructions", "inputs") if payload.get(key)}
    messages = wire_messages(payload)
    if messages:
        asked = {"messages": messages, **asked}
    request = json.dumps(asked, ensure_ascii=False)
    response = "" if result is None else str(result.get("text") or "")
    return {"request": request[:CAPTURE_LIMIT_CHARS], "response": response[:CAPTURE_LIMIT_CHARS],
            "truncated": len(request) > CAPTURE_LIMIT_CHARS or len(response) > CAPTURE_LIMIT_CHARS}


class ActivityRing:
    """The last ``size`` finished requests, oldest first."""

    def __init__(self, size: int = 1000):
        self.records: deque[RequestRecord] = deque(maxlen=size)

    def resize(self, size: int) -> None:
        if size != self.records.maxlen:
            self.records = deque(self.records, maxlen=size)

    def add(self, record: RequestRecord) -> None:
        self.records.append(record)

    def items(self, model: str | None = None, limit: int | None = None, *, captures: bool = False) -> list[dict]:
        """Newest first, of ``model`` only when given; with ``captures``, each one's ``capture``."""
        chosen = [r for r in reversed(self.records) if model is None or r.model == model][:limit]
        if not captures:
            return [r.to_wire() for r in chosen]
        return [{**r.to_wire(), "capture": r.capture} for r in chosen]

    def stats(self, model: str, window: float = STATS_WINDOW_SECONDS) -> dict:
        """The entry's rolling ``stats``: requests, p50/p95 time to first token and output tokens
        per second over the last ``window`` seconds."""
        since = time.monotonic() - window
        recent = [r for r in self.records if r.model == model and (r.ended or 0) >= since]
        ttfts = sorted(r.ttft for r in recent if r.ttft is not None and r.code is None)
        tokens = sum(r.output_tokens for r in recent if r.code is None)
        return {
            "window_seconds": window,
            "requests": len(recent),
            "errors": sum(1 for r in recent if r.code is not None),
            "ttft_p50_ms": _percentile_ms(ttfts, 0.50),
            "ttft_p95_ms": _percentile_ms(ttfts, 0.95),
            "output_tokens": tokens,
            "tokens_per_second": round(tokens / window, 3),
        }


def _percentile_ms(ordered: list[float], fraction: float) -> float | None:
    """The nearest-rank percentile, in milliseconds."""
    if not ordered:
        return None
    rank = max(0, math.ceil(fraction * len(ordered)) - 1)
    return round(ordered[rank] * 1000, 1)


class RequestObserver:
    """Runs each generate / embed request as one ``RequestRecord``: into the metrics and the ring."""

    def __init__(self, metrics):
        self.metrics = metrics
        self.ring = ActivityRing()
        self.capture = False

    def configure(self, service: dict) -> None:
        """From the service settings the runtime started with (they change only with a restart)."""
        self.ring.resize(service["activity_requests"])
        self.capture = bool(service["capture_requests"])

    async def run(self, payload: dict, work) -> dict:
        """``await work(record)``: its result, its error; the record is kept either way."""
        record = RequestRecord(endpoint_label(payload.get("endpoint")), payload.get("fairness_key"))
        result = None
        try:
            result = await work(record)
            usage = result.get("usage") or {}
            record.succeeded(usage.get("input_tokens", usage.get("prompt_tokens")), usage.get("output_tokens"))
            return result
        except BaseException as exc:
            record.failed(exc)
            raise
        finally:
            if self.capture:
                record.capture = capture_of(payload, result)
            self.metrics.observe_request(record)
            self.ring.add(record)


def activity_answer(pool, observer: RequestObserver, payload: dict) -> dict:
    """``{"requests": [...], "size", "capture_requests"}``; an unknown ``model`` is 404
    unknown_model, a ``limit`` that is not an integer from 1 to the ring's size 400 invalid_request."""
    model = payload.get("model")
    if model is not None:
        model = pool.lookup(model).name  # a name or an alias; else UnknownModel
    size = observer.ring.records.maxlen
    limit = payload.get("limit")
    if limit is not None:
        limit = count_param(limit, upper=size, param="limit")
    items = observer.ring.items(model, limit, captures=observer.capture)
    return {"requests": items, "size": size, "capture_requests": observer.capture}
