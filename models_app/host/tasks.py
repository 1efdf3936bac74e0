"""Stopping the host's background tasks so that a stop always returns.

A task cancelled inside a library call does not always end: a cancel that lands as the call
completes can be dropped on the way out (Python 3.11's ``asyncio.wait_for`` does that, and so
can ``asyncio.timeout`` over redis-py's blocking pool: the admin event sender, cancelled on
SIGTERM, can be back on its outbox's ``get``).  ``cancel_and_wait`` cancels again while a
task still runs, so a dropped cancel lands at the task's next await, and gives up (with a
warning) after ``timeout`` seconds rather than hang the shutdown.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

logger = logging.getLogger("llmpool.runtime")

RECANCEL_SECONDS = 0.5


async def cancel_and_wait(tasks: Iterable[asyncio.Task], timeout: float = 10.0) -> None:
    """Cancel ``tasks`` and wait until they are done, cancelling again every RECANCEL_SECONDS."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        remaining = deadline - loop.time()
        if remaining <= 0:
            logger.warning("tasks still running after %g s of cancels: %s", timeout,
                           ", ".join(sorted(task.get_name() for task in pending)))
            return
        _, pending = await asyncio.wait(pending, timeout=min(RECANCEL_SECONDS, remaining))


async def cancel_the_rest(timeout: float = 10.0) -> None:
    """Cancel every other task of the running loop and wait for them as ``cancel_and_wait`` does:
    the end of a process's main coroutine, before ``asyncio.run`` cancels what is left and waits for
    it without a second cancel or a limit (a task that drops that cancel would hang the stop)."""
    current = asyncio.current_task()
    await cancel_and_wait([task for task in asyncio.all_tasks() if task is not current], timeout)
