"""What a model that switches by itself keeps beside its lifecycle: the requests waiting for it
to load, and its idle clock (the TTL); and what a request is refused with when it may not wait.

Both belong to one ``ModelController`` and are touched only by its writer, like its state.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.errors import LLMPoolError, ModelFailed, ModelLoading, ModelNotLoaded, ModelUnloading
from runtime.model.tickets import Ticket
from runtime.model.state import RuntimeState

S = RuntimeState
# How a request for a failed model learns where the reason is: last_error, on the admin side only.
OPERATOR_SEES_WHY = "an operator can see why in its last_error (GET /v1/admin/models)"


def not_serving(name: str, state: RuntimeState) -> LLMPoolError:
    """What a request for a model in ``state`` is refused with.  A failed model's last_error is
    the operator's (paths, the engine's output, stacks): requests are only told where it is."""
    if state is S.LOADING:
        return ModelLoading(f"model {name} is loading; retry shortly")
    if state is S.UNLOADING:
        return ModelUnloading(f"model {name} is unloading")
    if state is S.FAILED:
        return ModelFailed(f"model {name} failed; {OPERATOR_SEES_WHY}")
    return ModelNotLoaded(f"model {name} is not loaded; load it through the admin API first")


def resolve(waiters: list[asyncio.Future], result: Any = None, error: Exception | None = None) -> None:
    """Answer every waiter still waiting with ``result`` (or raise ``error`` in it); the list is emptied."""
    for waiter in waiters:
        if waiter.done():
            continue
        if error is not None:
            waiter.set_exception(error)
        else:
            waiter.set_result(result)
    waiters.clear()


@dataclass(frozen=True)
class Waiting:
    """The writer's answer to a request it cannot queue yet (the model is loading on its behalf,
    or will): ``queued`` resolves to the request's dispatch future once it is in the scheduler,
    or raises the error that ends the wait (model_failed, model_unloading, a full queue)."""

    queued: asyncio.Future


class Waiters:
    """Requests waiting for a load, in arrival order."""

    def __init__(self):
        self._waiting: dict[Ticket, asyncio.Future] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, ticket: Ticket) -> Waiting:
        queued = asyncio.get_running_loop().create_future()
        self._waiting[ticket] = queued
        return Waiting(queued)

    def remove(self, ticket: Ticket) -> bool:
        """Forget a waiter that went away (timed out, cancelled); False when it was not waiting."""
        return self._waiting.pop(ticket, None) is not None

    def release(self, queue: Callable[[Ticket], asyncio.Future]) -> None:
        """Queue every waiter, in order, with ``queue`` (which raises the request's LLMPoolError)."""
        waiting, self._waiting = self._waiting, {}
        for ticket, queued in waiting.items():
            if queued.done():
                continue
            try:
                queued.set_result(queue(ticket))
            except LLMPoolError as exc:
                queued.set_exception(exc)

    def fail(self, error: LLMPoolError) -> None:
        """End every wait with ``error``."""
        waiting, self._waiting = self._waiting, {}
        for queued in waiting.values():
            if not queued.done():
                queued.set_exception(error)
                queued.exception()  # the waiter may have gone; nobody else is told it was lost

    def futures(self) -> list[asyncio.Future]:
        return list(self._waiting.values())


class IdleClock:
    """When the model last got a request and since when it has been idle; the TTL timer.

    ``idle`` arms the timer (``on_expire`` is called with the idle start it was armed for, so a
    late call for an idle period that has ended is recognised); ``busy`` disarms it.
    """

    def __init__(self):
        self.last_request_at: float | None = None
        self.idle_since: float | None = None
        self._timer: asyncio.TimerHandle | None = None

    def touch(self) -> None:
        self.last_request_at = time.time()

    def idle(self, ttl: float | None, on_expire: Callable[[float], None]) -> None:
        self.disarm()
        if self.idle_since is None:
            self.idle_since = time.time()
        if ttl is not None:
            delay = max(0.0, self.idle_since + ttl - time.time())
            self._timer = asyncio.get_running_loop().call_later(delay, on_expire, self.idle_since)

    def busy(self) -> None:
        self.disarm()
        self.idle_since = None

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def expires_at(self, ttl: float | None) -> float | None:
        if ttl is None or self.idle_since is None:
            return None
        return self.idle_since + ttl
