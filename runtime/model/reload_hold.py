"""A model's side of a settings reload (``ModelPool.reload``): its vote, and the hold on its loads.

Every writer votes (``HoldForReload``): ``vote`` decides, from the model's state and the entry it
would get, whether the model is removed, updated or unchanged, whether it is active, and its
conflict.  The vote also holds the model (the writer marks it ``reload_held``): a load that
arrives until the reload ends waits in ``ReloadHold`` (it would make the model active after its
vote).  ``CommitReload`` takes the new entry, fairness settings and group, then releases the hold
like ``ReleaseReload``: the writer takes the held loads back and runs them against the new entry.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from runtime.model import commands as cmd
from runtime.model.state import ACTIVE_STATES, RuntimeState
from runtime.pool.catalog import CatalogEntry

# Changing only these definition fields never conflicts with an active model.
RELOAD_SAFE_FIELDS = frozenset(
    {"enabled", "load_on_request", "load_wait_timeout_seconds", "queue_timeout_seconds", "ttl_seconds", "pinned",
     "keep_warm", "aliases"}
)


@dataclass(frozen=True)
class ReloadVote:
    """A controller's answer to a planned settings reload, given by its writer.

    ``change`` is "removed", "updated" or "unchanged"; ``conflict`` the reason the
    reload must be refused for this model, or None.
    """

    change: str
    active: bool
    conflict: str | None


def vote(current: CatalogEntry, entry: CatalogEntry | None, state: RuntimeState) -> ReloadVote:
    """The vote of a model with ``current`` in ``state`` on a reload that gives it ``entry`` (None: removes it)."""
    name = current.name
    active = state in ACTIVE_STATES
    conflict = None
    if entry is None:
        change = "removed"
        if active:
            conflict = f"{name} would be removed while {state.value}"
    elif current.same_definition(entry):
        change = "unchanged"
    else:
        change = "updated"
        if active and not current.same_definition(entry, ignore=RELOAD_SAFE_FIELDS):
            conflict = f"{name} would change while {state.value}; unload it first"
    return ReloadVote(change, active, conflict)


class ReloadHold:
    """The loads held while a reload is planned; the writer marks the model, applies the commit
    and requeues what ``take`` hands back."""

    def __init__(self):
        self._held: list[tuple[cmd.Load, asyncio.Future]] = []

    def hold_load(self, load: cmd.Load, future: asyncio.Future) -> None:
        self._held.append((load, future))

    def waiters(self) -> list[asyncio.Future]:
        return [future for _, future in self._held]

    def take(self) -> list[tuple[cmd.Load, asyncio.Future]]:
        """The held loads, to run again now that the reload ended (the hold is empty after)."""
        held, self._held = self._held, []
        return held


def keeps_measurements(current: CatalogEntry, entry: CatalogEntry) -> bool:
    """Whether the VRAM measured for ``current`` still holds for ``entry`` (only reload-safe fields changed)."""
    return current.same_definition(entry, ignore=RELOAD_SAFE_FIELDS)
