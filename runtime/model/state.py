"""The lifecycle table: every runtime state and every legal move between them.

Each model has one ``StateMachine`` and exactly one writer (its
``ModelController`` task); callers send commands and await results.
"""
from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger("llmpool.runtime")


class RuntimeState(str, enum.Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    UNLOADING = "unloading"
    FAILED = "failed"


TRANSITIONS: dict[RuntimeState, frozenset[RuntimeState]] = {
    RuntimeState.UNLOADED: frozenset({RuntimeState.LOADING}),
    # loading -> unloaded: a load that waited for its swap group's slot and was withdrawn before it
    # began (every request that wanted it gave up); nothing was loaded.
    RuntimeState.LOADING: frozenset({RuntimeState.LOADED, RuntimeState.FAILED, RuntimeState.UNLOADED}),
    # A dead engine moves a loaded model to failed; so does an engine that fails to release.
    RuntimeState.LOADED: frozenset({RuntimeState.UNLOADING, RuntimeState.FAILED}),
    RuntimeState.UNLOADING: frozenset({RuntimeState.UNLOADED, RuntimeState.FAILED}),
    RuntimeState.FAILED: frozenset({RuntimeState.LOADING}),
}

# Why a lifecycle operation happened; a transition carries the reason of the operation it is part of
# (the loaded that ends a load started by a request is "request" too).
REASON_ADMIN = "admin"  # an admin load or unload
REASON_STARTUP = "startup"  # an enabled model loaded at start-up
REASON_REQUEST = "request"  # a request for a load_on_request model (or its waiters all gave up)
REASON_TTL = "ttl"  # idle for ttl_seconds
REASON_GROUP_SWAP = "group_swap"  # unloaded to free its swap group's slot for another member
REASON_KEEP_WARM = "keep_warm"  # a keep_warm model coming back once its group is free
REASON_ENGINE_FAILURE = "engine_failure"  # a loaded engine died
REASON_MEMORY_EVICTION = "memory_eviction"  # unloaded to make room for another model's load (runtime.pool.memory)

# States in which a model holds (or is acquiring / releasing) resources.
ACTIVE_STATES = frozenset({RuntimeState.LOADING, RuntimeState.LOADED, RuntimeState.UNLOADING})


class IllegalTransition(RuntimeError):
    def __init__(self, current: RuntimeState, expected: RuntimeState, new: RuntimeState):
        super().__init__(f"illegal transition {expected.value} -> {new.value} (current {current.value})")
        self.current, self.expected, self.new = current, expected, new


@dataclass(frozen=True)
class TransitionEvent:
    model: str
    old: RuntimeState
    new: RuntimeState
    at: float
    reason: str | None = None


class StateMachine:
    """Holds one model's state; ``transition`` is the only way to change it."""

    def __init__(self, model: str, listeners: list[Callable[[TransitionEvent], None]] | None = None):
        self.model = model
        self.state = RuntimeState.UNLOADED
        self.listeners = listeners if listeners is not None else []

    def transition(self, expected: RuntimeState, new: RuntimeState, reason: str | None = None) -> TransitionEvent:
        if self.state is not expected or new not in TRANSITIONS[expected]:
            raise IllegalTransition(self.state, expected, new)
        event = TransitionEvent(self.model, expected, new, time.time(), reason)
        self.state = new
        logger.info("model %s: %s -> %s (reason %s)", self.model, expected.value, new.value, reason or "-")
        self.emit(event)
        return event

    def emit(self, event) -> None:
        """A transition, or a change of the loaded model that is not one (a ``ModelEvent``), to the listeners."""
        for listener in self.listeners:
            listener(event)
