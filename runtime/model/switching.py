"""The swap-group turn and the idle clock of one model: a collaborator of its writer.

A model may switch by itself (docs/settings.md): requests may wait for its load
(``runtime.model.on_demand``), its TTL unloads it once idle, and its swap group
(``runtime.pool.groups``) hands out the slots its members load into and asks them to give one
back (``cmd.GROUP_NOTICES``: a slot granted, swap out, end or resume the turn, warm up).  ``SwapTurn``
decides inside the writer's step, from the model's own state, what each notice and the TTL
timer mean (a ``TurnStep``, which the writer applies), and after every command tells the idle
clock and the group what the step left (``settle``).
"""
from __future__ import annotations

from collections.abc import Callable
from enum import Enum

from runtime.model import commands as cmd
from runtime.model.phases import Mark, Phase
from runtime.model.state import ACTIVE_STATES, REASON_ADMIN, RuntimeState

S = RuntimeState
P = Phase


class TurnStep(Enum):
    """What a notice of the swap group decides; the writer applies it (``ModelWriter.take_turn``)."""

    START_ENGINES = "start_engines"  # the slot a load waited for is granted: its engines start
    RELEASE_SLOT = "release_slot"  # a slot granted to a load withdrawn meanwhile goes back
    SWAP_OUT = "swap_out"  # the drained member gives its slot: marked swapped out, it unloads
    DECLINE_SWAP = "decline_swap"  # the member is busy or pinned: the group asks another
    END_TURN = "end_turn"  # the turn is over: the member yields
    RESUME_TURN = "resume_turn"  # the turn goes on: a loaded member serves its waiting requests again
    WARM_UP = "warm_up"  # a free slot: a keep_warm member a swap took loads again


class SwapTurn:
    """What the idle clock and the swap group were last told, and the model's side of its turn.
    ``post`` sends a command to the model's writer (the TTL timer's)."""

    def __init__(self, model, post: Callable[[cmd.Command], object]):
        self.model = model
        self._post = post
        self.idle: bool | None = None  # as last told to the clock (None: tell it again)
        self._drained: bool | None = None  # as last reported to the group

    def tell_again(self) -> None:
        """The definition or the group changed: the next ``settle`` reports afresh."""
        self.idle = self._drained = None

    def ttl(self) -> float | None:
        """The idle time before the TTL unload: a request's keep_alive (a negative one: none) where
        one was given since the model loaded, else the definition's; a pinned model has none."""
        definition = self.model.entry.definition
        if definition.pinned:
            return None
        if self.model.keep_alive is not None:
            return None if self.model.keep_alive < 0 else self.model.keep_alive
        return definition.ttl_seconds

    def rearm_clock(self) -> None:
        """The TTL changed (a request's keep_alive): the next ``settle`` tells the clock afresh."""
        self.idle = None

    def settle(self) -> None:
        """After each command: tell the idle clock (TTL) and the swap group what the step left."""
        model = self.model
        drained = model.drained
        idle = drained and not model.waiters
        if idle != self.idle:
            self.idle = idle
            if idle:
                model.clock.idle(self.ttl(), self._ttl_expired)
                if model.memory is not None:
                    model.memory.model_idle()  # a load waiting for memory may evict it now
            else:
                model.clock.busy()
        if drained != self._drained and model.group is not None:
            self._drained = drained
            model.group.report(model.name, drained, model.clock.last_request_at)

    def _ttl_expired(self, idle_since: float) -> None:
        if not self.model._stopped:
            self._post(cmd.TtlExpired(idle_since))

    def expires_at(self) -> float | None:
        """When the TTL unloads the model if nothing comes (epoch seconds), or None."""
        return self.model.clock.expires_at(self.ttl()) if self.idle else None

    def may_wait(self, state: RuntimeState) -> bool:
        """Whether a request may wait for this model rather than be refused now: only with
        load_on_request, never for a failed model (an admin load is needed), and never during an
        admin unload (the contract refuses requests once it starts)."""
        if not self.model.entry.definition.load_on_request or state is S.FAILED:
            return False
        return not (state is S.UNLOADING and self.model.reason == REASON_ADMIN)

    def slot_wait_unwanted(self, load_waiters: list) -> bool:
        """Whether a load that waits for a group slot for requests only, all gone now (no request,
        no caller in ``load_waiters``), should not happen; the group then forgets its wish."""
        model = self.model
        return (
            model.phases.is_(P.AWAITING_SLOT, S.LOADING) and not model.waiters and not load_waiters
            and model.group is not None and model.group.withdraw(model.name)
        )

    # ---- the commands of the TTL timer and the swap group ----------------------------
    def release_slot(self) -> None:
        """The group's slot this model holds or was granted goes back (no group: nothing)."""
        if self.model.group is not None:
            self.model.group.release(self.model.name)

    def ttl_ran_out(self, idle_since: float) -> bool:
        """Whether the TTL timer's command still finds the model idle since then: it unloads."""
        return bool(self.idle) and self.model.clock.idle_since == idle_since and self.ttl() is not None

    def on_notice(self, notice: cmd.Notice) -> TurnStep | None:
        """What the swap group's ``notice`` (``cmd.GROUP_NOTICES``) means for this member, from its
        own state; None: nothing."""
        model = self.model
        definition = model.entry.definition
        match notice:
            case cmd.Notice.SLOT_GRANTED:
                if model.phases.is_(P.AWAITING_SLOT, S.LOADING):
                    return TurnStep.START_ENGINES
                if model.group is not None and model.state not in ACTIVE_STATES:
                    return TurnStep.RELEASE_SLOT
            case cmd.Notice.SWAP_OUT if model.group is not None:
                return TurnStep.SWAP_OUT if model.drained and not definition.pinned else TurnStep.DECLINE_SWAP
            case cmd.Notice.END_TURN if model.state in (S.LOADING, S.LOADED) and not definition.pinned:
                return TurnStep.END_TURN
            case cmd.Notice.RESUME_TURN:
                return TurnStep.RESUME_TURN
            case cmd.Notice.WARM_UP if self._may_warm_up():
                return TurnStep.WARM_UP
        return None

    def _may_warm_up(self) -> bool:
        """A free slot in the group: a keep_warm model that enabled loaded and a swap took comes back."""
        model = self.model
        definition = model.entry.definition
        return (
            model.state is S.UNLOADED and definition.keep_warm and definition.enabled
            and model.phases.has(Mark.SWAPPED_OUT) and not model.phases.has(Mark.RELOAD_HELD)
            and model.group is not None and model.group.has_free_slot()
        )
