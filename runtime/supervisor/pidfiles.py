"""Pidfiles, /proc helpers and the sweep of what a crashed runtime left behind.

A pidfile per process (``<state_dir>/managed/<pid>.json``, naming the owning runtime)
lets a restarted runtime kill the process groups a crashed one left, for instance
workers of a server whose leader died.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from runtime.supervisor.command import ServerCommand

logger = logging.getLogger("llmpool.runtime")

GROUP_GONE_SECONDS = 5.0


def _proc_stat(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/<pid>/stat (state, ppid, pgrp, ...), or None when there is no such process."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return data[data.rindex(")") + 2 :].split()


def start_time(pid: int) -> str | None:
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


def group_empty(pgid: int) -> bool:
    """True when group ``pgid`` has no process at all, not even a zombie: one signal 0 answers
    it, where ``group_members`` reads every process's /proc/<pid>/stat (a few ms)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _pidfile_dir(state_dir: Path) -> Path:
    return Path(state_dir) / "managed"


def write_pidfile(state_dir: Path, process: subprocess.Popen, command: ServerCommand) -> Path:
    folder = _pidfile_dir(state_dir)
    folder.mkdir(parents=True, exist_ok=True)
    record = {
        "pid": process.pid,
        "pgid": process.pid,
        "start_time": start_time(process.pid),
        "owner_pid": os.getpid(),
        "owner_start_time": start_time(os.getpid()),
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
    if start_time(owner) == record.get("owner_start_time"):
        return None  # its runtime is alive
    leader_start = start_time(pgid)
    if leader_start not in (None, record.get("start_time")):
        path.unlink(missing_ok=True)  # the pid now belongs to another process: the group is long gone
        return None
    stale = leader_start is not None or bool(group_members(pgid))
    if stale:
        signal_group(pgid, signal.SIGKILL)
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
        if owner.isdigit() and start_time(int(owner)) is None:
            path.unlink(missing_ok=True)


_swept: set[Path] = set()
_sweep_lock = threading.Lock()


def sweep_once(state_dir: Path) -> None:
    """The first managed start in a process sweeps its state folder (the start-up hook may not have)."""
    with _sweep_lock:
        resolved = Path(state_dir).resolve()
        if resolved not in _swept:
            sweep_stale_processes(resolved)
            _swept.add(resolved)
