"""How far a load has come: the stage a loading replica is in and, where known, its fraction.

An engine reports through ``context["on_load_progress"](stage, fraction)``, called on the
event loop (``fraction`` a float from 0 to 1, or None where the stage has no measure).
``load_replicas`` passes one that scales a replica's fraction into the whole load's (replica
``i`` of ``n`` covers ``i/n`` to ``(i+1)/n``) and hands it to the controller, whose entry shows
the latest as ``load_progress`` while the model is loading (null otherwise).

Stages, by backend:

- llama_cpp: ``loading_weights`` (llama.cpp's progress callback: the share of the tensors
  read), then ``creating_context``; in an engine process ``engine_process_started`` first;
- managed servers: ``spawned`` (the process runs), ``listening`` (its port takes a connection),
  ``loading_weights`` (while its log says so; llama-server's "loading model" lines), ``healthy``;
- the stub: ``stub_loading`` with a fraction rising over ``stub_load_seconds`` (ten steps).
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

STAGE_ENGINE_PROCESS_STARTED = "engine_process_started"
STAGE_LOADING_WEIGHTS = "loading_weights"
STAGE_CREATING_CONTEXT = "creating_context"
STAGE_SPAWNED = "spawned"
STAGE_LISTENING = "listening"
STAGE_HEALTHY = "healthy"
STAGE_STUB_LOADING = "stub_loading"
STAGES = frozenset({
    STAGE_ENGINE_PROCESS_STARTED, STAGE_LOADING_WEIGHTS, STAGE_CREATING_CONTEXT, STAGE_SPAWNED, STAGE_LISTENING,
    STAGE_HEALTHY, STAGE_STUB_LOADING,
})

# A native callback fires per tensor; only steps of at least this much are passed on.
MIN_FRACTION_STEP = 0.01

ProgressCallback = Callable[[str, "float | None"], None]


def report(context: dict, stage: str, fraction: float | None = None) -> None:
    """Tell the load's owner (if any) that this replica is at ``stage``; call on the event loop."""
    callback = context.get("on_load_progress")
    if callback is not None:
        callback(stage, None if fraction is None else min(1.0, max(0.0, float(fraction))))


def replica_reporter(callback: ProgressCallback, index: int, count: int) -> ProgressCallback:
    """``callback`` for the whole load, seen from replica ``index`` of ``count``."""

    def on_progress(stage: str, fraction: float | None) -> None:
        callback(stage, None if fraction is None else (index + fraction) / count)

    return on_progress


class ThreadedFraction:
    """A reporter that native code may call from any thread: fractions go to the event loop's
    ``report`` in steps of ``MIN_FRACTION_STEP`` (and always the last, 1.0)."""

    def __init__(self, context: dict, stage: str, loop: asyncio.AbstractEventLoop | None = None):
        self.context, self.stage = context, stage
        self.loop = loop or asyncio.get_running_loop()
        self._last = -1.0
        self._lock = threading.Lock()

    def __call__(self, fraction: float) -> None:
        with self._lock:
            if fraction < 1.0 and fraction - self._last < MIN_FRACTION_STEP:
                return
            if fraction <= self._last:
                return
            self._last = fraction
        self.loop.call_soon_threadsafe(report, self.context, self.stage, fraction)

    def stage_now(self, stage: str) -> None:
        self.loop.call_soon_threadsafe(report, self.context, stage, None)
