"""What the scheduler (``runtime.model.scheduler``) queues and keeps: a request's ``Ticket``, a
fairness key's ``KeyState``, and the two effects it calls (``SchedulerEffects``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from runtime.errors import LLMPoolError
from runtime.inference.prefix_marks import Mark
from runtime.queue_terms import DEFAULT_PRIORITY


@dataclass(eq=False)
class Ticket:
    request_id: str
    fairness_key: str | None
    cost_estimate: int = 0  # prompt tokens, estimated before the engine counts them
    prefix: tuple[Mark, ...] = ()  # its conversation's prefix marks (runtime.inference.prefix_marks)
    replica: int | None = None
    waits_for: int | None = None  # the busy replica it waits for (its cache holds the conversation)
    charged: float = 0.0  # weighted tokens charged to the key so far
    seq: int = 0
    priority: str = DEFAULT_PRIORITY  # one of runtime.queue_terms.PRIORITY_CLASSES
    deadline: float | None = None  # on the scheduler's clock: past it, the request never starts
    # Its key's fairness weight (a database key's, from the edge); None: its fairness key's weight in
    # ``engine.fairness``.  The scheduler sets it when the request queues: its tokens are charged by it.
    weight: float | None = None


class SchedulerEffects(Protocol):
    def start(self, ticket: Ticket, replica: int) -> None: ...

    def reject(self, ticket: Ticket, error: LLMPoolError) -> None: ...


@dataclass(slots=True)
class KeyState:
    weight: float  # the weight of its latest request (what ``key_report`` shows)
    counter: float = 0.0
    pending: int = 0  # queued requests, over every class
    ranks: int = 0  # the classes it has a lane in, bit ``1 << rank`` each
    active: int = 0
    waiting: int = 0  # taken from its lanes to wait for a replica of their own
    rejected: int = 0
