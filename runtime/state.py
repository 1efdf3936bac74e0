"""The lifecycle table: every runtime state and every legal move between them.

Each model has one ``StateMachine`` and exactly one writer (its
``ModelController`` task); callers send commands and await results.
"""
from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass


class RuntimeState(str, enum.Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    UNLOADING = "unloading"
    FAILED = "failed"


TRANSITIONS: dict[RuntimeState, frozenset[RuntimeState]] = {
    RuntimeState.UNLOADED: frozenset({RuntimeState.LOADING}),
    RuntimeState.LOADING: frozenset({RuntimeState.LOADED, RuntimeState.FAILED}),
    # A dead engine moves a loaded model to failed; so does an engine that fails to release.
    RuntimeState.LOADED: frozenset({RuntimeState.UNLOADING, RuntimeState.FAILED}),
    RuntimeState.UNLOADING: frozenset({RuntimeState.UNLOADED, RuntimeState.FAILED}),
    RuntimeState.FAILED: frozenset({RuntimeState.LOADING}),
}

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


class StateMachine:
    """Holds one model's state; ``transition`` is the only way to change it."""

    def __init__(self, model: str, listeners: list[Callable[[TransitionEvent], None]] | None = None):
        self.model = model
        self.state = RuntimeState.UNLOADED
        self.listeners = listeners if listeners is not None else []

    def transition(self, expected: RuntimeState, new: RuntimeState) -> TransitionEvent:
        if self.state is not expected or new not in TRANSITIONS[expected]:
            raise IllegalTransition(self.state, expected, new)
        event = TransitionEvent(self.model, expected, new, time.time())
        self.state = new
        for listener in self.listeners:
            listener(event)
        return event
