"""Where the runtime keeps its own files (pidfiles, logs, temporary configs of managed servers)."""
from __future__ import annotations

import os
from pathlib import Path


def state_dir() -> Path:
    """``$LLMPOOL_STATE_DIR``, else ``~/.local/state/llmpool``; created on first use."""
    folder = Path(os.environ.get("LLMPOOL_STATE_DIR") or Path.home() / ".local" / "state" / "llmpool")
    folder.mkdir(parents=True, exist_ok=True)
    return folder
