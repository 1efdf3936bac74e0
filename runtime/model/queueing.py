"""How a request waits for its model: the ticket it queues with (its priority class, its deadline
and its key's fairness weight), and the wait until it starts, which ends at that deadline.

The deadline is the request's queue timeout (``queue_timeout_seconds``: the edge's, from its key
and header), else
its model's ``queue_timeout_seconds``, after the runtime received it (``RequestRecord.started``).
It covers the wait for a load (load_on_request) and the wait in the scheduler's queue, never the
generation.  The scheduler never starts a request past its deadline (it starts the next one in
its place); ``before_deadline`` ends a wait that no dispatch reached first, so the caller hears
503 queue_deadline_exceeded at its deadline and its request leaves the queue unstarted.
"""
from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable
from typing import TypeVar

from runtime.backends.base import CommonDefinition
from runtime.errors import InvalidPriority, InvalidQueueTimeout, InvalidRequest
from runtime.inference.embedding import EmbeddingRequest
from runtime.inference.prefix_marks import Mark
from runtime.inputs.rerank import RerankRequest
from runtime.inputs.request import GenerationRequest
from runtime.inputs.transcription import TranscriptionRequest
from runtime.queue_terms import MAX_QUEUE_TIMEOUT_SECONDS, MAX_WEIGHT, PRIORITY_CLASSES, RANKS, deadline_passed
from runtime.model.tickets import Ticket

T = TypeVar("T")


def queue_ticket(request: GenerationRequest | EmbeddingRequest | RerankRequest | TranscriptionRequest, definition: CommonDefinition, cost_estimate: int,
                 received: float, prefix: tuple[Mark, ...] = ()) -> Ticket:
    """The scheduler's ticket of ``request`` for a model of ``definition``, received at ``received``
    (``time.monotonic()``), its conversation marked by ``prefix`` (routing).  A class or a timeout the edge refuses is refused here too (400): the
    channel layer's payload is the API's, but the scheduler must not hold what it cannot order."""
    if request.priority not in RANKS:
        raise InvalidPriority(f"priority must be one of {', '.join(PRIORITY_CLASSES)}", param="priority")
    timeout = request.queue_timeout_seconds
    if timeout is not None and not valid_queue_timeout(timeout):
        raise InvalidQueueTimeout(
            f"a queue timeout is a number of seconds above 0 and at most {MAX_QUEUE_TIMEOUT_SECONDS}",
            param="queue_timeout_seconds",
        )
    if timeout is None:
        timeout = definition.queue_timeout_seconds
    if request.weight is not None and not valid_weight(request.weight):
        raise InvalidRequest(f"a fairness weight is a number above 0 and at most {MAX_WEIGHT:g}", param="weight")
    return Ticket(
        request.request_id, request.fairness_key, cost_estimate=cost_estimate, priority=request.priority,
        deadline=None if timeout is None else received + timeout, prefix=prefix, weight=request.weight,
    )


def valid_queue_timeout(seconds) -> bool:
    return _number_within(seconds, MAX_QUEUE_TIMEOUT_SECONDS)


def valid_weight(weight) -> bool:
    return _number_within(weight, MAX_WEIGHT)


def _number_within(value, ceiling: float) -> bool:
    """Whether ``value`` is a finite number (not a bool) above 0 and at most ``ceiling``."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and 0 < value <= ceiling)


async def before_deadline(ticket: Ticket, awaitable: Awaitable[T]) -> T:
    """``await awaitable`` (a step of the wait before the request starts), ended at the ticket's
    deadline with QueueDeadlineExceeded; the awaitable is cancelled then, as if its caller left."""
    if ticket.deadline is None:
        return await awaitable
    scope = asyncio.timeout(ticket.deadline - time.monotonic())
    try:
        async with scope:
            return await awaitable
    except TimeoutError:
        if not scope.expired():
            raise
        raise deadline_passed() from None
