"""Fixtures of the engine-process tests: a state folder per test, a runtime, a leak check."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from runtime.paths import state_dir as state_dir_path


def engine_processes(spares: bool = False) -> list[psutil.Process]:
    """Live engine processes started by this test process; spares no replica took only with ``spares``.

    Only its own children: a live service that a test elsewhere keeps for the session (the admin
    workbench) has engine processes and spares of its own, one level further down.
    """
    found = []
    for child in psutil.Process().children(recursive=False):
        try:
            command = child.cmdline()
            if "runtime.engine_process.child" in command and child.status() != psutil.STATUS_ZOMBIE:
                if spares or not is_idle_spare(child.pid, command):
                    found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


def is_idle_spare(pid: int, command: list[str]) -> bool:
    """A spare (started with --warm) whose pidfile does not name a replica yet (or is not written yet)."""
    if "--warm" not in command:
        return False
    try:
        label = json.loads((state_dir_path() / "managed" / f"{pid}.json").read_text())["label"]
    except FileNotFoundError:
        return True
    return label.startswith("spare engine process")


@pytest.fixture(autouse=True)
def no_engine_process_left():
    """Fail a test that leaves an engine process running, spares included (and kill it)."""
    yield
    deadline = time.monotonic() + 5
    while engine_processes(spares=True) and time.monotonic() < deadline:
        time.sleep(0.05)
    leaked = engine_processes(spares=True)
    described = [describe(process) for process in leaked]
    for process in leaked:
        os.kill(process.pid, signal.SIGKILL)
    assert not leaked, f"engine processes left behind: {described}; {spare_pool_state()}"


def spare_pool_state() -> str:
    """What this process's spare pool holds and who wants what (for a leak's message)."""
    from runtime.engine_process.spares import SPARES

    wanted = {type(owner).__name__ + hex(id(owner)): sorted(map(str, keys)) for owner, keys in SPARES._wanted.items()}
    held = {str(key): ("done" if task.done() else "starting") for key, task in SPARES._spares.items()}
    return f"spares wanted {wanted}, held {held}, stopping {len(SPARES._stopping)}"


def describe(process: psutil.Process) -> str:
    """Which engine process it is and whose: its pid, age, arguments and the state folder it was
    started with (a test's tmp_path names that test)."""
    try:
        folder = process.environ().get("LLMPOOL_STATE_DIR", "(none)")
        age = time.time() - process.create_time()
        return f"pid {process.pid}, started {age:.1f} s ago, {' '.join(process.cmdline()[2:])}, state folder {folder}"
    except psutil.NoSuchProcess:
        return f"pid {process.pid} (gone meanwhile)"


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch) -> Path:
    """This test's runtime state folder (pidfiles, logs)."""
    folder = tmp_path / "state"
    monkeypatch.setenv("LLMPOOL_STATE_DIR", str(folder))
    return folder
