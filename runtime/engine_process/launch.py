"""Starting an engine process: ``python -m runtime.engine_process.child`` through the supervisor.

The process gets the child's end of a socket pair as an inherited fd, its own
process group, PR_SET_PDEATHSIG and a pidfile (``ManagedProcess``), and its output
goes to a ring and a log file.  ``warm`` names a backend whose engine library the
child imports before it waits for its ``load`` (a spare, ``runtime.engine_process.spares``).
"""
from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import runtime
from runtime.supervisor import ManagedProcess, ServerCommand

PROJECT_ROOT = str(Path(runtime.__file__).resolve().parent.parent)


@dataclass
class EngineProcessHandle:
    """A started engine process and the runtime's end of its socket."""

    process: ManagedProcess
    sock: socket.socket


async def launch_engine_process(
    label: str, log_path: Path, state_dir: Path, warm: str | None = None, env_extra: dict[str, str] | None = None
) -> EngineProcessHandle:
    """Start one engine process; raise ``ServerStartError`` when it cannot be executed.
    ``env_extra``: set in its environment (CUDA_VISIBLE_DEVICES of its placement)."""
    ours, theirs = socket.socketpair()
    try:
        env = {**os.environ, **(env_extra or {}), "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [PROJECT_ROOT, env.get("PYTHONPATH")]))
        argv = [sys.executable, "-m", "runtime.engine_process.child", "--fd", str(theirs.fileno())]
        command = ServerCommand(
            label=label,
            argv=argv + (["--warm", warm] if warm else []),
            env=env,
            log_path=log_path,
            pass_fds=(theirs.fileno(),),
        )
        process = ManagedProcess(command, state_dir)
        await process.start()
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return EngineProcessHandle(process, ours)
