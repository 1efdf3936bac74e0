"""Admission and dispatch of requests to a model's loaded replicas.

Decisions are pure and synchronous; effects (start a request on a replica,
reject a queued one) go through the small ``SchedulerEffects`` protocol so
tests drive the scheduler with a fake.  This is the foundation version:
first-come first-served with per-key and per-model queue limits; the
token-fair ordering replaces ``_next_pending`` in the scheduler issue.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from runtime.config import FairnessSettings
from runtime.errors import ExecutorQueueFull, FairnessKeyQueueFull, LLMPoolError


@dataclass(eq=False)
class Ticket:
    request_id: str
    fairness_key: str | None
    replica: int | None = None


class SchedulerEffects(Protocol):
    def start(self, ticket: Ticket, replica: int) -> None: ...

    def reject(self, ticket: Ticket, error: LLMPoolError) -> None: ...


@dataclass
class KeyStats:
    pending: int = 0
    active: int = 0
    rejected: int = 0


@dataclass
class Scheduler:
    fairness: FairnessSettings
    effects: SchedulerEffects
    replicas: int = 0
    target_per_replica: int = 1
    pending: deque[Ticket] = field(default_factory=deque)
    active: dict[int, set[Ticket]] = field(default_factory=dict)
    keys: dict[str | None, KeyStats] = field(default_factory=dict)
    rejected_per_key_limit: int = 0
    rejected_executor_limit: int = 0

    # -- lifecycle ---------------------------------------------------------------------
    def open(self, replicas: int, target_per_replica: int) -> None:
        self.replicas = replicas
        self.target_per_replica = target_per_replica
        self.active = {index: set() for index in range(replicas)}

    def close(self, error: LLMPoolError) -> None:
        """Stop dispatching; every queued request is rejected with ``error``."""
        while self.pending:
            ticket = self.pending.popleft()
            self._stats(ticket.fairness_key).pending -= 1
            self.effects.reject(ticket, error)
        self.replicas = 0

    def reset(self) -> None:
        """Forget counters (on unload)."""
        self.keys.clear()
        self.active.clear()
        self.rejected_per_key_limit = self.rejected_executor_limit = 0

    # -- decisions ---------------------------------------------------------------------
    def on_request(self, ticket: Ticket) -> None:
        stats = self._stats(ticket.fairness_key)
        if len(self.pending) >= self.fairness.executor_queue_limit:
            self.rejected_executor_limit += 1
            stats.rejected += 1
            raise ExecutorQueueFull(
                f"the model's queue is full ({self.fairness.executor_queue_limit} pending requests)"
            )
        if stats.pending >= self.fairness.per_key_queue_limit:
            self.rejected_per_key_limit += 1
            stats.rejected += 1
            raise FairnessKeyQueueFull(
                f"fairness key {ticket.fairness_key!r} already has {stats.pending} pending requests "
                f"(limit {self.fairness.per_key_queue_limit})"
            )
        self.pending.append(ticket)
        stats.pending += 1
        self._dispatch()

    def on_done(self, ticket: Ticket) -> None:
        if ticket.replica is not None and ticket in self.active.get(ticket.replica, ()):
            self.active[ticket.replica].discard(ticket)
            self._stats(ticket.fairness_key).active -= 1
        self._dispatch()

    def on_cancel(self, ticket: Ticket) -> bool:
        """Withdraw a queued request; False when it already started (or is unknown)."""
        try:
            self.pending.remove(ticket)
        except ValueError:
            return False
        self._stats(ticket.fairness_key).pending -= 1
        return True

    # -- views -------------------------------------------------------------------------
    @property
    def queue_depth(self) -> int:
        return len(self.pending)

    @property
    def inflight(self) -> int:
        return sum(len(tickets) for tickets in self.active.values())

    def idle(self) -> bool:
        return not self.pending and self.inflight == 0

    def weight(self, key: str | None) -> float:
        if key is not None and key in self.fairness.weights:
            return self.fairness.weights[key]
        return self.fairness.default_weight

    def key_report(self) -> list[dict]:
        busiest = sorted(
            self.keys.items(), key=lambda item: (-(item[1].pending + item[1].active), -item[1].rejected)
        )[: self.fairness.reported_keys]
        return [
            {
                "key": key,
                "pending": stats.pending,
                "active": stats.active,
                "weight": self.weight(key),
                "normalized_score": 0.0,
                "rejected": stats.rejected,
            }
            for key, stats in busiest
        ]

    # -- internals ---------------------------------------------------------------------
    def _stats(self, key: str | None) -> KeyStats:
        return self.keys.setdefault(key, KeyStats())

    def _free_replica(self) -> int | None:
        candidates = [
            (len(tickets), index)
            for index, tickets in self.active.items()
            if index < self.replicas and len(tickets) < self.target_per_replica
        ]
        return min(candidates)[1] if candidates else None

    def _dispatch(self) -> None:
        while self.pending:
            replica = self._free_replica()
            if replica is None:
                return
            ticket = self.pending.popleft()
            stats = self._stats(ticket.fairness_key)
            stats.pending -= 1
            stats.active += 1
            ticket.replica = replica
            self.active[replica].add(ticket)
            self.effects.start(ticket, replica)
