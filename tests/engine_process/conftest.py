"""Fixtures of the engine-process tests: a state folder per test, a runtime, a leak check."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest



def engine_processes() -> list[psutil.Process]:
    """Live engine processes started by this test process."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "runtime.engine_process.child" in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


@pytest.fixture(autouse=True)
def no_engine_process_left():
    """Fail a test that leaves an engine process running (and kill it)."""
    yield
    deadline = time.monotonic() + 5
    while engine_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    leaked = engine_processes()
    for process in leaked:
        os.kill(process.pid, signal.SIGKILL)
    assert not leaked, f"engine processes left behind: {[p.pid for p in leaked]}"


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch) -> Path:
    """This test's runtime state folder (pidfiles, logs)."""
    folder = tmp_path / "state"
    monkeypatch.setenv("LLMPOOL_STATE_DIR", str(folder))
    return folder
