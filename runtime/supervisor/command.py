"""What the supervisor runs, and the error a failed start raises."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


class ServerStartError(RuntimeError):
    """A managed server could not be started or did not become ready (the load fails)."""


@dataclass(frozen=True)
class ServerCommand:
    """What to run: ``label`` names it in messages ("llama-server for model m, replica 1");
    ``pass_fds`` are descriptors the process inherits (an engine process's socket)."""

    label: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    temp_files: tuple[Path, ...] = ()
    cwd: str | None = None
    pass_fds: tuple[int, ...] = ()
