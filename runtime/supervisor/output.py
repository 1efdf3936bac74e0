"""The output of a managed process: a size-capped log file that the process writes itself, and a
bounded ring of its last lines, read from that file when asked for.

The process's stdout and stderr are the log file itself (opened ``O_APPEND``), as supervisord's
``stdout_logfile`` and systemd's ``StandardOutput=append:`` make them: the kernel appends each
write, and nothing of llm-pool's runs per line.  Not a pipe copied line by line by a thread of
the runtime process: llama-server writes about nine lines a request, and each would wake that
thread and take the interpreter's lock from the event loop (about 0.5 ms of the runtime's CPU a
request, docs/performance.md).  The file is read when something asks for its
lines (``tail``, ``since``: a crash's message, the logs endpoint, a start's progress) and by
``check_size``, which the owner calls every few seconds off the event loop: it takes the new lines
into the ring (so an answer never has much to read) and keeps the file under its cap.

Capping a file that another process appends to: past ``LOG_ROTATE_BYTES``, the lines not read yet
are read, the file is copied to ``<log>.1`` and cut to nothing (logrotate's ``copytruncate``; the
process's next write lands at the start, since it appends).  What the process writes in the
moment between the copy and the cut is in neither file (the ring has it when it was read before
the cut); a process that writes 32 MiB of log rarely loses a line this way, and never its last.
"""
from __future__ import annotations

import os
import shutil
import threading
from collections import deque
from pathlib import Path

RING_LINES = 200
TAIL_LINES = 25
MAX_LINE_BYTES = 8192  # a longer line counts as several, of at most this many bytes each
LOG_ROTATE_BYTES = 32 * 1024 * 1024


class OutputLog:
    """The process output: its log file (``writer``: the descriptor the process writes to) and the
    ring of its last lines, numbered from 0 in the order written (``written``: the number after the
    newest), across the copies of ``<log>.1``."""

    def __init__(self, path: Path):
        self.path = path
        self.lines: deque[str] = deque(maxlen=RING_LINES)
        self.written = 0  # lines ever read: the number after the ring's newest line
        self._lock = threading.Lock()
        self._pending = b""  # the start of a line whose end has not been written yet
        self._ended = False  # no writer is left: a last line without its newline counts
        path.parent.mkdir(parents=True, exist_ok=True)
        _keep_previous(path)
        self.writer: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        self._reader = open(path, "rb")  # noqa: SIM115 - read as the lines are asked for; follows a rename

    def spawned(self) -> None:
        """The process has its own copy of ``writer``: this process's is closed."""
        if self.writer is not None:
            os.close(self.writer)
            self.writer = None

    def move_to(self, path: Path) -> None:
        """Carry on in ``path`` (the file written so far is moved there; an older one there becomes
        ``<path>.1``).  The process and the reader keep their descriptors: a rename keeps the file."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            _keep_previous(path)
            self.path.replace(path)
            self.path = path

    def ended(self) -> None:
        """The process (group) is gone: read what it wrote last, a line without its newline too."""
        with self._lock:
            self._ended = True
            self._read_new()

    def close(self) -> None:
        self.spawned()
        with self._lock:
            self._reader.close()

    def check_size(self) -> None:
        """Read the new lines, and keep the file under ``LOG_ROTATE_BYTES`` (the module docstring)."""
        with self._lock:
            self._read_new()
            if self._reader.closed or os.fstat(self._reader.fileno()).st_size <= LOG_ROTATE_BYTES:
                return
            shutil.copyfile(self.path, self.path.with_name(self.path.name + ".1"))
            self._read_new()  # what came during the copy
            os.truncate(self.path, 0)
            self._reader.seek(0)

    def size(self) -> int:
        """The log file's length in bytes (0 once closed): it changes as the process writes.  No
        lock: the reader is closed only by its owner's thread, and a size needs no consistent ring."""
        return 0 if self._reader.closed else os.fstat(self._reader.fileno()).st_size

    def tail(self, count: int = TAIL_LINES) -> str:
        with self._lock:
            self._read_new()
            lines = list(self.lines)[-count:]
        return "\n".join(lines) if lines else "(no output)"

    def since(self, after: int | None, count: int) -> tuple[list[str], int]:
        """The ring's lines numbered from ``after`` on (the last ``count`` when ``after`` is None),
        and the number that follows the newest; lines that left the ring are gone.  An ``after``
        past the newest (another process's number) reads as 0."""
        with self._lock:
            self._read_new()
            lines, written = list(self.lines), self.written
        if after is not None:
            after = 0 if after > written else after
            lines = lines[max(0, len(lines) - max(0, written - after)):]
        return lines[-count:], written

    def _read_new(self) -> None:
        """Take what the process wrote since the last read into the ring (under the lock)."""
        if self._reader.closed:
            return
        data = self._pending + self._reader.read()
        *complete, self._pending = data.split(b"\n")
        if self._ended and self._pending or len(self._pending) >= MAX_LINE_BYTES:
            # The process's last words without a newline; or a line (a progress bar redrawn with
            # carriage returns) this long already: its whole pieces count now, as they came.
            whole = len(self._pending) if self._ended else len(self._pending) - len(self._pending) % MAX_LINE_BYTES
            complete.append(self._pending[:whole])
            self._pending = self._pending[whole:]
        pieces = [line[start:start + MAX_LINE_BYTES] for line in complete
                  for start in range(0, max(1, len(line)), MAX_LINE_BYTES)]
        self.written += len(pieces)
        self.lines.extend(piece.decode("utf-8", "replace").rstrip("\r") for piece in pieces[-RING_LINES:])


def _keep_previous(path: Path) -> None:
    """A non-empty log already at ``path`` becomes ``<path>.1`` (one previous run kept)."""
    if path.exists() and path.stat().st_size:
        path.replace(path.with_name(path.name + ".1"))
