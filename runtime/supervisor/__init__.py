"""Managed server processes: start, health-check, watch, stop, and sweep after a crash.

Every managed server (llama-server, ``vllm serve``, ``sglang serve``, trtllm-serve)
is owned by the runtime process:

- It is started by one long-lived thread (the spawner), in its own session and
  process group, with ``PR_SET_PDEATHSIG = SIGKILL``.  The kernel sends that
  signal when the *thread* that forked the child ends, so the forking thread must
  live as long as the runtime: a ``kill -9`` of the runtime then takes the server
  leaders down with it.
- A pidfile per process (``<state_dir>/managed/<pid>.json``, naming the owning
  runtime) lets a restarted runtime kill what a crashed one left behind
  (``sweep_stale_processes``), for instance workers of a server whose leader died.
- Its output goes to a bounded ring buffer (for ``last_error``) and a log file per
  model replica (``<state_dir>/logs/<model>.r<replica>.log``, one previous run kept).
- When the leader exits, whatever is left of its process group is killed at once:
  the server is gone, its workers must not keep GPU memory.
- ``stop`` sends SIGTERM to the group, SIGKILL after a grace period, waits until
  the group is empty and removes the pidfile and the load's temporary files.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import errno
import functools
import json
import logging
import os
import queue
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

logger = logging.getLogger("llmpool.runtime")

STOP_GRACE_SECONDS = 10.0
KILL_WAIT_SECONDS = 10.0
GROUP_GONE_SECONDS = 5.0
RING_LINES = 200
TAIL_LINES = 25
MAX_LINE_BYTES = 8192
LOG_ROTATE_BYTES = 32 * 1024 * 1024
PR_SET_PDEATHSIG = 1


class ServerStartError(RuntimeError):
    """A managed server could not be started or did not become ready (the load fails)."""


@dataclass(frozen=True)
class ServerCommand:
    """What to run: ``label`` names it in messages ("llama-server for model m, replica 1")."""

    label: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    temp_files: tuple[Path, ...] = ()
    cwd: str | None = None


# ---- ports and environment -----------------------------------------------------------


def connect_host(host: str) -> str:
    """The host part of a URL that reaches a server bound to ``host``."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def choose_port(host: str, configured: int | None, replica_index: int) -> int:
    """The configured port (plus the replica index) or a free one; raise when it is taken."""
    if configured is None:
        return _free_port(host)
    port = configured + replica_index
    if port > 65535:
        raise ServerStartError(f"port {configured} + replica index {replica_index} is above 65535")
    family = _family(host, port)
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # Servers bind with SO_REUSEADDR too, so only a listener (not TIME_WAIT) counts as taken.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ServerStartError(f"port {port} on {host} is already in use") from None
            raise ServerStartError(f"cannot bind {host}:{port}: {exc.strerror or exc}") from None
    return port


def _family(host: str, port: int) -> int:
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        raise ServerStartError(f"cannot resolve host {host!r}: {exc.strerror}") from None


def _free_port(host: str) -> int:
    with socket.socket(_family(host, 0), socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def server_env(extra: dict[str, str], library_path: str | None) -> dict[str, str]:
    """The runtime's environment plus the definition's, with ``library_path`` first on LD_LIBRARY_PATH."""
    env = {**os.environ, **extra}
    if library_path:
        current = env.get("LD_LIBRARY_PATH")
        env["LD_LIBRARY_PATH"] = f"{library_path}:{current}" if current else library_path
    return env


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "is still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"exited with code {returncode} ({name})"
    return f"exited with code {returncode}"


# ---- the spawner thread ----------------------------------------------------------------


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


_SPAWNER = _Spawner()
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def _die_with_parent(parent_pid: int) -> None:
    """Runs in the child between fork and exec."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the runtime died before the signal was armed
        os._exit(127)


def _spawn(command: ServerCommand, state_dir: Path) -> tuple[subprocess.Popen, int, Path]:
    """Start the process and record its pidfile (on the spawner thread)."""
    process = subprocess.Popen(
        command.argv,
        env=command.env,
        cwd=command.cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=functools.partial(_die_with_parent, os.getpid()),
    )
    pidfd = os.pidfd_open(process.pid)
    pidfile = _write_pidfile(state_dir, process, command)
    return process, pidfd, pidfile


def _kill_unclaimed(future: concurrent.futures.Future) -> None:
    """A spawn whose caller was cancelled meanwhile: end it (on the spawner thread)."""
    if future.cancelled() or future.exception() is not None:
        return
    process, pidfd, pidfile = future.result()
    _signal_group(process.pid, signal.SIGKILL)
    process.wait()
    os.close(pidfd)
    pidfile.unlink(missing_ok=True)


# ---- /proc helpers and pidfiles -------------------------------------------------------


def _proc_stat(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/<pid>/stat (state, ppid, pgrp, ...), or None when there is no such process."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return data[data.rindex(")") + 2 :].split()


def _start_time(pid: int) -> str | None:
    fields = _proc_stat(pid)
    return fields[19] if fields else None


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    members = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _proc_stat(int(entry.name))
            if fields and fields[2] == str(pgid) and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _pidfile_dir(state_dir: Path) -> Path:
    return Path(state_dir) / "managed"


def _write_pidfile(state_dir: Path, process: subprocess.Popen, command: ServerCommand) -> Path:
    folder = _pidfile_dir(state_dir)
    folder.mkdir(parents=True, exist_ok=True)
    record = {
        "pid": process.pid,
        "pgid": process.pid,
        "start_time": _start_time(process.pid),
        "owner_pid": os.getpid(),
        "owner_start_time": _start_time(os.getpid()),
        "label": command.label,
        "argv": command.argv,
    }
    path = folder / f"{process.pid}.json"
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(record))
    temporary.replace(path)
    return path


def sweep_stale_processes(state_dir: Path) -> list[dict]:
    """Kill the process groups that a runtime which is no longer alive left behind.

    Reads every pidfile under ``state_dir``; groups whose owning runtime still
    runs (this one, or another sharing the folder) are left alone.  A group is
    killed (SIGKILL) when its leader is still the recorded process, or when the
    leader is gone but members remain (a process group id is not reused while
    the group has members).  Temporary files of runtimes that are gone are
    removed too.  Returns the pidfile records of the groups killed.
    """
    folder = _pidfile_dir(state_dir)
    killed = [record for path in sorted(folder.glob("*.json")) if (record := _sweep_pidfile(path))]
    for record in killed:
        logger.warning("killed %s (pid %s) left behind by a runtime that is gone", record.get("label"), record["pid"])
    _remove_stale_temp_files(Path(state_dir) / "tmp")
    return killed


def _sweep_pidfile(path: Path) -> dict | None:
    """Handle one pidfile; the record when its group was killed."""
    try:
        record = json.loads(path.read_text())
        owner, pgid = int(record["owner_pid"]), int(record["pgid"])
    except (OSError, ValueError, KeyError, TypeError):
        path.unlink(missing_ok=True)
        return None
    if _start_time(owner) == record.get("owner_start_time"):
        return None  # its runtime is alive
    leader_start = _start_time(pgid)
    if leader_start not in (None, record.get("start_time")):
        path.unlink(missing_ok=True)  # the pid now belongs to another process: the group is long gone
        return None
    stale = leader_start is not None or bool(group_members(pgid))
    if stale:
        _signal_group(pgid, signal.SIGKILL)
        deadline = time.monotonic() + GROUP_GONE_SECONDS
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
    if not group_members(pgid):
        path.unlink(missing_ok=True)
    return record if stale else None


def _remove_stale_temp_files(folder: Path) -> None:
    """Temporary files are named ``<runtime pid>-...``; drop those of runtimes that are gone."""
    if not folder.is_dir():
        return
    for path in folder.iterdir():
        owner = path.name.split("-", 1)[0]
        if owner.isdigit() and _start_time(int(owner)) is None:
            path.unlink(missing_ok=True)


_swept: set[Path] = set()
_sweep_lock = threading.Lock()


def _sweep_once(state_dir: Path) -> None:
    """The first managed start in a process sweeps its state folder (the start-up hook may not have)."""
    with _sweep_lock:
        resolved = Path(state_dir).resolve()
        if resolved not in _swept:
            sweep_stale_processes(resolved)
            _swept.add(resolved)


# ---- output -------------------------------------------------------------------------------


class _OutputLog:
    """The process output: a bounded ring of lines and a size-capped log file."""

    def __init__(self, path: Path):
        self.path = path
        self.lines: deque[str] = deque(maxlen=RING_LINES)
        self.done = threading.Event()  # set once every writer has closed the pipe
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._rotate()

    def _rotate(self) -> None:
        if self.path.exists() and self.path.stat().st_size:
            self.path.replace(self.path.with_name(self.path.name + ".1"))
        self._file = open(self.path, "wb")  # noqa: SIM115 - owned by the pump thread

    def pump(self, pipe) -> None:
        """Copy ``pipe`` until every writer closed it (runs on its own thread)."""
        try:
            with pipe:
                for raw in iter(lambda: pipe.readline(MAX_LINE_BYTES), b""):
                    self._file.write(raw)
                    self._file.flush()
                    with self._lock:
                        self.lines.append(raw.decode("utf-8", "replace").rstrip("\r\n"))
                    if self._file.tell() > LOG_ROTATE_BYTES:
                        self._file.close()
                        self._rotate()
        finally:
            self._file.close()
            self.done.set()

    def tail(self, count: int = TAIL_LINES) -> str:
        with self._lock:
            lines = list(self.lines)[-count:]
        return "\n".join(lines) if lines else "(no output)"


# ---- one managed process ------------------------------------------------------------------


class ManagedProcess:
    """One server process group, owned by the event loop that started it."""

    def __init__(self, command: ServerCommand, state_dir: Path):
        self.command = command
        self.state_dir = Path(state_dir)
        self.process: subprocess.Popen | None = None
        self.returncode: int | None = None
        self._output: _OutputLog | None = None
        self._pidfd: int | None = None
        self._pidfile: Path | None = None
        self._exited = asyncio.Event()
        self._exit_callbacks: list[Callable[[ManagedProcess], None]] = []

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def running(self) -> bool:
        return self.process is not None and not self._exited.is_set()

    def on_exit(self, callback: Callable[[ManagedProcess], None]) -> None:
        """Call ``callback(process)`` on the event loop once the leader has exited."""
        self._exit_callbacks.append(callback)

    def tail(self, count: int = TAIL_LINES) -> str:
        return self._output.tail(count) if self._output else "(no output)"

    async def output_settled(self, timeout: float = 1.0) -> None:
        """Wait (briefly) until the output of an exited group has been read to its end."""
        if self._output is not None:
            await asyncio.to_thread(self._output.done.wait, timeout)

    def exit_report(self, when: str) -> str:
        """``"<label> exited with code 1 <when>; last output:\\n..."``."""
        return f"{self.command.label} {describe_exit(self.returncode)} {when}; last output:\n{self.tail()}"

    async def start(self) -> None:
        """Start the process (raise ServerStartError when it cannot be executed)."""
        await asyncio.to_thread(_sweep_once, self.state_dir)
        spawned = _SPAWNER.submit(_spawn, self.command, self.state_dir)
        try:
            self.process, self._pidfd, self._pidfile = await asyncio.shield(asyncio.wrap_future(spawned))
        except asyncio.CancelledError:
            spawned.add_done_callback(_kill_unclaimed)
            raise
        except OSError as exc:
            raise ServerStartError(
                f"cannot start {self.command.argv[0]} ({self.command.label}): {exc.strerror or exc}"
            ) from None
        self._output = _OutputLog(self.command.log_path)
        threading.Thread(
            target=self._output.pump, args=(self.process.stdout,), name=f"output:{self.pid}", daemon=True
        ).start()
        asyncio.get_running_loop().add_reader(self._pidfd, self._leader_exited)

    def _leader_exited(self) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._pidfd = None
        # The leader is a zombie until polled, so its group id cannot have been reused yet.
        _signal_group(self.process.pid, signal.SIGKILL)
        self.returncode = self.process.poll()
        if self.returncode is None:  # pragma: no cover - pidfd said it exited
            self.returncode = self.process.wait()
        self._exited.set()
        for callback in self._exit_callbacks:
            try:
                callback(self)
            except Exception:
                logger.exception("exit callback of %s failed", self.command.label)

    async def wait_exit(self, timeout: float | None = None) -> bool:
        """True once the leader has exited, False after ``timeout`` seconds."""
        try:
            await asyncio.wait_for(self._exited.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def wait_ready(self, url: str, timeout: float, headers: dict | None = None) -> None:
        """Poll ``url`` until it answers 200; raise ServerStartError on exit or timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        delay = 0.05
        async with httpx.AsyncClient(timeout=2.0, trust_env=False, headers=headers) as client:
            while True:
                if self._exited.is_set():
                    await self.output_settled()
                    raise ServerStartError(self.exit_report("before it was ready"))
                try:
                    if (await client.get(url)).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise ServerStartError(
                        f"{self.command.label} was not ready within {timeout:g} s ({url} never answered 200); "
                        f"last output:\n{self.tail()}"
                    )
                await self.wait_exit(min(delay, remaining))
                delay = min(delay * 2, 0.5)

    async def stop(self, grace: float | None = None) -> int | None:
        """SIGTERM to the group, SIGKILL after ``grace`` (STOP_GRACE_SECONDS); wait until the group is gone."""
        grace = STOP_GRACE_SECONDS if grace is None else grace
        try:
            if self.process is not None:
                if not self._exited.is_set():
                    _signal_group(self.process.pid, signal.SIGTERM)
                    if not await self.wait_exit(grace):
                        logger.warning("%s ignored SIGTERM for %g s; killing it", self.command.label, grace)
                        _signal_group(self.process.pid, signal.SIGKILL)
                        if not await self.wait_exit(KILL_WAIT_SECONDS):
                            raise RuntimeError(f"{self.command.label} (pid {self.pid}) did not exit after SIGKILL")
                if await self._wait_group_gone():
                    if self._pidfile is not None:
                        self._pidfile.unlink(missing_ok=True)
                else:
                    raise RuntimeError(f"processes of {self.command.label} outlived SIGKILL; its pidfile stays")
            return self.returncode
        finally:
            for path in self.command.temp_files:
                path.unlink(missing_ok=True)

    async def _wait_group_gone(self) -> bool:
        deadline = time.monotonic() + GROUP_GONE_SECONDS
        while await asyncio.to_thread(group_members, self.process.pid):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True
