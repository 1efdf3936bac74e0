"""Where the runtime keeps its own files (pidfiles, logs, temporary configs of managed servers)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def state_dir() -> Path:
    """``$LLMPOOL_STATE_DIR``, else ``~/.local/state/llmpool``; created on first use."""
    folder = Path(os.environ.get("LLMPOOL_STATE_DIR") or Path.home() / ".local" / "state" / "llmpool")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def check_state_dir() -> Path:
    """The state folder, created if missing and proven writable by writing a file in it.

    Raises OSError (its message names the folder) when it cannot be created or written: a runtime
    that could not keep its pidfiles would leave managed servers and engine processes unswept.
    """
    folder = Path(os.environ.get("LLMPOOL_STATE_DIR") or Path.home() / ".local" / "state" / "llmpool")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise OSError(f"the state folder {folder} (LLMPOOL_STATE_DIR) is not writable: {exc.strerror}") from exc
    return folder
