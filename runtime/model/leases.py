"""The requests a model's writer admits: the futures they are dispatched by and the leases they
hold (``Leases``, the scheduler's effects ``start`` and ``reject``), and the handlers of ``Admit``
and ``Finish`` inside the writer's step (``Admission``).
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from runtime.backends.base import Engine
from runtime.errors import LLMPoolError
from runtime.model.on_demand import not_serving
from runtime.model.phases import Mark, Phase
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


class Admission:
    """A model's requests inside its writer's step: ``Admit`` and ``Finish``."""

    def __init__(self, writer):
        self.writer = writer
        self.model = writer.model

    def queue(self, ticket: Ticket) -> asyncio.Future:
        """Put a request in the scheduler (its 429s raise); the future it will be dispatched by."""
        return self.model.leases.queue(ticket, self.model.scheduler)

    def admit(self, future: asyncio.Future, ticket: Ticket) -> None:
        """Queue the request, make it wait for a load, or refuse it; a refused one changes nothing."""
        model, writer = self.model, self.writer
        state = model.state
        if state is S.LOADED and not model.phases.has(Mark.YIELDING):
            future.set_result(self.queue(ticket))
        elif writer.turn.may_wait(state):
            future.set_result(model.waiters.add(ticket))
            writer.load_for_waiters()
        else:
            raise not_serving(model.name, S.UNLOADING if state is S.LOADED else state)
        model.clock.touch()
        writer.operations.wake_for_request()  # a sleeping model wakes for it (runtime.model.operations)

    def finish(self, future: asyncio.Future, ticket: Ticket, tokens: int | None) -> None:
        model, writer = self.model, self.writer
        if model.waiters.remove(ticket):
            if writer.turn.slot_wait_unwanted(writer.load_waiters):  # a load for these requests only
                writer.withdraw(Phase.AWAITING_SLOT)
            writer.claim.withdraw_wait()
        elif not model.scheduler.on_cancel(ticket):
            model.scheduler.on_done(ticket, tokens)
        model.leases.forget(ticket)
        writer.release_when_idle()
        writer.operations.when_idle()  # a reconfigure or sleep waiting for the active requests
        future.set_result(None)
