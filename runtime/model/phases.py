"""The model writer's sub-phases: what it is doing inside a lifecycle state, and how that may move.

The contract's five states (``runtime.model.state``) say what a client sees; inside ``loading``
and ``loaded`` the writer is always in exactly one ``Phase``:

- loading: ``awaiting_memory`` (other models make room, or busy ones are waited for),
  ``awaiting_slot`` (its swap group has no slot for it yet), ``starting`` (the engines load);
- loaded: ``serving``, ``operating`` (a reconfigure or sleep pauses the queue, waits for the
  active requests, runs), ``asleep``, ``awaiting_memory`` then ``waking`` (a wake: room is made
  for its awake charge first, when it does not fit);
- unloaded, unloading, failed: ``idle`` (no load under way, no engine serves).

Beside the phase, three marks hold across phases and states: ``yielding`` (its swap group's turn
is over: new requests wait for the next one), ``swapped_out`` (its last unload was a swap, so
keep_warm brings it back) and ``reload_held`` (a settings reload holds it: loads wait).

``PhaseMachine.move`` is the only way to change the phase, ``mark`` / ``clear`` the only way to
change a mark; each checks the states each phase and mark declares and the moves table below,
as ``transition`` checks the contract's.
"""
from __future__ import annotations

import enum
import logging
from collections.abc import Callable

from runtime.model.state import RuntimeState

logger = logging.getLogger("llmpool.runtime")

S = RuntimeState


class Phase(enum.Enum):
    """A sub-phase, with the lifecycle states it may be held in."""

    IDLE = "idle", (S.UNLOADED, S.UNLOADING, S.FAILED)
    AWAITING_MEMORY = "awaiting_memory", (S.LOADING, S.LOADED)  # a load, or (loaded) a wake
    AWAITING_SLOT = "awaiting_slot", (S.LOADING,)
    STARTING = "starting", (S.LOADING,)
    SERVING = "serving", (S.LOADED,)
    OPERATING = "operating", (S.LOADED,)
    ASLEEP = "asleep", (S.LOADED,)
    WAKING = "waking", (S.LOADED,)

    def __init__(self, label: str, states: tuple[RuntimeState, ...]):
        self.label = label
        self.states = frozenset(states)


P = Phase

# The legal moves; every phase but idle may end in idle (an unload, a failure, a withdrawn load).
PHASE_MOVES: dict[Phase, frozenset[Phase]] = {
    P.IDLE: frozenset({P.AWAITING_MEMORY, P.AWAITING_SLOT, P.STARTING}),
    # Planned again it may wait again; a wake's wait ends waking, or asleep (refused, or its requests gone).
    P.AWAITING_MEMORY: frozenset({P.AWAITING_MEMORY, P.AWAITING_SLOT, P.STARTING, P.WAKING, P.ASLEEP, P.IDLE}),
    P.AWAITING_SLOT: frozenset({P.STARTING, P.IDLE}),
    P.STARTING: frozenset({P.SERVING, P.IDLE}),
    P.SERVING: frozenset({P.OPERATING, P.IDLE}),
    # A reconfigure goes back to where it began (serving or asleep); a sleep that succeeds ends asleep.
    P.OPERATING: frozenset({P.SERVING, P.ASLEEP, P.IDLE}),
    P.ASLEEP: frozenset({P.AWAITING_MEMORY, P.WAKING, P.OPERATING, P.IDLE}),
    P.WAKING: frozenset({P.SERVING, P.ASLEEP, P.IDLE}),
}

# The phases a model may be in while ``loaded``.
LOADED_PHASES = frozenset({P.SERVING, P.OPERATING, P.ASLEEP, P.AWAITING_MEMORY, P.WAKING})
# The phases of a loaded model that pause its queue for an operation (a wake's wait included).
PAUSED_PHASES = frozenset({P.OPERATING, P.AWAITING_MEMORY, P.WAKING})


class Mark(enum.Enum):
    """A mark, with the lifecycle states it may be set in (it is cleared in any)."""

    YIELDING = "yielding", (S.LOADING, S.LOADED)
    SWAPPED_OUT = "swapped_out", (S.LOADED,)  # set as the swap's unload begins
    RELOAD_HELD = "reload_held", tuple(RuntimeState)

    def __init__(self, label: str, states: tuple[RuntimeState, ...]):
        self.label = label
        self.states = frozenset(states)


class IllegalPhase(RuntimeError):
    def __init__(self, state: RuntimeState, current: Phase, expected: Phase | None, new: Phase | Mark):
        shown = expected.label if expected is not None else "-"
        super().__init__(
            f"illegal phase move {shown} -> {new.label} (current {current.label}, state {state.value})"
        )


class PhaseMachine:
    """One model's phase and marks; the writer's ``state`` callable tells the lifecycle state."""

    def __init__(self, model: str, state: Callable[[], RuntimeState]):
        self.model = model
        self._state = state
        self.phase = Phase.IDLE
        self._marks: set[Mark] = set()

    def move(self, expected: Phase | frozenset[Phase], new: Phase) -> None:
        """``expected`` (a phase or the phases it may be in) -> ``new``, checked against both tables."""
        allowed = expected if isinstance(expected, frozenset) else frozenset({expected})
        state = self._state()
        current = self.phase
        if current not in allowed or new not in PHASE_MOVES[current] or state not in new.states:
            raise IllegalPhase(state, current, expected if isinstance(expected, Phase) else None, new)
        self.phase = new
        logger.debug("model %s: phase %s -> %s (%s)", self.model, current.label, new.label, state.value)

    def is_(self, phase: Phase, state: RuntimeState) -> bool:
        """Whether the model is in ``phase`` inside ``state`` (awaiting_memory is a load's or a wake's)."""
        return self.phase is phase and self._state() is state

    def mark(self, mark: Mark) -> None:
        state = self._state()
        if state not in mark.states:
            raise IllegalPhase(state, self.phase, None, mark)
        self._marks.add(mark)

    def clear(self, mark: Mark) -> None:
        self._marks.discard(mark)

    def has(self, mark: Mark) -> bool:
        return mark in self._marks
