"""One load's admission decision (``Plan``: load, evict, wait or refuse, with what it needs and
what it may evict or relieve), a model's ``Charge``, and the choice of the fewest models to evict."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Literal

@dataclass
class Charge:
    """What one model holds: MiB per device; ``kind`` "reserved" (its estimate, while loading)
    or "measured" (after its load)."""

    mib: dict[str, int]
    kind: Literal["reserved", "measured"]
    since: float = field(default_factory=time.time)


@dataclass
class Plan:
    """The admission decision for one load (the ``insufficient_memory`` details, the dry run).

    ``action``: "load" (fits), "evict" (fits once ``evict`` are unloaded), "wait" (fits once busy,
    loading or unloading models are done: request-triggered loads only) or "refuse"."""

    action: str
    placement: list[str]
    needed: dict[str, int]
    device: str
    needed_mib: int
    free_mib: int
    evictable: list[dict]
    blocking: list[dict]
    evict: list[str] = field(default_factory=list)
    estimate_source: str = "unavailable"
    # Models that give memory back while they stay loaded, before any eviction:
    # [{name, action: "sleep" | "shrink", frees_mib, (shrink) to: {field: value}}].
    relieve: list[dict] = field(default_factory=list)
    # MiB on ``device`` that the loader's swap group gives back before its engines start (the
    # holder swapped out for it: ``slot_credit``), counted as free on top of ``free_mib``.
    slot_mib: int = 0

    @property
    def fits(self) -> bool:
        return self.action in ("load", "evict")

    def details(self) -> dict:
        """The machine-readable plan of an ``insufficient_memory`` error."""
        return {
            "device": self.device, "needed_mib": self.needed_mib, "free_mib": self.free_mib,
            "evictable": self.evictable, "blocking": self.blocking,
        }

    def to_dict(self) -> dict:
        return {
            "fits": self.fits, "action": self.action, "placement": self.placement, **self.details(),
            "evict": self.evict, "relieve": self.relieve, "estimate_source": self.estimate_source,
            "slot_mib": self.slot_mib,
        }


def config_key(config: dict) -> str:
    return json.dumps(config, sort_keys=True, default=str)


def each_model_once(items: list[dict]) -> list[dict]:
    """Each model once (a model placed on two devices is relieved once)."""
    seen, unique = set(), []
    for item in items:
        if item["name"] not in seen:
            seen.add(item["name"])
            unique.append(item)
    return unique


def fewest_lru(evictable: list[dict], deficit: int) -> list[str] | None:
    """The fewest of ``evictable`` (least recently used first) whose charges free ``deficit``
    MiB, preferring the least recently used among sets of that size; None when all are not enough."""
    if sum(item["charge_mib"] for item in evictable) < deficit:
        return None
    sizes = sorted((item["charge_mib"] for item in evictable), reverse=True)
    count, total = 0, 0
    while total < deficit:
        total += sizes[count]
        count += 1
    chosen, need, left = [], deficit, count
    for index, item in enumerate(evictable):
        if left == 0 or need <= 0:
            break
        rest = sorted((other["charge_mib"] for other in evictable[index + 1:]), reverse=True)[: left - 1]
        if item["charge_mib"] + sum(rest) >= need:
            chosen.append(item["name"])
            need -= item["charge_mib"]
            left -= 1
    return chosen
