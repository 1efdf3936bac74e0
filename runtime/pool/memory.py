"""Memory-aware placement: device budgets, what each model is charged, and load admission.

docs/settings.md ("Memory and devices") states the rules; docs/architecture.md the accounting.

- Devices: every NVML GPU (``cuda:N``) and ``cpu`` are found at start; ``memory.devices`` may give
  each a ``budget_mib`` (null: the device's total minus ``reserve_mib``).
- Charges: a model that is loading is charged its estimate (reserved before its engines start,
  so two concurrent loads never count the same free memory); once loaded, what was measured.
  The charge goes when its engines are released.
- Admission (``MemoryManager.decide``): a load whose charge fits every device it is placed on
  goes ahead; otherwise, with ``eviction: "idle_lru"``, the fewest idle unpinned models on that
  device, least recently used first, are unloaded first (reason ``memory_eviction``); a busy or
  loading model is never evicted (a request-triggered load waits for it, bounded by its
  requests' ``load_wait_timeout_seconds``; an admin load is refused), and
  a load that cannot fit is refused with ``insufficient_memory`` and the plan, changing nothing.
- Relief before eviction (``idle_lru``, runtime.model.residency): an idle model that can give memory
  back while it stays loaded is asked first, least recently used first: its context shrunk to
  its definition's ``gguf_n_ctx_min`` (it still answers at once), then put to sleep where its
  backend can sleep; only what that cannot free is evicted.  Once the relieved models have their new charges, the loader
  plans again (a relief that freed less than expected leads to an eviction then, not an overrun).

Everything here is synchronous and runs on the event loop, called from a model's writer
(``ModelController``): nothing interleaves inside one decision.  The manager never changes
another model's state: it asks that model's writer (``Notice.MEMORY_EVICT``), which decides from its
own state, so a model that became busy meanwhile declines and the loader plans again.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

from runtime.backends.shared.adapters import adapters_mib
from runtime.backends.shared.adapters import declared as declared_adapters
from runtime.model import commands as cmd
from runtime.pool.devices import MemorySettings, budgets, device_order, found_devices
from runtime.pool.memory_plan import Charge, Plan, each_model_once, config_key, fewest_lru

logger = logging.getLogger("llmpool.runtime")

# A load that runs out of memory raises the model's next estimate by this factor at least.
OOM_RAISE = 1.25
OOM_WORDS = re.compile(r"out of memory|cannot allocate|failed to allocate|oom|insufficient memory", re.I)
MIB_IN_ERROR = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*MiB", re.I)


class MemoryManager:
    """The pool's devices, every model's charge, and the admission decisions.

    ``controllers()`` gives every model's controller by name (the candidates for eviction)."""

    def __init__(self, settings: MemorySettings, controllers: Callable[[], Mapping[str, Any]],
                 found: dict[str, int] | None = None):
        self._controllers = controllers
        self.found = found if found is not None else found_devices()
        self.configure(settings)
        self.charges: dict[str, Charge] = {}
        self.leaving: dict[str, str] = {}  # model being evicted -> the loader it makes room for
        self._claimed: dict[str, Charge] = {}  # an evicted model's charge, until it is released
        self.victims: dict[str, set[str]] = {}  # loader -> models it waits to see released
        self.waiting: set[str] = set()  # loaders waiting for busy or unloading models
        self.relieving: dict[str, dict] = {}  # model asked to sleep or shrink -> its plan item
        self._relief_loaders: set[str] = set()  # loaders that plan again once their victims are done
        self.unrelievable: set[str] = set()  # a relief failed: not asked again until it is released
        self.shrunk: set[str] = set()  # shrunk under pressure: grows back once memory frees (``memory_grow``)
        self.learned: dict[tuple[str, str], tuple[int, str]] = {}  # (model, config) -> (MiB/replica, source)
        self._estimates: dict[tuple, tuple[int | None, str]] = {}

    def configure(self, settings: MemorySettings) -> None:
        self.settings = settings
        self.devices = budgets(settings, self.found)

    # ---- estimates ---------------------------------------------------------------------
    def estimate(self, controller, overrides: dict, replicas: int) -> tuple[int, str, dict]:
        """(MiB for ``replicas`` replicas, source, effective config key) of a load: what the last
        load of this model with the same effective config measured, else the backend's estimate
        (an unavailable estimate counts 0)."""
        entry = controller.entry
        config = entry.spec.effective_config(entry.definition, overrides)
        key = config_key(config)
        learned = self.learned.get((entry.name, key))
        if learned is not None:
            return learned[0] * replicas, learned[1], key
        parts = self.estimate_parts(controller, overrides)
        if parts is not None:
            per_replica = sum(value for part, value in parts.items() if part.endswith("_mib"))
            fraction = parts.get("device_fraction")
            if fraction:
                totals = self._fraction_totals(self.requested(controller, config.get("device")))
                if totals:
                    per_replica = max(per_replica, sum(int(fraction * total) for total in totals))
            return per_replica * replicas, "estimate", key
        cache_key = (entry.name, id(entry), key, replicas)
        if cache_key not in self._estimates:
            self._estimates[cache_key] = entry.spec.vram_estimate(entry.definition, config, replicas, entry.base_dir)
        mib, source = self._estimates[cache_key]
        if mib is not None:
            mib += adapters_mib(config, entry.base_dir) * replicas
        return (mib or 0), ("estimate" if mib is not None else "unavailable"), key

    def estimate_parts(self, controller, overrides: dict) -> dict | None:
        """One replica's estimate in parts (the backend's ``estimate_parts``), cached per catalog
        entry and effective config; None when the backend gives only a total.  A model's LoRA
        adapters are charged to it: their files' size, ``adapters_mib``."""
        entry = controller.entry
        config = entry.spec.effective_config(entry.definition, overrides)
        cache_key = ("parts", entry.name, id(entry), config_key(config))
        if cache_key not in self._estimates:
            parts = entry.spec.estimate_parts(entry.definition, config, entry.base_dir)
            if parts is not None and declared_adapters(config):
                parts = {**parts, "adapters_mib": adapters_mib(config, entry.base_dir)}
            self._estimates[cache_key] = parts
        return self._estimates[cache_key]

    def _fraction_totals(self, requested) -> list[int]:
        """The totals a share of the device is taken of: each named GPU's, for "auto" the largest
        GPU's; empty when none is known (the parts' sum counts then)."""
        gpus = {name: d.total_mib for name, d in self.devices.items() if name != "cpu" and d.total_mib}
        if requested == "auto":
            return [max(gpus.values())] if gpus else []
        names = requested if isinstance(requested, list) else [requested]
        return [gpus[name] for name in names if name in gpus]

    def learn(self, name: str, key: str, per_replica_mib: int, source: str) -> None:
        self.learned[(name, key)] = (per_replica_mib, source)

    def learn_from_failure(self, name: str, key: str, attempted_mib: int, replicas: int, error: str) -> bool:
        """A load that ran out of memory: its next estimate is raised to at least what it tried
        to take (the MiB figure in the error when there is one, else the estimate × 1.25)."""
        if not OOM_WORDS.search(error or ""):
            return False
        per_replica = -(-attempted_mib // max(1, replicas))
        named = [float(m) for m in MIB_IN_ERROR.findall(error)]
        raised = max([per_replica * OOM_RAISE, per_replica + 1, *named])
        self.learn(name, key, int(-(-raised // 1)), "raised_after_oom")
        return True

    # ---- placement ---------------------------------------------------------------------
    def requested(self, controller, config_device) -> list[str] | str:
        device = config_device if config_device is not None else controller.entry.spec.default_device(
            controller.entry.definition
        )
        return device

    def place(self, requested, needed_mib: int, exclude: str | None = None, credit=None) -> list[str]:
        """The devices a load goes on: "auto" is the GPU with the most free budget that fits (the
        one with the most free budget when none does), or cpu when there is no GPU.  ``credit(device)``:
        MiB that count as free there besides (the loader's swap-group slot, ``slot_credit``)."""
        if isinstance(requested, list):
            return list(requested)
        if requested != "auto":
            return [requested]
        gpus = [name for name in self.devices if name != "cpu" and self.devices[name].total_mib is not None]
        if not gpus:
            return ["cpu"]
        free = {name: self.free(name, exclude) + (credit(name) if credit is not None else 0) for name in gpus}
        fitting = [name for name in gpus if free[name] >= needed_mib]
        return [max(fitting or gpus, key=lambda name: (free[name], -device_order(name)[1]))]

    @staticmethod
    def split(needed_mib: int, placement: list[str]) -> dict[str, int]:
        share = -(-needed_mib // len(placement))
        return {device: share for device in placement}

    # ---- accounting --------------------------------------------------------------------
    def used(self, device: str, exclude: str | None = None) -> int:
        return sum(c.mib.get(device, 0) for name, c in self.charges.items() if name != exclude)

    def free(self, device: str, exclude: str | None = None) -> int:
        budget = self.devices[device].budget_mib if device in self.devices else 0
        return budget - self.used(device, exclude)

    def reserve(self, name: str, needed: dict[str, int]) -> None:
        self.charges[name] = Charge(dict(needed), "reserved")

    def measured(self, name: str, mib: dict[str, int]) -> None:
        """The load finished: the reservation becomes what was measured (the difference goes back)."""
        self.charges[name] = Charge(dict(mib), "measured")
        self._changed()

    def release(self, name: str) -> None:
        """``name`` holds nothing any more (unloaded, failed, withdrawn, removed)."""
        self.charges.pop(name, None)
        self._claimed.pop(name, None)
        self.waiting.discard(name)
        self.victims.pop(name, None)
        self._relief_loaders.discard(name)
        self.relieving.pop(name, None)
        self.unrelievable.discard(name)
        self.shrunk.discard(name)
        self._victim_done(name)
        self._changed()

    def relieved(self, name: str, ok: bool) -> None:
        """``name`` slept or shrank for a loader (its new charge is set), or failed to (``ok``
        false: it is not asked again while loaded); the loader plans again once all are done."""
        self.relieving.pop(name, None)
        if not ok:
            self.unrelievable.add(name)
        self._victim_done(name)

    def _victim_done(self, name: str) -> None:
        loader = self.leaving.pop(name, None)
        if loader is not None:
            pending = self.victims.get(loader)
            if pending is not None:
                pending.discard(name)
                if not pending:
                    del self.victims[loader]
                    if loader in self._relief_loaders:
                        self._relief_loaders.discard(loader)
                        self._tell(loader, cmd.Notice.MEMORY_REPLAN)
                    else:
                        self._tell(loader, cmd.Notice.MEMORY_READY)

    def device_report(self) -> list[dict]:
        report = []
        for name, device in self.devices.items():
            used = sum(c.mib.get(name, 0) for c in self.charges.values() if c.kind == "measured")
            reserved = sum(c.mib.get(name, 0) for c in self.charges.values() if c.kind == "reserved")
            entry = device.to_dict(used, reserved)
            entry["models"] = {m: c.mib[name] for m, c in self.charges.items() if c.mib.get(name)}
            entry["charges"] = [  # each model's share, measured or reserved (the workbench's bars)
                {"name": m, "mib": c.mib[name], "kind": c.kind} for m, c in self.charges.items() if c.mib.get(name)
            ]
            report.append(entry)
        return report

    # ---- admission ---------------------------------------------------------------------
    def decide(self, loader, needed_mib: int, requested, *, operator: bool, source: str = "estimate") -> Plan:
        """The plan for ``loader`` to take ``needed_mib`` on the devices ``requested`` names."""
        name = loader.name
        placement = self.place(requested, needed_mib, exclude=name,
                               credit=lambda device: self.slot_credit(loader, device)[0])
        needed = self.split(needed_mib, placement)
        plans = [self._device_plan(name, device, mib, operator, self.slot_credit(loader, device))
                 for device, mib in needed.items()]
        worst = next((plan for plan in plans if plan[0] != "load"), plans[0])
        order = ("refuse", "wait", "evict", "load")
        action = min((plan[0] for plan in plans), key=order.index)
        evict = [victim for plan in plans for victim in plan[5]] if action == "evict" else []
        relieve = [item for plan in plans for item in plan[6]] if action == "evict" else []
        _, device, mib, free, (evictable, blocking), _, _, slot = worst
        return Plan(action, placement, needed, device, mib, free, evictable, blocking, list(dict.fromkeys(evict)),
                    source, each_model_once(relieve), slot)

    def slot_credit(self, loader, device: str) -> tuple[int, set[str]]:
        """(MiB, holders): what ``loader``'s swap group gives back on ``device`` before the
        loader's engines start.  When every slot of its group is held and no other member waits
        ahead of it, the group swaps a holder out for it (one that is not pinned and is loaded or
        unloading): the smallest such charge counts as free.  Those holders are left out of this
        plan's eviction candidates: evicting one would free the slot instead of a swap, and its
        memory would be counted twice.  (0, {}) outside a group or with a slot free anyway."""
        from runtime.model.state import RuntimeState as S

        group = getattr(loader, "group", None)
        if group is None or loader.name in group.holders or len(group.holders) < group.settings.max_loaded:
            return 0, set()
        if any(name != loader.name for name in group.waiting):
            return 0, set()  # the next free slot is another member's
        controllers = self._controllers()
        holders = {
            name for name in group.holders
            if (controller := controllers.get(name)) is not None and not controller.entry.definition.pinned
            and controller.state in (S.LOADED, S.UNLOADING)
        }
        if not holders:
            return 0, set()
        charges = [self.charges[name].mib.get(device, 0) if name in self.charges else 0 for name in holders]
        return min(charges), holders

    def _device_plan(self, loader: str, device: str, needed: int, operator: bool,
                     slot: tuple[int, set[str]] = (0, set())):
        credit, holders = slot
        free = self.free(device, exclude=loader)
        evictable, blocking, busy_mib = self._candidates(loader, device, skip=holders if credit else ())
        if device not in self.devices:
            blocking = [{"name": None, "charge_mib": 0, "why": f"device {device} is not on this machine"}]
            return "refuse", device, needed, free, ([], blocking), [], [], 0
        if needed <= free + credit:
            return "load", device, needed, free, (evictable, blocking), [], [], credit
        deficit = needed - free - credit
        if self.settings.eviction == "idle_lru":
            relieve, chosen = self._make_room(device, evictable, deficit)
            if chosen is not None:
                return "evict", device, needed, free, (evictable, blocking), chosen, relieve, credit
        movable = busy_mib + (sum(c["charge_mib"] for c in evictable) if self.settings.eviction == "idle_lru" else 0)
        if not operator and movable >= deficit:
            return "wait", device, needed, free, (evictable, blocking), [], [], credit
        return "refuse", device, needed, free, (evictable, blocking), [], [], credit

    def _make_room(self, device: str, evictable: list[dict], deficit: int):
        """(relieve, evict) freeing ``deficit`` MiB on ``device``.  The idle models that can give
        memory back while loaded go first, in two rounds, least recently used first in each:
        shrinks (the model still answers at once), then sleeps (a sleep of a model chosen to
        shrink takes the shrink's place); the rest by eviction (``fewest_lru`` of the others).
        evict None: not enough either way."""
        chosen: dict[str, dict] = {}
        freed = 0
        for item in self._reliefs(device, evictable):
            if freed >= deficit:
                break
            earlier = chosen.get(item["name"])
            gain = item["frees_mib"] - (earlier["frees_mib"] if earlier is not None else 0)
            if gain <= 0:
                continue
            chosen[item["name"]] = item
            freed += gain
        relieve = list(chosen.values())
        if freed >= deficit:
            return relieve, []
        rest = fewest_lru([item for item in evictable if item["name"] not in chosen], deficit - freed)
        if rest is not None:
            return relieve, rest
        return [], fewest_lru(evictable, deficit)

    def _reliefs(self, device: str, evictable: list[dict]) -> list[dict]:
        """What the idle, evictable models could give back on ``device`` while staying loaded
        (each writer's ``memory_relief``): every shrink, then every sleep, each in LRU order."""
        controllers = self._controllers()
        options = []
        for item in evictable:  # least recently used first
            controller = controllers.get(item["name"])
            if controller is None or item["name"] in self.unrelievable or item["name"] in self.relieving:
                continue
            relief = getattr(controller, "memory_relief", None)
            for option in relief(device) if relief is not None else ():
                if option["frees_mib"] > 0:
                    options.append({"name": item["name"], **option})
        return [o for o in options if o["action"] == "shrink"] + [o for o in options if o["action"] == "sleep"]

    def _candidates(self, loader: str, device: str, skip=()) -> tuple[list[dict], list[dict], int]:
        """(evictable [{name, charge_mib, last_used}] least recently used first, blocking [{name,
        charge_mib, why}], MiB that busy unpinned or unloading models will give back later, and
        with ``idle_lru`` loading unpinned ones too: once loaded and idle they are evictable);
        the models of ``skip`` (counted through the swap group's slot) are in neither."""
        from runtime.model.state import RuntimeState as S

        evictable, blocking, later = [], [], 0
        controllers = self._controllers()
        for name, charge in self.charges.items():  # a model without a charge holds nothing to free
            mib = charge.mib.get(device, 0)
            controller = controllers.get(name)
            if controller is None or name == loader or not mib or name in skip:
                continue
            pinned = controller.entry.definition.pinned
            state = controller.state
            if state is S.LOADED and controller.memory_idle() and not pinned:
                last = max(controller.clock.last_request_at or 0.0, charge.since)
                evictable.append({"name": name, "charge_mib": mib, "last_used": last})
                continue
            if pinned and state is not S.UNLOADING:
                why = "pinned"
            elif state is S.LOADED:
                why, later = "busy", later + mib
            elif state is S.UNLOADING:
                why, later = "unloading", later + mib
            elif state is S.LOADING and self.settings.eviction == "idle_lru":
                why, later = "loading", later + mib
            else:
                why = state.value
            blocking.append({"name": name, "charge_mib": mib, "why": why})
        evictable.sort(key=lambda item: (item["last_used"], item["name"]))
        for item in evictable:
            del item["last_used"]
        if len(blocking) > 1:  # in the catalog's order, as the plan has always listed them
            position = {name: index for index, name in enumerate(controllers)}
            blocking.sort(key=lambda item: position[item["name"]])
        return evictable, blocking, later

    def claim(self, loader: str, victims: list[str], relieve: list[dict] = ()) -> None:
        """``loader`` makes room by evicting ``victims``: their charges are its now (it reserved
        its whole need), and it starts once every one of them is released.  The models of
        ``relieve`` are asked to sleep or shrink first (their charges stay theirs, then shrink):
        with any of them, the loader plans again once all are done instead of starting."""
        for victim in victims:
            charge = self.charges.pop(victim, None)
            if charge is not None:
                self._claimed[victim] = charge
            self.leaving[victim] = loader
        for item in relieve:
            self.relieving[item["name"]] = item
            self.leaving[item["name"]] = loader
        self.victims[loader] = set(victims) | {item["name"] for item in relieve}
        if relieve:
            self._relief_loaders.add(loader)
        for item in relieve:
            logger.info("model %s: asking %s to %s (frees about %d MiB)", loader, item["name"], item["action"],
                        item["frees_mib"])
            self._tell(item["name"], cmd.Notice.MEMORY_RELIEVE)
        for victim in victims:
            self._tell(victim, cmd.Notice.MEMORY_EVICT)

    def declined(self, victim: str) -> None:
        """``victim`` refused to be evicted (it became busy or pinned meanwhile): its charge comes
        back and its loader plans again."""
        loader = self.leaving.pop(victim, None)
        self.relieving.pop(victim, None)
        charge = self._claimed.pop(victim, None)
        if charge is not None:
            self.charges[victim] = charge
        if loader is not None:
            self.victims.pop(loader, None)
            self._relief_loaders.discard(loader)
            self._tell(loader, cmd.Notice.MEMORY_REPLAN)

    def wait(self, loader: str) -> None:
        self.waiting.add(loader)

    def _changed(self) -> None:
        """Memory was given back or a model became idle: loaders that wait plan again; with none
        waiting or making room, the models shrunk under pressure try to grow back."""
        for loader in sorted(self.waiting):
            self._tell(loader, cmd.Notice.MEMORY_REPLAN)
        self._grow_back()

    def model_idle(self) -> None:
        if self.waiting:
            self._changed()
        else:
            self._grow_back()

    def _grow_back(self) -> None:
        """Each shrunk model checks, idle, whether its configured context fits again (its writer's
        ``memory_grow``: a reconfigure with reason ``memory_freed`` where it does)."""
        if self.waiting or self.victims:
            return
        for name in sorted(self.shrunk):
            self._tell(name, cmd.Notice.MEMORY_GROW)

    def _tell(self, name: str, notice: cmd.Notice) -> None:
        controller = self._controllers().get(name)
        if controller is not None:
            controller.tell(notice)
