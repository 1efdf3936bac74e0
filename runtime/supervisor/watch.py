"""A wake-up when a file is written: Linux's inotify, read on the event loop.

A starting server's readiness shows in its log before any poll would find it (llama-server
prints "model loaded" as its /health turns 200), so the health check waits on the log: a write
to it brings the next check forward at once, with no timer ticking meanwhile.  ``FileWatch``
is that wait: one inotify descriptor watching one file for writes (``IN_MODIFY``), registered
with the event loop as a reader.  Where inotify is not to be had (another OS, a kernel without
it, the per-user watch limit reached), ``open_watch`` returns None and the caller polls.
"""
from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
from pathlib import Path

logger = logging.getLogger("llmpool.runtime")

IN_MODIFY = 0x00000002
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
_READ_BYTES = 4096  # events are 16 bytes and more each; one read drains a burst


def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.inotify_init1, libc.inotify_add_watch  # noqa: B018 - present on Linux only
    except (OSError, AttributeError):
        return None
    libc.inotify_add_watch.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
    return libc


_LIBC = _libc()


class FileWatch:
    """Writes to one file, as an awaitable: ``await written(timeout)``."""

    def __init__(self, fd: int):
        self._fd = fd
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        self._loop.add_reader(fd, self._readable)

    def _readable(self) -> None:
        try:
            while os.read(self._fd, _READ_BYTES):
                pass
        except BlockingIOError:
            pass  # drained
        self._event.set()

    async def written(self, timeout: float) -> bool:
        """True once the file was written since the last call (or is written within ``timeout``
        seconds), False when the time passed without a write."""
        if not self._event.is_set():
            try:
                async with asyncio.timeout(timeout):
                    await self._event.wait()
            except TimeoutError:
                return False
        self._event.clear()
        return True

    def close(self) -> None:
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)  # the watch goes with its descriptor
            self._fd = -1


def open_watch(path: Path) -> FileWatch | None:
    """A watch on writes to ``path`` on the running loop, or None where inotify cannot give one."""
    if _LIBC is None:
        return None
    fd = _LIBC.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
    if fd < 0:
        logger.debug("inotify_init1 failed: %s", os.strerror(ctypes.get_errno()))
        return None
    if _LIBC.inotify_add_watch(fd, os.fsencode(path), IN_MODIFY) < 0:
        logger.debug("inotify_add_watch(%s) failed: %s", path, os.strerror(ctypes.get_errno()))
        os.close(fd)
        return None
    return FileWatch(fd)
