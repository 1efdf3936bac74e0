"""One managed server process group: start, health-check, watch and stop."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

from runtime.supervisor.command import ServerCommand, ServerStartError
from runtime.supervisor.output import TAIL_LINES, OutputLog
from runtime.supervisor.pidfiles import (
    GROUP_GONE_SECONDS,
    group_empty,
    group_members,
    signal_group,
    sweep_once,
    write_pidfile,
)
from runtime.supervisor.spawner import SPAWNER, kill_unclaimed, spawn
from runtime.supervisor.watch import open_watch

logger = logging.getLogger("llmpool.runtime")

STOP_GRACE_SECONDS = 10.0
KILL_WAIT_SECONDS = 10.0
OUTPUT_CHECK_SECONDS = 5.0  # how often a running process's log is read and kept under its cap
# How often a starting server's health is asked for at least: a load (a swap's second half) ends
# at most this long after the server is ready.  One check costs about 0.13 ms of the runtime's
# CPU (a kept-alive connection; a refused connect before the server listens costs less), so 50
# a second take under 1 % of a core from the load they wait for.
READY_POLL_SECONDS = 0.02
# Where inotify is not to be had: how often a starting server's log size is looked at between two
# checks (an fstat, about 1 µs); output the server wrote brings the next check forward to the next tick.
OUTPUT_WATCH_SECONDS = 0.005
HEALTH_TIMEOUT_SECONDS = 2.0


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


class ManagedProcess:
    """One server process group, owned by the event loop that started it."""

    def __init__(self, command: ServerCommand, state_dir: Path):
        self.command = command
        self.state_dir = Path(state_dir)
        self.process: subprocess.Popen | None = None
        self.returncode: int | None = None
        self._output: OutputLog | None = None
        self._output_check: asyncio.Task | None = None
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

    def has_exited(self) -> bool:
        """True once the leader exited, even before the event loop has seen its pidfd (the zombie
        is not reaped, so its process group id stays reserved)."""
        if not self.running:
            return self.process is not None
        try:
            return os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True

    def on_exit(self, callback: Callable[[ManagedProcess], None]) -> None:
        """Call ``callback(process)`` on the event loop once the leader has exited."""
        self._exit_callbacks.append(callback)

    def tail(self, count: int = TAIL_LINES) -> str:
        return self._output.tail(count) if self._output else "(no output)"

    def output_since(self, after: int | None, count: int) -> tuple[list[str], int]:
        """``OutputLog.since`` of this process's output (nothing before it started)."""
        return self._output.since(after, count) if self._output else ([], 0)

    def rename(self, label: str, log_path: Path) -> None:
        """Go on as ``label`` (in messages and the pidfile), with the output so far and from now on
        in ``log_path``: a spare engine process taken by a replica."""
        self.command = dataclasses.replace(self.command, label=label, log_path=log_path)
        if self._output is not None:
            self._output.move_to(log_path)
        if self._pidfile is not None:
            self._pidfile = write_pidfile(self.state_dir, self.process, self.command)

    async def output_settled(self) -> None:
        """Read the output of an exited group to its end (what its members wrote as they died too)."""
        if self._output is not None and self.has_exited():
            self._output.ended()

    def exit_report(self, when: str) -> str:
        """``"<label> exited with code 1 <when>; last output:\\n..."``."""
        return f"{self.command.label} {describe_exit(self.returncode)} {when}; last output:\n{self.tail()}"

    async def start(self) -> None:
        """Start the process (raise ServerStartError when it cannot be executed)."""
        await asyncio.to_thread(sweep_once, self.state_dir)
        # The process writes its output to its log file itself (runtime.supervisor.output).
        output = OutputLog(self.command.log_path)
        spawned = SPAWNER.submit(spawn, self.command, self.state_dir, output.writer)
        try:
            self.process, self._pidfd, self._pidfile = await asyncio.shield(asyncio.wrap_future(spawned))
        except asyncio.CancelledError:
            # Whoever cancelled (a spare's stop, a shutdown) must find no process left once this
            # returns: the spawn may still be queued or forking, so the kill is queued behind it on
            # the spawner thread and awaited.  Cancelled again meanwhile, the kill still happens.
            await asyncio.shield(asyncio.wrap_future(SPAWNER.submit(kill_unclaimed, spawned)))
            output.close()
            raise
        except OSError as exc:
            output.close()
            raise ServerStartError(
                f"cannot start {self.command.argv[0]} ({self.command.label}): {exc.strerror or exc}"
            ) from None
        output.spawned()
        self._output = output
        self._output_check = asyncio.create_task(self._check_output(), name=f"output:{self.pid}")
        asyncio.get_running_loop().add_reader(self._pidfd, self._leader_exited)

    async def _check_output(self) -> None:
        """While the process runs: read its new lines and keep its log under the cap, off the loop."""
        while True:
            await asyncio.sleep(OUTPUT_CHECK_SECONDS)
            await asyncio.to_thread(self._output.check_size)

    def _leader_exited(self) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._pidfd = None
        # The leader is a zombie until polled, so its group id cannot have been reused yet.
        signal_group(self.process.pid, signal.SIGKILL)
        if self._output_check is not None:
            self._output_check.cancel()
        self._output.ended()
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
            async with asyncio.timeout(timeout):
                await self._exited.wait()
        except TimeoutError:
            return False
        return True

    async def wait_ready(self, url: str, timeout: float, headers: dict | None = None) -> None:
        """Ask ``url`` until it answers 200; raise ServerStartError on exit or timeout.

        It is asked again ``READY_POLL_SECONDS`` after each answer, or sooner, as soon as the
        server writes output (an inotify wake-up on its log, ``runtime.supervisor.watch``; where
        there is none, one ``OUTPUT_WATCH_SECONDS`` tick after): llama-server says "model loaded"
        as its /health turns 200, so a swap's load ends about a millisecond after the server is
        ready.  The interval is fixed (no back-off), so the end of a long load is noticed as soon
        as the end of a short one."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        watch = open_watch(self._output.path) if self._output is not None else None
        try:
            await self._until_ready(session_headers=headers, url=url, deadline=deadline, timeout=timeout, watch=watch)
        finally:
            if watch is not None:
                watch.close()

    async def _until_ready(self, *, session_headers, url: str, deadline: float, timeout: float, watch) -> None:
        loop = asyncio.get_running_loop()
        async with _health_session(session_headers) as session:
            while True:
                if self._exited.is_set():
                    await self.output_settled()
                    raise ServerStartError(self.exit_report("before it was ready"))
                written = self._output_size()  # before asking: output during the check counts
                if await _answers_ok(session, url):
                    return
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise ServerStartError(
                        f"{self.command.label} was not ready within {timeout:g} s ({url} never answered 200); "
                        f"last output:\n{self.tail()}"
                    )
                if watch is not None:
                    await self._written_or_exit(watch, min(READY_POLL_SECONDS, remaining))
                else:
                    await self._output_or_exit(written, min(READY_POLL_SECONDS, remaining))

    async def _written_or_exit(self, watch, seconds: float) -> None:
        """Wait ``seconds``, or less: until the server writes to its log or exits."""
        exited = asyncio.ensure_future(self._exited.wait())
        written = asyncio.ensure_future(watch.written(seconds))
        try:
            await asyncio.wait((exited, written), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (exited, written):
                task.cancel()
            await asyncio.gather(exited, written, return_exceptions=True)

    def _output_size(self) -> int:
        return self._output.size() if self._output is not None else 0

    async def _output_or_exit(self, written: int, seconds: float) -> None:
        """Wait ``seconds``, or less: until the log is no longer ``written`` bytes long (checked
        every ``OUTPUT_WATCH_SECONDS``: a size, no read) or the process exits."""
        end = asyncio.get_running_loop().time() + seconds
        while (left := end - asyncio.get_running_loop().time()) > 0:
            if await self.wait_exit(min(OUTPUT_WATCH_SECONDS, left)) or self._output_size() != written:
                return

    def kill(self) -> None:
        """SIGKILL to the group now (a process that cannot be asked to stop); its exit is seen as any
        other (``on_exit``), and ``stop`` still waits for the group to be gone."""
        if self.process is not None and not self._exited.is_set():
            signal_group(self.process.pid, signal.SIGKILL)

    async def stop(self, grace: float | None = None) -> int | None:
        """SIGTERM to the group, SIGKILL after ``grace`` (STOP_GRACE_SECONDS); wait until the group is gone."""
        grace = STOP_GRACE_SECONDS if grace is None else grace
        try:
            if self.process is not None:
                if not self._exited.is_set():
                    signal_group(self.process.pid, signal.SIGTERM)
                    if not await self.wait_exit(grace):
                        logger.warning("%s ignored SIGTERM for %g s; killing it", self.command.label, grace)
                        signal_group(self.process.pid, signal.SIGKILL)
                        if not await self.wait_exit(KILL_WAIT_SECONDS):
                            raise RuntimeError(f"{self.command.label} (pid {self.pid}) did not exit after SIGKILL")
                if await self._wait_group_gone():
                    if self._pidfile is not None:
                        self._pidfile.unlink(missing_ok=True)
                    if self._output is not None:  # every writer is gone: its last lines, then the file closed
                        self._output.ended()
                        self._output.close()
                else:
                    raise RuntimeError(f"processes of {self.command.label} outlived SIGKILL; its pidfile stays")
            return self.returncode
        finally:
            for path in self.command.temp_files:
                path.unlink(missing_ok=True)

    async def _wait_group_gone(self) -> bool:
        if group_empty(self.process.pid):  # the usual end: the leader, reaped, was the group's only process
            return True
        deadline = time.monotonic() + GROUP_GONE_SECONDS
        while await asyncio.to_thread(group_members, self.process.pid):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True


def _health_session(headers: dict | None) -> aiohttp.ClientSession:
    """A session for a start's health checks: one kept-alive connection, each check bounded by
    ``HEALTH_TIMEOUT_SECONDS`` (aiohttp's client: a quarter of httpx's CPU a call)."""
    return aiohttp.ClientSession(
        headers=headers,
        timeout=aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_SECONDS),
        trust_env=False,
        cookie_jar=aiohttp.DummyCookieJar(),
    )


async def _answers_ok(session: aiohttp.ClientSession, url: str) -> bool:
    """Whether ``url`` answers 200 now; a refused connection or a slow answer is not ready."""
    try:
        async with session.get(url) as response:
            await response.read()  # the whole answer read: its connection is kept for the next check
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False
