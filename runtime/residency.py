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
A reconfigure that would not fit the memory budget (runtime.memory) or whose context is below a
queued request's estimated size is refused before anything changes.  Each success is a
``ModelEvent`` (``reconfigured``, ``slept``, ``woke``) to the pool's listeners, next to the
transitions.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

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
from runtime.memory_writer import measure_engines
from runtime.state import REASON_ADMIN, REASON_REQUEST, RuntimeState

logger = logging.getLogger("llmpool.runtime")

S = RuntimeState
EVENT_KINDS = {"reconfigure": "reconfigured", "sleep": "slept", "wake": "woke"}
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
    began: float = field(default_factory=time.monotonic)
    task: asyncio.Task | None = None


class ResidencyWriter:
    """Handlers of ``ModelController`` (state, scheduler, engines, memory, ``_post``)."""

    _operation: _Operation | None = None
    _slept_engines: list | None = None  # ``engines`` while they sleep (a new load makes a new list)

    @property
    def residency(self) -> str:
        """``"sleeping"`` while a loaded model's engines have freed their inference state, else ``"active"``."""
        asleep = self._slept_engines is not None and self._slept_engines is self.engines and self.engines
        return "sleeping" if asleep and self.state is S.LOADED else "active"

    # ---- commands (any task) ---------------------------------------------------------
    async def reconfigure(self, body: dict[str, Any]) -> dict:
        """Change reconfigurable fields while loaded; answers ``{duration_ms, changed, reason}``."""
        return await self._post("reconfigure", body)

    async def sleep(self) -> dict:
        return await self._post("sleep")

    async def wake(self) -> dict:
        return await self._post("wake")

    # ---- handlers (in the writer) ----------------------------------------------------
    def _on_reconfigure(self, future, body: dict[str, Any]) -> None:
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
        memory_key = self._check_reconfigure_memory(accepted)
        if not changed:
            future.set_result({"duration_ms": 0.0, "changed": {}, "reason": REASON_ADMIN})
            return
        self._begin_operation(_Operation(
            "reconfigure", REASON_ADMIN, [future], config=config, old_config=old_config, overrides=accepted,
            changed=changed, memory_key=memory_key,
        ))

    def _on_sleep(self, future) -> None:
        if not self.entry.spec.sleepable:
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
        self._begin_operation(_Operation("wake", REASON_ADMIN, [future]))

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

    def _check_reconfigure_memory(self, overrides: dict) -> str | None:
        """409 insufficient_memory when the new configuration's estimate does not fit where the model
        is placed (its own charge counted as free); the effective config's key otherwise."""
        if self.memory is None or not self.placement:
            return None
        needed, _source, key = self.memory.estimate(self, overrides, max(1, len(self.engines)))
        for device, mib in self.memory.split(needed, self.placement).items():
            free = self.memory.free(device, exclude=self.name)
            if mib > free:
                raise InsufficientMemory(
                    f"model {self.name} reconfigured would need {mib} MiB on {device}, {free} MiB is free there "
                    "(its own charge counted as free); nothing was changed",
                    details={"device": device, "needed_mib": mib, "free_mib": free, "evictable": [], "blocking": []},
                )
        return key

    def _wake_for_request(self) -> None:
        """A request queued for a sleeping model wakes it (it waits in the paused queue meanwhile)."""
        if self.residency == "sleeping" and self._operation is None and self.scheduler.queue_depth:
            self._begin_operation(_Operation("wake", REASON_REQUEST))

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
        if self.scheduler.inflight:
            return
        operation.task = asyncio.get_running_loop().create_task(self._operate(operation, list(self.engines)))
        if self._work is None:
            self._work = operation.task  # an unload meanwhile waits for it

    async def _operate(self, operation: _Operation, engines: list) -> None:
        try:
            if operation.kind == "reconfigure":
                done = []
                try:
                    for engine in engines:
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
            self._post("operation_finished", operation, exc, None)
            return
        self._post("operation_finished", operation, None, measured)

    def _on_operation_finished(self, future, operation: _Operation, error: Exception | None, measured) -> None:
        future.set_result(None)
        if self._work is operation.task:
            self._work = None
        self._operation = None
        loaded = self.state is S.LOADED
        if error is None and loaded:
            details = {"duration_ms": round((time.monotonic() - operation.began) * 1000, 1), "reason": operation.reason}
            if operation.kind == "reconfigure":
                self.load_override = operation.overrides
                details["changed"] = operation.changed
                if operation.memory_key is not None:
                    self._memory_key = operation.memory_key
                self._memory_loaded(measured)  # the new configuration's measured figure is learned
            elif self.memory is not None and self.placement and measured is not None:
                self.memory.measured(self.name, self.memory.split(measured, self.placement))  # not learned
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
                self._post("engine_failed", f"{operation.kind} failed: {failure.message}")
        if self.state is S.LOADED:
            if self.residency == "active":
                self.scheduler.resume()
            else:
                self._wake_for_request()  # requests that came while it fell asleep
        self._release_when_idle()


def _settle(callers: list[asyncio.Future], outcome: Any) -> None:
    for caller in callers:
        if caller.done():
            continue
        if isinstance(outcome, BaseException):
            caller.set_exception(outcome)
        else:
            caller.set_result(outcome)
