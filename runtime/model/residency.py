"""A loaded model's inference state, changed while its weights stay (``ModelController`` mixes it in).

Three operations of the model's writer, one at a time, none of them a state transition (the
model stays ``loaded``):

- ``reconfigure``: the fields whose load_constraints entry says ``"reconfigurable": true``
  (llama_cpp: gguf_n_ctx, gguf_type_k, gguf_type_v, gguf_flash_attn) take new values; each
  engine builds its inference state again over the same weights (``engine.reconfigure``).
- ``sleep``: each engine frees its inference state (llama_cpp: the context and its KV cache),
  the weights stay mapped; ``residency`` is then ``"sleeping"``.
- ``wake``: the inference state is built again; a request to a sleeping model wakes it and
  waits in the queue meanwhile.

Each one pauses admission (requests queue, none is refused for it), waits for the active
requests to finish, runs on the engines in a side task, then resumes admission.  A reconfigure
that an engine rejects leaves the old configuration rebuilt (the engine's own rollback) and
answers 400 ``invalid_load_request`` or 409 ``insufficient_memory``; the model goes on serving.
A reconfigure that would not fit the memory budget (runtime.pool.memory) or whose context is below a
queued request's estimated size is refused before anything changes.  Each success is a
``ModelEvent`` (``reconfigured``, ``slept``, ``woke``) to the pool's listeners, next to the
transitions.

Memory pressure (runtime.pool.memory, ``eviction: "idle_lru"``): before it evicts anything, the
manager asks idle models for what they could give back while loaded (``memory_relief``): a
llama_cpp model whose definition has ``gguf_n_ctx_min`` can shrink its context to that floor, a
sleepable one can sleep.  The one asked (``memory_relieve``) runs that as a reconfigure or a sleep
with reason ``memory_pressure`` (its event names the model it makes room for, ``for_model``);
its new charge is then set and the loader plans again.

A wake is planned as a load is (``_plan_wake``): the sleeping charge grows back to the awake one
(the charge held before the sleep), so the wake needs that on the model's devices, its own charge
counted as free.  It fits: the awake charge is reserved and the wake runs.  It does not, with
``idle_lru``: other idle models are relieved or evicted for it as for a load (never the one
waking; their events name it, ``for_model``), and the wake runs once they are done (or plans
again).  Otherwise it is refused with ``insufficient_memory`` and the plan: an admin wake answers
it, the requests that would wake the model are failed with it, and the model stays asleep (and
loaded).  A request-triggered wake that only busy models block waits for them, as a load does.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from runtime.model import commands as cmd
from runtime.errors import (
    BackendError,
    InsufficientMemory,
    InvalidLoadRequest,
    LLMPoolError,
    ModelNotLoaded,
    ModelStateConflict,
    ModelUnloading,
    NotReconfigurable,
    NotSleepable,
)
from runtime.pool.memory_plan import Plan
from runtime.model.memory_claim import measure_engines
from runtime.model.state import REASON_ADMIN, REASON_REQUEST, RuntimeState

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
class _Operation:
    kind: str  # reconfigure | sleep | wake
    reason: str
    callers: list[asyncio.Future] = field(default_factory=list)
    config: dict | None = None  # reconfigure: the new effective config, the new load_override,
    old_config: dict | None = None  # the old config (a partial success goes back to it)
    overrides: dict | None = None
    changed: dict | None = None
    memory_key: str | None = None
    for_model: str | None = None  # the load a memory_pressure operation makes room for
    overlap: bool = False  # reconfigure: make-before-break (the new context built before the old is freed)
    awaiting_memory: bool = False  # wake: other models make room for it (or it waits for busy ones) first
    asleep_mib: dict | None = None  # wake: the sleeping charge, given back if the wake does not happen
    began: float = field(default_factory=time.monotonic)
    task: asyncio.Task | None = None


class ResidencyWriter:
    """Handlers of ``ModelController`` (state, scheduler, engines, memory, ``_post``)."""

    _operation: _Operation | None = None
    _slept_engines: list | None = None  # ``engines`` while they sleep (a new load makes a new list)
    _awake_charge: dict | None = None  # the memory charge before a sleep (a wake nobody measures gets it back)
    _grow_to: dict | None = None  # shrunk under pressure: the reconfigure body that restores its context

    @property
    def residency(self) -> str:
        """``"sleeping"`` while a loaded model's engines have freed their inference state, else ``"active"``."""
        asleep = self._slept_engines is not None and self._slept_engines is self.engines and self.engines
        return "sleeping" if asleep and self.state is S.LOADED else "active"

    # ---- commands (any task) ---------------------------------------------------------
    async def reconfigure(self, body: dict[str, Any]) -> dict:
        """Change reconfigurable fields while loaded; answers ``{duration_ms, changed, reason}``."""
        return await self._post(cmd.Reconfigure(body))

    async def sleep(self) -> dict:
        return await self._post(cmd.Sleep())

    async def wake(self) -> dict:
        return await self._post(cmd.Wake())

    # ---- handlers (in the writer) ----------------------------------------------------
    def _on_reconfigure(self, future, body: dict[str, Any]) -> None:
        operation = self._reconfigure_operation(body, REASON_ADMIN)
        if operation is None:
            future.set_result({"duration_ms": 0.0, "changed": {}, "reason": REASON_ADMIN})
            return
        operation.callers.append(future)
        self._begin_operation(operation)

    def _reconfigure_operation(self, body: dict[str, Any], reason: str) -> _Operation | None:
        """The reconfigure ``body`` asks for, checked (raises as the API answers); None when it
        changes nothing."""
        spec, definition = self.entry.spec, self.entry.definition
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
        self._check_operable("reconfigure")
        overrides = {**self.load_override, **body}
        for key, value in body.items():
            if value is None:
                overrides.pop(key)  # null: back to the definition's value
        accepted = spec.validate_overrides(definition, overrides)
        old_config = spec.effective_config(definition, self.load_override)
        config = spec.effective_config(definition, accepted)
        changed = {k: {"from": old_config.get(k), "to": config.get(k)} for k in body if old_config.get(k) != config.get(k)}
        self._check_queued_fit(spec.context_length(config))
        memory_key, overlap = self._check_reconfigure_memory(accepted)
        if not changed:
            return None
        return _Operation("reconfigure", reason, config=config, old_config=old_config, overrides=accepted,
                          changed=changed, memory_key=memory_key, overlap=overlap)

    def _on_sleep(self, future) -> None:
        if not self.entry.spec.can_sleep(self.entry.definition):
            raise NotSleepable(f"model {self.name} (backend {self.entry.definition.backend}) cannot sleep")
        if self._operation is not None and self._operation.kind == "sleep":
            self._operation.callers.append(future)
            return
        self._check_operable("sleep")
        if self.residency == "sleeping":
            future.set_result({"duration_ms": 0.0, "reason": REASON_ADMIN})
            return
        self._begin_operation(_Operation("sleep", REASON_ADMIN, [future]))

    def _on_wake(self, future) -> None:
        if self._operation is not None and self._operation.kind == "wake":
            self._operation.callers.append(future)
            return
        self._check_operable("wake")
        if self.residency == "active":
            future.set_result({"duration_ms": 0.0, "reason": REASON_ADMIN})
            return
        operation = _Operation("wake", REASON_ADMIN, [future])
        self._plan_wake(operation)  # insufficient_memory: nothing changes
        self._begin_operation(operation)

    # ---- the memory of a wake ----------------------------------------------------------
    def wake_plan(self, reason: str) -> Plan | None:
        """The memory plan of waking now (None without accounting): the awake charge (held before
        the sleep, else the estimate) on the model's devices, its own charge counted as free."""
        if self.memory is None or not self.placement:
            return None
        awake = self._awake_charge
        if awake:
            needed, source = sum(awake.values()), "measured"
        else:
            needed, source, _key = self.memory.estimate(self, self.load_override, max(1, len(self.serving_engines)))
        return self.memory.decide(self, needed, list(self.placement), operator=reason == REASON_ADMIN,
                                  source=source)

    def _plan_wake(self, operation: _Operation) -> None:
        """Act on the wake's plan: reserve the awake charge and go, make room first, or wait
        (``operation.awaiting_memory``); refused, raise InsufficientMemory having changed nothing."""
        plan = self.wake_plan(operation.reason)
        if plan is None:
            return
        if plan.action == "refuse":
            raise InsufficientMemory(
                f"model {self.name} needs {plan.needed_mib} MiB on {plan.device} to wake but {plan.free_mib} MiB "
                f"of its budget are free (its sleeping charge counted as free); it stays asleep",
                details=plan.details(),
            )
        if plan.action == "wait":
            operation.awaiting_memory = True
            self.memory.wait(self.name)
            return
        charge = self.memory.charges.get(self.name)
        if operation.asleep_mib is None:
            operation.asleep_mib = dict(charge.mib) if charge is not None else {}
        self.memory.reserve(self.name, plan.needed)
        if plan.action == "evict":
            operation.awaiting_memory = True
            if plan.evict:
                logger.info("model %s: evicting %s to wake on %s", self.name, ", ".join(plan.evict), plan.device)
            self.memory.claim(self.name, plan.evict, plan.relieve)

    def _wake_memory(self, *, replan: bool) -> None:
        """``MemoryReady`` (``replan`` false) / ``MemoryReplan`` for a wake that waits for memory."""
        operation = self._operation
        if operation is None or operation.kind != "wake" or not operation.awaiting_memory:
            return
        operation.awaiting_memory = False
        if replan:
            self.memory.waiting.discard(self.name)
            try:
                self._plan_wake(operation)
            except InsufficientMemory as exc:
                self._wake_refused(operation, exc)
                return
        self._operate_when_idle()

    def _wake_refused(self, operation: _Operation, error: InsufficientMemory) -> None:
        """The wake does not happen: its callers and the requests that wait for it get ``error``;
        the model stays asleep with its sleeping charge."""
        self._operation = None
        self.memory.waiting.discard(self.name)
        if operation.asleep_mib is not None:
            self.memory.measured(self.name, operation.asleep_mib)
        logger.info("%s", error.message)
        _settle(operation.callers, error)
        self.scheduler.reject_queued(error)

    def waking(self) -> bool:
        """A wake is planned or under way (the model is wanted: no candidate to make room)."""
        return self._operation is not None and self._operation.kind == "wake"

    def _check_operable(self, kind: str) -> None:
        if self.state is not S.LOADED:
            raise ModelNotLoaded(f"model {self.name} is {self.state.value}; it can {kind} only while loaded")
        if self._operation is not None:
            raise ModelStateConflict(
                f"model {self.name} is in the middle of a {self._operation.kind}; {kind} it once that has finished"
            )

    def _check_queued_fit(self, n_ctx: int | None) -> None:
        """A new context below a queued request's estimated size is refused (it would fail it)."""
        if n_ctx is None:
            return
        sizes = [ticket.cost_estimate for state in self.scheduler.keys.values() for ticket in state.queue]
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
        if self.memory is None or not self.placement:
            return None, False
        count = max(1, len(self.serving_engines))
        needed, _source, key = self.memory.estimate(self, overrides, count)
        free = {}
        for device, mib in self.memory.split(needed, self.placement).items():
            free[device] = self.memory.free(device, exclude=self.name)
            if mib > free[device]:
                raise InsufficientMemory(
                    f"model {self.name} reconfigured would need {mib} MiB on {device}, {free[device]} MiB is free "
                    "there (its own charge counted as free); nothing was changed",
                    details={"device": device, "needed_mib": mib, "free_mib": free[device], "evictable": [],
                             "blocking": []},
                )
        spec, definition = self.entry.spec, self.entry.definition
        if not spec.make_before_break:
            return key, False
        per_replica = -(-needed // count)
        config = spec.effective_config(definition, overrides)
        context = max(0, per_replica - spec.sleeping_mib(definition, config, self.entry.base_dir, per_replica))
        charge = self.memory.charges.get(self.name)
        held = charge.mib if charge is not None else {}
        extra = self.memory.split(context, self.placement)
        return key, all(held.get(device, 0) + extra[device] <= free[device] for device in free)

    # ---- memory pressure (runtime.pool.memory asks; read between commands, acted on in the writer) ----
    def memory_relief(self, device: str) -> list[dict]:
        """What this idle model could give back on ``device`` while it stays loaded: a ``shrink``
        of its context to ``gguf_n_ctx_min`` and a ``sleep``, each ``{action, frees_mib}`` (the
        shrink with ``to``), from the estimates against its charge there; [] when neither."""
        charge = self.memory.charges.get(self.name) if self.memory is not None else None
        if (charge is None or self.state is not S.LOADED or self._operation is not None or not self.placement
                or self.residency != "active"):
            return []
        held = charge.mib.get(device, 0)
        spec, definition = self.entry.spec, self.entry.definition
        options = []
        floor = getattr(definition, "gguf_n_ctx_min", None)
        current = None
        if floor is not None:  # the effective config costs a dump of the definition: only when it can shrink
            current = spec.effective_config(definition, self.load_override).get("gguf_n_ctx")
        if floor is not None and current is not None and current > floor:
            to = {"gguf_n_ctx": floor}
            needed, _source, _key = self.memory.estimate(self, {**self.load_override, **to}, max(1, len(self.serving_engines)))
            after = self.memory.split(needed, self.placement).get(device, 0)
            options.append({"action": "shrink", "frees_mib": held - after, "to": to})
        if spec.can_sleep(definition):
            options.append({"action": "sleep", "frees_mib": held - self._asleep_charge().get(device, 0)})
        return options

    def _asleep_charge(self) -> dict[str, int]:
        """The charge expected once asleep (the backend's ``sleeping_mib`` of the one held now)."""
        charge = self.memory.charges.get(self.name)
        awake = sum(charge.mib.values()) if charge is not None else 0
        count = max(1, len(self.serving_engines))
        spec, definition = self.entry.spec, self.entry.definition
        config = spec.effective_config(definition, self.load_override)
        asleep = spec.sleeping_mib(definition, config, self.entry.base_dir, -(-awake // count)) * count
        return self.memory.split(max(0, min(awake, asleep)), self.placement)

    def _on_memory_relieve(self, future) -> None:
        """Asked to make room: sleep or shrink as planned while still idle, else decline."""
        future.set_result(None)
        item = self.memory.relieving.get(self.name) if self.memory is not None else None
        if item is None:
            return
        idle = self.state is S.LOADED and self.memory_idle() and self._operation is None
        if not idle or self.entry.definition.pinned:
            self.memory.declined(self.name)
            return
        try:
            if item["action"] == "shrink":
                operation = self._reconfigure_operation(item["to"], REASON_MEMORY_PRESSURE)
            else:
                operation = _Operation("sleep", REASON_MEMORY_PRESSURE) if self.residency == "active" else None
        except LLMPoolError as exc:
            logger.info("model %s cannot %s to make room: %s", self.name, item["action"], exc.message)
            operation = None
        if operation is None:
            self.memory.relieved(self.name, False)
            return
        operation.for_model = self.memory.leaving.get(self.name)
        logger.info("model %s: %s to make room for %s", self.name, item["action"], operation.for_model)
        self._begin_operation(operation)

    def _on_memory_grow(self, future) -> None:
        """Memory was freed: shrunk under pressure and idle, grow back to the context it had
        (a reconfigure with reason ``memory_freed``) where that fits now; else stay as it is."""
        future.set_result(None)
        if self.memory is None or self.name not in self.memory.shrunk:
            return
        if self._grow_to is None:
            self.memory.shrunk.discard(self.name)
            return
        idle = self.state is S.LOADED and self.memory_idle() and self._operation is None
        if not idle or self.residency != "active":
            return
        try:
            operation = self._reconfigure_operation(self._grow_to, REASON_MEMORY_FREED)
        except InsufficientMemory:
            return  # not yet
        except LLMPoolError as exc:
            logger.info("model %s cannot grow back: %s", self.name, exc.message)
            operation = None
        if operation is None:
            self.memory.shrunk.discard(self.name)
            return
        self._begin_operation(operation)

    def _wake_for_request(self) -> None:
        """A request queued for a sleeping model wakes it (it waits in the paused queue meanwhile);
        a wake that memory refuses fails the queued requests with insufficient_memory."""
        if self.residency == "sleeping" and self._operation is None and self.scheduler.queue_depth:
            operation = _Operation("wake", REASON_REQUEST)
            try:
                self._plan_wake(operation)
            except InsufficientMemory as exc:
                logger.info("%s", exc.message)
                self.scheduler.reject_queued(exc)
                return
            self._begin_operation(operation)

    def _begin_operation(self, operation: _Operation) -> None:
        self._operation = operation
        self.scheduler.pause()
        self._operate_when_idle()

    def _operate_when_idle(self) -> None:
        """Once the active requests are done, the operation runs on the engines (a side task)."""
        operation = self._operation
        if operation is None or operation.task is not None:
            return
        if self.state is not S.LOADED:  # an unload (or a failure) came first
            self._operation = None
            _settle(operation.callers, ModelUnloading(f"model {self.name} is {self.state.value}"))
            return
        if operation.awaiting_memory:
            gone = operation.reason == REASON_REQUEST and not self.scheduler.queue_depth
            if gone and self.name in self.memory.waiting:
                self._operation = None  # its requests are gone while it waited for busy models: no wake
                self.memory.waiting.discard(self.name)
            return
        if self.scheduler.inflight:
            return
        operation.task = asyncio.get_running_loop().create_task(self._operate(operation, self.serving_engines))
        if self._work is None:
            self._work = operation.task  # an unload meanwhile waits for it

    async def _operate(self, operation: _Operation, engines: list) -> None:
        try:
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
                    for engine in done:  # the replicas already changed go back too
                        await engine.reconfigure(operation.old_config)
                    raise
            else:
                for engine in engines:
                    await getattr(engine, operation.kind)()
            measured = await measure_engines(engines, self.placement, None, None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._post(cmd.OperationFinished(operation, exc, None))
            return
        self._post(cmd.OperationFinished(operation, None, measured))

    def _on_operation_finished(self, future, operation: _Operation, error: Exception | None, measured) -> None:
        future.set_result(None)
        if self._work is operation.task:
            self._work = None
        self._operation = None
        loaded = self.state is S.LOADED
        if error is None and loaded:
            details = {"duration_ms": round((time.monotonic() - operation.began) * 1000, 1), "reason": operation.reason}
            if operation.for_model is not None:
                details["for_model"] = operation.for_model
            if operation.kind == "reconfigure":
                self._track_shrink(operation)
                self.load_override = operation.overrides
                details["changed"] = operation.changed
                details["mode"] = self._reconfigure_mode(operation)
                if operation.memory_key is not None:
                    self._memory_key = operation.memory_key
                self._memory_loaded(measured)  # the new configuration's measured figure is learned
            elif self.memory is not None and self.placement:
                self._residency_charge(operation.kind, measured)
            self._slept_engines = self.engines if operation.kind == "sleep" else None
            logger.info("model %s %s in %.1f ms %s", self.name, EVENT_KINDS[operation.kind], details["duration_ms"],
                        details.get("changed", ""))
            event = ModelEvent(self.name, EVENT_KINDS[operation.kind], time.time(), details)
            for listener in self.machine.listeners:
                listener(event)
            _settle(operation.callers, details)
        elif error is None:
            _settle(operation.callers, ModelUnloading(f"model {self.name} is {self.state.value}"))
        else:
            failure = error if isinstance(error, LLMPoolError) else BackendError(str(error) or type(error).__name__)
            _settle(operation.callers, failure)
            if loaded and not isinstance(error, ROLLBACK_ERRORS):  # no configuration left to serve with
                self._post(cmd.EngineFailed(f"{operation.kind} failed: {failure.message}"))
        if operation.reason == REASON_MEMORY_PRESSURE and self.memory is not None:
            self.memory.relieved(self.name, error is None and loaded)  # its loader plans again
        if self.state is S.LOADED:
            if self.residency == "active":
                self.scheduler.resume()
            else:
                self._wake_for_request()  # requests that came while it fell asleep
        self._release_when_idle()

    def _track_shrink(self, operation: _Operation) -> None:
        """Before a reconfigure takes effect: a shrink under pressure remembers how to grow back
        (the first one since the model was shrunk: the load override's value, or its absence);
        growing back, or another change of the context, forgets it."""
        if self.memory is None:
            return
        if operation.reason == REASON_MEMORY_PRESSURE:
            if self.name not in self.memory.shrunk:
                self._grow_to = {key: self.load_override.get(key) for key in operation.changed}
                self.memory.shrunk.add(self.name)
        elif self.name in self.memory.shrunk and set(operation.changed) & set(self._grow_to or {}):
            self._grow_to = None
            self.memory.shrunk.discard(self.name)

    def _reconfigure_mode(self, operation: _Operation) -> str:
        """``make_before_break``, ``break_then_make`` or (llama_server) ``restart``."""
        if operation.overlap:
            return "make_before_break"
        restart = any(o.constraint.get("reconfigure_mode") == "restart" for o in self.entry.spec.overrides)
        return "restart" if restart else "break_then_make"

    def _residency_charge(self, kind: str, measured: int | None) -> None:
        """After a sleep or wake: the measured figure (not learned), else the sleeping estimate
        (sleep) or the charge held before the sleep (wake)."""
        if kind == "sleep":
            charge = self.memory.charges.get(self.name)
            self._awake_charge = dict(charge.mib) if charge is not None else None
        if measured is not None:
            self.memory.measured(self.name, self.memory.split(measured, self.placement))
        elif kind == "sleep":
            self.memory.measured(self.name, self._asleep_charge())
        elif self._awake_charge is not None:
            self.memory.measured(self.name, self._awake_charge)


def _settle(callers: list[asyncio.Future], outcome: Any) -> None:
    for caller in callers:
        if caller.done():
            continue
        if isinstance(outcome, BaseException):
            caller.set_exception(outcome)
        else:
            caller.set_result(outcome)
