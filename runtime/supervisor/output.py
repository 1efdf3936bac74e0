"""The output of a managed process: a bounded ring of lines and a size-capped log file."""
from __future__ import annotations

import threading
from collections import deque
from pathlib import Path

RING_LINES = 200
TAIL_LINES = 25
MAX_LINE_BYTES = 8192
LOG_ROTATE_BYTES = 32 * 1024 * 1024


class OutputLog:
    """The process output: a bounded ring of lines and a size-capped log file."""

    def __init__(self, path: Path):
        self.path = path
        self.lines: deque[str] = deque(maxlen=RING_LINES)
        self.written = 0  # lines ever appended: the number after the ring's newest line
        self.done = threading.Event()  # set once every writer has closed the pipe
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._rotate()

    def _rotate(self) -> None:
        _keep_previous(self.path)
        self._file = open(self.path, "wb")  # noqa: SIM115 - owned by the pump thread

    def move_to(self, path: Path) -> None:
        """Carry on writing in ``path`` (the file written so far is moved there; an older one there
        becomes ``<path>.1``)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            _keep_previous(path)
            self.path.replace(path)
            self.path = path

    def pump(self, pipe) -> None:
        """Copy ``pipe`` until every writer closed it (runs on its own thread)."""
        try:
            with pipe:
                for raw in iter(lambda: pipe.readline(MAX_LINE_BYTES), b""):
                    with self._lock:  # move_to renames the file under it
                        self._file.write(raw)
                        self._file.flush()
                        self.lines.append(raw.decode("utf-8", "replace").rstrip("\r\n"))
                        self.written += 1
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


    def since(self, after: int | None, count: int) -> tuple[list[str], int]:
        """The ring's lines numbered from ``after`` on (the last ``count`` when ``after`` is None),
        and the number that follows the newest; lines that left the ring are gone.  An ``after``
        past the newest (another process's number) reads as 0."""
        with self._lock:
            lines, written = list(self.lines), self.written
        if after is not None:
            after = 0 if after > written else after
            lines = lines[max(0, len(lines) - max(0, written - after)):]
        return lines[-count:], written


def _keep_previous(path: Path) -> None:
    """A non-empty log already at ``path`` becomes ``<path>.1`` (one previous run kept)."""
    if path.exists() and path.stat().st_size:
        path.replace(path.with_name(path.name + ".1"))
