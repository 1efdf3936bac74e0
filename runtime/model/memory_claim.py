"""The part of a model's writer that deals with memory (``ModelController`` mixes it in).

Before a load starts, the writer asks the pool's ``MemoryManager`` (``runtime.pool.memory``) for a
plan: it reserves its estimate on the devices it is placed on, waits for the models evicted
for it to be released, waits for busy or loading ones (a request-triggered load), or is refused
(``insufficient_memory``, nothing changed).  After the load it charges what was measured, and
the charge goes when its engines are released.  A model asked to make room (``memory_evict``)
decides from its own state: idle, unpinned and loaded, it unloads with reason
``memory_eviction``; otherwise it declines and the loader plans again.
"""
from __future__ import annotations

import logging

from runtime.model import commands as cmd
from runtime.errors import InsufficientMemory
from runtime.pool.devices import measure_process_memory
from runtime.pool.memory_plan import Plan
from runtime.model.state import REASON_ADMIN, REASON_MEMORY_EVICTION, REASON_REQUEST, RuntimeState

logger = logging.getLogger("llmpool.runtime")

S = RuntimeState
# memory_relieve: sleep or shrink to make room; memory_grow: grow back once memory frees
# (runtime.model.residency, ``_on_memory_relieve`` / ``_on_memory_grow``).
MIB = 1024 * 1024


class MemoryWriter:
    """Handlers of ``ModelController`` (which provides ``memory``, the state and the load steps)."""

    memory = None  # the pool's MemoryManager, or None (a controller outside a pool)
    placement: list[str] | None = None  # the devices of the current (or last) load
    _awaiting_memory = False  # loading, but waiting for evicted or busy models to give memory back
    _memory_plan: Plan | None = None
    _memory_key: str | None = None  # the effective config the charge was estimated for

    def memory_command(self, command: cmd.Command) -> None:
        if not isinstance(command, cmd.MEMORY_COMMANDS):
            raise ValueError(f"not a memory command: {command!r}")
        if not self._stopped:
            self._post(command)

    def memory_idle(self) -> bool:
        """Whether this model could be evicted now (read by the manager between commands); a
        model about to wake is wanted (runtime.model.residency)."""
        return self._is_drained() and not self.waiters and not self.waking()

    # ---- planning ----------------------------------------------------------------------
    def plan_load(self, overrides: dict, count: int, reason: str) -> Plan | None:
        """The plan for a load with ``overrides`` and ``count`` replicas (None without a manager);
        it changes nothing (the dry run answers it)."""
        if self.memory is None:
            return None
        needed, source, _key = self.memory.estimate(self, overrides, count)
        config = self.entry.spec.effective_config(self.entry.definition, overrides)
        requested = self.memory.requested(self, config.get("device"))
        return self.memory.decide(self, needed, requested, operator=reason == REASON_ADMIN, source=source)

    def checked_plan(self, overrides: dict, count: int, reason: str) -> Plan | None:
        """``plan_load``, raising ``InsufficientMemory`` with the plan when it is refused."""
        plan = self.plan_load(overrides, count, reason)
        if self.memory is not None:
            self._memory_key = self.memory.estimate(self, overrides, count)[2]
        if plan is not None and plan.action == "refuse":
            raise InsufficientMemory(_refusal(self.name, plan), details=plan.details())
        return plan

    def _on_plan(self, future, overrides: dict, replicas: int | None) -> None:
        """The dry run of an admin load: what it would do, checked as the load would be, acting on nothing."""
        state = self.state
        count, accepted = self.checked_load_body(overrides, replicas)
        answer = {"model": self.name, "runtime_state": state.value}
        if state in (S.LOADED, S.LOADING, S.UNLOADING) or self.memory is None:
            charge = self.memory.charges.get(self.name) if self.memory is not None else None
            answer.update({"fits": state is not S.UNLOADING, "action": "none", "placement": self.placement,
                           "charge_mib": dict(charge.mib) if charge is not None else {}})
        else:
            answer.update(self.plan_load(accepted, count, REASON_ADMIN).to_dict())
        future.set_result(answer)

    def _memory_go(self, plan: Plan | None) -> bool:
        """Act on ``plan`` once the model is loading: True when its engines may start now."""
        self._memory_plan = plan
        self._awaiting_memory = False
        if plan is None:
            return True
        self.placement = plan.placement
        if plan.action == "wait":
            self._awaiting_memory = True
            self.memory.wait(self.name)
            return False
        self.memory.reserve(self.name, plan.needed)
        if plan.action == "evict":
            self._awaiting_memory = True
            if plan.evict:
                logger.info("model %s: evicting %s to fit on %s", self.name, ", ".join(plan.evict), plan.device)
            self.memory.claim(self.name, plan.evict, plan.relieve)
            return False
        return True

    def _memory_release(self) -> None:
        self._awaiting_memory = False
        if self.memory is not None:
            self.memory.release(self.name)

    # ---- commands ----------------------------------------------------------------------
    def _on_memory_evict(self, future) -> None:
        future.set_result(None)
        if self.state is S.LOADED and self.memory_idle() and not self.entry.definition.pinned:
            self._swapped_out = False
            self._start_unload(REASON_MEMORY_EVICTION)
        elif self.memory is not None:
            self.memory.declined(self.name)

    def _on_memory_ready(self, future) -> None:
        """The models evicted for this load are released: its engines start (a wake: it runs)."""
        future.set_result(None)
        if self.state is S.LOADED:
            self._wake_memory(replan=False)
        elif self.state is S.LOADING and self._awaiting_memory:
            self._awaiting_memory = False
            self._after_memory()

    def _on_memory_replan(self, future) -> None:
        """Memory was given back, a model became idle, or a model refused eviction: plan again."""
        future.set_result(None)
        if self.state is S.LOADED and self.memory is not None:
            self._wake_memory(replan=True)
            return
        if self.state is not S.LOADING or not self._awaiting_memory or self.memory is None:
            return
        self.memory.release(self.name)  # the old reservation, if any, does not count against itself
        plan = self.plan_load(self.load_override, self.replicas, self.reason)
        if plan.action == "refuse":
            error = InsufficientMemory(_refusal(self.name, plan), details=plan.details())
            self._awaiting_memory = False
            self.last_error = error.message
            self.machine.transition(S.LOADING, S.UNLOADED, self.reason)
            self.waiters.fail(error)
            for waiter in self._load_waiters:
                if not waiter.done():
                    waiter.set_exception(error)
            self._load_waiters.clear()
            return
        if self._memory_go(plan):
            self._after_memory()

    def _withdraw_memory_wait(self) -> None:
        """A request-triggered load that waits for memory, all its requests gone: it does not happen."""
        if (
            self.state is S.LOADING and self._awaiting_memory and not self.waiters and not self._load_waiters
            and self.reason == REASON_REQUEST
        ):
            self._memory_release()
            self.machine.transition(S.LOADING, S.UNLOADED, REASON_REQUEST)

    # ---- after the load ----------------------------------------------------------------
    def _memory_loaded(self, measured_mib: int | None) -> None:
        """Charge what the load measured (the estimate stays when nothing could be measured)."""
        if self.memory is None or self.placement is None:
            return
        if measured_mib is None:
            plan = self._memory_plan
            self.memory.measured(self.name, plan.needed if plan is not None else {})
            return
        self.memory.measured(self.name, self.memory.split(measured_mib, self.placement))
        if self._memory_key is not None:
            per_replica = -(-measured_mib // max(1, len(self.serving_engines)))
            self.memory.learn(self.name, self._memory_key, per_replica, "measured")

    def _memory_replica_failed(self, serving_before: int) -> None:
        """One of ``serving_before`` serving replicas failed: its share of the charge goes back."""
        charge = self.memory.charges.get(self.name) if self.memory is not None else None
        if charge is None or serving_before < 2:
            return
        left = serving_before - 1
        self.memory.measured(self.name, {device: -(-mib * left // serving_before) for device, mib in charge.mib.items()})

    def _memory_failed(self, error: str) -> None:
        """The load failed: its reservation goes; out of memory, its next estimate is raised."""
        plan = self._memory_plan
        if self.memory is not None and plan is not None and self._memory_key is not None:
            if self.memory.learn_from_failure(self.name, self._memory_key, plan.needed_mib * len(plan.placement),
                                              self.replicas, error):
                self.last_error = f"out of memory on {', '.join(plan.placement)}: {error}"
        self._memory_release()

    def memory_view(self) -> dict | None:
        """The admin entry's ``memory``: the estimate of the next load and the charge held now."""
        if self.memory is None:
            return None
        try:
            estimate, source, _key = self.memory.estimate(self, self.load_override, self.replicas)
        except Exception:  # an estimate that cannot be made is no reason to fail a read
            estimate, source = None, "unavailable"
        try:
            parts = self.memory.estimate_parts(self, self.load_override) if source == "estimate" else None
        except Exception:
            parts = None
        charge = self.memory.charges.get(self.name)
        return {
            "estimate_mib": estimate,
            "estimate_source": source,
            "estimate_parts": parts,
            "charge_mib": dict(charge.mib) if charge is not None else {},
            "charge": charge.kind if charge is not None else None,
            "awaiting_memory": self._awaiting_memory,
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


def _refusal(name: str, plan: Plan) -> str:
    blocking = ", ".join(f"{b['name']} ({b['why']})" for b in plan.blocking if b["name"]) or "none"
    return (
        f"model {name} needs {plan.needed_mib} MiB on {plan.device} but {plan.free_mib} MiB of its budget are "
        f"free; blocking: {blocking}"
    )
