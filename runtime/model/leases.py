"""The requests a model's writer admits: the futures they are dispatched by and the leases they
hold (``Leases``, the scheduler's effects ``start`` and ``reject``), and where the writer puts a
request it admits (``entry_for``: queue it, make it wait for a load, or refuse it).
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from runtime.backends.base import Engine
from runtime.errors import LLMPoolError
from runtime.model.on_demand import not_serving
from runtime.model.scheduler import Scheduler
from runtime.model.tickets import Ticket
from runtime.model.state import RuntimeState

S = RuntimeState


@dataclass(eq=False)
class Lease:
    """A dispatched request's hold on one replica, valid until the request finishes.

    The writer hands it out when the scheduler starts the request and keeps it
    valid: the engine stays referenced even after the model's engines are
    released, and ``failure`` is set when that engine dies, so the caller never
    reads the controller's live ``engines`` list (which the writer may empty).
    """

    replica: int
    engine: Engine
    failure: LLMPoolError | None = None

    def check(self) -> None:
        """Raise the engine's failure, if it failed while this request held it."""
        if self.failure is not None:
            raise self.failure


def stalled(lease: Lease, engines: list[Engine]) -> bool:
    """Whether a request whose timeout ran out holds an engine that did not stop within the grace
    of its cancel (``stalled``, an engine process only) and that serves the current load still:
    it is taken out of dispatch and killed."""
    engine = lease.engine
    return (getattr(engine, "stalled", False) and lease.replica < len(engines)
            and engines[lease.replica] is engine)


class Leases:
    """Each queued request's dispatch future and each running one's lease; ``engine(replica)``
    is the engine a replica index names now."""

    def __init__(self, engine: Callable[[int], Engine]):
        self._engine = engine
        self._dispatch: dict[Ticket, asyncio.Future] = {}
        self._leases: dict[Ticket, Lease] = {}

    def queue(self, ticket: Ticket, scheduler: Scheduler) -> asyncio.Future:
        """Put a request in the scheduler (its 429s raise); the future it will be dispatched by."""
        dispatched = asyncio.get_running_loop().create_future()
        self._dispatch[ticket] = dispatched
        try:
            scheduler.on_request(ticket)
        except LLMPoolError:
            del self._dispatch[ticket]
            raise
        return dispatched

    def forget(self, ticket: Ticket) -> None:
        self._dispatch.pop(ticket, None)
        self._leases.pop(ticket, None)

    def fail(self, failure: LLMPoolError, replica: int | None = None) -> None:
        """The engine of ``replica`` (None: every one) died: the requests running there learn it."""
        for lease in self._leases.values():
            if replica is None or lease.replica == replica:
                lease.failure = failure

    def futures(self) -> list[asyncio.Future]:
        return list(self._dispatch.values())

    # ---- scheduler effects (called from inside the writer) ----------------------------
    def start(self, ticket: Ticket, replica: int) -> None:
        dispatched = self._dispatch.get(ticket)
        if dispatched is not None and not dispatched.done():
            lease = Lease(replica, self._engine(replica))
            self._leases[ticket] = lease
            dispatched.set_result(lease)

    def reject(self, ticket: Ticket, error: LLMPoolError) -> None:
        dispatched = self._dispatch.pop(ticket, None)
        if dispatched is not None and not dispatched.done():
            dispatched.set_exception(error)


class Entry(Enum):
    """Where the writer puts a request it admits."""

    QUEUE = "queue"  # the scheduler's queue: the model serves
    WAIT = "wait"  # the waiters of a load (``runtime.model.on_demand``): it loads on their behalf


def entry_for(name: str, state: RuntimeState, yielding: bool, may_wait: bool) -> Entry:
    """Where a request for model ``name`` goes, in ``state`` (``yielding``: its group turn is over;
    ``may_wait``: the swap turn lets it wait); refused, it raises and changes nothing."""
    if state is S.LOADED and not yielding:
        return Entry.QUEUE
    if may_wait:
        return Entry.WAIT
    raise not_serving(name, S.UNLOADING if state is S.LOADED else state)
