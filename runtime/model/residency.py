"""A loaded model's inference state, changed while its weights stay: a collaborator of its writer.

Three operations of the model's writer, one at a time, none of them a state transition (the
model stays ``loaded``; its phase moves, ``runtime.model.phases``):

- ``reconfigure``: the fields whose load_constraints entry says ``"reconfigurable": true``
  (llama_cpp: gguf_n_ctx, gguf_type_k, gguf_type_v, gguf_flash_attn; the adapters_loaded of
  llama_cpp, vllm and vllm_serve) take new values; each engine builds its inference state again
  over the same weights, or changes the LoRA adapters it holds (``engine.reconfigure``).
- ``sleep``: each engine frees its inference state (llama_cpp: the context and its KV cache),
  the weights stay mapped; ``residency`` is then ``"sleeping"``.
- ``wake``: the inference state is built again; a request to a sleeping model wakes it and
  waits in the queue meanwhile.

Each one pauses admission (requests queue, none is refused for it), waits for the active
requests to finish, runs on the engines in a side task (``run``), then resumes admission.  A
reconfigure that an engine rejects leaves the old configuration rebuilt (the engine's own
rollback) and answers 400 ``invalid_load_request`` or 409 ``insufficient_memory``; the model
goes on serving.  A reconfigure that would not fit the memory budget (runtime.pool.memory) or
whose context is below a queued request's estimated size is refused before anything changes.
Each success is a ``ModelEvent`` (``reconfigured``, ``slept``, ``woke``) to the pool's
listeners, next to the transitions.

Memory pressure (runtime.pool.memory, ``eviction: "idle_lru"``): before it evicts anything, the
manager asks idle models for what they could give back while loaded (``memory_relief``): a
llama_cpp model whose definition has ``gguf_n_ctx_min`` can shrink its context to that floor, a
sleepable one can sleep.  The one asked (``Notice.MEMORY_RELIEVE``) runs that as a reconfigure or a sleep
with reason ``memory_pressure`` (its event names the model it makes room for, ``for_model``);
its new charge is then set and the loader plans again.

A wake is planned as a load is (``wake_plan``): the sleeping charge grows back to the awake one
(the charge held before the sleep), so the wake needs that on the model's devices, its own charge
counted as free.  It fits: the awake charge is reserved and the wake runs.  It does not, with
``idle_lru``: other idle models are relieved or evicted for it as for a load (never the one
waking; their events name it, ``for_model``), and the wake runs once they are done (or plans
again).  Otherwise it is refused with ``insufficient_memory`` and the plan: an admin wake answers
it, the requests that would wake the model are failed with it, and the model stays asleep (and
loaded).  A request-triggered wake that only busy models block waits for them, as a load does.

``Residency`` builds and checks operations and keeps what they leave behind (the body that grows
a shrunk model back, the charge held before a sleep); ``runtime.model.operations`` runs them.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runtime.errors import (
    InsufficientMemory,
    InvalidLoadRequest,
    LLMPoolError,
    ModelNotLoaded,
    ModelStateConflict,
    NotReconfigurable,
)
from runtime.pool.memory_plan import Plan
from runtime.model.memory_claim import measure_engines
from runtime.model.phases import Phase
from runtime.model.state import REASON_ADMIN, RuntimeState

logger = logging.getLogger("llmpool.runtime")

S = RuntimeState
EVENT_KINDS = {"reconfigure": "reconfigured", "sleep": "slept", "wake": "woke"}
REASON_MEMORY_PRESSURE = "memory_pressure"  # a sleep or shrink that makes room for another model's load
REASON_MEMORY_FREED = "memory_freed"  # a model shrunk under pressure grows back to its context
ROLLBACK_ERRORS = (InvalidLoadRequest, InsufficientMemory)  # the engine rebuilt the old configuration


@dataclass(frozen=True)
class ModelEvent:
    """A change of a loaded model that is not a transition: ``kind`` reconfigured, slept or woke;
    ``details`` duration_ms, reason and (reconfigured) ``changed`` {field: {from, to}}."""

    model: str
    kind: str
    at: float
    details: dict


@dataclass(eq=False)
class Operation:
    kind: str  # reconfigure | sleep | wake
    reason: str
    resting: Phase  # the phase it began in, and goes back to when it does not succeed
    callers: list[asyncio.Future] = field(default_factory=list)
    config: dict | None = None  # reconfigure: the new effective config, the new load_override,
    old_config: dict | None = None  # the old config (a partial success goes back to it)
    overrides: dict | None = None
    changed: dict | None = None
    memory_key: str | None = None
    for_model: str | None = None  # the load a memory_pressure operation makes room for
    overlap: bool = False  # reconfigure: make-before-break (the new context built before the old is freed)
    asleep_mib: dict | None = None  # wake: the sleeping charge, given back if the wake does not happen
    began: float = field(default_factory=time.monotonic)
    task: asyncio.Task | None = None

    @property
    def ends_in(self) -> Phase:
        """The phase a success leaves."""
        return Phase.ASLEEP if self.kind == "sleep" else Phase.SERVING


class Residency:
    """Plans and checks a loaded model's operations; reads the model (``owner``, its controller),
    its memory ``claim`` and the operation under way (``current()``), and changes none of them."""

    def __init__(self, owner, claim, current: Callable[[], Operation | None]):
        self.owner = owner
        self.claim = claim
        self.current = current
        self.grow_to: dict | None = None  # shrunk under pressure: the reconfigure body that restores its context
        self.awake_charge: dict | None = None  # the memory charge before a sleep (a wake nobody measures gets it back)

    @property
    def memory(self):
        return self.owner.memory

    @property
    def name(self) -> str:
        return self.owner.name

    # ---- checks ------------------------------------------------------------------------
    def check_operable(self, kind: str) -> None:
        owner = self.owner
        if owner.state is not S.LOADED:
            raise ModelNotLoaded(f"model {self.name} is {owner.state.value}; it can {kind} only while loaded")
        operation = self.current()
        if operation is not None:
            raise ModelStateConflict(
                f"model {self.name} is in the middle of a {operation.kind}; {kind} it once that has finished"
            )

    def reconfigure_operation(self, body: dict[str, Any], reason: str) -> Operation | None:
        """The reconfigure ``body`` asks for, checked (raises as the API answers); None when it
        changes nothing."""
        owner = self.owner
        spec, definition = owner.entry.spec, owner.entry.definition
        allowed = spec.reconfigurable_fields()
        for key in body:
            if key not in allowed:
                names = ", ".join(sorted(allowed)) or "none"
                raise NotReconfigurable(
                    f"{key} cannot be changed while model {self.name} is loaded (backend {definition.backend}; "
                    f"reconfigurable: {names}); unload and load it with the new value",
                    param=key,
                )
        if not body:
            raise InvalidLoadRequest("the reconfigure body names no field to change")
        self.check_operable("reconfigure")
        overrides = {**owner.load_override, **body}
        for key, value in body.items():
            if value is None:
                overrides.pop(key)  # null: back to the definition's value
        accepted = spec.validate_overrides(definition, overrides)
        old_config = spec.effective_config(definition, owner.load_override)
        config = spec.effective_config(definition, accepted)
        changed = {k: {"from": old_config.get(k), "to": config.get(k)} for k in body if old_config.get(k) != config.get(k)}
        self._check_queued_fit(spec.context_length(config))
        memory_key, overlap = self._check_reconfigure_memory(accepted)
        if not changed:
            return None
        return Operation("reconfigure", reason, owner.phases.phase, config=config, old_config=old_config,
                         overrides=accepted, changed=changed, memory_key=memory_key, overlap=overlap)

    def _check_queued_fit(self, n_ctx: int | None) -> None:
        """A new context below a queued request's estimated size is refused (it would fail it)."""
        if n_ctx is None:
            return
        sizes = [ticket.cost_estimate for ticket in self.owner.scheduler.queued()]
        if sizes and max(sizes) >= n_ctx:
            raise InvalidLoadRequest(
                f"a context of {n_ctx} tokens is too small for a request queued for model {self.name} "
                f"(about {max(sizes)} prompt tokens); nothing was changed",
                param="gguf_n_ctx",
            )

    def _check_reconfigure_memory(self, overrides: dict) -> tuple[str | None, bool]:
        """409 insufficient_memory when the new configuration's estimate does not fit where the model
        is placed (its own charge counted as free); else (the effective config's key, overlap).
        ``overlap`` (make-before-break): the backend can build the new context before it frees the
        old (``make_before_break``) and every device holds the charge now plus one replica's new
        context (its estimate less what stays asleep, ``sleeping_mib``); else break-then-make."""
        owner, memory = self.owner, self.memory
        if memory is None or not owner.placement:
            return None, False
        count = max(1, len(owner.serving_engines))
        needed, _source, key = memory.estimate(owner, overrides, count)
        free = {}
        for device, mib in memory.split(needed, owner.placement).items():
            free[device] = memory.free(device, exclude=self.name)
            if mib > free[device]:
                raise InsufficientMemory(
                    f"model {self.name} reconfigured would need {mib} MiB on {device}, {free[device]} MiB is free "
                    "there (its own charge counted as free); nothing was changed",
                    details={"device": device, "needed_mib": mib, "free_mib": free[device], "evictable": [],
                             "blocking": []},
                )
        spec, definition = owner.entry.spec, owner.entry.definition
        if not spec.make_before_break:
            return key, False
        per_replica = -(-needed // count)
        config = spec.effective_config(definition, overrides)
        context = max(0, per_replica - spec.sleeping_mib(definition, config, owner.entry.base_dir, per_replica))
        held = self.claim.charge_mib()
        extra = memory.split(context, owner.placement)
        return key, all(held.get(device, 0) + extra[device] <= free[device] for device in free)

    # ---- the memory of a wake ----------------------------------------------------------
    def wake_plan(self, reason: str) -> Plan | None:
        """The memory plan of waking now (None without accounting): the awake charge (held before
        the sleep, else the estimate) on the model's devices, its own charge counted as free."""
        owner, memory = self.owner, self.memory
        if memory is None or not owner.placement:
            return None
        awake = self.awake_charge
        if awake:
            needed, source = sum(awake.values()), "measured"
        else:
            needed, source, _key = memory.estimate(owner, owner.load_override, max(1, len(owner.serving_engines)))
        return memory.decide(owner, needed, list(owner.placement), operator=reason == REASON_ADMIN, source=source)

    def wake_refusal(self, plan: Plan) -> InsufficientMemory:
        return InsufficientMemory(
            f"model {self.name} needs {plan.needed_mib} MiB on {plan.device} to wake but {plan.free_mib} MiB "
            f"of its budget are free (its sleeping charge counted as free); it stays asleep",
            details=plan.details(),
        )

    # ---- memory pressure (runtime.pool.memory asks; read between commands, acted on in the writer) ----
    def memory_relief(self, device: str) -> list[dict]:
        """What this idle model could give back on ``device`` while it stays loaded: a ``shrink``
        of its context to ``gguf_n_ctx_min`` and a ``sleep``, each ``{action, frees_mib}`` (the
        shrink with ``to``), from the estimates against its charge there; [] when neither."""
        owner, memory = self.owner, self.memory
        charge = memory.charges.get(self.name) if memory is not None else None
        if (charge is None or owner.state is not S.LOADED or self.current() is not None or not owner.placement
                or owner.residency != "active"):
            return []
        held = charge.mib.get(device, 0)
        spec, definition = owner.entry.spec, owner.entry.definition
        options = []
        floor = getattr(definition, "gguf_n_ctx_min", None)
        current = None
        if floor is not None:  # the effective config costs a dump of the definition: only when it can shrink
            current = spec.effective_config(definition, owner.load_override).get("gguf_n_ctx")
        if floor is not None and current is not None and current > floor:
            to = {"gguf_n_ctx": floor}
            needed, _source, _key = memory.estimate(owner, {**owner.load_override, **to},
                                                    max(1, len(owner.serving_engines)))
            after = memory.split(needed, owner.placement).get(device, 0)
            options.append({"action": "shrink", "frees_mib": held - after, "to": to})
        if spec.can_sleep(definition):
            options.append({"action": "sleep", "frees_mib": held - self.asleep_charge().get(device, 0)})
        return options

    def asleep_charge(self) -> dict[str, int]:
        """The charge expected once asleep (the backend's ``sleeping_mib`` of the one held now)."""
        owner = self.owner
        awake = sum(self.claim.charge_mib().values())
        count = max(1, len(owner.serving_engines))
        spec, definition = owner.entry.spec, owner.entry.definition
        config = spec.effective_config(definition, owner.load_override)
        asleep = spec.sleeping_mib(definition, config, owner.entry.base_dir, -(-awake // count)) * count
        return self.memory.split(max(0, min(awake, asleep)), owner.placement)

    def relief_operation(self, action: str, to: dict | None) -> Operation | None:
        """The planned relief (a shrink to ``to``, or a sleep) as an operation; None when it
        changes nothing or cannot be done now."""
        try:
            if action == "shrink":
                operation = self.reconfigure_operation(to, REASON_MEMORY_PRESSURE)
            elif self.owner.residency == "active":
                operation = Operation("sleep", REASON_MEMORY_PRESSURE, self.owner.phases.phase)
            else:
                operation = None
        except LLMPoolError as exc:
            logger.info("model %s cannot %s to make room: %s", self.name, action, exc.message)
            return None
        if operation is not None:
            operation.for_model = self.memory.leaving.get(self.name)
            logger.info("model %s: %s to make room for %s", self.name, action, operation.for_model)
        return operation

    def grow_operation(self) -> Operation | None:
        """Shrunk under pressure (``grow_to`` set) and idle: the reconfigure that grows it back when
        it fits now (None: not now, or never, in which case it is no longer counted as shrunk)."""
        memory = self.memory
        try:
            operation = self.reconfigure_operation(self.grow_to, REASON_MEMORY_FREED)
        except InsufficientMemory:
            return None  # not yet
        except LLMPoolError as exc:
            logger.info("model %s cannot grow back: %s", self.name, exc.message)
            operation = None
        if operation is None:
            memory.shrunk.discard(self.name)
        return operation

    # ---- after an operation ------------------------------------------------------------
    def track_shrink(self, operation: Operation) -> None:
        """Before a reconfigure takes effect: a shrink under pressure remembers how to grow back
        (the first one since the model was shrunk: the load override's value, or its absence);
        growing back, or another change of the context, forgets it."""
        memory = self.memory
        if memory is None:
            return
        if operation.reason == REASON_MEMORY_PRESSURE:
            if self.name not in memory.shrunk:
                self.grow_to = {key: self.owner.load_override.get(key) for key in operation.changed}
                memory.shrunk.add(self.name)
        elif self.name in memory.shrunk and set(operation.changed) & set(self.grow_to or {}):
            self.grow_to = None
            memory.shrunk.discard(self.name)

    def reconfigure_mode(self, operation: Operation) -> str:
        """``make_before_break``, ``break_then_make`` or ``restart`` (a changed field whose
        load_constraints entry says so: llama_server's, vllm_serve's adapters_loaded without
        runtime LoRA loading)."""
        if operation.overlap:
            return "make_before_break"
        entry = self.owner.entry
        constraints = entry.spec.load_constraints(entry.definition)
        restart = any(constraints[key].get("reconfigure_mode") == "restart" for key in operation.changed)
        return "restart" if restart else "break_then_make"

    def charge_after(self, kind: str, measured: int | None) -> None:
        """After a sleep or wake: the measured figure (not learned), else the sleeping estimate
        (sleep) or the charge held before the sleep (wake)."""
        memory, placement = self.memory, self.owner.placement
        if kind == "sleep":
            charge = memory.charges.get(self.name)
            self.awake_charge = dict(charge.mib) if charge is not None else None
        if measured is not None:
            memory.measured(self.name, memory.split(measured, placement))
        elif kind == "sleep":
            memory.measured(self.name, self.asleep_charge())
        elif self.awake_charge is not None:
            memory.measured(self.name, self.awake_charge)


async def run(operation: Operation, engines: list, placement: list[str] | None) -> int | None:
    """The operation on each engine, one after the other; what they hold after it (MiB, or None).
    A reconfigure that an engine rolls back puts the replicas already changed back too."""
    if operation.kind == "reconfigure":
        done = []
        try:
            for engine in engines:
                if operation.overlap:
                    await engine.reconfigure(operation.config, overlap=True)
                else:
                    await engine.reconfigure(operation.config)
                done.append(engine)
        except ROLLBACK_ERRORS:
            for engine in done:
                await engine.reconfigure(operation.old_config)
            raise
    elif operation.kind == "sleep":
        for engine in engines:
            await engine.sleep()
    else:
        for engine in engines:
            await engine.wake()
    return await measure_engines(engines, placement, None, None)


def settle(callers: list[asyncio.Future], outcome: Any) -> None:
    """Answer every caller still waiting with ``outcome`` (a result, or an exception to raise)."""
    for caller in callers:
        if caller.done():
            continue
        if isinstance(outcome, BaseException):
            caller.set_exception(outcome)
        else:
            caller.set_result(outcome)
