"""``kill -USR1 <pid>`` on a serving process writes every thread's stack and every asyncio task's
await chain to its standard error (the log): what to look at when a process hangs.

The threads' stacks are written by ``faulthandler`` from the signal handler itself, in C, so they
come even when no Python code can run (the main thread blocked in a C call, another thread holding
the GIL); the tasks' await chains need the interpreter and come once the main thread runs Python."""
from __future__ import annotations

import asyncio
import faulthandler
import os
import signal
import sys
import threading
from contextlib import contextmanager

# A stop that takes longer than this writes every thread's stack to the log once (stacks_if_slow).
SLOW_STOP_SECONDS = 20


def install() -> None:
    """Install the SIGUSR1 handler (the main thread only, where Python runs signal handlers)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, _dump)
        # Registered after Python's handler, which it calls next (chain): first the threads, in C.
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True, chain=True)


@contextmanager
def stacks_if_slow(seconds: float = SLOW_STOP_SECONDS):
    """Around a stop: if it is still running after ``seconds``, every thread's stack goes to the
    log (from faulthandler's own thread, so a stop hung anywhere says where), and the stop goes on."""
    faulthandler.dump_traceback_later(seconds, file=sys.stderr)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def _dump(_signum, _frame) -> None:
    out = sys.stderr
    print(f"--- SIGUSR1: the stacks of process {os.getpid()} (its threads' are above) ---", file=out)
    loop = asyncio._get_running_loop()  # the loop this handler interrupted, if any
    if loop is not None:
        for task in asyncio.all_tasks(loop):
            print(f"task {task.get_name()} ({'cancelling' if task.cancelling() else 'running'}):", file=out)
            for line in await_chain(task.get_coro()):
                print(f"  {line}", file=out)
    print("--- end of the stacks ---", file=out, flush=True)


def await_chain(awaitable) -> list[str]:
    """Where a coroutine waits: each coroutine or async generator it awaits, with file and line."""
    lines = []
    while awaitable is not None:
        frame = getattr(awaitable, "cr_frame", None) or getattr(awaitable, "ag_frame", None)
        name = getattr(awaitable, "__qualname__", type(awaitable).__name__)
        where = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "(not running)"
        lines.append(f"{name} at {where}")
        awaitable = getattr(awaitable, "cr_await", None) or getattr(awaitable, "ag_await", None)
    return lines
