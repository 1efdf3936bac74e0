"""The swap-group turn and the idle clock of one model: a collaborator of its writer.

A model may switch by itself (docs/settings.md): requests may wait for its load
(``runtime.model.on_demand``), its TTL unloads it once idle, and its swap group
(``runtime.pool.groups``) hands out the slots its members load into and asks them to give one
back (``cmd.GROUP_NOTICES``: a slot granted, swap out, end or resume the turn, warm up).  ``SwapTurn``
handles those inside the writer's step, deciding from the model's own state, and after every
command tells the idle clock and the group what the step left (``settle``).
"""
from __future__ import annotations

from runtime.errors import InsufficientMemory
from runtime.model import commands as cmd
from runtime.model.phases import Mark, Phase
from runtime.model.state import ACTIVE_STATES, REASON_ADMIN, REASON_GROUP_SWAP, REASON_KEEP_WARM, REASON_TTL, RuntimeState

S = RuntimeState
P = Phase


class SwapTurn:
    """What the idle clock and the swap group were last told, and the model's side of its turn."""

    def __init__(self, writer):
        self.writer = writer
        self.model = writer.model
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

    def keep_alive(self, seconds: float) -> None:
        """A request's keep_alive: the TTL from now on; an idle model's timer is armed again."""
        self.model.keep_alive = seconds
        self.idle = None  # the next settle tells the clock afresh

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
            self.writer.post(cmd.TtlExpired(idle_since))

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

    def withdraw_unwanted_load(self) -> None:
        """A load that waits for a group slot for requests only, all gone now, does not happen."""
        model = self.model
        if (
            model.phases.is_(P.AWAITING_SLOT, S.LOADING) and not model.waiters and not self.writer.load_waiters
            and model.group is not None and model.group.withdraw(model.name)
        ):
            self.writer.withdraw(P.AWAITING_SLOT)

    # ---- the commands of the TTL timer and the swap group ----------------------------
    def ttl_expired(self, idle_since: float) -> None:
        if self.idle and self.model.clock.idle_since == idle_since and self.ttl() is not None:
            self.writer.start_unload(REASON_TTL)

    def on_notice(self, notice: cmd.Notice) -> None:
        """What the swap group tells this member (``cmd.GROUP_NOTICES``), decided from its own state."""
        model, writer = self.model, self.writer
        definition = model.entry.definition
        match notice:
            case cmd.Notice.SLOT_GRANTED:
                if model.phases.is_(P.AWAITING_SLOT, S.LOADING):
                    writer.start_engines(P.AWAITING_SLOT)
                elif model.group is not None and model.state not in ACTIVE_STATES:
                    model.group.release(model.name)  # withdrawn meanwhile
            case cmd.Notice.SWAP_OUT if model.group is not None:
                if model.drained and not definition.pinned:
                    model.phases.mark(Mark.SWAPPED_OUT)
                    model.group.swapping_out(model.name)
                    writer.start_unload(REASON_GROUP_SWAP)
                else:
                    model.group.declined(model.name)
            case cmd.Notice.END_TURN if model.state in (S.LOADING, S.LOADED) and not definition.pinned:
                model.phases.mark(Mark.YIELDING)
            case cmd.Notice.RESUME_TURN:
                model.phases.clear(Mark.YIELDING)
                if model.state is S.LOADED:
                    model.waiters.release(writer.requests.queue)
            case cmd.Notice.WARM_UP if self._may_warm_up():
                try:
                    writer.begin_load(S.UNLOADED, REASON_KEEP_WARM)
                except InsufficientMemory as exc:
                    model.last_error = exc.message  # it comes back when there is room (the next warm_up)

    def _may_warm_up(self) -> bool:
        """A free slot in the group: a keep_warm model that enabled loaded and a swap took comes back."""
        model = self.model
        definition = model.entry.definition
        return (
            model.state is S.UNLOADED and definition.keep_warm and definition.enabled
            and model.phases.has(Mark.SWAPPED_OUT) and not model.phases.has(Mark.RELOAD_HELD)
            and model.group is not None and model.group.has_free_slot()
        )
