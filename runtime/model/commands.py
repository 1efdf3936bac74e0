"""The commands a model's writer handles: one small dataclass each, and the notices.

Callers (the admin operations, requests, engines, the writer's own side tasks, the swap group,
the memory manager, timers) post a command to the model's ``ModelController``; its writer
(``runtime.model.writer``) handles them one at a time in one ``match``, taking each apart by
position, and answers each command's future (with None where its line names no answer).
Nothing but the writer acts on a command.  What the memory manager and a swap group tell a model
carries no data: those are ``Notice`` members.
"""
from __future__ import annotations

import enum
from dataclasses import field, make_dataclass
from typing import Any


def command(name: str, *fields: tuple) -> type:
    """A command class: a slots dataclass of ``fields``, each (name, type) or (name, type, default)."""
    specs = [spec if len(spec) == 2 else (spec[0], spec[1], field(default=spec[2])) for spec in fields]
    made = make_dataclass(name, specs, slots=True)
    made.__module__ = __name__
    return made


# ---- the lifecycle (runtime.model.writer) --------------------------------------------------
# An admin, start-up, request or keep_warm load (``reason``); answered once it has settled.
Load = command("Load", ("overrides", dict), ("replicas", int | None), ("reason", str))
# The dry run of an admin load (``?dry_run=true``); answered with the memory plan it would follow.
Plan = command("Plan", ("overrides", dict), ("replicas", int | None))
# A stage of the load under way, from its side task (runtime.model.load_progress).
LoadProgress = command("LoadProgress", ("stage", str), ("fraction", float | None))
# The load's side task is over: its engines and what they hold (MiB), or why it failed.
LoadFinished = command("LoadFinished", ("engines", list | None), ("error", str | None),
                       ("observed_mib", int | None, None), ("measured", int | None, None))
# The admin unload; answered with the state it produced.
Unload = command("Unload")
# The engines are released; ``errors``: one line per replica that failed to.
UnloadFinished = command("UnloadFinished", ("errors", list[str]))
# A request ran past request_timeout_seconds (``limit``) on ``lease`` and was cancelled; sent
# before its ``Finish``, so the replica found stuck gets no other request meanwhile.
TimedOut = command("TimedOut", ("lease", Any), ("limit", float))
# A loaded engine died: replica ``replica``'s, or (None) the model's as a whole.
EngineFailed = command("EngineFailed", ("message", str), ("replica", int | None, None))
# The engines of a model that failed while loaded are released.
FailedReleased = command("FailedReleased")

# ---- a settings reload (runtime.model.reload_hold) -----------------------------------------
# Vote on a reload that gives the model ``entry`` (a CatalogEntry, None: removes it) and hold its
# loads; answered with the ``ReloadVote``.
HoldForReload = command("HoldForReload", ("entry", Any))
# Take the reload's entry, fairness settings and swap group, then release the hold.
CommitReload = command("CommitReload", ("entry", Any), ("fairness", Any), ("group", Any, None))
# The reload was refused: release the hold, changing nothing.
ReleaseReload = command("ReleaseReload")

# ---- requests (runtime.model.leases) -------------------------------------------------------
# Queue a request, or make it wait for a load; answered with its dispatch future or a ``Waiting``.
Admit = command("Admit", ("ticket", Any))
# A request ended (done, failed or withdrawn while queued); ``tokens`` it really used.
Finish = command("Finish", ("ticket", Any), ("tokens", int | None))

# ---- residency: reconfigure, sleep, wake (runtime.model.operations) --------------------------
# Change reconfigurable fields while loaded; answered with ``{duration_ms, changed, reason}``.
Reconfigure = command("Reconfigure", ("body", dict))
# Free the engines' inference state, keeping the weights; answered with ``{duration_ms, reason}``.
Sleep = command("Sleep")
# Build a sleeping model's inference state again; answered as ``Sleep``.
Wake = command("Wake")
# A reconfigure, sleep or wake's side task is over: its ``error``, or what the engines hold (MiB).
OperationFinished = command("OperationFinished", ("operation", Any), ("error", Exception | None), ("measured", Any))

# ---- the TTL timer (runtime.model.switching) -----------------------------------------------
# The TTL timer armed when the model became idle at ``idle_since`` ran out.
TtlExpired = command("TtlExpired", ("idle_since", float))


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
    | TtlExpired | Notice
)
