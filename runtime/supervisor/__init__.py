"""Managed server processes: start, health-check, watch, stop, and sweep after a crash.

Every managed server (llama-server, ``vllm serve``, ``sglang serve``, trtllm-serve)
is owned by the runtime process:

- It is started by one long-lived thread (the spawner), in its own session and
  process group, with ``PR_SET_PDEATHSIG = SIGKILL``.  The kernel sends that
  signal when the *thread* that forked the child ends, so the forking thread must
  live as long as the runtime: a ``kill -9`` of the runtime then takes the server
  leaders down with it.
- A pidfile per process (``<state_dir>/managed/<pid>.json``, naming the owning
  runtime) lets a restarted runtime kill what a crashed one left behind
  (``sweep_stale_processes``), for instance workers of a server whose leader died.
- Its output goes to a bounded ring buffer (for ``last_error``) and a log file per
  model replica (``<state_dir>/logs/<model>.r<replica>.log``, one previous run kept).
- When the leader exits, whatever is left of its process group is killed at once:
  the server is gone, its workers must not keep GPU memory.
- ``stop`` sends SIGTERM to the group, SIGKILL after a grace period, waits until
  the group is empty and removes the pidfile and the load's temporary files.

Modules: ``command`` (what to run, the start error), ``ports`` (ports and the
environment), ``spawner`` (the forking thread), ``pidfiles`` (pidfiles, /proc
helpers, the sweep), ``output`` (the ring and the log file), ``process``
(``ManagedProcess``).
"""
from __future__ import annotations

from runtime.supervisor.command import ServerCommand, ServerStartError
from runtime.supervisor.pidfiles import sweep_stale_processes
from runtime.supervisor.ports import choose_port, connect_host, server_env
from runtime.supervisor.process import ManagedProcess, describe_exit

__all__ = [
    "ManagedProcess",
    "ServerCommand",
    "ServerStartError",
    "choose_port",
    "connect_host",
    "describe_exit",
    "server_env",
    "sweep_stale_processes",
]
