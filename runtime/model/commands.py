"""The commands a model's writer handles: one small dataclass each, and the notices.

Callers (the admin operations, requests, engines, the writer's own side tasks, the swap group,
the memory manager, timers) post a command to the model's ``ModelController``; its writer
(``runtime.model.writer``) handles them one at a time in one ``match``, taking each apart by
position, and answers each command's future (None where its docstring names no answer).
Nothing but the writer acts on a command.  What the memory manager and a swap group tell a model
carries no data: those are ``Notice`` members.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


# ---- the lifecycle (runtime.model.writer) --------------------------------------------------
@dataclass(slots=True)
class Load:
    """An admin, start-up, request or keep_warm load (``reason``); answered once it has settled."""

    overrides: dict
    replicas: int | None
    reason: str


@dataclass(slots=True)
class Plan:
    """The dry run of an admin load (``?dry_run=true``); answered with the memory plan it would follow."""

    overrides: dict
    replicas: int | None


@dataclass(slots=True)
class LoadProgress:
    """A stage of the load under way, from its side task (runtime.model.load_progress)."""

    stage: str
    fraction: float | None


@dataclass(slots=True)
class LoadFinished:
    """The load's side task is over: its engines and what they hold (MiB), or why it failed."""

    engines: list | None
    error: str | None
    observed_mib: int | None = None
    measured: int | None = None


@dataclass(slots=True)
class Unload:
    """The admin unload; answered with the state it produced."""


@dataclass(slots=True)
class UnloadFinished:
    """The engines are released; ``errors``: one line per replica that failed to."""

    errors: list[str]


@dataclass(slots=True)
class TimedOut:
    """A request ran past request_timeout_seconds (``limit``) on ``lease`` and was cancelled; sent
    before its ``Finish``, so the replica found stuck gets no other request meanwhile."""

    lease: Any
    limit: float


@dataclass(slots=True)
class EngineFailed:
    """A loaded engine died: replica ``replica``'s, or (None) the model's as a whole."""

    message: str
    replica: int | None = None


@dataclass(slots=True)
class FailedReleased:
    """The engines of a model that failed while loaded are released."""

# ---- a settings reload (runtime.model.reload_hold) -----------------------------------------
@dataclass(slots=True)
class HoldForReload:
    """Vote on a reload that gives the model ``entry`` (a CatalogEntry, None: removes it) and hold its
    loads; answered with the ``ReloadVote``."""

    entry: Any


@dataclass(slots=True)
class CommitReload:
    """Take the reload's entry, fairness settings and swap group, then release the hold."""

    entry: Any
    fairness: Any
    group: Any = None


@dataclass(slots=True)
class ReleaseReload:
    """The reload was refused: release the hold, changing nothing."""

# ---- requests (runtime.model.leases) -------------------------------------------------------
@dataclass(slots=True)
class Admit:
    """Queue a request, or make it wait for a load; answered with its dispatch future or a ``Waiting``."""

    ticket: Any


@dataclass(slots=True)
class Finish:
    """A request ended (done, failed or withdrawn while queued); ``tokens`` it really used."""

    ticket: Any
    tokens: int | None

# ---- residency: reconfigure, sleep, wake (runtime.model.operations) --------------------------
@dataclass(slots=True)
class Reconfigure:
    """Change reconfigurable fields while loaded; answered with ``{duration_ms, changed, reason}``."""

    body: dict


@dataclass(slots=True)
class Sleep:
    """Free the engines' inference state, keeping the weights; answered with ``{duration_ms, reason}``."""


@dataclass(slots=True)
class Wake:
    """Build a sleeping model's inference state again; answered as ``Sleep``."""


@dataclass(slots=True)
class OperationFinished:
    """A reconfigure, sleep or wake's side task is over: its ``error``, or what the engines hold (MiB)."""

    operation: Any
    error: Exception | None
    measured: Any


# ---- the TTL timer (runtime.model.switching) -----------------------------------------------
@dataclass(slots=True)
class KeepAlive:
    """A request's keep_alive: the model's idle time before its TTL unload from now on until it
    unloads (seconds; a negative value: no TTL); pinned still wins."""

    seconds: float


@dataclass(slots=True)
class TtlExpired:
    """The TTL timer armed when the model became idle at ``idle_since`` ran out."""

    idle_since: float


class Notice(enum.Enum):
    """What the memory manager (``MemoryManager._tell``, runtime.pool.memory) or a swap group
    (``SwapGroup._tell``, runtime.pool.groups) tells a model: nothing but the notice; the
    model's writer decides from its own state."""

    MEMORY_EVICT = enum.auto()  # unload to make room for another model's load, if idle and not pinned
    MEMORY_READY = enum.auto()  # the models evicted or relieved for this load (or wake) gave memory back
    MEMORY_REPLAN = enum.auto()  # memory was given back, a model became idle or declined: plan again
    MEMORY_RELIEVE = enum.auto()  # sleep or shrink as planned (``MemoryManager.relieving``), if still idle
    MEMORY_GROW = enum.auto()  # memory was freed: a model shrunk under pressure grows back if it fits
    SLOT_GRANTED = enum.auto()  # the group has a slot for this member's waiting load
    SWAP_OUT = enum.auto()  # give the slot back for another member (if drained and not pinned)
    END_TURN = enum.auto()  # this member's turn is over: new requests wait for its next one
    RESUME_TURN = enum.auto()  # this member's turn is back: the requests that waited are queued
    WARM_UP = enum.auto()  # a slot is free: a keep_warm member that a swap took may come back


MEMORY_NOTICES = frozenset(notice for notice in Notice if notice.name.startswith("MEMORY_"))
GROUP_NOTICES = frozenset(Notice) - MEMORY_NOTICES

Command = (
    Load | Plan | LoadProgress | LoadFinished | Unload | UnloadFinished | TimedOut | EngineFailed | FailedReleased
    | HoldForReload | CommitReload | ReleaseReload | Admit | Finish | Reconfigure | Sleep | Wake | OperationFinished
    | KeepAlive | TtlExpired | Notice
)
