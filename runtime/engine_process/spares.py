"""Warm spare engine processes, so that a load pays neither interpreter start nor imports.

A spare is an engine process started ahead of need: its interpreter is up,
``runtime.backends`` and its backend's engine library are imported (``warm_up``),
and it waits for the ``load`` of whichever replica takes it.  There is at most one
spare per engine kind (backend) and state folder:

- ``keep(owner, backends, state_dir)``: the runtime's model pool asks for one spare
  per backend that a definition with ``isolation: "process"`` names, at start and
  after each settings reload; spares nobody asks for any more are stopped.  They
  start in the background, so start-up does not wait for them.
- ``take(backend, state_dir, ...)``: a ``ProcessEngine`` load takes the spare
  (waiting for one still starting); no spare, or one that died while it waited,
  means None and the load starts a fresh process.  ``replenish`` starts the next
  spare once that load is over, so its start-up does not compete with the load.
  A spare runs under ``SCHED_IDLE`` from its start, so its warm-up takes only CPU time
  nothing else wants; ``take`` sets every thread it has back to ``SCHED_OTHER`` (a load
  never waits on an idle-priority warm-up, and the engine's threads, which start later,
  inherit the normal policy); stopping one does the same first, so that its exit is not starved.
- ``release(owner)``: at shutdown, every spare no other owner asks for is stopped
  and awaited; no spare outlives the runtime (PR_SET_PDEATHSIG covers a kill -9).

Spares are engine processes like the others: started through the supervisor (own
process group, PR_SET_PDEATHSIG, pidfile for the start-up sweep), their output in
``<state_dir>/logs/spare-<backend>-<runtime pid>.log`` until taken, then in the replica's log
(the runtime's pid in the name: two runtimes sharing a state folder never take each other's file).
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Iterable
from pathlib import Path

from runtime.engine_process.launch import EngineProcessHandle, launch_engine_process
from runtime.supervisor.pidfiles import signal_group

logger = logging.getLogger("llmpool.runtime")

SpareKey = tuple[str, Path]  # (backend, state folder)
STOP_GRACE_SECONDS = 5.0


class SparePool:
    """The spare engine processes of this runtime process, one per wanted (backend, state folder)."""

    def __init__(self):
        self._wanted: dict[object, set[SpareKey]] = {}
        self._spares: dict[SpareKey, asyncio.Task[EngineProcessHandle]] = {}
        self._stopping: set[asyncio.Task] = set()

    def idle(self) -> list[EngineProcessHandle]:
        """The spares started and not taken yet."""
        return [
            task.result()
            for task in self._spares.values()
            if task.done() and not task.cancelled() and task.exception() is None
        ]

    def idle_pids(self) -> list[int]:
        """Process ids of the spares started and not taken yet."""
        return [spare.process.pid for spare in self.idle()]

    def keep(self, owner: object, backends: Iterable[str], state_dir: Path) -> None:
        """``owner`` wants a spare for each of ``backends``; start what is missing, stop the rest."""
        self._wanted[owner] = {(backend, Path(state_dir)) for backend in backends}
        for key in sorted(self._stop_unwanted()):
            self._start_if_missing(key)

    async def release(self, owner: object) -> None:
        """``owner`` wants no spares any more: stop those nobody else wants and wait until they are gone."""
        self._wanted.pop(owner, None)
        self._stop_unwanted()
        loop = asyncio.get_running_loop()
        await asyncio.gather(*[task for task in self._stopping if task.get_loop() is loop], return_exceptions=True)

    async def take(self, backend: str, state_dir: Path, label: str, log_path: Path) -> EngineProcessHandle | None:
        """The spare for ``backend``, renamed ``label`` with its output in ``log_path``, or None when
        there is none alive.  Call ``replenish`` once the load that took it is over."""
        self._forget_other_loops()
        task = self._spares.pop((backend, Path(state_dir)), None)
        if task is None:
            return None
        try:
            spare = await task
        except Exception as exc:
            logger.warning("the spare engine process for %s did not start: %s", backend, exc)
            return None
        if spare.process.has_exited():
            self._stop(task)
            return None
        _normal_policy(spare.process.pid)  # every thread: the warm-up may have started some (OpenMP, ggml)
        spare.process.rename(label, log_path)
        return spare

    # ---- starting and stopping -------------------------------------------------------
    def _stop_unwanted(self) -> set[SpareKey]:
        """Stop the spares no owner wants; the keys that are wanted."""
        self._forget_other_loops()
        wanted = set().union(*self._wanted.values())
        for key in [key for key in self._spares if key not in wanted]:
            self._stop(self._spares.pop(key))
        return wanted

    def _forget_other_loops(self) -> None:
        """Kill and drop the spares of another event loop (one that ended without releasing them)."""
        loop = asyncio.get_running_loop()
        for key in [key for key, task in self._spares.items() if task.get_loop() is not loop]:
            task = self._spares.pop(key)
            if task.done() and not task.cancelled() and task.exception() is None:
                signal_group(task.result().process.pid, signal.SIGKILL)

    def _start(self, key: SpareKey) -> None:
        self._spares[key] = asyncio.get_running_loop().create_task(self._launch(key), name=f"spare:{key[0]}")

    def replenish(self, backend: str, state_dir: Path) -> None:
        """Start the spare of ``backend`` unless it runs already or nobody wants it."""
        self._start_if_missing((backend, Path(state_dir)))

    def _start_if_missing(self, key: SpareKey) -> None:
        """Start the spare of ``key`` unless it runs already or nobody wants it."""
        if key in set().union(*self._wanted.values()) and key not in self._spares:
            self._start(key)

    async def _launch(self, key: SpareKey) -> EngineProcessHandle:
        backend, state_dir = key
        spare = await launch_engine_process(
            f"spare engine process for {backend}", spare_log_path(state_dir, backend), state_dir, warm=backend
        )
        _set_policy(spare.process.pid, os.SCHED_IDLE)
        return spare

    def _stop(self, task: asyncio.Task[EngineProcessHandle]) -> None:
        stopping = asyncio.get_running_loop().create_task(_stop_spare(task))
        self._stopping.add(stopping)
        stopping.add_done_callback(self._stopping.discard)


def _threads(pid: int) -> list[int]:
    try:
        return [int(name) for name in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


def _normal_policy(pid: int) -> None:
    """Every thread of process ``pid`` back to SCHED_OTHER."""
    for thread in _threads(pid):
        _set_policy(thread, os.SCHED_OTHER)


def _set_policy(thread: int, policy: int) -> None:
    """The scheduling policy of one thread (a pid names its main thread); a refusal only costs
    speed, so it is logged."""
    try:
        os.sched_setscheduler(thread, policy, os.sched_param(0))
    except ProcessLookupError:
        pass  # that thread has ended
    except OSError as exc:
        logger.warning("cannot set the scheduling policy of engine process thread %d to %d: %s", thread, policy, exc)


async def _stop_spare(task: asyncio.Task[EngineProcessHandle]) -> None:
    """End a spare: SIGTERM at once (it holds nothing to save), SIGKILL if it does not go."""
    if not task.done():
        task.cancel()
    try:
        spare = await task
    except BaseException:
        return  # it never started (a cancelled start kills what it had spawned)
    # A spare reads its socket only once its warm-up is over, and the warm-up runs under
    # SCHED_IDLE: on a busy machine a spare still importing its engine library can take longer
    # than the grace to notice a closed socket.  Back to the normal policy, so that it dies promptly.
    _normal_policy(spare.process.pid)
    spare.sock.close()
    await spare.process.stop(grace=STOP_GRACE_SECONDS)


SPARES = SparePool()


def spare_log_path(state_dir: Path, backend: str) -> Path:
    """Where a spare's output goes until it is taken: named by this runtime's pid too, since
    another runtime sharing the state folder keeps its own spare of the same backend."""
    return state_dir / "logs" / f"spare-{backend}-{os.getpid()}.log"
