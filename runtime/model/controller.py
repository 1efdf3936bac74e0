"""One configured model: its record, the commands callers send it, and its writer's task.

``ModelController`` is what the pool holds for a model.  Its fields (the state, the engines,
the scheduler, last_error ...) are the model's record: callers in any task read them between
commands, and only the model's writer (``runtime.model.writer.ModelWriter``, one per
controller, handling one command at a time in one asyncio task) changes them, itself or through
the record's update methods (``forget_load``, ``adopt_entry``), which it alone calls.  Callers send
typed commands (``runtime.model.commands``) through the methods below and await the answer;
nothing but the writer acts on a command.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from runtime.backends.base import Engine
from runtime.config import FairnessSettings
from runtime.errors import InsufficientMemory, LLMPoolError, ModelLoading, UnknownModel
from runtime.model import commands as cmd, reload_hold
from runtime.model.leases import Lease, Leases
from runtime.model.on_demand import IdleClock, Waiters, Waiting
from runtime.model.phases import PAUSED_PHASES, Mark, Phase, PhaseMachine
from runtime.model.scheduler import Scheduler
from runtime.model.tickets import Ticket
from runtime.model.state import ACTIVE_STATES, REASON_ADMIN, REASON_STARTUP, RuntimeState, StateMachine, TransitionEvent
from runtime.model.writer import ModelWriter
from runtime.pool.catalog import CatalogEntry
from runtime.pool.groups import SwapGroup
from runtime.pool.vram import VramFigure

logger = logging.getLogger("llmpool.runtime")

S = RuntimeState
P = Phase


class ModelController:
    """One model's record and inbox; its ``writer`` is the only code that changes the record."""

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
        self.phases = PhaseMachine(entry.name, lambda: self.machine.state)
        self.last_error: str | None = None
        self.load_override: dict[str, Any] = {}
        self.replicas = entry.definition.replicas
        self.engines: list[Engine] = []  # one per replica, by replica index, while loaded
        self.failed_replicas: dict[int, str] = {}  # replica index -> why it failed while the others serve
        self.leases = Leases(lambda replica: self.engines[replica])
        self.scheduler = Scheduler(fairness, effects=self.leases)
        self.vram = VramFigure()
        self.waiters = Waiters()  # requests waiting for a load (load_on_request)
        self.clock = IdleClock()
        self.keep_alive: float | None = None  # a request's keep_alive (cmd.KeepAlive) until the model unloads
        self.reason: str | None = None  # of the lifecycle operation under way, or of the last one
        self.load_progress: dict | None = None  # {stage, fraction} of the load under way (runtime.model.load_progress)
        self._inbox: asyncio.Queue = asyncio.Queue()
        self._task: asyncio.Task | None = None
        self._stopped = False
        self._handling = False  # the writer is inside a command's handler (``_handle``)
        self.writer = ModelWriter(self)

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

    def set_keep_alive(self, seconds: float) -> None:
        """A request's keep_alive: the model's TTL from now on, until it unloads (cmd.KeepAlive)."""
        if not self._stopped:
            self._post(cmd.KeepAlive(seconds))

    def tell(self, notice: cmd.Notice) -> None:
        """A notice from the pool's memory manager or the model's swap group; its writer decides."""
        if not isinstance(notice, cmd.Notice):
            raise ValueError(f"not a notice: {notice!r}")
        if not self._stopped:
            self._post(notice)

    async def reconfigure(self, body: dict[str, Any]) -> dict:
        """Change reconfigurable fields while loaded; answers ``{duration_ms, changed, reason}``."""
        return await self._post(cmd.Reconfigure(body))

    async def sleep(self) -> dict:
        return await self._post(cmd.Sleep())

    async def wake(self) -> dict:
        return await self._post(cmd.Wake())

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

    async def stop(self) -> None:
        """Stop the controller (model removed or service shutting down); release its engines.
        Every caller still waiting gets ``unknown_model``."""
        self._stopped = True
        self.clock.disarm()
        if self.group is not None:
            self.group.forget(self.name)
        if self._task is not None:
            self._task.cancel()
        pending: list[asyncio.Future] = []
        while not self._inbox.empty():
            pending.append(self._inbox.get_nowait()[1])
        waiting = await self.writer.stop()
        gone = UnknownModel(f"model {self.name} is no longer served")
        for future in [*pending, *waiting, *self.waiters.futures(), *self.leases.futures()]:
            if not future.done():
                future.set_exception(gone)
                future.exception()  # callers that await still get it; nobody else is told it was lost

    # ---- views (read between commands) ---------------------------------------------------
    @property
    def serving_engines(self) -> list[Engine]:
        """The engines of the replicas that serve: every loaded one but those that failed."""
        return [engine for index, engine in enumerate(self.engines) if index not in self.failed_replicas]

    @property
    def placement(self) -> list[str] | None:
        """The devices of the current (or last) load."""
        return self.writer.claim.placement

    @property
    def residency(self) -> str:
        """``"sleeping"`` while a loaded model's engines have freed their inference state, else ``"active"``."""
        if self.state is not S.LOADED:
            return "active"
        phase, operation = self.phases.phase, self.writer.operations.current
        if phase in PAUSED_PHASES and operation is not None:
            phase = operation.resting
        return "sleeping" if phase is P.ASLEEP else "active"

    def waking(self) -> bool:
        """A wake is planned or under way (the model is wanted: no candidate to make room)."""
        operation = self.writer.operations.current
        return operation is not None and operation.kind == "wake"

    def memory_idle(self) -> bool:
        """Whether this model could be evicted now (read by the manager between commands); a
        model about to wake is wanted."""
        return self.drained and not self.waiters and not self.waking()

    @property
    def drained(self) -> bool:
        """Loaded, with no request running or queued."""
        return self.state is S.LOADED and self.scheduler.inflight == 0 and self.scheduler.queue_depth == 0

    def plan_load(self, overrides: dict, count: int, reason: str):
        """The memory plan of a load (``MemoryClaim.plan_load``), changing nothing."""
        return self.writer.claim.plan_load(overrides, count, reason)

    def wake_plan(self, reason: str):
        """The memory plan of waking now (``Residency.wake_plan``), changing nothing."""
        return self.writer.operations.planner.wake_plan(reason)

    def memory_relief(self, device: str) -> list[dict]:
        """What this idle model could give back on ``device`` while loaded (``Residency.memory_relief``)."""
        return self.writer.operations.planner.memory_relief(device)

    def memory_view(self) -> dict | None:
        """The admin entry's ``memory`` (``MemoryClaim.view``)."""
        awaiting = self.phases.is_(P.AWAITING_MEMORY, S.LOADING)
        return self.writer.claim.view(self.load_override, self.replicas, awaiting)

    @property
    def idle_expires_at(self) -> float | None:
        """When the TTL unloads the model if nothing comes (epoch seconds), or None."""
        return self.writer.turn.expires_at()

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

    # ---- record updates the writer makes in its step ------------------------------------
    def forget_load(self) -> None:
        """What the load that ended (unloaded, or failed while loaded) set goes."""
        self.failed_replicas = {}
        self.scheduler.reset()
        self.load_override = {}
        self.keep_alive = None  # a request's keep_alive lasts while the model stays loaded
        self.replicas = self.entry.definition.replicas
        self.phases.clear(Mark.YIELDING)

    def adopt_entry(self, entry: CatalogEntry, fairness: FairnessSettings, group: SwapGroup | None) -> None:
        """A settings reload's new definition, fairness and group (``runtime.model.reload_hold``)."""
        if not reload_hold.keeps_measurements(self.entry, entry):
            self.vram.forget()  # measured for a definition that no longer exists
        self.entry, self.group = entry, group
        if self.state not in ACTIVE_STATES:
            self.replicas = entry.definition.replicas
        self.scheduler.fairness = fairness

    # ---- the mailbox --------------------------------------------------------------------
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

    def requeue(self, command: cmd.Command, future: asyncio.Future) -> None:
        """Put a command the writer held back (a load during a reload) in the inbox again."""
        self._inbox.put_nowait((command, future))

    async def _run(self) -> None:
        while True:
            command, future = await self._inbox.get()
            self._handle(command, future)

    def _handle(self, command: cmd.Command, future: asyncio.Future) -> None:
        """One command: its handler answers ``future``; then the state settles."""
        self._handling = True
        try:
            try:
                self.writer.apply(command, future)
            except LLMPoolError as exc:
                if not future.done():
                    future.set_exception(exc)
            except Exception as exc:  # a bug must not kill the writer
                logger.exception("model %s: command %s failed", self.name, type(command).__name__)
                if not future.done():
                    future.set_exception(exc)
            try:
                self.writer.turn.settle()  # the idle clock (TTL) and the swap group learn what the step left
            except Exception:
                logger.exception("model %s: settling after %s failed", self.name, type(command).__name__)
        finally:
            self._handling = False
