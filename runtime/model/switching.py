"""The part of a model's writer that switches it by itself (``ModelController`` mixes it in).

These handlers run inside the model's single writer like every other command: requests that
wait for a load (``runtime.model.on_demand``), the idle TTL, and what the model's swap group asks
(``runtime.pool.groups``: ``slot_granted``, ``swap_out``, ``end_turn``, ``resume_turn``,
``warm_up``), which the writer decides from its own state.  ``_settle`` runs after every
command and tells the idle clock and the group what the step left.
"""
from __future__ import annotations

from runtime.model import commands as cmd
from runtime.errors import InsufficientMemory
from runtime.model.state import (
    ACTIVE_STATES,
    REASON_ADMIN,
    REASON_GROUP_SWAP,
    REASON_KEEP_WARM,
    REASON_REQUEST,
    REASON_TTL,
    RuntimeState,
)

S = RuntimeState
# The commands a swap group sends a member (``SwapGroup._tell``).


class SwitchingWriter:
    """Handlers of ``ModelController`` (which provides the state, the clock, the waiters, the
    scheduler, the group and ``_begin_load`` / ``_start_engines`` / ``_start_unload``)."""

    def group_command(self, command: cmd.Command) -> None:
        """A command from the model's swap group (``cmd.GROUP_COMMANDS``); its writer decides."""
        if not isinstance(command, cmd.GROUP_COMMANDS):
            raise ValueError(f"not a group command: {command!r}")
        if not self._stopped:
            self._post(command)

    def _load_for_waiters(self) -> None:
        if self.waiters and self.state is S.UNLOADED and not self._reload_held:
            try:
                self._begin_load(S.UNLOADED, REASON_REQUEST)
            except InsufficientMemory as exc:  # nothing changed: the requests get the plan
                self.waiters.fail(exc)

    def _release_slot(self) -> None:
        self._awaiting_slot = False
        if self.group is not None:
            self.group.release(self.name)

    def _may_wait(self, state: RuntimeState) -> bool:
        """Whether a request may wait for this model rather than be refused now: only with
        load_on_request, never for a failed model (an admin load is needed), and never during an
        admin unload (the contract refuses requests once it starts)."""
        if not self.entry.definition.load_on_request or state is S.FAILED:
            return False
        return not (state is S.UNLOADING and self.reason == REASON_ADMIN)

    def _withdraw_unwanted_load(self) -> None:
        """A load that waits for a group slot for requests only, all gone now, does not happen."""
        if (
            self.state is S.LOADING and self._awaiting_slot and not self.waiters and not self._load_waiters
            and self.group is not None and self.group.withdraw(self.name)
        ):
            self._awaiting_slot = False
            self._memory_release()
            self.machine.transition(S.LOADING, S.UNLOADED, REASON_REQUEST)

    def _on_ttl_expired(self, future, idle_since: float) -> None:
        future.set_result(None)
        if self._idle and self.clock.idle_since == idle_since and self._ttl() is not None:
            self._start_unload(REASON_TTL)

    def _on_slot_granted(self, future) -> None:
        future.set_result(None)
        if self.state is S.LOADING and self._awaiting_slot:
            self._awaiting_slot = False
            self._start_engines()
        elif self.group is not None and self.state not in ACTIVE_STATES:
            self.group.release(self.name)  # withdrawn meanwhile

    def _on_swap_out(self, future) -> None:
        future.set_result(None)
        if self.group is None:
            return
        if self.state is S.LOADED and self._is_drained() and not self.entry.definition.pinned:
            self._swapped_out = True
            self.group.swapping_out(self.name)
            self._start_unload(REASON_GROUP_SWAP)
        else:
            self.group.declined(self.name)

    def _on_end_turn(self, future) -> None:
        future.set_result(None)
        if self.state in (S.LOADING, S.LOADED) and not self.entry.definition.pinned:
            self._yielding = True

    def _on_resume_turn(self, future) -> None:
        future.set_result(None)
        self._yielding = False
        if self.state is S.LOADED:
            self.waiters.release(self._queue)

    def _on_warm_up(self, future) -> None:
        """A free slot in the group: a keep_warm model that enabled loaded and a swap took comes back."""
        future.set_result(None)
        definition = self.entry.definition
        if (
            self.state is S.UNLOADED and definition.keep_warm and definition.enabled and self._swapped_out
            and not self._reload_held and self.group is not None and self.group.has_free_slot()
        ):
            try:
                self._begin_load(S.UNLOADED, REASON_KEEP_WARM)
            except InsufficientMemory as exc:
                self.last_error = exc.message  # it comes back when there is room (the next warm_up)

    def _settle(self) -> None:
        """After each command: tell the idle clock (TTL) and the swap group what the step left."""
        drained = self._is_drained()
        idle = drained and not self.waiters
        if idle != self._idle:
            self._idle = idle
            if idle:
                self.clock.idle(self._ttl(), self._ttl_expired)
                if self.memory is not None:
                    self.memory.model_idle()  # a load waiting for memory may evict it now
            else:
                self.clock.busy()
        if drained != self._drained and self.group is not None:
            self._drained = drained
            self.group.report(self.name, drained, self.clock.last_request_at)

    def _is_drained(self) -> bool:
        return self.state is S.LOADED and self.scheduler.inflight == 0 and self.scheduler.queue_depth == 0

    def _ttl(self) -> int | None:
        definition = self.entry.definition
        return None if definition.pinned else definition.ttl_seconds

    def _ttl_expired(self, idle_since: float) -> None:
        if not self._stopped:
            self._post(cmd.TtlExpired(idle_since))

    @property
    def idle_expires_at(self) -> float | None:
        """When the TTL unloads the model if nothing comes (epoch seconds), or None."""
        return self.clock.expires_at(self._ttl()) if self._idle else None
