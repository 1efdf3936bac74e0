"""One model's lifecycle, owned by exactly one asyncio task.

``ModelController`` is the single writer of a model's state: callers put
commands in its inbox and await the answer; the task handles one command at a
time with synchronous handlers, so nothing can interleave between the read of
a state and the transition that follows it.  Long work (loading replicas,
releasing them) runs in a side task that reports back through the inbox.

A model may switch by itself (docs/settings.md): with ``load_on_request`` a request
that finds it unloaded starts its load and waits (``runtime.model.on_demand``); its TTL
unloads it once idle; a swap group (``runtime.pool.groups``) hands out the slots its
members load into and asks this writer to give one back (those handlers are in
``runtime.model.switching``).  Every transition carries the reason of the operation it
belongs to (``runtime.model.state``'s REASON_*).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from runtime.backends.base import Engine
from runtime.model import commands as cmd
from runtime.pool.catalog import CatalogEntry
from runtime.config import FairnessSettings
from runtime.errors import (
    BackendError,
    InsufficientMemory,
    InvalidLoadRequest,
    LLMPoolError,
    ModelFailed,
    ModelLoading,
    ModelNotLoaded,
    ModelStateConflict,
    ModelUnloading,
    UnknownModel,
)
from runtime.pool.groups import SwapGroup
from runtime.model.memory_claim import MemoryWriter, measure_engines, process_rss_mib
from runtime.model.on_demand import IdleClock, Waiters, Waiting
from runtime.model.replicas import load_replicas, release_replicas
from runtime.model.residency import ModelEvent, ResidencyWriter
from runtime.model.scheduler import Scheduler, Ticket
from runtime.model.switching import SwitchingWriter
from runtime.model.state import (
    ACTIVE_STATES,
    REASON_ADMIN,
    REASON_ENGINE_FAILURE,
    REASON_STARTUP,
    RuntimeState,
    StateMachine,
    TransitionEvent,
)
from runtime.pool.vram import VramFigure

logger = logging.getLogger("llmpool.runtime")

S = RuntimeState
# How a request for a failed model learns where the reason is: last_error, on the admin side only.
OPERATOR_SEES_WHY = "an operator can see why in its last_error (GET /v1/admin/models)"

# The commands a caller's task handles itself when the writer is idle (``_writer_idle``): a
# request's admission, on the path of every request.


@dataclass(eq=False)
class Lease:
    """A dispatched request's hold on one replica, valid until the request finishes.

    The writer hands it out when the scheduler starts the request and keeps it
    valid: the engine stays referenced even after the model's engines are
    released, and ``failure`` is set when that engine dies, so the caller never
    reads the controller's live ``engines`` list (which the writer may empty).
    """

    replica: int
    engine: Engine
    failure: LLMPoolError | None = None

    def check(self) -> None:
        """Raise the engine's failure, if it failed while this request held it."""
        if self.failure is not None:
            raise self.failure


@dataclass(frozen=True)
class ReloadVote:
    """A controller's answer to a planned settings reload, given by its writer.

    ``change`` is "removed", "updated" or "unchanged"; ``conflict`` the reason the
    reload must be refused for this model, or None.
    """

    change: str
    active: bool
    conflict: str | None


# Changing only these definition fields never conflicts with an active model.
RELOAD_SAFE_FIELDS = frozenset(
    {"enabled", "load_on_request", "load_wait_timeout_seconds", "ttl_seconds", "pinned", "keep_warm", "aliases"}
)


class ModelController(SwitchingWriter, MemoryWriter, ResidencyWriter):
    def __init__(
        self,
        entry: CatalogEntry,
        fairness: FairnessSettings,
        listeners: list[Callable[[TransitionEvent], None]] | None = None,
        group: SwapGroup | None = None,
        memory=None,
    ):
        self.entry = entry
        self.group = group
        self.memory = memory  # the pool's runtime.pool.memory.MemoryManager (None: no accounting)
        self.machine = StateMachine(entry.name, listeners)
        self.last_error: str | None = None
        self.load_override: dict[str, Any] = {}
        self.replicas = entry.definition.replicas
        self.engines: list[Engine] = []  # one per replica, by replica index, while loaded
        self.failed_replicas: dict[int, str] = {}  # replica index -> why it failed while the others serve
        self.scheduler = Scheduler(fairness, effects=self)
        self._dispatch: dict[Ticket, asyncio.Future] = {}
        self._leases: dict[Ticket, Lease] = {}
        self._inbox: asyncio.Queue = asyncio.Queue()
        self._load_waiters: list[asyncio.Future] = []
        self._unload_waiters: list[asyncio.Future] = []
        # While a settings reload holds this model, loads wait here (a load would make it active
        # after its writer voted on the reload); the reload's commit or release replays them.
        self._reload_held = False
        self._held_loads: list[tuple[cmd.Load, asyncio.Future]] = []
        self._work: asyncio.Task | None = None
        self._task: asyncio.Task | None = None
        self._stopped = False
        self._handling = False  # the writer is inside a command's handler (``_handle``)
        self.vram = VramFigure()
        self.waiters = Waiters()  # requests waiting for a load (load_on_request)
        self.clock = IdleClock()
        self.reason: str | None = None  # of the lifecycle operation under way, or of the last one
        self.load_progress: dict | None = None  # {stage, fraction} of the load under way (runtime.model.load_progress)
        self._awaiting_slot = False  # loading, but the swap group has no slot for it yet
        self._yielding = False  # its group turn is over: new requests wait for its next turn
        self._swapped_out = False  # the last unload was a group swap (keep_warm brings it back)
        self._idle: bool | None = None  # as last told to the clock (None: tell it again)
        self._drained: bool | None = None  # as last reported to the group

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def state(self) -> RuntimeState:
        return self.machine.state

    # ---- commands (any task) ---------------------------------------------------------
    def launch(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"model:{self.name}")

    async def load(self, overrides: dict[str, Any], replicas: int | None) -> None:
        """Start a load (or join/ignore per the state rules); returns once it has settled.

        In a swap group the load first waits for a slot (the model is ``loading`` meanwhile)."""
        await self._post(cmd.Load(overrides, replicas, REASON_ADMIN))

    async def plan(self, overrides: dict[str, Any], replicas: int | None) -> dict:
        """The dry run of ``load``: the memory plan it would follow (runtime.pool.memory), changing nothing."""
        return await self._post(cmd.Plan(overrides, replicas))

    def begin_load(self) -> asyncio.Future:
        """Start a load with the configured definition without waiting (start-up loading); a load
        that does not fit keeps the model unloaded with ``insufficient_memory`` as its last_error."""
        started = self._post(cmd.Load({}, None, REASON_STARTUP))
        started.add_done_callback(self._startup_outcome)
        return started

    def _startup_outcome(self, started: asyncio.Future) -> None:
        error = None if started.cancelled() else started.exception()
        if isinstance(error, InsufficientMemory):
            self.last_error = error.message
            logger.warning("model %s is not loaded at start-up: %s", self.name, error.message)

    async def unload(self) -> RuntimeState:
        """Unload (or join the unload under way); returns the state the unload produced, as the
        writer saw it then (a load that starts right after cannot show in the answer)."""
        return await self._post(cmd.Unload())

    async def admit(self, ticket: Ticket, on_wait: Callable[[], Awaitable[None]] | None = None) -> asyncio.Future:
        """Queue a request; returns a future resolving to the ``Lease`` of the replica it runs on.

        A ``load_on_request`` model that cannot serve yet (unloaded, loading, unloading after its
        TTL or a swap, its group turn over) makes the request wait: ``on_wait`` is awaited (a
        stream tells its client), then the wait lasts until the request is queued, at most
        ``load_wait_timeout_seconds`` (then ModelLoading, 503), or until the error that ends it
        (ModelFailed, 409, which points to last_error without quoting it).  Any other refusal
        raises at once.
        """
        admitted = self._post(cmd.Admit(ticket))
        try:
            answer = await asyncio.shield(admitted)
        except asyncio.CancelledError:
            # The caller went away; a request the writer admits anyway must not keep its slot.
            admitted.add_done_callback(lambda f: f.cancelled() or f.exception() or self.finish(ticket))
            raise
        if not isinstance(answer, Waiting):
            return answer
        limit = self.entry.definition.load_wait_timeout_seconds
        try:
            if on_wait is not None:
                await on_wait()
            async with asyncio.timeout(limit):
                return await asyncio.shield(answer.queued)
        except TimeoutError:
            self.finish(ticket)
            raise ModelLoading(
                f"model {self.name} did not finish loading within load_wait_timeout_seconds={limit:g}; retry shortly"
            ) from None
        except BaseException:
            self.finish(ticket)  # gone while waiting, or the wait failed: it holds nothing
            raise

    def finish(self, ticket: Ticket, tokens: int | None = None) -> None:
        """A request ended (done, failed or withdrawn while queued); ``tokens`` it really used.

        Posted on the loop's next turn, not now: the request's answer, sent right after this, then
        reaches its client before the writer does the finish's bookkeeping (the slot given back, the
        next request dispatched), instead of after it."""
        if not self._stopped:
            asyncio.get_running_loop().call_soon(self._post_finish, ticket, tokens)

    def _post_finish(self, ticket: Ticket, tokens: int | None) -> None:
        if not self._stopped:
            self._post(cmd.Finish(ticket, tokens))

    def engine_failed(self, message: str, replica: int | None = None) -> None:
        """A loaded engine died (a managed server exited, a device was lost): replica ``replica``'s,
        or (None) the model's as a whole."""
        if not self._stopped:
            self._post(cmd.EngineFailed(message, replica))

    def timed_out(self, lease: Lease, limit: float) -> None:
        """A request ran past the model's request_timeout_seconds (``limit``) on ``lease`` and was
        cancelled.  Called before the request's ``finish``, so a replica found stuck gets no
        other request meanwhile."""
        if not self._stopped:
            self._post(cmd.TimedOut(lease, limit))

    @property
    def serving_engines(self) -> list[Engine]:
        """The engines of the replicas that serve: every loaded one but those that failed."""
        return [engine for index, engine in enumerate(self.engines) if index not in self.failed_replicas]

    async def stop(self) -> None:
        """Stop the controller (model removed or service shutting down); release its engines."""
        self._stopped = True
        self.clock.disarm()
        if self.group is not None:
            self.group.forget(self.name)
        if self._task is not None:
            self._task.cancel()
        if self._work is not None:
            self._work.cancel()
            await asyncio.gather(self._work, return_exceptions=True)
        await release_replicas(self.engines)
        self.engines = []
        self.failed_replicas = {}
        self._memory_release()
        gone = UnknownModel(f"model {self.name} is no longer served")
        pending: list[asyncio.Future] = []
        while not self._inbox.empty():
            pending.append(self._inbox.get_nowait()[1])
        held = [waiter for _, waiter in self._held_loads]
        waiting = self.waiters.futures()
        for future in [*pending, *held, *waiting, *self._load_waiters, *self._unload_waiters, *self._dispatch.values()]:
            if not future.done():
                future.set_exception(gone)
                future.exception()  # callers that await still get it; nobody else is told it was lost

    def hold_for_reload(self, entry: CatalogEntry | None) -> asyncio.Future:
        """Vote on a reload that would give this model ``entry`` (None: remove it) and hold it:
        loads wait until ``commit_reload`` or ``release_reload``.  Resolves to a ``ReloadVote``."""
        return self._post(cmd.HoldForReload(entry))

    def commit_reload(
        self, entry: CatalogEntry, fairness: FairnessSettings, group: SwapGroup | None = None
    ) -> asyncio.Future:
        """Take the reloaded entry, fairness settings and swap group, then release the hold."""
        return self._post(cmd.CommitReload(entry, fairness, group))

    def release_reload(self) -> asyncio.Future:
        """The reload was refused: release the hold, changing nothing."""
        return self._post(cmd.ReleaseReload())

    # ---- the writer --------------------------------------------------------------------
    def _post(self, command: cmd.Command) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        if self._stopped:
            future.set_exception(UnknownModel(f"model {self.name} is no longer served"))
        elif isinstance(command, cmd.Admit) and self._writer_idle():
            self._handle(command, future)
        else:
            self._inbox.put_nowait((command, future))
        return future

    def _writer_idle(self) -> bool:
        """Whether the writer waits for a command with none queued, and is not handling one now.

        The writer handles a command synchronously between two waits on its inbox, so while
        another task runs, an empty inbox means the writer's next step would be this command: the
        caller may take that step itself (an ``Admit``), in the same order and with the
        same handler, one wake-up of the writer task and one of the caller fewer."""
        return (not self._handling and self._inbox.empty()
                and self._task is not None and not self._task.done())

    async def _run(self) -> None:
        while True:
            command, future = await self._inbox.get()
            self._handle(command, future)

    def _handle(self, command: cmd.Command, future: asyncio.Future) -> None:
        """One command: its handler answers ``future``; then the state settles."""
        self._handling = True
        try:
            try:
                self._apply(command, future)
            except LLMPoolError as exc:
                if not future.done():
                    future.set_exception(exc)
            except Exception as exc:  # a bug must not kill the writer
                logger.exception("model %s: command %s failed", self.name, type(command).__name__)
                if not future.done():
                    future.set_exception(exc)
            try:
                self._settle()
            except Exception:
                logger.exception("model %s: settling after %s failed", self.name, type(command).__name__)
        finally:
            self._handling = False

    def _apply(self, command: cmd.Command, future: asyncio.Future) -> None:
        """The handler of ``command``, with its fields."""
        match command:
            case cmd.Admit(ticket):
                self._on_admit(future, ticket)
            case cmd.Finish(ticket, tokens):
                self._on_finish(future, ticket, tokens)
            case cmd.Load(overrides, replicas, reason):
                self._on_load(future, overrides, replicas, reason)
            case cmd.Plan(overrides, replicas):
                self._on_plan(future, overrides, replicas)
            case cmd.LoadProgress(stage, fraction):
                self._on_load_progress(future, stage, fraction)
            case cmd.LoadFinished(engines, error, observed_mib, measured):
                self._on_load_finished(future, engines, error, observed_mib, measured)
            case cmd.Unload():
                self._on_unload(future)
            case cmd.UnloadFinished(errors):
                self._on_unload_finished(future, errors)
            case cmd.TimedOut(lease, limit):
                self._on_timed_out(future, lease, limit)
            case cmd.EngineFailed(message, replica):
                self._on_engine_failed(future, message, replica)
            case cmd.FailedReleased():
                self._on_failed_released(future)
            case cmd.HoldForReload(entry):
                self._on_hold_for_reload(future, entry)
            case cmd.CommitReload(entry, fairness, group):
                self._on_commit_reload(future, entry, fairness, group)
            case cmd.ReleaseReload():
                self._on_release_reload(future)
            case cmd.Reconfigure(body):
                self._on_reconfigure(future, body)
            case cmd.Sleep():
                self._on_sleep(future)
            case cmd.Wake():
                self._on_wake(future)
            case cmd.OperationFinished(operation, error, measured):
                self._on_operation_finished(future, operation, error, measured)
            case cmd.MemoryEvict():
                self._on_memory_evict(future)
            case cmd.MemoryReady():
                self._on_memory_ready(future)
            case cmd.MemoryReplan():
                self._on_memory_replan(future)
            case cmd.MemoryRelieve():
                self._on_memory_relieve(future)
            case cmd.MemoryGrow():
                self._on_memory_grow(future)
            case cmd.TtlExpired(idle_since):
                self._on_ttl_expired(future, idle_since)
            case cmd.SlotGranted():
                self._on_slot_granted(future)
            case cmd.SwapOut():
                self._on_swap_out(future)
            case cmd.EndTurn():
                self._on_end_turn(future)
            case cmd.ResumeTurn():
                self._on_resume_turn(future)
            case cmd.WarmUp():
                self._on_warm_up(future)
            case _:
                raise TypeError(f"not a command: {command!r}")

    def checked_load_body(self, overrides: dict, replicas: int | None) -> tuple[int, dict]:
        """A load's replica count and accepted overrides (400 invalid_load_request otherwise)."""
        definition = self.entry.definition
        count = definition.replicas if replicas is None else replicas
        if count > definition.replica_max:
            raise InvalidLoadRequest(
                f"replicas={count} exceeds replica_max={definition.replica_max} of model {self.name}",
                param="replicas",
            )
        return count, self.entry.spec.validate_overrides(definition, overrides)

    def _on_load(self, future: asyncio.Future, overrides: dict, replicas: int | None, reason: str) -> None:
        if self._reload_held:
            self._held_loads.append((cmd.Load(overrides, replicas, reason), future))
            return
        state = self.state
        if state in (S.LOADED, S.LOADING):
            if (overrides and overrides != self.load_override) or (replicas is not None and replicas != self.replicas):
                raise InvalidLoadRequest(
                    f"model {self.name} is {state.value}; replicas and load overrides may only be changed "
                    "while it is unloaded or failed (unload it first)"
                )
            future.set_result(None)
            return
        if state is S.UNLOADING:
            raise ModelStateConflict(f"model {self.name} is unloading; load it again once it is unloaded")
        count, accepted = self.checked_load_body(overrides, replicas)
        plan = self.checked_plan(accepted, count, reason)  # insufficient_memory: nothing changes
        if reason == REASON_ADMIN:
            self._swapped_out = False  # the operator decides again what it is loaded for
        self._load_waiters.append(future)
        self._begin_load(state, reason, accepted, count, plan)

    def _begin_load(
        self, state: RuntimeState, reason: str, overrides: dict | None = None, count: int | None = None, plan=False
    ) -> None:
        """state -> loading; the engines load at once, or once the memory they need is free and
        the swap group grants a slot.  ``plan``: the memory plan made already (False: make it;
        refused, it raises InsufficientMemory before anything changes)."""
        if plan is False:
            plan = self.checked_plan(overrides or {}, self.entry.definition.replicas if count is None else count, reason)
        # Fields first, transition last: listeners read a consistent entry.
        self.last_error = None
        self.load_override = overrides or {}
        self.replicas = self.entry.definition.replicas if count is None else count
        self.reason = reason
        self.load_progress = None
        self._yielding = False
        self.machine.transition(state, S.LOADING, reason)
        if self._memory_go(plan):
            self._after_memory()

    def _after_memory(self) -> None:
        if self.group is None or self.group.want(self.name):
            self._start_engines()
        else:
            self._awaiting_slot = True

    def _start_engines(self) -> None:
        self._work = asyncio.get_running_loop().create_task(
            # The engines see where the load was placed (config["placement"]: CUDA_VISIBLE_DEVICES, main_gpu).
            self._load_engines(self.entry, {**self.load_override, "placement": self.placement}, self.replicas)
        )

    async def _load_engines(self, entry: CatalogEntry, overrides: dict, count: int) -> None:
        try:
            rss_before = await asyncio.to_thread(process_rss_mib)
            engines, observed_mib = await load_replicas(
                entry, overrides, count, self.engine_failed, on_load_progress=self._report_load_progress
            )
            rss_after = await asyncio.to_thread(process_rss_mib)
            rss_delta = None if None in (rss_before, rss_after) else max(0, rss_after - rss_before)
            measured = await measure_engines(engines, self.placement, observed_mib, rss_delta)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._post(cmd.LoadFinished(None, str(exc) or type(exc).__name__))
            return
        self._post(cmd.LoadFinished(engines, None, observed_mib, measured))

    def _report_load_progress(self, stage: str, fraction: float | None) -> None:
        self._post(cmd.LoadProgress(stage, fraction))

    def _on_load_progress(self, future, stage: str, fraction: float | None) -> None:
        if self.state is S.LOADING and self._work is not None:  # not a late report of a load that ended
            self.load_progress = {"stage": stage, "fraction": None if fraction is None else round(fraction, 4)}
        future.set_result(None)

    def _on_load_finished(
        self, future, engines: list[Engine] | None, error: str | None, observed_mib: int | None = None,
        measured_mib: int | None = None,
    ) -> None:
        self._work = None
        if engines is not None:
            self.engines = engines
            self.failed_replicas = {}
            self.vram.observe(observed_mib, len(engines))
            self._memory_loaded(measured_mib)
            self.scheduler.open(len(engines), self.effective_target_inflight)
            self.machine.transition(S.LOADING, S.LOADED, self.reason)
            self.waiters.release(self._queue)  # they waited for this turn, even if the group ended it
        else:
            self.last_error = error
            self._memory_failed(error)
            self.load_override = {}
            self.replicas = self.entry.definition.replicas
            self.machine.transition(S.LOADING, S.FAILED, self.reason)
            self._release_slot()
            self.waiters.fail(_not_serving(self.name, S.FAILED))
        _resolve(self._load_waiters)
        future.set_result(None)

    def _on_unload(self, future: asyncio.Future) -> None:
        """The admin unload: requests are refused from then on (waiting ones too), as the contract says."""
        state = self.state
        if state is S.LOADING:
            raise ModelStateConflict(f"model {self.name} is loading; unload it once the load has finished")
        self._swapped_out = False
        self.waiters.fail(ModelUnloading(f"model {self.name} is unloading"))
        if state is S.LOADED:
            self._unload_waiters.append(future)
            self._start_unload(REASON_ADMIN)
            return
        if state is S.UNLOADING:
            self.reason = REASON_ADMIN  # an automatic unload under way becomes the operator's
        future.set_result(state)

    def _start_unload(self, reason: str) -> None:
        """loaded -> unloading: queued requests are refused, active ones finish first."""
        self.reason = reason
        self.machine.transition(S.LOADED, S.UNLOADING, reason)
        self.scheduler.close(ModelUnloading(f"model {self.name} is unloading"))
        self._operate_when_idle()  # a wake waiting for memory (runtime.model.residency) does not happen
        self._release_when_idle()

    def _release_when_idle(self) -> None:
        if self.state is S.UNLOADING and self.scheduler.inflight == 0 and self._work is None:
            self._work = asyncio.get_running_loop().create_task(self._release_engines(self.engines))

    async def _release_engines(self, engines: list[Engine]) -> None:
        errors = await release_replicas(engines)
        self._post(cmd.UnloadFinished(errors))

    def _on_unload_finished(self, future, errors: list[str]) -> None:
        self._work = None
        self.engines = []
        self.failed_replicas = {}
        self.scheduler.reset()
        self.load_override = {}
        self.replicas = self.entry.definition.replicas
        self._yielding = False
        self._memory_release()
        if errors:
            self.last_error = "unload failed: " + "; ".join(errors)
            self.machine.transition(S.UNLOADING, S.FAILED, self.reason)
        else:
            self.machine.transition(S.UNLOADING, S.UNLOADED, self.reason)
        _resolve(self._unload_waiters, self.state)
        self._release_slot()
        if self.state is S.FAILED:
            self.waiters.fail(_not_serving(self.name, S.FAILED))
        self._load_for_waiters()  # requests that came during an automatic unload load it again
        future.set_result(None)

    def _on_timed_out(self, future, lease: Lease, limit: float) -> None:
        """A request's timeout ran out: an engine that did not stop within the grace of its cancel
        (``stalled``, an engine process only) is taken out of dispatch and killed; its death then
        fails the replica as a crash would (``engine_failed``)."""
        future.set_result(None)
        engine = lease.engine
        if self.state not in (S.LOADED, S.UNLOADING) or not getattr(engine, "stalled", False):
            return
        if lease.replica >= len(self.engines) or self.engines[lease.replica] is not engine:
            return  # an engine of an earlier load
        self.scheduler.retire(lease.replica)
        engine.kill(f"a request ran past request_timeout_seconds={limit:g}")

    def _on_engine_failed(self, future, message: str, replica: int | None = None) -> None:
        """A replica's engine died: while other replicas serve, that replica alone fails
        (``_fail_replica``); otherwise loaded -> failed: queued requests get backend_error,
        active ones fail on their own.

        While unloading the release already under way finishes the job, so nothing changes.
        """
        if self.state is not S.LOADED or replica in self.failed_replicas:
            future.set_result(None)
            return
        others = [index for index in range(len(self.engines)) if index not in self.failed_replicas]
        if replica is not None and others != [replica]:
            self._fail_replica(replica, message)
            future.set_result(None)
            return
        self.last_error = message
        failure = BackendError(f"model {self.name} failed while loaded; {OPERATOR_SEES_WHY}")
        self.scheduler.close(failure)
        for lease in self._leases.values():
            lease.failure = failure
        self.scheduler.reset()
        engines, self.engines = self.engines, []
        self.failed_replicas = {}
        self.load_override = {}
        self.replicas = self.entry.definition.replicas
        self._yielding = False
        self.reason = REASON_ENGINE_FAILURE
        self.machine.transition(S.LOADED, S.FAILED, REASON_ENGINE_FAILURE)
        self.waiters.fail(_not_serving(self.name, S.FAILED))
        self._operate_when_idle()  # a wake waiting for memory (runtime.model.residency) does not happen
        self._work = asyncio.get_running_loop().create_task(self._release_failed(engines))
        future.set_result(None)

    def _fail_replica(self, replica: int, message: str) -> None:
        """One replica failed while the others serve on: nothing more is dispatched to it, its
        requests fail with backend_error, its share of the memory charge goes; the model stays
        loaded (``loaded_replicas`` one less) until it is unloaded, which releases that engine too."""
        serving = len(self.serving_engines)
        self.failed_replicas[replica] = message
        self.last_error = message
        failure = BackendError(f"model {self.name} replica {replica + 1} failed: {message}")
        for lease in self._leases.values():
            if lease.replica == replica:
                lease.failure = failure
        self.scheduler.retire(replica)
        self._memory_replica_failed(serving)
        logger.warning("model %s: replica %d failed, %d serve on: %s", self.name, replica + 1, serving - 1, message)
        event = ModelEvent(self.name, "replica_failed", time.time(),
                           {"replica": replica + 1, "reason": REASON_ENGINE_FAILURE, "error": message})
        for listener in self.machine.listeners:
            listener(event)

    async def _release_failed(self, engines: list[Engine]) -> None:
        await release_replicas(engines)
        self._post(cmd.FailedReleased())

    def _on_failed_released(self, future) -> None:
        if self._work is not None and self._work.done():  # a new load may already be running
            self._work = None
        if self.state is S.FAILED:  # its engines are gone now: so is its claim on the group's slot
            self._release_slot()
            self._memory_release()
        future.set_result(None)

    def _on_hold_for_reload(self, future, entry: CatalogEntry | None) -> None:
        state = self.state
        active = state in ACTIVE_STATES
        conflict = None
        if entry is None:
            change = "removed"
            if active:
                conflict = f"{self.name} would be removed while {state.value}"
        elif self.entry.same_definition(entry):
            change = "unchanged"
        else:
            change = "updated"
            if active and not self.entry.same_definition(entry, ignore=RELOAD_SAFE_FIELDS):
                conflict = f"{self.name} would change while {state.value}; unload it first"
        self._reload_held = True
        future.set_result(ReloadVote(change, active, conflict))

    def _on_commit_reload(self, future, entry: CatalogEntry, fairness: FairnessSettings, group) -> None:
        if not self.entry.same_definition(entry, ignore=RELOAD_SAFE_FIELDS):
            self.vram.forget()  # measured for a definition that no longer exists
        self.entry = entry
        self.group = group
        self._idle = self._drained = None  # tell the clock (a new ttl_seconds) and the group again
        if self.state not in ACTIVE_STATES:
            self.replicas = entry.definition.replicas
        self.scheduler.fairness = fairness
        self._on_release_reload(future)

    def _on_release_reload(self, future) -> None:
        self._reload_held = False
        for load, waiter in self._held_loads:
            self._inbox.put_nowait((load, waiter))
        self._held_loads.clear()
        self._load_for_waiters()
        future.set_result(None)

    def _on_admit(self, future: asyncio.Future, ticket: Ticket) -> None:
        """Queue the request, make it wait for a load, or refuse it; a refused one changes nothing."""
        state = self.state
        if state is S.LOADED and not self._yielding:
            future.set_result(self._queue(ticket))
        elif self._may_wait(state):
            future.set_result(self.waiters.add(ticket))
            self._load_for_waiters()
        else:
            raise _not_serving(self.name, S.UNLOADING if state is S.LOADED else state)
        self.clock.touch()
        self._wake_for_request()  # a sleeping model wakes for it (runtime.model.residency)

    def _queue(self, ticket: Ticket) -> asyncio.Future:
        """Put a request in the scheduler (its 429s raise); the future it will be dispatched by."""
        dispatched = asyncio.get_running_loop().create_future()
        self._dispatch[ticket] = dispatched
        try:
            self.scheduler.on_request(ticket)
        except LLMPoolError:
            del self._dispatch[ticket]
            raise
        return dispatched

    def _on_finish(self, future, ticket: Ticket, tokens: int | None) -> None:
        if self.waiters.remove(ticket):
            self._withdraw_unwanted_load()
            self._withdraw_memory_wait()
        elif not self.scheduler.on_cancel(ticket):
            self.scheduler.on_done(ticket, tokens)
        self._dispatch.pop(ticket, None)
        self._leases.pop(ticket, None)
        self._release_when_idle()
        self._operate_when_idle()  # a reconfigure or sleep waiting for the active requests (runtime.model.residency)
        future.set_result(None)

    # ---- scheduler effects (called from inside the writer) ----------------------------
    def start(self, ticket: Ticket, replica: int) -> None:
        dispatched = self._dispatch.get(ticket)
        if dispatched is not None and not dispatched.done():
            lease = Lease(replica, self.engines[replica])
            self._leases[ticket] = lease
            dispatched.set_result(lease)

    def reject(self, ticket: Ticket, error: LLMPoolError) -> None:
        dispatched = self._dispatch.pop(ticket, None)
        if dispatched is not None and not dispatched.done():
            dispatched.set_exception(error)

    # ---- views -----------------------------------------------------------------------
    def vram_estimate(self) -> tuple[int | None, int, str]:
        """(MiB, replica count it is for, source); see ``runtime.pool.vram.VramFigure``."""
        return self.vram.value(self.entry, self.load_override, self.replicas)

    @property
    def configured_target_inflight(self) -> int:
        override = self.load_override.get("target_inflight")
        return override if override is not None else self.entry.definition.target_inflight

    @property
    def effective_target_inflight(self) -> int:
        return self.entry.spec.effective_target_inflight(self.configured_target_inflight)


def _resolve(waiters: list[asyncio.Future], result: Any = None) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(result)
    waiters.clear()


def _not_serving(name: str, state: RuntimeState) -> LLMPoolError:
    """What a request for a model in ``state`` is refused with.  A failed model's last_error is
    the operator's (paths, the engine's output, stacks): requests are only told where it is."""
    if state is S.LOADING:
        return ModelLoading(f"model {name} is loading; retry shortly")
    if state is S.UNLOADING:
        return ModelUnloading(f"model {name} is unloading")
    if state is S.FAILED:
        return ModelFailed(f"model {name} failed; {OPERATOR_SEES_WHY}")
    return ModelNotLoaded(f"model {name} is not loaded; load it through the admin API first")
