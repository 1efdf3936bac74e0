"""What the runtime remembers of the requests it served: one ``RequestRecord`` per request,
fed to the metrics (runtime.observe.metrics) and kept in a bounded ring (``ActivityRing``) that
GET /v1/admin/activity and the admin entry's rolling ``stats`` read.

A record holds figures only (time, model, endpoint, fairness key, status, tokens, timings,
replica).  The prompt and the answer are kept only when ``service.capture_requests`` is true,
cut to ``CAPTURE_LIMIT_CHARS`` each: a privacy choice of the operator's (docs/observability.md).
"""
from __future__ import annotations

import json
import math
import time
from collections import deque

from runtime.queue_terms import DEFAULT_PRIORITY, RANKS
from runtime.observe.metrics import endpoint_label
from runtime.observe.params import count_param
from runtime.observe.records import RequestRecord
from runtime.inputs.request import wire_messages

CAPTURE_LIMIT_CHARS = 16_384  # of a captured prompt and of a captured answer
STATS_WINDOW_SECONDS = 300.0  # the admin entry's rolling figures


def capture_of(payload: dict, result: dict | None) -> dict:
    """The request's messages / input (a rerank's query and documents) and the answer's text, each
    cut to CAPTURE_LIMIT_CHARS."""
    shown = ("prompt", "instructions", "inputs", "query", "documents")
    asked = {key: payload[key] for key in shown if payload.get(key)}
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
        """The entry's rolling ``stats``: requests, p50/p95 time to first token, output tokens
        per second and speculative decoding's drafted and accepted tokens (and their ratio: None
        without drafts) over the last ``window`` seconds."""
        since = time.monotonic() - window
        recent = [r for r in self.records if r.model == model and (r.ended or 0) >= since]
        ttfts = sorted(r.ttft for r in recent if r.ttft is not None and r.code is None)
        tokens = sum(r.output_tokens for r in recent if r.code is None)
        drafted = sum(r.draft_tokens or 0 for r in recent)
        accepted = sum(r.accepted_tokens or 0 for r in recent)
        return {
            "window_seconds": window,
            "requests": len(recent),
            "errors": sum(1 for r in recent if r.code is not None),
            "ttft_p50_ms": _percentile_ms(ttfts, 0.50),
            "ttft_p95_ms": _percentile_ms(ttfts, 0.95),
            "output_tokens": tokens,
            "tokens_per_second": round(tokens / window, 3),
            "draft_tokens": drafted,
            "accepted_draft_tokens": accepted,
            "draft_acceptance_rate": round(accepted / drafted, 3) if drafted else None,
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
        priority = payload.get("priority")
        record = RequestRecord(endpoint_label(payload.get("endpoint")), payload.get("fairness_key"),
                               priority if priority in RANKS else DEFAULT_PRIORITY)
        result = None
        try:
            result = await work(record)
            usage = result.get("usage") or {}
            record.succeeded(usage.get("input_tokens", usage.get("prompt_tokens")), usage.get("output_tokens"), usage)
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
