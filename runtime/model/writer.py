"""The single writer of one model: every command, one at a time, in one ``match``.

``ModelWriter`` runs inside its controller's task (``runtime.model.controller``) and is the only
code that changes the model's record (state, sub-phase and marks, last_error, load_override,
replicas, engines, scheduler, measured VRAM).  Handlers are synchronous, so nothing interleaves
between the read of a state and the transition that follows it; slow work runs in a side task
(``runtime.model.side_work``) that reports back as another command.  Its collaborators
(docs/architecture.md lists them) decide inside its step and return what they decided (a
``Claim``, a ``TurnStep``, an ``OpStep``, a request's ``Entry`` ...); the writer applies it.
Fields are set before the transition, so listeners see them; every transition carries the
reason of its operation (``runtime.model.state``'s REASON_*).
"""
from __future__ import annotations

import asyncio
import logging
import time

from runtime.errors import BackendError, InsufficientMemory, ModelStateConflict, ModelUnloading
from runtime.model import commands as cmd, reload_hold, switching
from runtime.model.leases import Entry, entry_for, stalled
from runtime.model.memory_claim import Claim, MemoryClaim, MemoryStep
from runtime.model.on_demand import OPERATOR_SEES_WHY, not_serving, resolve
from runtime.model.operations import Operations, OpStep
from runtime.model.phases import LOADED_PHASES, Mark, Phase
from runtime.model.replicas import LoadGate, checked_load_body, load_gate, release_replicas
from runtime.model.side_work import SideWork
from runtime.model.residency import ModelEvent
from runtime.model.tickets import Ticket
from runtime.model.state import REASON_ADMIN, REASON_ENGINE_FAILURE, REASON_REQUEST, RuntimeState
from runtime.model.state import REASON_GROUP_SWAP, REASON_KEEP_WARM, REASON_MEMORY_EVICTION, REASON_TTL


logger = logging.getLogger("llmpool.runtime")

S = RuntimeState
P = Phase


class ModelWriter:
    """The writer of ``model`` (its ``ModelController``), and the owner of its collaborators."""

    def __init__(self, model):
        self.model = model
        self.claim = MemoryClaim(model)
        self.turn = switching.SwapTurn(model, self.post)
        self.reload = reload_hold.ReloadHold()
        self.side = SideWork(self.post)  # the slow work under way: a load, a release, an operation
        self.operations = Operations(model, self.claim, self.post)
        self.load_waiters: list[asyncio.Future] = []
        self.unload_waiters: list[asyncio.Future] = []

    def apply(self, command: cmd.Command, future: asyncio.Future) -> None:
        """The handler of ``command``, with its fields; it answers ``future``."""
        m = self.model
        match command:
            case cmd.Admit(ticket):
                self._admit(future, ticket)
            case cmd.Finish(ticket, tokens):
                self._finish(future, ticket, tokens)
            case cmd.Load(overrides, replicas, reason):
                self._on_load(future, overrides, replicas, reason)
            case cmd.Plan(overrides, replicas):
                future.set_result(self.claim.dry_run(m.state, *checked_load_body(m.entry, overrides, replicas)))
            case cmd.LoadProgress(stage, fraction):
                if m.phases.is_(P.STARTING, S.LOADING):  # not a late report of a load that ended
                    m.load_progress = {"stage": stage, "fraction": None if fraction is None else round(fraction, 4)}
                future.set_result(None)
            case cmd.LoadFinished(engines, error, observed_mib, measured):
                self._on_load_finished(future, engines, error, observed_mib, measured)
            case cmd.Unload():
                self._on_unload(future)
            case cmd.UnloadFinished(errors):
                self._on_unload_finished(future, errors)
            case cmd.TimedOut(lease, limit):
                future.set_result(None)
                if m.state in (S.LOADED, S.UNLOADING) and stalled(lease, m.engines):  # killed, it fails as a crash would
                    m.scheduler.retire(lease.replica)
                    lease.engine.kill(f"a request ran past request_timeout_seconds={limit:g}")
            case cmd.EngineFailed(message, replica):
                future.set_result(None)
                self._on_engine_failed(message, replica)
            case cmd.FailedReleased():
                self._on_failed_released(future)
            case cmd.HoldForReload(entry):
                m.phases.mark(Mark.RELOAD_HELD)
                future.set_result(reload_hold.vote(m.entry, entry, m.state))
            case cmd.CommitReload(entry, fairness, group):
                m.adopt_entry(entry, fairness, group)
                self.turn.tell_again()  # a new ttl_seconds, a new group
                self._end_reload_hold(future)
            case cmd.ReleaseReload():
                self._end_reload_hold(future)
            case cmd.Reconfigure(body):
                self.operate(self.operations.reconfigure(future, body))
            case cmd.Sleep():
                self.operate(self.operations.sleep(future))
            case cmd.Wake():
                self.operate(self.operations.wake(future))
            case cmd.OperationFinished(operation, error, measured):
                future.set_result(None)
                self.side.ended(operation.task)
                self.operate(self.operations.finished(operation, error, measured))
                self.release_when_idle()  # an unload that waited for the operation's run
            case cmd.KeepAlive(seconds):
                future.set_result(None)
                m.keep_alive = seconds  # the TTL from now on: an idle model's timer is armed again
                self.turn.rearm_clock()
            case cmd.TtlExpired(idle_since):
                future.set_result(None)
                if self.turn.ttl_ran_out(idle_since):
                    self.start_unload(REASON_TTL)
            case cmd.Notice() if command in cmd.GROUP_NOTICES:
                future.set_result(None)
                self.take_turn(self.turn.on_notice(command))
            case cmd.Notice():
                future.set_result(None)
                self.on_memory(self.claim.on_notice(command))
            case _:
                raise TypeError(f"not a command: {command!r}")

    def take_turn(self, step: switching.TurnStep | None) -> None:
        """What a swap group's notice decided (``runtime.model.switching``), applied."""
        m = self.model
        match step:
            case switching.TurnStep.START_ENGINES:
                self.start_engines(P.AWAITING_SLOT)
            case switching.TurnStep.RELEASE_SLOT:
                self.turn.release_slot()
            case switching.TurnStep.SWAP_OUT:
                m.phases.mark(Mark.SWAPPED_OUT)
                m.group.swapping_out(m.name)
                self.start_unload(REASON_GROUP_SWAP)
            case switching.TurnStep.DECLINE_SWAP:
                m.group.declined(m.name)
            case switching.TurnStep.END_TURN:
                m.phases.mark(Mark.YIELDING)
            case switching.TurnStep.RESUME_TURN:
                m.phases.clear(Mark.YIELDING)
                if m.state is S.LOADED:
                    m.waiters.release(self.queue)
            case switching.TurnStep.WARM_UP:
                try:
                    self.begin_load(S.UNLOADED, REASON_KEEP_WARM)
                except InsufficientMemory as exc:
                    m.last_error = exc.message  # it comes back when there is room (the next warm_up)

    def on_memory(self, step: MemoryStep | None) -> None:
        """What a memory manager's notice decided (``runtime.model.memory_claim``), applied."""
        m = self.model
        match step:
            case MemoryStep.EVICT:
                m.phases.clear(Mark.SWAPPED_OUT)
                self.start_unload(REASON_MEMORY_EVICTION)
            case MemoryStep.DECLINE:
                m.memory.declined(m.name)
            case MemoryStep.LOAD_GOES:
                self.after_memory(P.AWAITING_MEMORY)  # the models evicted for it are released
            case MemoryStep.REPLAN_LOAD:
                try:
                    claim = self.claim.replan()
                except InsufficientMemory as exc:
                    self.refuse_load(exc)
                    return
                self.claimed(P.AWAITING_MEMORY, claim)
            case MemoryStep.WAKE_GOES | MemoryStep.REPLAN_WAKE:
                self.operate(self.operations.memory_ready(replan=step is MemoryStep.REPLAN_WAKE))
            case MemoryStep.RELIEVE:
                self.operate(self.operations.relieve())
            case MemoryStep.GROW:
                self.operate(self.operations.grow())

    def operate(self, step: OpStep | None) -> None:
        """What the operation under way decided (``runtime.model.operations``), applied, and what follows."""
        m, operations = self.model, self.operations
        while step is not None:
            if step.pause:
                m.scheduler.pause()
            if step.reconfigured is not None:
                m.load_override = step.reconfigured.overrides
            if step.move is not None:
                m.phases.move(*step.move)
            if step.event is not None:
                m.machine.emit(step.event)
            if step.reject is not None:
                m.scheduler.reject_queued(step.reject)
            if step.run is not None:
                step.run.task = asyncio.get_running_loop().create_task(operations.run(step.run, m.serving_engines))
                self.side.adopt(step.run.task)  # an unload meanwhile waits for it
            if step.failed is not None:
                self.post(cmd.EngineFailed(step.failed))
            if step.resume:
                m.scheduler.resume()
            step = step.then() if step.then is not None else None

    def post(self, command: cmd.Command) -> asyncio.Future:
        return self.model._post(command)

    async def stop(self) -> list[asyncio.Future]:
        """The model is no longer served: its work, engines and memory go; the waiting callers' futures."""
        m = self.model
        await self.side.cancel()
        await release_replicas(m.engines)
        m.engines, m.failed_replicas = [], {}
        self.claim.release()
        return [*self.reload.waiters(), *self.load_waiters, *self.unload_waiters]

    # ---- requests ------------------------------------------------------------------------
    def queue(self, ticket: Ticket) -> asyncio.Future:
        """Put a request in the scheduler (its 429s raise); the future it will be dispatched by."""
        return self.model.leases.queue(ticket, self.model.scheduler)

    def _admit(self, future: asyncio.Future, ticket: Ticket) -> None:
        """Queue the request, make it wait for a load, or refuse it; a refused one changes nothing."""
        m = self.model
        match entry_for(m.name, m.state, m.phases.has(Mark.YIELDING), self.turn.may_wait(m.state)):
            case Entry.QUEUE:
                future.set_result(self.queue(ticket))
            case Entry.WAIT:
                future.set_result(m.waiters.add(ticket))
                self.load_for_waiters()
        m.clock.touch()
        self.operate(self.operations.wake_for_request())  # a sleeping model wakes for it

    def _finish(self, future: asyncio.Future, ticket: Ticket, tokens: int | None) -> None:
        m = self.model
        if m.waiters.remove(ticket):
            if self.turn.slot_wait_unwanted(self.load_waiters):  # a load for these requests only
                self.withdraw(P.AWAITING_SLOT)
            if self.claim.wait_unwanted(self.load_waiters):
                self.withdraw(P.AWAITING_MEMORY)
        elif not m.scheduler.on_cancel(ticket):
            m.scheduler.on_done(ticket, tokens)
        m.leases.forget(ticket)
        self.release_when_idle()
        self.operate(self.operations.when_idle())  # a reconfigure or sleep waiting for the active requests
        future.set_result(None)

    # ---- a settings reload (runtime.model.reload_hold) -----------------------------------
    def _end_reload_hold(self, future: asyncio.Future) -> None:
        """The reload ended: the loads it held run again (against the new entry, if any)."""
        self.model.phases.clear(Mark.RELOAD_HELD)
        for load, waiter in self.reload.take():
            self.model.requeue(load, waiter)
        self.load_for_waiters()
        future.set_result(None)

    # ---- load ----------------------------------------------------------------------
    def _on_load(self, future: asyncio.Future, overrides: dict, replicas: int | None, reason: str) -> None:
        m = self.model
        match load_gate(m, overrides, replicas):
            case LoadGate.HOLD:
                self.reload.hold_load(cmd.Load(overrides, replicas, reason), future)
            case LoadGate.DONE:
                future.set_result(None)
            case LoadGate.BEGIN:
                count, accepted = checked_load_body(m.entry, overrides, replicas)
                plan = self.claim.checked_plan(accepted, count, reason)  # insufficient_memory: nothing changes
                if reason == REASON_ADMIN:
                    m.phases.clear(Mark.SWAPPED_OUT)  # the operator decides again what it is loaded for
                self.load_waiters.append(future)
                self.begin_load(m.state, reason, accepted, count, plan)

    def begin_load(self, state: RuntimeState, reason: str, overrides: dict | None = None, count: int | None = None,
                   plan=False) -> None:
        """state -> loading; the engines load at once, or once the memory they need is free and
        the swap group grants a slot.  ``plan``: the memory plan made already (False: make it;
        refused, it raises InsufficientMemory before anything changes)."""
        m = self.model
        replicas = m.entry.definition.replicas if count is None else count
        if plan is False:
            plan = self.claim.checked_plan(overrides or {}, replicas, reason)
        # Fields first, transition last: listeners read a consistent entry.
        m.last_error = None
        m.load_override = overrides or {}
        m.replicas = replicas
        m.reason = reason
        m.load_progress = None
        m.phases.clear(Mark.YIELDING)
        m.machine.transition(state, S.LOADING, reason)
        self.claimed(P.IDLE, self.claim.act_for_load(plan))

    def claimed(self, phase: Phase, claim: Claim) -> None:
        """The load's plan acted on (from ``phase``): its engines go on, or it awaits memory."""
        if claim is Claim.GO:
            self.after_memory(phase)
        else:
            self.model.phases.move(phase, P.AWAITING_MEMORY)

    def after_memory(self, phase: Phase) -> None:
        m = self.model
        if m.group is None or m.group.want(m.name):
            self.start_engines(phase)
        else:
            m.phases.move(phase, P.AWAITING_SLOT)

    def start_engines(self, phase: Phase) -> None:
        m = self.model
        m.phases.move(phase, P.STARTING)
        # The engines see where the load was placed (config["placement"]: CUDA_VISIBLE_DEVICES, main_gpu).
        overrides = {**m.load_override, "placement": m.placement}
        self.side.load(m.entry, overrides, m.replicas, m.placement, m.engine_failed)

    def _on_load_finished(self, future, engines, error: str | None, observed_mib: int | None,
                          measured_mib: int | None) -> None:
        m = self.model
        self.side.ended()
        if engines is not None:
            m.engines, m.failed_replicas = engines, {}
            m.vram.observe(observed_mib, len(engines))
            self.claim.loaded(measured_mib, len(m.serving_engines))
            target, routing = m.effective_target_inflight, m.entry.routing
            cached = m.entry.spec.prefix_cache_sequences(target) if routing.prefix_affinity else 0
            m.scheduler.open(len(engines), target, cached, routing.load_factor)
            m.machine.transition(S.LOADING, S.LOADED, m.reason)
            m.phases.move(P.STARTING, P.SERVING)
            m.waiters.release(self.queue)  # they waited for this turn, even if the group ended it
        else:
            m.last_error = self.claim.failed(error, m.replicas) or error
            m.load_override = {}
            m.replicas = m.entry.definition.replicas
            m.machine.transition(S.LOADING, S.FAILED, m.reason)
            m.phases.move(P.STARTING, P.IDLE)
            self.turn.release_slot()
            m.waiters.fail(not_serving(m.name, S.FAILED))
        resolve(self.load_waiters)
        future.set_result(None)

    def refuse_load(self, error: InsufficientMemory) -> None:
        """A load that waited for memory is refused when planned again: loading -> unloaded, and
        its callers and waiting requests get ``error``."""
        m = self.model
        m.last_error = error.message
        m.machine.transition(S.LOADING, S.UNLOADED, m.reason)
        m.phases.move(P.AWAITING_MEMORY, P.IDLE)
        m.waiters.fail(error)
        resolve(self.load_waiters, error=error)

    def load_for_waiters(self) -> None:
        m = self.model
        if m.waiters and m.state is S.UNLOADED and not m.phases.has(Mark.RELOAD_HELD):
            try:
                self.begin_load(S.UNLOADED, REASON_REQUEST)
            except InsufficientMemory as exc:  # nothing changed: the requests get the plan
                m.waiters.fail(exc)

    def withdraw(self, phase: Phase) -> None:
        """A request-triggered load that waits (in ``phase``), every request gone: it does not happen."""
        m = self.model
        self.claim.release()
        m.machine.transition(S.LOADING, S.UNLOADED, REASON_REQUEST)
        m.phases.move(phase, P.IDLE)

    # ---- unload and failure ----------------------------------------------------------
    def _on_unload(self, future: asyncio.Future) -> None:
        """The admin unload: requests are refused from then on (waiting ones too), as the contract says."""
        m = self.model
        state = m.state
        if state is S.LOADING:
            raise ModelStateConflict(f"model {m.name} is loading; unload it once the load has finished")
        m.phases.clear(Mark.SWAPPED_OUT)
        m.waiters.fail(ModelUnloading(f"model {m.name} is unloading"))
        if state is S.LOADED:
            self.unload_waiters.append(future)
            self.start_unload(REASON_ADMIN)
            return
        if state is S.UNLOADING:
            m.reason = REASON_ADMIN  # an automatic unload under way becomes the operator's
        future.set_result(state)

    def start_unload(self, reason: str) -> None:
        """loaded -> unloading: queued requests are refused, active ones finish first."""
        m = self.model
        m.reason = reason
        m.machine.transition(S.LOADED, S.UNLOADING, reason)
        m.phases.move(LOADED_PHASES, P.IDLE)
        m.scheduler.close(ModelUnloading(f"model {m.name} is unloading"))
        self.operate(self.operations.when_idle())  # a reconfigure, sleep or wake not yet running does not happen
        self.release_when_idle()

    def release_when_idle(self) -> None:
        m = self.model
        if m.state is S.UNLOADING and m.scheduler.inflight == 0 and self.side.task is None:
            self.side.release(m.engines, cmd.UnloadFinished)

    def _on_unload_finished(self, future, errors: list[str]) -> None:
        m = self.model
        self.side.ended()
        m.engines = []
        m.forget_load()
        self.claim.release()
        if errors:
            m.last_error = "unload failed: " + "; ".join(errors)
            m.machine.transition(S.UNLOADING, S.FAILED, m.reason)
        else:
            m.machine.transition(S.UNLOADING, S.UNLOADED, m.reason)
        resolve(self.unload_waiters, m.state)
        self.turn.release_slot()
        if m.state is S.FAILED:
            m.waiters.fail(not_serving(m.name, S.FAILED))
        self.load_for_waiters()  # requests that came during an automatic unload load it again
        future.set_result(None)

    def _on_engine_failed(self, message: str, replica: int | None) -> None:
        """A replica's engine died: while other replicas serve, that replica alone fails
        (``_fail_replica``); otherwise loaded -> failed: queued requests get backend_error, active
        ones fail on their own.  While unloading, the release under way finishes the job."""
        m = self.model
        if m.state is not S.LOADED or replica in m.failed_replicas:
            return
        others = [index for index in range(len(m.engines)) if index not in m.failed_replicas]
        if replica is not None and others != [replica]:
            self._fail_replica(replica, message)
            return
        m.last_error = message
        failure = BackendError(f"model {m.name} failed while loaded; {OPERATOR_SEES_WHY}")
        m.scheduler.close(failure)
        m.leases.fail(failure)
        engines, m.engines = m.engines, []
        m.forget_load()
        m.reason = REASON_ENGINE_FAILURE
        m.machine.transition(S.LOADED, S.FAILED, REASON_ENGINE_FAILURE)
        m.phases.move(LOADED_PHASES, P.IDLE)
        m.waiters.fail(not_serving(m.name, S.FAILED))
        self.operate(self.operations.when_idle())  # a reconfigure, sleep or wake not yet running does not happen
        self.side.release(engines, lambda _errors: cmd.FailedReleased())

    def _fail_replica(self, replica: int, message: str) -> None:
        """One replica failed while the others serve on: nothing more is dispatched to it, its
        requests fail with backend_error, its share of the memory charge goes; the model stays
        loaded (``loaded_replicas`` one less) until it is unloaded, which releases that engine too."""
        m = self.model
        serving = len(m.serving_engines)
        m.failed_replicas[replica] = message
        m.last_error = message
        m.leases.fail(BackendError(f"model {m.name} replica {replica + 1} failed: {message}"), replica)
        m.scheduler.retire(replica)
        self.claim.replica_failed(serving)
        logger.warning("model %s: replica %d failed, %d serve on: %s", m.name, replica + 1, serving - 1, message)
        m.machine.emit(ModelEvent(m.name, "replica_failed", time.time(),
                                  {"replica": replica + 1, "reason": REASON_ENGINE_FAILURE, "error": message}))

    def _on_failed_released(self, future) -> None:
        m = self.model
        if self.side.task is not None and self.side.task.done():  # a new load may already be running
            self.side.ended()
        if m.state is S.FAILED:  # its engines are gone now: so is its claim on the group's slot
            self.turn.release_slot()
            self.claim.release()
        future.set_result(None)
