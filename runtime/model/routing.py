"""Which replica a dispatched request goes to: the one whose cache holds the longest prefix of its
conversation, within a load bound; the least loaded where none holds any.

The scheduler cannot look into an engine's KV cache, so it keeps a model of it (as SGLang's
cache-aware router keeps an approximate tree per worker): each replica remembers the prefix marks
(runtime.inference.prefix_marks) of the last ``capacity`` sequences it was sent, least recently
used out first; a request that continues a remembered sequence replaces it, as the engine reuses
that sequence's slot.  ``capacity`` is what the backend says its replica keeps
(``BackendSpec.prefix_cache_sequences``); 0 remembers nothing and every request goes to the least
loaded replica.

The rule is prefix matching with a load cap (``choose``).  A request goes to the free replica
(below ``target_inflight``) with the longest match, then the least loaded, then the one whose
cache was used least recently.  When a busy replica holds a longer match than every free one, the
request waits for that replica instead, if the replica's load (its requests running and waiting
for it) stays within the bound of consistent hashing with bounded loads (Mirrokni, Thorup and
Zadimoghaddam, 2018): ``ceil(load_factor * (all requests running or waiting, this one included)
/ replicas)``.  So a replica never holds more than ``load_factor`` times the average, while the
others idle, for the sake of its cache.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

from runtime.inference.prefix_marks import Mark


class ReplicaPrefixes:
    """The sequences one replica's cache is believed to hold: their marks, least recently used first."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._sequences: OrderedDict[int, tuple[Mark, ...]] = OrderedDict()
        self._held: dict[int, int] = {}  # mark hash -> how many remembered sequences carry it
        self._next_id = 0
        self.last_used = -1  # the stamp of the last request sent here (-1: none)

    def match(self, marks: tuple[Mark, ...]) -> int:
        """The characters of the longest prefix of ``marks`` a remembered sequence holds (0: none)."""
        for digest, size in reversed(marks):
            if digest in self._held:
                return size
        return 0

    def record(self, marks: tuple[Mark, ...], stamp: int) -> None:
        """A request with ``marks`` was sent here: it continues the remembered sequence it shares
        the most with (that sequence's slot is reused), else it takes a new one."""
        self.last_used = stamp
        if not marks:
            return
        continued = self._longest_shared(marks)
        if continued is not None:
            self._forget(continued)
        self._sequences[self._next_id] = marks
        self._next_id += 1
        for digest, _ in marks:
            self._held[digest] = self._held.get(digest, 0) + 1
        while len(self._sequences) > self.capacity:
            self._forget(next(iter(self._sequences)))

    def _longest_shared(self, marks: tuple[Mark, ...]) -> int | None:
        best, best_shared = None, 0
        for sequence, held in self._sequences.items():  # least recently used first: ties go to the latest
            shared = 0
            for mine, theirs in zip(marks, held):
                if mine[0] != theirs[0]:
                    break
                shared += 1
            if shared and shared >= best_shared:
                best, best_shared = sequence, shared
        return best

    def _forget(self, sequence: int) -> None:
        for digest, _ in self._sequences.pop(sequence):
            left = self._held[digest] - 1
            if left:
                self._held[digest] = left
            else:
                del self._held[digest]


@dataclass(frozen=True, slots=True)
class Route:
    """Where a request goes: ``replica``, now (``wait`` False) or once it has a free slot."""

    replica: int
    wait: bool = False


def choose(
    marks: tuple[Mark, ...], caches: list[ReplicaPrefixes], loads: list[int], usable: list[int],
    target: int, load_factor: float,
) -> Route | None:
    """The route of a request with ``marks`` among the ``usable`` replicas, given each one's load
    (requests running on it and waiting for it) and remembered prefixes; None when no replica is
    free and the request cannot wait for one."""
    free = [index for index in usable if loads[index] < target]
    if not free:
        return None
    matches = {index: caches[index].match(marks) for index in usable} if marks else dict.fromkeys(usable, 0)

    def preference(index: int) -> tuple:
        return -matches[index], loads[index], caches[index].last_used, index

    best_free = min(free, key=preference)
    cached = min(usable, key=preference)
    if matches[cached] > matches[best_free]:
        everyone = sum(loads[index] for index in usable) + 1
        bound = math.ceil(load_factor * everyone / len(usable))
        if loads[cached] + 1 <= bound:
            return Route(cached, wait=True)
    return Route(best_free)
