"""The reconfigure, sleep or wake under way on a loaded model: a collaborator of its writer.

One at a time (``current``), each decided inside the writer's step: it is planned and checked by
the residency planner (``runtime.model.residency``), pauses the queue (requests queue, none is
refused for it), waits for the active requests to finish (``when_idle``, asked after every step
that may have ended one), runs on the serving engines in a side task (``run``), and ends in
``OperationFinished``, which reopens the queue (or, asleep, leaves it paused until a request wakes
the model).  Each step returns an ``OpStep`` that the writer applies (``ModelWriter.operate``):
the model's phase (``runtime.model.phases``: serving or asleep -> operating -> serving or asleep;
asleep -> (awaiting_memory ->) waking -> serving), its queue, its event and the side task are the
writer's to change.  What stays here is the operation's own record, its callers' answers and the
memory manager's bookkeeping of the memory it waits for or gives.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from runtime.errors import BackendError, InsufficientMemory, LLMPoolError, ModelUnloading, NotSleepable
from runtime.model import commands as cmd
from runtime.model import residency
from runtime.model.memory_claim import Claim, MemoryClaim
from runtime.model.phases import Phase
from runtime.model.residency import EVENT_KINDS, REASON_MEMORY_PRESSURE, ROLLBACK_ERRORS, ModelEvent, Operation
from runtime.model.state import REASON_ADMIN, REASON_REQUEST, RuntimeState

logger = logging.getLogger("llmpool.runtime")

S = RuntimeState
P = Phase
RUNNING = frozenset({P.OPERATING, P.WAKING})


@dataclass(frozen=True, slots=True)
class OpStep:
    """What one step of an operation decided, applied by the writer in the order of its fields."""

    pause: bool = False  # the queue holds its requests: an operation begins
    reconfigured: Operation | None = None  # a reconfigure that succeeded: its overrides become the load_override
    move: tuple[Phase | frozenset[Phase], Phase] | None = None  # the model's phase: from -> to
    event: ModelEvent | None = None  # what the operation did, for the model's listeners
    reject: LLMPoolError | None = None  # the queued requests fail with it (a wake that cannot happen)
    run: Operation | None = None  # runs on the serving engines now, as a side task (``Operations.run``)
    failed: str | None = None  # the engines are left with no configuration: an engine failure
    resume: bool = False  # the queue serves again
    then: Callable[[], OpStep | None] | None = None  # asked once applied: the step that follows, if any


class Operations:
    """The operation under way (``current``) and what each of its steps decides."""

    def __init__(self, model, claim: MemoryClaim, post: Callable[[cmd.Command], object]):
        self.model = model
        self.claim = claim  # the model's memory claim, shared with its loads
        self._post = post  # a command to the writer: the run's outcome
        self.current: Operation | None = None
        self.planner = residency.Residency(model, claim, lambda: self.current)

    # ---- the admin's commands ----------------------------------------------------------
    def reconfigure(self, future, body: dict) -> OpStep | None:
        operation = self.planner.reconfigure_operation(body, REASON_ADMIN)
        if operation is None:
            future.set_result({"duration_ms": 0.0, "changed": {}, "reason": REASON_ADMIN})
            return None
        operation.callers.append(future)
        return self._begin(operation)

    def sleep(self, future) -> OpStep | None:
        model = self.model
        if not model.entry.spec.can_sleep(model.entry.definition):
            raise NotSleepable(f"model {model.name} (backend {model.entry.definition.backend}) cannot sleep")
        if self.current is not None and self.current.kind == "sleep":
            self.current.callers.append(future)
            return None
        self.planner.check_operable("sleep")
        if model.residency == "sleeping":
            future.set_result({"duration_ms": 0.0, "reason": REASON_ADMIN})
            return None
        return self._begin(Operation("sleep", REASON_ADMIN, model.phases.phase, [future]))

    def wake(self, future) -> OpStep | None:
        if self.current is not None and self.current.kind == "wake":
            self.current.callers.append(future)
            return None
        self.planner.check_operable("wake")
        if self.model.residency == "active":
            future.set_result({"duration_ms": 0.0, "reason": REASON_ADMIN})
            return None
        operation = Operation("wake", REASON_ADMIN, P.ASLEEP, [future])
        return self._begin(operation, self._claim_wake(operation))  # insufficient_memory: nothing changes

    # ---- a wake's memory ---------------------------------------------------------------
    def _claim_wake(self, operation: Operation) -> Claim:
        """Act on the wake's plan with the model's memory claim: reserve the awake charge and go,
        make room first, or wait; refused, raise InsufficientMemory having changed nothing."""
        plan = self.planner.wake_plan(operation.reason)
        if plan is None:
            return Claim.GO
        if plan.action == "refuse":
            raise self.planner.wake_refusal(plan)
        if plan.action != "wait" and operation.asleep_mib is None:
            operation.asleep_mib = self.claim.charge_mib()
        return self.claim.act(plan, "wake")

    def memory_ready(self, *, replan: bool) -> OpStep | None:
        """``MEMORY_READY`` (``replan`` false) / ``MEMORY_REPLAN`` for a wake that waits for memory."""
        operation, model = self.current, self.model
        if operation is None or operation.kind != "wake" or not model.phases.is_(P.AWAITING_MEMORY, S.LOADED):
            return None
        claim = Claim.GO
        if replan:
            model.memory.waiting.discard(model.name)
            try:
                claim = self._claim_wake(operation)
            except InsufficientMemory as exc:
                return self._wake_refused(operation, exc)
        return OpStep(move=(P.AWAITING_MEMORY, P.WAKING if claim is Claim.GO else P.AWAITING_MEMORY),
                      then=self.when_idle)

    def _wake_refused(self, operation: Operation, error: InsufficientMemory) -> OpStep:
        """The wake does not happen: its callers and the requests that wait for it get ``error``;
        the model stays asleep with its sleeping charge."""
        model = self.model
        self.current = None
        model.memory.waiting.discard(model.name)
        if operation.asleep_mib is not None:
            model.memory.measured(model.name, operation.asleep_mib)
        logger.info("%s", error.message)
        residency.settle(operation.callers, error)
        return OpStep(move=(P.AWAITING_MEMORY, P.ASLEEP), reject=error)

    def wake_for_request(self) -> OpStep | None:
        """A request queued for a sleeping model wakes it (it waits in the paused queue meanwhile);
        a wake that memory refuses fails the queued requests with insufficient_memory."""
        model = self.model
        if model.residency != "sleeping" or self.current is not None or not model.scheduler.queue_depth:
            return None
        operation = Operation("wake", REASON_REQUEST, P.ASLEEP)
        try:
            claim = self._claim_wake(operation)
        except InsufficientMemory as exc:
            logger.info("%s", exc.message)
            return OpStep(reject=exc)
        return self._begin(operation, claim)

    # ---- memory pressure ---------------------------------------------------------------
    def _idle(self) -> bool:
        model = self.model
        return model.state is S.LOADED and model.memory_idle() and self.current is None

    def relieve(self) -> OpStep | None:
        """Asked to make room: sleep or shrink as planned while still idle, else decline."""
        model, memory = self.model, self.model.memory
        item = memory.relieving.get(model.name) if memory is not None else None
        if item is None:
            return None
        if not self._idle() or model.entry.definition.pinned:
            memory.declined(model.name)
            return None
        operation = self.planner.relief_operation(item["action"], item.get("to"))
        if operation is None:
            memory.relieved(model.name, False)
            return None
        return self._begin(operation)

    def grow(self) -> OpStep | None:
        """Memory was freed: shrunk under pressure and idle, grow back to the context it had
        (a reconfigure with reason ``memory_freed``) where that fits now; else stay as it is."""
        model, memory = self.model, self.model.memory
        if memory is None or model.name not in memory.shrunk:
            return None
        if self.planner.grow_to is None:
            memory.shrunk.discard(model.name)
            return None
        if not self._idle() or model.residency != "active":
            return None
        operation = self.planner.grow_operation()
        return None if operation is None else self._begin(operation)

    # ---- running it --------------------------------------------------------------------
    def _begin(self, operation: Operation, claim: Claim = Claim.GO) -> OpStep:
        self.current = operation
        if operation.kind == "wake":
            move = (P.ASLEEP, P.WAKING if claim is Claim.GO else P.AWAITING_MEMORY)
        else:
            move = (operation.resting, P.OPERATING)
        return OpStep(pause=True, move=move, then=self.when_idle)

    def when_idle(self) -> OpStep | None:
        """Once the active requests are done, the operation runs on the engines (a side task)."""
        operation, model = self.current, self.model
        if operation is None or operation.task is not None:
            return None
        if model.state is not S.LOADED:  # an unload (or a failure) came first
            self.current = None
            residency.settle(operation.callers, ModelUnloading(f"model {model.name} is {model.state.value}"))
            return None
        if model.phases.phase is P.AWAITING_MEMORY:
            gone = operation.reason == REASON_REQUEST and not model.scheduler.queue_depth
            if gone and model.name in model.memory.waiting:
                self.current = None  # its requests are gone while it waited for busy models: no wake
                model.memory.waiting.discard(model.name)
                return OpStep(move=(P.AWAITING_MEMORY, P.ASLEEP))
            return None
        if model.scheduler.inflight:
            return None
        return OpStep(run=operation)

    async def run(self, operation: Operation, engines: list) -> None:
        """The operation on ``engines``, reported to the writer as ``OperationFinished``."""
        try:
            measured = await residency.run(operation, engines, self.model.placement)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._post(cmd.OperationFinished(operation, exc, None))
            return
        self._post(cmd.OperationFinished(operation, None, measured))

    def finished(self, operation: Operation, error: Exception | None, measured) -> OpStep:
        """The run is over: its callers are answered; the step moves the model back to rest."""
        model = self.model
        self.current = None
        loaded = model.state is S.LOADED
        step = OpStep(then=self.reopen)
        if error is None and loaded:
            details = self._succeeded(operation, measured)
            logger.info("model %s %s in %.1f ms %s", model.name, EVENT_KINDS[operation.kind], details["duration_ms"],
                        details.get("changed", ""))
            event = ModelEvent(model.name, EVENT_KINDS[operation.kind], time.time(), details)
            step = OpStep(reconfigured=operation if operation.kind == "reconfigure" else None,
                          move=(RUNNING, operation.ends_in), event=event, then=self.reopen)
            residency.settle(operation.callers, details)
        elif error is None:
            residency.settle(operation.callers, ModelUnloading(f"model {model.name} is {model.state.value}"))
        else:
            failure = error if isinstance(error, LLMPoolError) else BackendError(str(error) or type(error).__name__)
            residency.settle(operation.callers, failure)
            if loaded:  # a rollback error leaves the old configuration serving; any other, none
                failed = None if isinstance(error, ROLLBACK_ERRORS) else f"{operation.kind} failed: {failure.message}"
                step = OpStep(move=(RUNNING, operation.resting), failed=failed, then=self.reopen)
        if operation.reason == REASON_MEMORY_PRESSURE and model.memory is not None:
            model.memory.relieved(model.name, error is None and loaded)  # its loader plans again
        return step

    def reopen(self) -> OpStep | None:
        """After an operation: an active model's queue serves again; a sleeping one's stays paused
        until a request wakes it (one may have come while it fell asleep)."""
        model = self.model
        if model.state is not S.LOADED:
            return None
        return OpStep(resume=True) if model.residency == "active" else self.wake_for_request()

    def _succeeded(self, operation: Operation, measured: int | None) -> dict:
        """Apply a successful operation to the model's memory claim; its event's details."""
        planner = self.planner
        details = {"duration_ms": round((time.monotonic() - operation.began) * 1000, 1), "reason": operation.reason}
        if operation.for_model is not None:
            details["for_model"] = operation.for_model
        if operation.kind == "reconfigure":
            planner.track_shrink(operation)
            details["changed"] = operation.changed
            details["mode"] = planner.reconfigure_mode(operation)
            if operation.memory_key is not None:
                self.claim.key = operation.memory_key
            self.claim.loaded(measured, len(self.model.serving_engines))  # the new configuration's figure is learned
        elif self.model.memory is not None and self.model.placement:
            planner.charge_after(operation.kind, measured)
        return details
