"""The spawner thread: one long-lived thread performs every fork.

``PR_SET_PDEATHSIG`` fires when the *thread* that forked the child ends, so the forking
thread must live as long as the runtime; a ``kill -9`` of the runtime then takes the
server leaders down with it.
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from runtime.supervisor.command import ServerCommand
from runtime.supervisor.pidfiles import signal_group, write_pidfile

PR_SET_PDEATHSIG = 1


class _Spawner:
    """One daemon thread that performs every fork, so PR_SET_PDEATHSIG ties children to the runtime."""

    def __init__(self):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._owner_pid: int | None = None

    def submit(self, function: Callable, *args) -> concurrent.futures.Future:
        with self._lock:
            if self._owner_pid != os.getpid():  # first use, or a forked copy of the runtime
                self._jobs = queue.SimpleQueue()
                threading.Thread(target=self._run, args=(self._jobs,), name="llmpool-spawner", daemon=True).start()
                self._owner_pid = os.getpid()
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((function, args, future))
        return future

    @staticmethod
    def _run(jobs: queue.SimpleQueue) -> None:
        while True:
            function, args, future = jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(function(*args))
            except BaseException as exc:  # handed to the awaiting task
                future.set_exception(exc)


SPAWNER = _Spawner()
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def _die_with_parent(parent_pid: int) -> None:
    """Runs in the child between fork and exec."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the runtime died before the signal was armed
        os._exit(127)


def spawn(command: ServerCommand, state_dir: Path, output: int) -> tuple[subprocess.Popen, int, Path]:
    """Start the process and record its pidfile (on the spawner thread).  ``output``: the
    descriptor its stdout and stderr write to (its log file, ``OutputLog.writer``)."""
    process = subprocess.Popen(
        command.argv,
        env=command.env,
        cwd=command.cwd,
        stdin=subprocess.DEVNULL,
        stdout=output,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        pass_fds=command.pass_fds,
        preexec_fn=functools.partial(_die_with_parent, os.getpid()),
    )
    pidfd = os.pidfd_open(process.pid)
    pidfile = write_pidfile(state_dir, process, command)
    return process, pidfd, pidfile


def kill_unclaimed(future: concurrent.futures.Future) -> None:
    """A spawn whose caller was cancelled meanwhile: end it and reap it (on the spawner thread,
    submitted after the spawn, so that the spawn is over)."""
    if future.cancelled() or future.exception() is not None:
        return
    process, pidfd, pidfile = future.result()
    signal_group(process.pid, signal.SIGKILL)
    process.wait()
    os.close(pidfd)
    pidfile.unlink(missing_ok=True)
