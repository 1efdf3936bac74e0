"""The reconfigure, sleep or wake under way on a loaded model: a collaborator of its writer.

One at a time (``current``), each handled inside the writer's step: it is planned and checked by
the residency planner (``runtime.model.residency``), pauses the queue (requests queue, none is
refused for it), waits for the active requests to finish (``when_idle``, called after every
step that may have ended one), runs on the serving engines in a side task (``_run``), and ends
in ``OperationFinished``, which resumes the queue (or, asleep, leaves it paused until a request
wakes the model).  The model's phase moves with it (``runtime.model.phases``): serving or asleep
-> operating -> serving or asleep; asleep -> (awaiting_memory ->) waking -> serving.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from runtime.errors import BackendError, InsufficientMemory, LLMPoolError, ModelUnloading, NotSleepable
from runtime.model import commands as cmd
from runtime.model import residency
from runtime.model.memory_claim import Claim, MemoryClaim
from runtime.model.phases import Phase
from runtime.model.residency import EVENT_KINDS, REASON_MEMORY_PRESSURE, ROLLBACK_ERRORS, ModelEvent, Operation
from runtime.model.side_work import SideWork
from runtime.model.state import REASON_ADMIN, REASON_REQUEST, RuntimeState

logger = logging.getLogger("llmpool.runtime")

S = RuntimeState
P = Phase
RUNNING = frozenset({P.OPERATING, P.WAKING})


class Operations:
    """The operation under way (``current``) and its steps inside the writer's step."""

    def __init__(self, model, claim: MemoryClaim, side: SideWork, post: Callable[[cmd.Command], object]):
        self.model = model
        self.claim = claim  # the model's memory claim, shared with its loads
        self.side = side  # the writer's side work: an operation's run is its task
        self._post = post  # a command to the writer: the run's outcome, an engine failure
        self.current: Operation | None = None
        self.planner = residency.Residency(model, claim, lambda: self.current)

    # ---- the admin's commands ----------------------------------------------------------
    def reconfigure(self, future, body: dict) -> None:
        operation = self.planner.reconfigure_operation(body, REASON_ADMIN)
        if operation is None:
            future.set_result({"duration_ms": 0.0, "changed": {}, "reason": REASON_ADMIN})
            return
        operation.callers.append(future)
        self._begin(operation)

    def sleep(self, future) -> None:
        model = self.model
        if not model.entry.spec.can_sleep(model.entry.definition):
            raise NotSleepable(f"model {model.name} (backend {model.entry.definition.backend}) cannot sleep")
        if self.current is not None and self.current.kind == "sleep":
            self.current.callers.append(future)
            return
        self.planner.check_operable("sleep")
        if model.residency == "sleeping":
            future.set_result({"duration_ms": 0.0, "reason": REASON_ADMIN})
            return
        self._begin(Operation("sleep", REASON_ADMIN, model.phases.phase, [future]))

    def wake(self, future) -> None:
        if self.current is not None and self.current.kind == "wake":
            self.current.callers.append(future)
            return
        self.planner.check_operable("wake")
        if self.model.residency == "active":
            future.set_result({"duration_ms": 0.0, "reason": REASON_ADMIN})
            return
        operation = Operation("wake", REASON_ADMIN, P.ASLEEP, [future])
        self._begin(operation, self._claim_wake(operation))  # insufficient_memory: nothing changes

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

    def memory_ready(self, *, replan: bool) -> None:
        """``MEMORY_READY`` (``replan`` false) / ``MEMORY_REPLAN`` for a wake that waits for memory."""
        operation, model = self.current, self.model
        if operation is None or operation.kind != "wake" or not model.phases.is_(P.AWAITING_MEMORY, S.LOADED):
            return
        claim = Claim.GO
        if replan:
            model.memory.waiting.discard(model.name)
            try:
                claim = self._claim_wake(operation)
            except InsufficientMemory as exc:
                self._wake_refused(operation, exc)
                return
        model.phases.move(P.AWAITING_MEMORY, P.WAKING if claim is Claim.GO else P.AWAITING_MEMORY)
        self.when_idle()

    def _wake_refused(self, operation: Operation, error: InsufficientMemory) -> None:
        """The wake does not happen: its callers and the requests that wait for it get ``error``;
        the model stays asleep with its sleeping charge."""
        model = self.model
        self.current = None
        model.phases.move(P.AWAITING_MEMORY, P.ASLEEP)
        model.memory.waiting.discard(model.name)
        if operation.asleep_mib is not None:
            model.memory.measured(model.name, operation.asleep_mib)
        logger.info("%s", error.message)
        residency.settle(operation.callers, error)
        model.scheduler.reject_queued(error)

    def wake_for_request(self) -> None:
        """A request queued for a sleeping model wakes it (it waits in the paused queue meanwhile);
        a wake that memory refuses fails the queued requests with insufficient_memory."""
        model = self.model
        if model.residency == "sleeping" and self.current is None and model.scheduler.queue_depth:
            operation = Operation("wake", REASON_REQUEST, P.ASLEEP)
            try:
                claim = self._claim_wake(operation)
            except InsufficientMemory as exc:
                logger.info("%s", exc.message)
                model.scheduler.reject_queued(exc)
                return
            self._begin(operation, claim)

    # ---- memory pressure ---------------------------------------------------------------
    def _idle(self) -> bool:
        model = self.model
        return model.state is S.LOADED and model.memory_idle() and self.current is None

    def relieve(self) -> None:
        """Asked to make room: sleep or shrink as planned while still idle, else decline."""
        model, memory = self.model, self.model.memory
        item = memory.relieving.get(model.name) if memory is not None else None
        if item is None:
            return
        if not self._idle() or model.entry.definition.pinned:
            memory.declined(model.name)
            return
        operation = self.planner.relief_operation(item["action"], item.get("to"))
        if operation is None:
            memory.relieved(model.name, False)
            return
        self._begin(operation)

    def grow(self) -> None:
        """Memory was freed: shrunk under pressure and idle, grow back to the context it had
        (a reconfigure with reason ``memory_freed``) where that fits now; else stay as it is."""
        model, memory = self.model, self.model.memory
        if memory is None or model.name not in memory.shrunk:
            return
        if self.planner.grow_to is None:
            memory.shrunk.discard(model.name)
            return
        if not self._idle() or model.residency != "active":
            return
        operation = self.planner.grow_operation()
        if operation is not None:
            self._begin(operation)

    # ---- running it --------------------------------------------------------------------
    def _begin(self, operation: Operation, claim: Claim = Claim.GO) -> None:
        model = self.model
        self.current = operation
        model.scheduler.pause()
        if operation.kind == "wake":
            model.phases.move(P.ASLEEP, P.WAKING if claim is Claim.GO else P.AWAITING_MEMORY)
        else:
            model.phases.move(operation.resting, P.OPERATING)
        self.when_idle()

    def when_idle(self) -> None:
        """Once the active requests are done, the operation runs on the engines (a side task)."""
        operation, model = self.current, self.model
        if operation is None or operation.task is not None:
            return
        if model.state is not S.LOADED:  # an unload (or a failure) came first
            self.current = None
            residency.settle(operation.callers, ModelUnloading(f"model {model.name} is {model.state.value}"))
            return
        if model.phases.phase is P.AWAITING_MEMORY:
            gone = operation.reason == REASON_REQUEST and not model.scheduler.queue_depth
            if gone and model.name in model.memory.waiting:
                self.current = None  # its requests are gone while it waited for busy models: no wake
                model.phases.move(P.AWAITING_MEMORY, P.ASLEEP)
                model.memory.waiting.discard(model.name)
            return
        if model.scheduler.inflight:
            return
        operation.task = asyncio.get_running_loop().create_task(self._run(operation, model.serving_engines))
        self.side.adopt(operation.task)  # an unload meanwhile waits for it

    async def _run(self, operation: Operation, engines: list) -> None:
        try:
            measured = await residency.run(operation, engines, self.model.placement)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._post(cmd.OperationFinished(operation, exc, None))
            return
        self._post(cmd.OperationFinished(operation, None, measured))

    def finished(self, future, operation: Operation, error: Exception | None, measured) -> None:
        future.set_result(None)
        model = self.model
        self.side.ended(operation.task)
        self.current = None
        loaded = model.state is S.LOADED
        if error is None and loaded:
            details = self._succeeded(operation, measured)
            model.phases.move(RUNNING, operation.ends_in)
            logger.info("model %s %s in %.1f ms %s", model.name, EVENT_KINDS[operation.kind], details["duration_ms"],
                        details.get("changed", ""))
            model.machine.emit(ModelEvent(model.name, EVENT_KINDS[operation.kind], time.time(), details))
            residency.settle(operation.callers, details)
        elif error is None:
            residency.settle(operation.callers, ModelUnloading(f"model {model.name} is {model.state.value}"))
        else:
            failure = error if isinstance(error, LLMPoolError) else BackendError(str(error) or type(error).__name__)
            residency.settle(operation.callers, failure)
            if loaded:
                model.phases.move(RUNNING, operation.resting)
                if not isinstance(error, ROLLBACK_ERRORS):  # no configuration left to serve with
                    self._post(cmd.EngineFailed(f"{operation.kind} failed: {failure.message}"))
        if operation.reason == REASON_MEMORY_PRESSURE and model.memory is not None:
            model.memory.relieved(model.name, error is None and loaded)  # its loader plans again
        if model.state is S.LOADED:
            if model.residency == "active":
                model.scheduler.resume()
            else:
                self.wake_for_request()  # requests that came while it fell asleep

    def _succeeded(self, operation: Operation, measured: int | None) -> dict:
        """Apply a successful operation to the model (its overrides, its charge); its event's details."""
        model, planner = self.model, self.planner
        details = {"duration_ms": round((time.monotonic() - operation.began) * 1000, 1), "reason": operation.reason}
        if operation.for_model is not None:
            details["for_model"] = operation.for_model
        if operation.kind == "reconfigure":
            planner.track_shrink(operation)
            model.load_override = operation.overrides
            details["changed"] = operation.changed
            details["mode"] = planner.reconfigure_mode(operation)
            if operation.memory_key is not None:
                self.claim.key = operation.memory_key
            self.claim.loaded(measured, len(model.serving_engines))  # the new configuration's figure is learned
        elif model.memory is not None and model.placement:
            planner.charge_after(operation.kind, measured)
        return details
