"""Swap groups: members that cannot all be loaded at once share ``max_loaded`` slots.

A ``SwapGroup`` owns its slots: which members hold one (loading, loaded or unloading), which
wait for one (first come, first served) and when each holder's turn began.  It never changes
a member's state: it tells the member's writer (``ModelController.tell``) to swap out
(``Notice.SWAP_OUT``) or to end its turn (``Notice.END_TURN``), and that writer decides from its
own state, so a member that became busy in the meantime declines.  Every method is synchronous and runs on the event loop, called from
a member's writer or from the group's own turn timer, so nothing interleaves inside one.

The rules (docs/settings.md, "Swap groups"):

- a swap never cancels a request: only a member with nothing active or queued is swapped out;
- a busy member is not chosen while an idle one exists; among idle ones the least recently
  used goes first; a pinned member is never chosen;
- turns: a member keeps its slot while it has work.  While another member waits for a slot
  and no holder is idle, a busy holder's turn lasts ``max_turn_seconds`` from the later of its
  load and the start of the wait; then it takes no new requests (they wait for its next turn),
  finishes what it has, and is swapped out.  So with continuous demand for two members, a slot
  changes hands at most once per ``max_turn_seconds`` plus the drain, and requests that arrive
  interleaved are served grouped, every waiting request of a member in the same turn;
- ``keep_warm`` members come back into a slot nobody waits for (``Notice.WARM_UP``), never by eviction.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from runtime.model import commands as cmd
from runtime.config import GroupSettings

logger = logging.getLogger("llmpool.runtime")


@dataclass
class Holder:
    granted_at: float
    drained: bool = False  # nothing active or queued (reported by the member's writer)
    last_used: float = 0.0
    asked: bool = False  # swap_out sent and not declined: the slot is being freed
    yielding: bool = False  # end_turn sent: its turn is over


class SwapGroup:
    def __init__(self, name: str, settings: GroupSettings, member: Callable[[str], object | None]):
        """``member(name)`` is the member's controller (None once it is gone)."""
        self.name = name
        self.settings = settings
        self._member = member
        self.holders: dict[str, Holder] = {}
        self.waiting: dict[str, float] = {}  # member -> since when, in arrival order
        self.swaps = 0  # members swapped out for another, since the group was created
        self._turn_timer: asyncio.TimerHandle | None = None

    @property
    def members(self) -> list[str]:
        return list(self.settings.members)

    # ---- called by a member's writer ---------------------------------------------------
    def want(self, name: str) -> bool:
        """``name`` is about to load: True when it holds a slot now; otherwise it waits and is
        told with ``Notice.SLOT_GRANTED`` (a notice to its writer) once a slot is free."""
        if name in self.holders or self._grant(name):
            return True
        self.waiting.setdefault(name, time.monotonic())
        self._rebalance()
        return False

    def has_free_slot(self) -> bool:
        return not self.waiting and len(self.holders) < self.settings.max_loaded

    def withdraw(self, name: str) -> bool:
        """``name`` no longer wants a slot; False when it holds one already (granted meanwhile)."""
        if self.waiting.pop(name, None) is None:
            return False
        self._rebalance()
        return True

    def release(self, name: str) -> None:
        """``name`` holds no slot any more (unloaded, failed, removed)."""
        self.waiting.pop(name, None)
        if self.holders.pop(name, None) is None:
            return
        while self.waiting and self._grant(next(iter(self.waiting))):
            granted = next(iter(self.waiting))
            del self.waiting[granted]
            self._tell(granted, cmd.Notice.SLOT_GRANTED)
        if self.waiting:
            self._rebalance()
        else:
            self._warm_up()

    def forget(self, name: str) -> None:
        """``name`` is stopped (removed, or the service shuts down): drop it without handing its
        slot on (a stopping pool must not start loads)."""
        self.waiting.pop(name, None)
        self.holders.pop(name, None)

    def report(self, name: str, drained: bool, last_used: float | None) -> None:
        """A holder's work changed: ``drained`` when nothing is active or queued."""
        holder = self.holders.get(name)
        if holder is None:
            return
        holder.drained = drained
        holder.last_used = max(holder.last_used, last_used or 0.0)
        if drained and self.waiting:
            self._rebalance()

    def swapping_out(self, name: str) -> None:
        """``name`` accepted ``Notice.SWAP_OUT``: it is unloading for a waiting member."""
        self.swaps += 1
        logger.info("group %s: %s swapped out for %s", self.name, name, ", ".join(self.waiting) or "-")

    def declined(self, name: str) -> None:
        """``name`` refused ``Notice.SWAP_OUT`` (it became busy or pinned meanwhile)."""
        holder = self.holders.get(name)
        if holder is not None:
            holder.asked = False
            holder.drained = False
        self._rebalance()

    def turn_deadline(self, name: str) -> float | None:
        """When ``name``'s turn ends (monotonic clock), while another member waits; else None."""
        holder = self.holders.get(name)
        if holder is None or not self.waiting:
            return None
        return max(holder.granted_at, min(self.waiting.values())) + self.settings.max_turn_seconds

    # ---- decisions ---------------------------------------------------------------------
    def _grant(self, name: str) -> bool:
        if len(self.holders) >= self.settings.max_loaded:
            return False
        now = time.monotonic()
        self.holders[name] = Holder(granted_at=now, last_used=time.time())
        return True

    def _needed(self) -> int:
        """Slots the waiting members still need, beyond those being freed already."""
        freeing = sum(1 for h in self.holders.values() if h.asked or h.yielding)
        free = self.settings.max_loaded - len(self.holders)
        return len(self.waiting) - free - freeing

    def _candidates(self) -> list[tuple[str, Holder]]:
        return [
            (name, holder)
            for name, holder in self.holders.items()
            if not holder.asked and not self._pinned(name)
        ]

    def _rebalance(self) -> None:
        """Free slots for the waiting members: drained holders first (least recently used first),
        then, when every candidate is busy, end the turn that ends first (now or at its deadline)."""
        self._disarm()
        for name, holder in sorted(self._candidates(), key=lambda item: item[1].last_used):
            if holder.drained and (holder.yielding or self._needed() > 0):
                holder.asked = True
                self._tell(name, cmd.Notice.SWAP_OUT)
        for name, holder in self.holders.items():
            if holder.yielding and not holder.asked and self._needed() < 0:
                holder.yielding = False  # nobody needs its slot any more: it serves again
                self._tell(name, cmd.Notice.RESUME_TURN)
        if self._needed() <= 0:
            return
        busy = [name for name, holder in self._candidates() if not holder.yielding]
        if not busy:
            return  # every holder is pinned or on its way out already: wait for a release
        deadline, name = min((self.turn_deadline(name), name) for name in busy)
        delay = deadline - time.monotonic()
        if delay > 0:
            self._turn_timer = asyncio.get_running_loop().call_later(delay, self._rebalance)
            return
        self.holders[name].yielding = True
        self._tell(name, cmd.Notice.END_TURN)
        self._rebalance()

    def _warm_up(self) -> None:
        """Offer the free slots to the keep_warm members that hold none (their writers decide)."""
        for name in self.settings.members:
            if len(self.holders) >= self.settings.max_loaded:
                return
            controller = self._member(name)
            if name not in self.holders and controller is not None and controller.entry.definition.keep_warm:
                self._tell(name, cmd.Notice.WARM_UP)

    # ---- effects ----------------------------------------------------------------------
    def _pinned(self, name: str) -> bool:
        controller = self._member(name)
        return controller is not None and controller.entry.definition.pinned

    def _tell(self, name: str, notice: cmd.Notice) -> None:
        controller = self._member(name)
        if controller is not None:
            controller.tell(notice)

    def _disarm(self) -> None:
        if self._turn_timer is not None:
            self._turn_timer.cancel()
            self._turn_timer = None

    def close(self) -> None:
        self._disarm()
