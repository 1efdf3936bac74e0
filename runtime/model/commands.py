"""The commands a model's writer handles, one dataclass each.

Callers (the admin operations, requests, engines, the swap group, the memory manager, timers)
post a command to the model's ``ModelController``; its writer handles them one at a time in one
``match`` (``ModelController._handle``) and answers each command's future.  Nothing but the
writer acts on a command.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# ---- the lifecycle (runtime.model.writer) --------------------------------------------------


@dataclass(slots=True)
class Load:
    overrides: dict
    replicas: int | None
    reason: str


@dataclass(slots=True)
class Plan:
    """The dry run of an admin load (``?dry_run=true``)."""
    overrides: dict
    replicas: int | None


@dataclass(slots=True)
class LoadProgress:
    stage: str
    fraction: float | None


@dataclass(slots=True)
class LoadFinished:
    engines: list | None
    error: str | None
    observed_mib: int | None = None
    measured: int | None = None


@dataclass(slots=True)
class Unload:
    pass


@dataclass(slots=True)
class UnloadFinished:
    errors: list[str]


@dataclass(slots=True)
class TimedOut:
    lease: Any
    limit: float


@dataclass(slots=True)
class EngineFailed:
    message: str
    replica: int | None = None


@dataclass(slots=True)
class FailedReleased:
    pass


@dataclass(slots=True)
class HoldForReload:
    entry: Any  # CatalogEntry, or None: the model is removed


@dataclass(slots=True)
class CommitReload:
    entry: Any
    fairness: Any
    group: Any = None


@dataclass(slots=True)
class ReleaseReload:
    pass


@dataclass(slots=True)
class Admit:
    ticket: Any


@dataclass(slots=True)
class Finish:
    ticket: Any
    tokens: int | None


# ---- residency: reconfigure, sleep, wake (runtime.model.residency) -----------------------------


@dataclass(slots=True)
class Reconfigure:
    body: dict


@dataclass(slots=True)
class Sleep:
    pass


@dataclass(slots=True)
class Wake:
    pass


@dataclass(slots=True)
class OperationFinished:
    operation: Any
    error: Exception | None
    measured: Any


# ---- from the memory manager (runtime.pool.memory) --------------------------------------------


@dataclass(slots=True)
class MemoryEvict:
    pass


@dataclass(slots=True)
class MemoryReady:
    pass


@dataclass(slots=True)
class MemoryReplan:
    pass


@dataclass(slots=True)
class MemoryRelieve:
    pass


@dataclass(slots=True)
class MemoryGrow:
    pass


MEMORY_COMMANDS = (MemoryEvict, MemoryReady, MemoryReplan, MemoryRelieve, MemoryGrow)

# ---- from the swap group and the TTL timer (runtime.pool.groups, runtime.model.switching) -----------


@dataclass(slots=True)
class TtlExpired:
    idle_since: float


@dataclass(slots=True)
class SlotGranted:
    pass


@dataclass(slots=True)
class SwapOut:
    pass


@dataclass(slots=True)
class EndTurn:
    pass


@dataclass(slots=True)
class ResumeTurn:
    pass


@dataclass(slots=True)
class WarmUp:
    pass


GROUP_COMMANDS = (SlotGranted, SwapOut, EndTurn, ResumeTurn, WarmUp)

Command = (
    Load | Plan | LoadProgress | LoadFinished | Unload | UnloadFinished | TimedOut | EngineFailed | FailedReleased
    | HoldForReload | CommitReload | ReleaseReload | Admit | Finish | Reconfigure | Sleep | Wake | OperationFinished
    | MemoryEvict | MemoryReady | MemoryReplan | MemoryRelieve | MemoryGrow
    | TtlExpired | SlotGranted | SwapOut | EndTurn | ResumeTurn | WarmUp
)
