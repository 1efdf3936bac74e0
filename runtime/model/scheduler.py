"""Admission and token-fair dispatch of one model's requests to its loaded replicas.

Decisions are pure and synchronous; effects (start a request on a replica,
reject a queued one) go through the small ``SchedulerEffects`` protocol, so
tests drive the scheduler with a fake.

Ordering follows the Virtual Token Counter (Sheng et al., "Fairness in Serving
Large Language Models", OSDI 2024): every fairness key has a counter of the
service it received, in tokens (prompt + generated) divided by its weight.
The next request comes from the backlogged key with the lowest counter; a key
that becomes backlogged again is lifted to the current minimum so idle time
banks no credit.  A key's prompt estimate is charged at dispatch and corrected
to the real token count when the request ends.

Which replica a dispatched request starts on is ``runtime.model.routing``'s choice: the one
whose cache holds the longest prefix of its conversation, within a load bound; such a request may
wait for its replica (``waiting``, still counted in ``queue_depth``) while another replica idles.

Per-key state is bounded: a key is kept while it has pending or active requests; once idle
it stays only as a record for the lift (and its rejection count), at most
``IDLE_KEYS_RETAINED`` idle keys, the least recently active forgotten first.  An idle key
whose counter is at or below the floor (the lowest counter at the last dispatch) with no
rejections is forgotten at once: the lift would give it the same counter as a new key.
"""
from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Protocol

from runtime.config import FairnessSettings
from runtime.errors import ExecutorQueueFull, FairnessKeyQueueFull, LLMPoolError
from runtime.inference.prefix_marks import Mark
from runtime.model.routing import ReplicaPrefixes, Route, choose

# How many idle keys (no pending or active request) keep their counter for the lift.
IDLE_KEYS_RETAINED = 4096


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


class SchedulerEffects(Protocol):
    def start(self, ticket: Ticket, replica: int) -> None: ...

    def reject(self, ticket: Ticket, error: LLMPoolError) -> None: ...


@dataclass(slots=True)
class KeyState:
    weight: float
    counter: float = 0.0
    # An idle record's queue is the empty tuple, not a deque of its own: a deque is 760 bytes,
    # two thirds of what an idle key cost (the soak's RSS grew 1.1 KiB per fairness key seen).
    queue: deque[Ticket] | tuple = field(default_factory=deque)
    active: int = 0
    waiting: int = 0  # taken from the queue to wait for a replica of their own
    rejected: int = 0


@dataclass
class Scheduler:
    fairness: FairnessSettings
    effects: SchedulerEffects
    replicas: int = 0
    target_per_replica: int = 1
    active: dict[int, set[Ticket]] = field(default_factory=dict)
    keys: dict[str | None, KeyState] = field(default_factory=dict)
    rejected_per_key_limit: int = 0
    rejected_executor_limit: int = 0
    queue_depth: int = 0
    # (counter, head ticket seq, key) of backlogged keys; stale entries are skipped on pop.
    _heap: list = field(default_factory=list)
    _floor: float = 0.0  # the lowest backlogged counter seen at the last dispatch
    _seq: itertools.count = field(default_factory=itertools.count)
    # Idle keys of ``keys``, least recently active first (the values are unused).
    _idle: OrderedDict = field(default_factory=OrderedDict)
    # Admission paused (runtime.model.residency: a reconfigure or a sleep): requests queue, none starts.
    paused: bool = False
    # Replicas that failed while the model serves on the others: nothing is dispatched to them.
    retired: set[int] = field(default_factory=set)
    # Per replica: the prefixes its cache is believed to hold, and the requests waiting for it.
    caches: list[ReplicaPrefixes] = field(default_factory=list)
    waiting: dict[int, deque[Ticket]] = field(default_factory=dict)
    load_factor: float = 1.25
    _stamp: itertools.count = field(default_factory=itertools.count)

    # -- lifecycle ---------------------------------------------------------------------
    def open(self, replicas: int, target_per_replica: int, cached_sequences: int = 0, load_factor: float = 1.25) -> None:
        """Serve on ``replicas``, each up to ``target_per_replica`` requests at once, each believed
        to keep the prefixes of its last ``cached_sequences`` requests (0: routing by load alone)."""
        self.replicas = replicas
        self.target_per_replica = target_per_replica
        self.active = {index: set() for index in range(replicas)}
        self.waiting = {index: deque() for index in range(replicas)}
        self.caches = [ReplicaPrefixes(cached_sequences) for _ in range(replicas)]
        self.load_factor = load_factor
        self.retired = set()

    def close(self, error: LLMPoolError) -> None:
        """Stop dispatching; every queued request is rejected with ``error``."""
        self.replicas = 0
        self.reject_queued(error)

    def reject_queued(self, error: LLMPoolError) -> None:
        """Every queued request is rejected with ``error`` (the active ones go on)."""
        for replica in list(self.waiting):
            self._requeue_waiting(replica)
        for key, state in list(self.keys.items()):
            while state.queue:
                self.effects.reject(state.queue.popleft(), error)
            if self.replicas:
                self._settle(key, state)
        self.queue_depth = 0
        self._heap.clear()

    def pause(self) -> None:
        """Queue requests without starting any until ``resume`` (active ones go on)."""
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        self._dispatch()

    def retire(self, replica: int) -> None:
        """Dispatch nothing more to ``replica`` (it failed); the requests it holds end as they do,
        those waiting for it go to the others."""
        self.retired.add(replica)
        self._requeue_waiting(replica)
        self._dispatch()

    def reset(self) -> None:
        """Forget counters and key statistics (on unload)."""
        self.paused = False
        self.retired.clear()
        self.keys.clear()
        self._idle.clear()
        self.active.clear()
        self.waiting.clear()
        self.caches.clear()
        self._heap.clear()
        self._floor = 0.0
        self.queue_depth = 0
        self.rejected_per_key_limit = self.rejected_executor_limit = 0

    # -- decisions ---------------------------------------------------------------------
    def on_request(self, ticket: Ticket) -> None:
        """Queue a request (raising a 429 error when a limit is reached) and dispatch what fits."""
        state = self._key(ticket.fairness_key)
        if self.queue_depth >= self.fairness.executor_queue_limit:
            self.rejected_executor_limit += 1
            state.rejected += 1
            self._settle(ticket.fairness_key, state)
            raise ExecutorQueueFull(
                f"the model's queue is full ({self.fairness.executor_queue_limit} pending requests)"
            )
        if len(state.queue) >= self.fairness.per_key_queue_limit:
            self.rejected_per_key_limit += 1
            state.rejected += 1
            self._settle(ticket.fairness_key, state)
            raise FairnessKeyQueueFull(
                f"fairness key {ticket.fairness_key!r} already has {len(state.queue)} pending requests "
                f"(limit {self.fairness.per_key_queue_limit})"
            )
        ticket.seq = next(self._seq)
        if not state.queue:
            # Lift a key that becomes backlogged to the current minimum: idle time banks no credit.
            state.counter = max(state.counter, self._current_minimum())
            heapq.heappush(self._heap, (state.counter, ticket.seq, ticket.fairness_key))
        state.queue.append(ticket)
        self.queue_depth += 1
        self._dispatch()

    def on_done(self, ticket: Ticket, tokens: int | None = None) -> None:
        """An active request ended; ``tokens`` is its real prompt + generated count."""
        replica_tickets = self.active.get(ticket.replica)
        if replica_tickets is None or ticket not in replica_tickets:
            return
        replica_tickets.discard(ticket)
        state = self._key(ticket.fairness_key)
        state.active -= 1
        if tokens is not None:
            self._charge(state, ticket, tokens / state.weight - ticket.charged)
        self._dispatch()
        self._settle(ticket.fairness_key, state)

    def on_cancel(self, ticket: Ticket) -> bool:
        """Withdraw a queued request; False when it already started (or is unknown)."""
        state = self.keys.get(ticket.fairness_key)
        if state is not None and ticket in self.waiting.get(ticket.waits_for, ()):
            self.waiting[ticket.waits_for].remove(ticket)
            state.waiting -= 1
            self.queue_depth -= 1
            self._settle(ticket.fairness_key, state)
            return True
        if state is None or ticket not in state.queue:
            return False
        was_head = state.queue[0] is ticket
        state.queue.remove(ticket)
        self.queue_depth -= 1
        if was_head and state.queue:
            heapq.heappush(self._heap, (state.counter, state.queue[0].seq, ticket.fairness_key))
        self._settle(ticket.fairness_key, state)
        return True

    # -- views -------------------------------------------------------------------------
    @property
    def inflight(self) -> int:
        return sum(len(tickets) for tickets in self.active.values())

    def key_report(self) -> list[dict]:
        """The busiest keys (pending + active, then rejections), at most ``reported_keys``.

        ``normalized_score`` is the key's weighted token counter minus the lowest
        counter of any known key: 0 for the key that is served next.
        """
        if not self.keys:
            return []
        lowest = min(state.counter for state in self.keys.values())
        busiest = sorted(
            self.keys.items(),
            key=lambda item: (-(len(item[1].queue) + item[1].waiting + item[1].active), -item[1].rejected, str(item[0])),
        )[: self.fairness.reported_keys]
        return [
            {
                "key": key,
                "pending": len(state.queue) + state.waiting,
                "active": state.active,
                "weight": state.weight,
                "normalized_score": round(state.counter - lowest, 3),
                "rejected": state.rejected,
            }
            for key, state in busiest
        ]

    # -- internals ---------------------------------------------------------------------
    def _key(self, key: str | None) -> KeyState:
        """The key's state, kept (no longer idle) until ``_settle`` finds it idle again."""
        state = self.keys.get(key)
        if state is None:
            weight = self.fairness.weights.get(key, self.fairness.default_weight)
            state = self.keys[key] = KeyState(weight=weight)
        else:
            self._idle.pop(key, None)
            if not isinstance(state.queue, deque):
                state.queue = deque()
        return state

    def _settle(self, key: str | None, state: KeyState) -> None:
        """After a key's request left the queue or ended: an idle key becomes a bounded record."""
        if state.queue or state.active or state.waiting or self.keys.get(key) is not state:
            return
        if state.counter <= self._floor and not state.rejected:
            del self.keys[key]
            return
        state.queue = ()
        self._idle[key] = None
        self._idle.move_to_end(key)
        while len(self._idle) > IDLE_KEYS_RETAINED:
            oldest, _ = self._idle.popitem(last=False)
            del self.keys[oldest]

    def _current_minimum(self) -> float:
        self._drop_stale()
        return self._heap[0][0] if self._heap else self._floor

    def _drop_stale(self) -> None:
        heap = self._heap
        while heap:
            counter, seq, key = heap[0]
            state = self.keys.get(key)
            if state is not None and state.queue and state.queue[0].seq == seq and state.counter == counter:
                return
            heapq.heappop(heap)

    def _charge(self, state: KeyState, ticket: Ticket, amount: float, *, rerank: bool = True) -> None:
        if not amount:
            return
        state.counter += amount
        ticket.charged += amount
        if rerank and state.queue:  # the key's heap entry must carry its new counter
            heapq.heappush(self._heap, (state.counter, state.queue[0].seq, ticket.fairness_key))

    def _load(self, replica: int) -> int:
        return len(self.active[replica]) + len(self.waiting[replica])

    def _free_replica(self) -> int | None:
        """The least loaded replica with a free slot, ties to the lowest index; None: none."""
        best, best_load = None, self.target_per_replica
        active, waiting = self.active, self.waiting
        for index in range(self.replicas):
            load = len(active[index]) + len(waiting[index])
            if load < best_load and index not in self.retired:
                best, best_load = index, load
        return best

    def _route(self, ticket: Ticket, free: int) -> Route | None:
        """Where ``ticket`` goes (``routing.choose``); without remembered prefixes, or for a
        request without marks, to ``free``, the least loaded free replica."""
        if not ticket.prefix or not self.caches[0].capacity:
            return Route(free)
        usable = [index for index in range(self.replicas) if index not in self.retired]
        loads = [self._load(index) for index in range(self.replicas)]
        return choose(ticket.prefix, self.caches, loads, usable, self.target_per_replica, self.load_factor)

    def _dispatch(self) -> None:
        if self.paused or not self.replicas:
            return
        for replica, tickets in self.waiting.items():  # a freed slot goes first to those waiting for it
            while tickets and len(self.active[replica]) < self.target_per_replica:
                ticket = tickets.popleft()
                state = self.keys[ticket.fairness_key]
                state.waiting -= 1
                self._start(ticket, state, replica, rerank=True)
        while self._heap:
            free = self._free_replica()
            if free is None:
                return
            self._drop_stale()
            if not self._heap:
                return
            counter, _seq, key = self._heap[0]
            state = self.keys[key]
            route = self._route(state.queue[0], free)
            if route is None:
                return
            heapq.heappop(self._heap)
            self._floor = max(self._floor, counter)
            ticket = state.queue.popleft()
            if route.wait:
                ticket.waits_for = route.replica
                state.waiting += 1
                self.waiting[route.replica].append(ticket)
            else:
                self._start(ticket, state, route.replica, rerank=False)
            if state.queue:  # the key's next request, at the counter this one left
                heapq.heappush(self._heap, (state.counter, state.queue[0].seq, key))

    def _start(self, ticket: Ticket, state: KeyState, replica: int, *, rerank: bool) -> None:
        self.queue_depth -= 1
        state.active += 1
        ticket.replica = replica
        self.active[replica].add(ticket)
        cache = self.caches[replica]
        if cache.capacity:
            cache.record(ticket.prefix, next(self._stamp))
        self._charge(state, ticket, ticket.cost_estimate / state.weight, rerank=rerank)
        self.effects.start(ticket, replica)

    def _requeue_waiting(self, replica: int) -> None:
        """The requests waiting for ``replica`` go back to the heads of their keys' queues."""
        tickets = self.waiting.get(replica)
        while tickets:
            ticket = tickets.pop()  # the latest first, so each key's earliest ends up at its head
            ticket.waits_for = None
            state = self._key(ticket.fairness_key)
            state.waiting -= 1
            state.queue.appendleft(ticket)
            heapq.heappush(self._heap, (state.counter, ticket.seq, ticket.fairness_key))
