"""A model's claim on the memory budget: one collaborator of its writer, shared by load and wake.

Before a load starts, the writer asks for a plan (``plan_load``, ``checked_plan``) from the
pool's ``MemoryManager`` (``runtime.pool.memory``) and hands it to ``act``, which reserves the
estimate on the devices it is placed on and tells the writer what comes next: ``GO`` (the
engines start), ``WAIT`` (busy or loading models are waited for: a request-triggered load) or
``MAKE_ROOM`` (the models evicted or relieved for it give memory back first).  A refused plan
raises ``insufficient_memory`` before anything changed.  A wake is planned by the residency
collaborator and acted on by the same ``act``.  After the load the claim charges what was
measured (``loaded``), and the charge goes when the engines are released (``release``).

The claim holds its own bookkeeping (the plan acted on, the effective config's key, the
placement) and decides, inside the writer's step and from the model's own state, what the memory
manager's notices (``cmd.MEMORY_NOTICES``) mean: a ``MemoryStep`` that the writer applies.  A
model asked to make room unloads with reason ``memory_eviction`` when it is idle, unpinned and
loaded; otherwise it declines and the loader plans again.
"""
from __future__ import annotations

import enum
import logging

from runtime.errors import InsufficientMemory
from runtime.model import commands as cmd
from runtime.model.phases import Phase
from runtime.model.state import REASON_ADMIN, REASON_REQUEST, RuntimeState
from runtime.pool.devices import measure_process_memory
from runtime.pool.memory_plan import Plan

logger = logging.getLogger("llmpool.runtime")

MIB = 1024 * 1024
S = RuntimeState
P = Phase


class Claim(str, enum.Enum):
    """What acting on a plan leaves: start now, or wait for memory first."""

    GO = "go"
    WAIT = "wait"  # busy or loading models are waited for
    MAKE_ROOM = "make_room"  # evicted or relieved models give memory back first


class MemoryStep(enum.Enum):
    """What a notice of the memory manager decides; the writer applies it (``ModelWriter.on_memory``)."""

    EVICT = "evict"  # idle, unpinned and loaded: it unloads to make room
    DECLINE = "decline"  # busy or pinned: the manager asks another, or the loader plans again
    LOAD_GOES = "load_goes"  # the room a waiting load asked for is free: it goes on
    REPLAN_LOAD = "replan_load"  # memory changed under a waiting load: it is planned again (``replan``)
    WAKE_GOES = "wake_goes"  # the room a waiting wake asked for is free: it runs
    REPLAN_WAKE = "replan_wake"  # memory changed under a waiting wake: it is planned again
    RELIEVE = "relieve"  # asked to make room: the operations sleep or shrink it while idle
    GROW = "grow"  # memory was freed: a model shrunk under pressure may grow back


class MemoryClaim:
    """The writer's side of the memory manager.  The model (``owner``, its controller) is what the
    manager reads (its entry, group and state)."""

    def __init__(self, owner):
        self.owner = owner
        self.memory = self.owner.memory  # the pool's MemoryManager, or None (a controller outside a pool)
        self.placement: list[str] | None = None  # the devices of the current (or last) load
        self.plan: Plan | None = None  # the plan the current (or last) load acted on
        self.key: str | None = None  # the effective config the charge was estimated for

    @property
    def name(self) -> str:
        return self.owner.name

    # ---- planning ----------------------------------------------------------------------
    def plan_load(self, overrides: dict, count: int, reason: str) -> Plan | None:
        """The plan for a load with ``overrides`` and ``count`` replicas (None without a manager);
        it changes nothing (the dry run answers it)."""
        if self.memory is None:
            return None
        entry = self.owner.entry
        needed, source, _key = self.memory.estimate(self.owner, overrides, count)
        config = entry.spec.effective_config(entry.definition, overrides)
        requested = self.memory.requested(self.owner, config.get("device"))
        return self.memory.decide(self.owner, needed, requested, operator=reason == REASON_ADMIN, source=source)

    def checked_plan(self, overrides: dict, count: int, reason: str) -> Plan | None:
        """``plan_load``, raising ``InsufficientMemory`` with the plan when it is refused."""
        plan = self.plan_load(overrides, count, reason)
        if self.memory is not None:
            self.key = self.memory.estimate(self.owner, overrides, count)[2]
        if plan is not None and plan.action == "refuse":
            raise self.refusal(plan)
        return plan

    def dry_run(self, state: RuntimeState, count: int, accepted: dict) -> dict:
        """The dry run of an admin load: what it would do, checked as the load would be, acting on nothing."""
        answer = {"model": self.name, "runtime_state": state.value}
        if state in (S.LOADED, S.LOADING, S.UNLOADING) or self.memory is None:
            answer.update({"fits": state is not S.UNLOADING, "action": "none", "placement": self.placement,
                           "charge_mib": self.charge_mib()})
        else:
            answer.update(self.plan_load(accepted, count, REASON_ADMIN).to_dict())
        return answer

    def refusal(self, plan: Plan) -> InsufficientMemory:
        blocking = ", ".join(f"{b['name']} ({b['why']})" for b in plan.blocking if b["name"]) or "none"
        return InsufficientMemory(
            f"model {self.name} needs {plan.needed_mib} MiB on {plan.device} but {plan.free_mib} MiB of its "
            f"budget are free; blocking: {blocking}",
            details=plan.details(),
        )

    # ---- acting on a plan --------------------------------------------------------------
    def act_for_load(self, plan: Plan | None) -> Claim:
        """Act on a load's plan once the model is loading (None: no accounting, it goes)."""
        self.plan = plan
        if plan is None:
            return Claim.GO
        self.placement = plan.placement
        return self.act(plan, "fit")

    def act(self, plan: Plan, purpose: str) -> Claim:
        """Wait for busy models, or reserve the plan's charge and make room first when it says so."""
        if plan.action == "wait":
            self.memory.wait(self.name)
            return Claim.WAIT
        self.memory.reserve(self.name, plan.needed)
        if plan.action == "evict":
            if plan.evict:
                logger.info("model %s: evicting %s to %s on %s", self.name, ", ".join(plan.evict), purpose, plan.device)
            self.memory.claim(self.name, plan.evict, plan.relieve)
            return Claim.MAKE_ROOM
        return Claim.GO

    def charge_mib(self) -> dict[str, int]:
        """The charge held now, per device ({} when none)."""
        charge = self.memory.charges.get(self.name) if self.memory is not None else None
        return dict(charge.mib) if charge is not None else {}

    def release(self) -> None:
        if self.memory is not None:
            self.memory.release(self.name)

    # ---- what the memory manager tells the model (in the writer's step) -----------------
    def on_notice(self, notice: cmd.Notice) -> MemoryStep | None:
        """What the memory manager's ``notice`` (``cmd.MEMORY_NOTICES``) means for this model, from
        its own state; None: nothing."""
        model = self.owner
        loaded, load_waits = model.state is S.LOADED, model.phases.is_(P.AWAITING_MEMORY, S.LOADING)
        match notice:
            case cmd.Notice.MEMORY_EVICT:
                if loaded and model.memory_idle() and not model.entry.definition.pinned:
                    return MemoryStep.EVICT
                if self.memory is not None:
                    return MemoryStep.DECLINE
            case cmd.Notice.MEMORY_READY:
                if loaded:
                    return MemoryStep.WAKE_GOES
                if load_waits:
                    return MemoryStep.LOAD_GOES
            case cmd.Notice.MEMORY_REPLAN if self.memory is not None:
                if loaded:
                    return MemoryStep.REPLAN_WAKE
                if load_waits:
                    return MemoryStep.REPLAN_LOAD
            case cmd.Notice.MEMORY_RELIEVE:
                return MemoryStep.RELIEVE
            case cmd.Notice.MEMORY_GROW:
                return MemoryStep.GROW
        return None

    def replan(self) -> Claim:
        """Memory was given back, a model became idle, or a model refused eviction: the waiting
        load is planned again and acted on; refused, it raises InsufficientMemory."""
        model = self.owner
        self.memory.release(self.name)  # the old reservation, if any, does not count against itself
        plan = self.plan_load(model.load_override, model.replicas, model.reason)
        if plan.action == "refuse":
            raise self.refusal(plan)
        return self.act_for_load(plan)

    def wait_unwanted(self, load_waiters: list) -> bool:
        """Whether a request-triggered load that waits for memory, all its requests gone (no caller
        in ``load_waiters`` either), should not happen."""
        model = self.owner
        return (model.phases.is_(P.AWAITING_MEMORY, S.LOADING) and not model.waiters and not load_waiters
                and model.reason == REASON_REQUEST)

    # ---- after the load ----------------------------------------------------------------
    def loaded(self, measured_mib: int | None, serving: int) -> None:
        """Charge what the load measured (the estimate stays when nothing could be measured)."""
        if self.memory is None or self.placement is None:
            return
        if measured_mib is None:
            self.memory.measured(self.name, self.plan.needed if self.plan is not None else {})
            return
        self.memory.measured(self.name, self.memory.split(measured_mib, self.placement))
        if self.key is not None:
            self.memory.learn(self.name, self.key, -(-measured_mib // max(1, serving)), "measured")

    def replica_failed(self, serving_before: int) -> None:
        """One of ``serving_before`` serving replicas failed: its share of the charge goes back."""
        charge = self.memory.charges.get(self.name) if self.memory is not None else None
        if charge is None or serving_before < 2:
            return
        left = serving_before - 1
        self.memory.measured(self.name, {device: -(-mib * left // serving_before) for device, mib in charge.mib.items()})

    def failed(self, error: str, replicas: int) -> str | None:
        """The load failed: its reservation goes; out of memory, its next estimate is raised and
        the answer is the last_error that says so (None: ``error`` as it is)."""
        plan, why = self.plan, None
        if self.memory is not None and plan is not None and self.key is not None:
            if self.memory.learn_from_failure(self.name, self.key, plan.needed_mib * len(plan.placement), replicas,
                                              error):
                why = f"out of memory on {', '.join(plan.placement)}: {error}"
        self.release()
        return why

    def view(self, overrides: dict, replicas: int, awaiting: bool) -> dict | None:
        """The admin entry's ``memory``: the estimate of the next load and the charge held now."""
        if self.memory is None:
            return None
        try:
            estimate, source, _key = self.memory.estimate(self.owner, overrides, replicas)
        except Exception:  # an estimate that cannot be made is no reason to fail a read
            estimate, source = None, "unavailable"
        try:
            parts = self.memory.estimate_parts(self.owner, overrides) if source == "estimate" else None
        except Exception:
            parts = None
        charge = self.memory.charges.get(self.name)
        return {
            "estimate_mib": estimate,
            "estimate_source": source,
            "estimate_parts": parts,
            "charge_mib": dict(charge.mib) if charge is not None else {},
            "charge": charge.kind if charge is not None else None,
            "awaiting_memory": awaiting,
        }


async def measure_engines(engines, placement: list[str] | None, gpu_delta_mib: int | None,
                          rss_delta_mib: int | None) -> int | None:
    """What a loaded model holds, MiB: each engine's own figure (the stub's, an engine process's
    NVML per-process memory on a GPU or its RSS on cpu), else the GPU delta of the load on a
    GPU, or the runtime process's RSS growth on cpu; None when nothing could be measured."""
    on_gpu = bool(placement) and placement[0] != "cpu"
    total = 0
    for engine in engines:
        own = getattr(engine, "memory_mib", None)
        figure = None
        if own is not None:
            figure = own()
        elif hasattr(engine, "stats"):
            try:
                stats = await engine.stats()
            except Exception:
                stats = {}
            value = stats.get("gpu_memory_bytes") if on_gpu else stats.get("rss_bytes")
            figure = -(-value // MIB) if isinstance(value, int) and value > 0 else None
        if figure is None:
            total = None
            break
        total += figure
    if total is not None:
        return total
    return gpu_delta_mib if on_gpu else rss_delta_mib


def process_rss_mib() -> int | None:
    try:
        return measure_process_memory()
    except Exception:
        return None
