"""This process's bookkeeping that placement reads, as plain data: its requests in flight per node and
model (and per fairness key), and the nodes that left a call unanswered a moment ago."""
from __future__ import annotations

import time

from models_app.transport.nodes import EXPIRY_SECONDS


class Inflight:
    """(node, model) and (node, model, fairness key) -> this process's requests in flight there."""

    def __init__(self):
        self.counts: dict[tuple, int] = {}

    def track(self, keys: tuple[tuple, tuple]) -> tuple[tuple, tuple]:
        """Count one request in each of ``keys`` (``decide.inflight_keys``); ``untrack`` ends it."""
        for key in keys:
            self.counts[key] = self.counts.get(key, 0) + 1
        return keys

    def untrack(self, keys: tuple[tuple, tuple] | None) -> None:
        for key in keys or ():
            if key not in self.counts:
                continue
            if self.counts[key] <= 1:
                del self.counts[key]
            else:
                self.counts[key] -= 1


class Suspects:
    """Node name -> until when (monotonic) this process prefers other nodes: it did not answer in
    time.  For ``EXPIRY_SECONDS``, by when the registry says whether it is down, placement routes
    elsewhere where another node serves the model."""

    def __init__(self):
        self.until: dict[str, float] = {}

    def suspect(self, name: str, now: float | None = None) -> None:
        self.until[name] = (time.monotonic() if now is None else now) + EXPIRY_SECONDS

    def names(self, now: float | None = None) -> frozenset[str]:
        if not self.until:
            return frozenset()
        now = time.monotonic() if now is None else now
        for name in [n for n, until in self.until.items() if until < now]:
            del self.until[name]
        return frozenset(self.until)


INFLIGHT = Inflight()
SUSPECTS = Suspects()
