"""The spawner thread: one long-lived thread performs every fork.

``PR_SET_PDEATHSIG`` fires when the *thread* that forked the child ends, so the forking
thread must live as long as the runtime; a ``kill -9`` of the runtime then takes the
server leaders down with it.

The signal is armed by util-linux's ``setpriv --pdeathsig KILL`` in front of the server's
command, which then execs the server (the setting survives the exec): Python's subprocess can
then start the child with vfork, where a ``preexec_fn`` forces a full fork of the runtime
process (its page tables copied: several ms of a swap, more the bigger the runtime).  Where
setpriv is missing or too old, the child arms the signal itself in a ``preexec_fn``.  Either
way a runtime that dies between the fork and the arming leaves a server behind for the next
start's pidfile sweep (``runtime.supervisor.pidfiles``).
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import os
import errno
import queue
import shutil
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


def _setpriv() -> str | None:
    """setpriv's path where it has ``--pdeathsig`` (util-linux 2.33 and newer), else None."""
    path = shutil.which("setpriv")
    if path is None:
        return None
    try:
        probe = subprocess.run([path, "--pdeathsig", "KILL", "--", "true"], capture_output=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return path if probe.returncode == 0 else None


_SETPRIV = functools.cache(_setpriv)


def _executable(argv0: str, env: dict | None, cwd: str | os.PathLike | None) -> str:
    """``argv0`` as the exec would find it (a relative path from ``cwd``, a bare name on the
    command's PATH); OSError as the exec would raise it when it cannot run (setpriv execs the
    server itself, so its failure would otherwise show only as an exit code)."""
    if "/" in argv0:
        found = os.path.join(cwd, argv0) if cwd is not None else argv0
    else:
        found = shutil.which(argv0, path=(env or os.environ).get("PATH", os.defpath))
    if found is None or not os.path.exists(found):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv0)
    if os.path.isdir(found) or not os.access(found, os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), argv0)
    return found


def spawn(command: ServerCommand, state_dir: Path, output: int) -> tuple[subprocess.Popen, int, Path]:
    """Start the process and record its pidfile (on the spawner thread).  ``output``: the
    descriptor its stdout and stderr write to (its log file, ``OutputLog.writer``)."""
    setpriv = _SETPRIV()
    if setpriv is not None:
        argv = [setpriv, "--pdeathsig", "KILL", "--", _executable(command.argv[0], command.env, command.cwd), *command.argv[1:]]
        arm = None
    else:
        argv, arm = command.argv, functools.partial(_die_with_parent, os.getpid())
    process = subprocess.Popen(
        argv,
        env=command.env,
        cwd=command.cwd,
        stdin=subprocess.DEVNULL,
        stdout=output,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        pass_fds=command.pass_fds,
        preexec_fn=arm,
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
