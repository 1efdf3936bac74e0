"""Admission and token-fair dispatch of one model's requests to its loaded replicas.

Decisions are pure and synchronous; effects (start a request on a replica,
reject a queued one) go through the small ``SchedulerEffects`` protocol, so
tests drive the scheduler with a fake.

Ordering follows the Virtual Token Counter (Sheng et al., "Fairness in Serving
Large Language Models", OSDI 2024): every fairness key has a counter of the
service it received, in tokens (prompt + generated) divided by its weight: the request's own
(``Ticket.weight``: its database key's), else the key's in ``engine.fairness``.
The next request comes from the backlogged key with the lowest counter; a key
that becomes backlogged again is lifted to the current minimum so idle time
banks no credit.  A key's prompt estimate is charged at dispatch and corrected
to the real token count when the request ends.

Priority classes (``runtime.queue_terms``) come before that order: the next request comes
from the highest class with a queued request, in VTC order within the class, except for the turn
``ClassTurns`` gives a lower class passed over ``engine.fairness.priority_starvation_limit`` times.
A key's counter is one over its classes; its requests queue in one lane per class, first in first
out, and each class keeps its own heap of the keys backlogged in it.

A request whose deadline (``Ticket.deadline``, on ``clock``) has passed never starts: the
dispatch that would start it rejects it (503 queue_deadline_exceeded) and starts the next in its
place.  The caller's own timer (``runtime.model.queueing``) drops it at the deadline when no
dispatch comes first.

Which replica a dispatched request starts on is ``runtime.model.routing``'s choice: the one
whose cache holds the longest prefix of its conversation, within a load bound; such a request may
wait for its replica (``waiting``: still counted in ``queue_depth`` and its key's pending
requests, no longer in its class's lane) while another replica idles.

Per-key state is bounded: a key is kept while it has pending or active requests; once idle
it stays only as a record for the lift (and its rejection count), at most
``IDLE_KEYS_RETAINED`` idle keys, the least recently active forgotten first.  An idle key
whose counter is at or below the floor (the lowest counter at the last dispatch) with no
rejections is forgotten at once: it comes back as a new key does, lifted to the current minimum.
"""
from __future__ import annotations

import heapq
import itertools
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from runtime.config import FairnessSettings
from runtime.errors import ExecutorQueueFull, FairnessKeyQueueFull, LLMPoolError
from runtime.model.class_turns import ClassTurns
from runtime.model.routing import ReplicaPrefixes, Route, choose
from runtime.model.tickets import KeyState, SchedulerEffects, Ticket
from runtime.queue_terms import PRIORITY_CLASSES, RANKS, deadline_passed

# How many idle keys (no pending or active request) keep their counter for the lift.
IDLE_KEYS_RETAINED = 4096


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
    # What ``Ticket.deadline`` is read against.
    clock: Callable[[], float] = time.monotonic
    # Each key's queued requests of one class, first in first out: (rank, key) -> its lane, never empty.
    lanes: dict[tuple[int, str | None], deque[Ticket]] = field(default_factory=dict)
    # Queued requests per class, and the rule that picks the class of the next start.
    turns: ClassTurns = field(default_factory=ClassTurns)
    # Per class, (counter, head ticket seq, key) of the keys backlogged in it; stale entries are skipped on pop.
    _heaps: list[list] = field(default_factory=lambda: [[] for _ in PRIORITY_CLASSES])
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
        lanes, self.lanes = self.lanes, {}
        for (_rank, key), lane in lanes.items():
            state = self.keys[key]
            state.ranks = 0
            while lane:
                self.effects.reject(lane.popleft(), error)
                state.pending -= 1
            if self.replicas:
                self._settle(key, state)
        self.queue_depth = 0
        self.turns.clear()
        for heap in self._heaps:
            heap.clear()

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
        self.lanes.clear()
        self._idle.clear()
        self.active.clear()
        self.waiting.clear()
        self.caches.clear()
        for heap in self._heaps:
            heap.clear()
        self.turns.clear()
        self._floor = 0.0
        self.queue_depth = 0
        self.rejected_per_key_limit = self.rejected_executor_limit = 0

    # -- decisions ---------------------------------------------------------------------
    def on_request(self, ticket: Ticket) -> None:
        """Queue a request (raising a 429 error when a limit is reached) and dispatch what fits."""
        state = self._key(ticket.fairness_key)
        if ticket.weight is None:
            ticket.weight = self.fairness.weights.get(ticket.fairness_key, self.fairness.default_weight)
        state.weight = ticket.weight
        refusal = self._queue_full(ticket.fairness_key, state)
        if refusal is not None:
            state.rejected += 1
            self._settle(ticket.fairness_key, state)
            raise refusal
        ticket.seq = next(self._seq)
        rank, key = RANKS[ticket.priority], ticket.fairness_key
        lane = self.lanes.get((rank, key))
        if lane is None:
            # Lift a key that becomes backlogged in a class to the class's current minimum: idle
            # time banks no credit.  Its lanes in other classes move with the one counter.
            lifted = max(state.counter, self._current_minimum(rank))
            if lifted != state.counter:
                state.counter = lifted
                self._rerank(key)
            lane = self.lanes[(rank, key)] = deque()
            state.ranks |= 1 << rank
            heapq.heappush(self._heaps[rank], (state.counter, ticket.seq, key))
        lane.append(ticket)
        state.pending += 1
        self.queue_depth += 1
        self.turns.depth[rank] += 1
        self._dispatch()

    def _queue_full(self, key: str | None, state: KeyState) -> LLMPoolError | None:
        """The 429 of a request that finds a queue limit reached (counted by limit), else None."""
        if self.queue_depth >= self.fairness.executor_queue_limit:
            self.rejected_executor_limit += 1
            limit = self.fairness.executor_queue_limit
            return ExecutorQueueFull(f"the model's queue is full ({limit} pending requests)")
        if state.pending + state.waiting >= self.fairness.per_key_queue_limit:
            self.rejected_per_key_limit += 1
            return FairnessKeyQueueFull(
                f"fairness key {key!r} already has {state.pending + state.waiting} pending requests "
                f"(limit {self.fairness.per_key_queue_limit})"
            )
        return None

    def on_done(self, ticket: Ticket, tokens: int | None = None) -> None:
        """An active request ended; ``tokens`` is its real prompt + generated count."""
        replica_tickets = self.active.get(ticket.replica)
        if replica_tickets is None or ticket not in replica_tickets:
            return
        replica_tickets.discard(ticket)
        state = self._key(ticket.fairness_key)
        state.active -= 1
        if tokens is not None:
            self._charge(state, ticket, tokens / ticket.weight - ticket.charged)
        self._dispatch()
        self._settle(ticket.fairness_key, state)

    def on_cancel(self, ticket: Ticket) -> bool:
        """Withdraw a queued request; False when it already started (or is unknown)."""
        rank, key = RANKS[ticket.priority], ticket.fairness_key
        waiters = self.waiting.get(ticket.waits_for)
        if waiters is not None and ticket in waiters:
            waiters.remove(ticket)
            state = self.keys[key]
            state.waiting -= 1
            self.queue_depth -= 1
            self._settle(key, state)
            return True
        lane = self.lanes.get((rank, key))
        if lane is None or ticket not in lane:
            return False
        was_head = lane[0] is ticket
        lane.remove(ticket)
        self._dequeued(rank, key, lane)
        state = self.keys[key]
        if was_head and lane:
            heapq.heappush(self._heaps[rank], (state.counter, lane[0].seq, key))
        self._settle(key, state)
        return True

    # -- views -------------------------------------------------------------------------
    @property
    def inflight(self) -> int:
        return sum(len(tickets) for tickets in self.active.values())

    def queued(self) -> Iterator[Ticket]:
        """Every queued request, class by class in the order lanes began."""
        for lane in self.lanes.values():
            yield from lane
        for tickets in self.waiting.values():
            yield from tickets

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
            key=lambda item: (-(item[1].pending + item[1].waiting + item[1].active), -item[1].rejected, str(item[0])),
        )[: self.fairness.reported_keys]
        return [
            {
                "key": key,
                "pending": state.pending + state.waiting,
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
        return state

    def _settle(self, key: str | None, state: KeyState) -> None:
        """After a key's request left the queue or ended: an idle key becomes a bounded record."""
        if state.pending or state.active or state.waiting or self.keys.get(key) is not state:
            return
        if state.counter <= self._floor and not state.rejected:
            del self.keys[key]
            return
        self._idle[key] = None
        self._idle.move_to_end(key)
        while len(self._idle) > IDLE_KEYS_RETAINED:
            oldest, _ = self._idle.popitem(last=False)
            del self.keys[oldest]

    def _dequeued(self, rank: int, key: str | None, lane: deque[Ticket]) -> None:
        """A request of ``lane`` left the queue (started, dropped or withdrawn)."""
        state = self.keys[key]
        if not lane:
            del self.lanes[(rank, key)]
            state.ranks &= ~(1 << rank)
        state.pending -= 1
        self.queue_depth -= 1
        self.turns.depth[rank] -= 1

    def _current_minimum(self, rank: int) -> float:
        self._drop_stale(rank)
        heap = self._heaps[rank]
        return heap[0][0] if heap else self._floor

    def _drop_stale(self, rank: int) -> None:
        heap = self._heaps[rank]
        while heap:
            counter, seq, key = heap[0]
            lane = self.lanes.get((rank, key))
            if lane is not None and lane[0].seq == seq and self.keys[key].counter == counter:
                return
            heapq.heappop(heap)

    def _rerank(self, key: str | None) -> None:
        """The key's counter moved: each class it is backlogged in gets a heap entry that carries it."""
        state = self.keys[key]
        counter, ranks, rank = state.counter, state.ranks, 0
        while ranks:
            if ranks & 1:
                heapq.heappush(self._heaps[rank], (counter, self.lanes[(rank, key)][0].seq, key))
            ranks >>= 1
            rank += 1

    def _charge(self, state: KeyState, ticket: Ticket, amount: float, *, rerank: bool = True) -> None:
        if not amount:
            return
        state.counter += amount
        ticket.charged += amount
        if rerank and state.pending:
            self._rerank(ticket.fairness_key)

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

    def _route(self, ticket: Ticket, free: int) -> Route:
        """Where ``ticket`` goes (``routing.choose``); without remembered prefixes, or for a
        request without marks, to ``free``, the least loaded free replica."""
        if not ticket.prefix or not self.caches[0].capacity:
            return Route(free)
        usable = [index for index in range(self.replicas) if index not in self.retired]
        loads = [self._load(index) for index in range(self.replicas)]
        return choose(ticket.prefix, self.caches, loads, usable, self.target_per_replica, self.load_factor) or Route(free)

    def _next_ticket(self) -> Ticket | None:
        """Take the request to start next off the queue: from the class ``turns`` picks, the key
        with the lowest counter in it.  Requests past their deadline are rejected on the way.  The
        key's heap entry for the lane it came from is left to the caller (its counter moves)."""
        while any(self.turns.depth):
            rank = self.turns.pick(self.fairness.priority_starvation_limit)
            self._drop_stale(rank)
            heap = self._heaps[rank]
            counter, _seq, key = heapq.heappop(heap)
            lane = self.lanes[(rank, key)]
            ticket = lane.popleft()
            self._dequeued(rank, key, lane)
            if self._expired(ticket):
                if lane:
                    heapq.heappush(heap, (counter, lane[0].seq, key))
                continue
            self._floor = max(self._floor, counter)
            self.turns.served(rank)
            return ticket
        return None

    def _expired(self, ticket: Ticket) -> bool:
        """Whether ``ticket`` (off the queue) is past its deadline: then it is rejected."""
        if ticket.deadline is None or self.clock() < ticket.deadline:
            return False
        self.effects.reject(ticket, deadline_passed())
        self._settle(ticket.fairness_key, self.keys[ticket.fairness_key])
        return True

    def _dispatch(self) -> None:
        if self.paused or not self.replicas:
            return
        for replica, tickets in self.waiting.items():  # a freed slot goes first to those waiting for it
            while tickets and len(self.active[replica]) < self.target_per_replica:
                ticket = tickets.popleft()
                ticket.waits_for = None
                self.keys[ticket.fairness_key].waiting -= 1
                self.queue_depth -= 1
                if not self._expired(ticket):
                    self._start(ticket, replica)
        while any(self.turns.depth):
            free = self._free_replica()
            if free is None:
                return
            ticket = self._next_ticket()
            if ticket is None:
                return
            route = self._route(ticket, free)
            if route.wait:
                ticket.waits_for = route.replica
                self.keys[ticket.fairness_key].waiting += 1
                self.queue_depth += 1
                self.waiting[route.replica].append(ticket)
            else:
                self._start(ticket, route.replica)

    def _start(self, ticket: Ticket, replica: int) -> None:
        state = self.keys[ticket.fairness_key]
        state.active += 1
        ticket.replica = replica
        self.active[replica].add(ticket)
        cache = self.caches[replica]
        if cache.capacity:
            cache.record(ticket.prefix, next(self._stamp))
        self._charge(state, ticket, ticket.cost_estimate / ticket.weight, rerank=False)
        if state.pending:  # the key's lanes (the one just taken from too) rank by its new counter
            self._rerank(ticket.fairness_key)
        self.effects.start(ticket, replica)

    def _requeue_waiting(self, replica: int) -> None:
        """The requests waiting for ``replica`` go back to the heads of their lanes."""
        tickets = self.waiting.get(replica)
        while tickets:
            ticket = tickets.pop()  # the latest first, so each key's earliest ends up at its head
            ticket.waits_for = None
            rank, key = RANKS[ticket.priority], ticket.fairness_key
            state = self._key(key)
            state.waiting -= 1
            lane = self.lanes.get((rank, key))
            if lane is None:
                lane = self.lanes[(rank, key)] = deque()
                state.ranks |= 1 << rank
            lane.appendleft(ticket)
            heapq.heappush(self._heaps[rank], (state.counter, ticket.seq, key))
            state.pending += 1
            self.turns.depth[rank] += 1  # it stays in queue_depth
